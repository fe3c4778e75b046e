"""A batch's token layout, the chunks strategies cut it into, and the keys and values they read.

A *chunk* is a contiguous range of rows of the stack's token layout (all of them for the
baseline, one half for a split): its decode rows first (a mixed batch's decode tokens), then its
prefill *segments*, each saying which sequence a run of rows belongs to and where, so attention
of a chunk that continues a sequence sees the earlier chunk's keys and values. Those live in the
batch's `KVBuffer`; a decode token's cached keys and values in the `DecodeCache`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from overlapbench.model.attention import ChunkPlan, decode_attention
from overlapbench.model.models import ModelShape
from overlapbench.model.schedule import Rows, SequenceParts
from overlapbench.model.weights import seeded_randn, stable_seed


@dataclass(frozen=True)
class Segment:
    """`length` query rows at `row` of a chunk: positions [start, start+length) of one sequence.

    Position p < start + length of the sequence has its key and value at row kv_row + p of the
    layer's KV buffer where an earlier chunk stored it: attention of this segment reads its
    prefix, positions [0, start), from there, and its own keys from the chunk.
    """

    row: int
    length: int
    start: int
    seq_len: int
    kv_row: int

    @property
    def continued(self) -> bool:
        """Whether a later chunk holds more of this sequence (so reads these keys and values)."""
        return self.start + self.length < self.seq_len


@dataclass
class DecodeCache:
    """The decode tokens' KV cache on one rank: per layer, keys and values of `tokens` sequences
    of `context` cached tokens each, [tokens, context + 1, kv_heads, head_dim] (one sequence per
    batch entry, as one query attends to it), with one slot past the context for the new token,
    which each step writes in place before attending over all context + 1 keys."""

    tokens: int
    context: int
    k: list[torch.Tensor]
    v: list[torch.Tensor]

    def attend(self, layer: int, rows: DecodeRows, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               out: torch.Tensor) -> torch.Tensor:
        """Store the rows' new keys and values in their slot, then one batched attention call of
        their queries over their caches, into `out` [rows, heads * head_dim]."""
        tokens = slice(rows.first, rows.first + rows.length)
        cache_k, cache_v = self.k[layer][tokens], self.v[layer][tokens]
        cache_k[:, self.context] = k
        cache_v[:, self.context] = v
        return decode_attention(q, cache_k, cache_v, out)

    def to(self, dtype: torch.dtype) -> DecodeCache:
        """A copy in `dtype` (the fp32 truth reads the very keys and values the bf16 cache holds)."""
        return DecodeCache(self.tokens, self.context, [t.to(dtype) for t in self.k], [t.to(dtype) for t in self.v])


def build_decode_cache(
    shape: ModelShape,
    num_layers: int,
    tp: int,
    rank: int | None,
    tokens: int,
    context: int,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
) -> DecodeCache:
    """Rank `rank`'s KV-head shard of the cache (`rank=None`: all shards joined, for the reference),
    seeded per (layer, shard) as the weights are, so both see the same keys and values.

    Memory per layer and rank: 2 x tokens x (context + 1) x kv_heads / tp x head_dim elements
    (512 tokens at 4096 context, 4 kv heads of 128 in bf16: 1 GiB each for K and V)."""
    shards = range(tp) if rank is None else [rank]
    heads = shape.kv_heads // tp

    def make(layer: int, name: str) -> torch.Tensor:
        parts = [
            seeded_randn((tokens, context + 1, heads, shape.head_dim), stable_seed(seed, layer, name, s), device, 1.0).to(dtype)
            for s in shards
        ]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)

    layers = range(num_layers)
    return DecodeCache(tokens, context, [make(i, "cache_k") for i in layers], [make(i, "cache_v") for i in layers])


@dataclass(frozen=True)
class DecodeRows:
    """`length` rows at the front of a chunk: decode tokens [first, first + length) of the batch,
    each the next token (position `context`) of its own sequence, whose keys and values are in
    `cache`."""

    length: int
    first: int
    cache: DecodeCache = field(compare=False, repr=False)

    @property
    def context(self) -> int:
        return self.cache.context


@dataclass
class Chunk:
    """Rows [begin, end) of the stack's token layout, with their sequences and positions: the
    decode rows first (if any), then the prefill segments."""

    begin: int
    end: int
    segments: tuple[Segment, ...]
    positions: torch.Tensor  # [rows] position of each row in its sequence
    attention: ChunkPlan  # its prefill rows' attention geometry, planned once (overlapbench/model/attention.py)
    decode: DecodeRows | None = None

    @property
    def rows(self) -> slice:
        return slice(self.begin, self.end)

    @property
    def size(self) -> int:
        return self.end - self.begin


def sequence_starts(seq_lens: tuple[int, ...], offset: int = 0) -> list[int]:
    starts, total = [], offset
    for n in seq_lens:
        starts.append(total)
        total += n
    return starts


def decode_tokens(decode: DecodeCache | None) -> int:
    return 0 if decode is None else decode.tokens


def make_chunk(
    seq_lens: tuple[int, ...],
    pieces: list[tuple[int, int, int]],
    begin: int,
    device,
    kv_rows: list[int] | None = None,
    decode: DecodeCache | None = None,
    decode_range: tuple[int, int] | None = None,
) -> Chunk:
    """A chunk beginning at layout row `begin`: decode tokens [lo, hi) of `decode` (`decode_range`;
    none when absent or empty), then `pieces` (sequence, start, end) of the prefill sequences, in order.

    `kv_rows[i]`: the KV-buffer row of sequence i's position 0. By default the buffer is in the
    batch's natural layout (decode tokens, then sequences back to back); a split whose first chunk
    holds every sequence's prefix (iso) passes that chunk's rows, so the prefixes lie back to back
    there and the second chunk's prefix attention is one ragged call.
    """
    kv_rows = sequence_starts(seq_lens, decode_tokens(decode)) if kv_rows is None else kv_rows
    rows_of_decode = None
    positions = []
    if decode is not None and decode_range is not None and decode_range[1] > decode_range[0]:
        lo, hi = decode_range
        rows_of_decode = DecodeRows(hi - lo, lo, decode)
        positions.append(torch.full((hi - lo,), decode.context, dtype=torch.long))
    first = 0 if rows_of_decode is None else rows_of_decode.length
    segments, row = [], first
    for seq, start, end in pieces:
        if end <= start:
            continue
        segments.append(Segment(row, end - start, start, seq_lens[seq], kv_rows[seq]))
        positions.append(torch.arange(start, end))
        row += end - start
    pos = torch.cat(positions) if positions else torch.empty(0, dtype=torch.long)
    segments = tuple(segments)
    plan = ChunkPlan.of(tuple(replace(s, row=s.row - first) for s in segments), row - first, device)
    return Chunk(begin, begin + row, segments, pos.to(device), plan, rows_of_decode)


def whole_batch(seq_lens: tuple[int, ...], device, decode: DecodeCache | None = None) -> Chunk:
    return token_range(seq_lens, 0, sum(seq_lens) + decode_tokens(decode), device, decode)


def token_range(seq_lens: tuple[int, ...], begin: int, end: int, device, decode: DecodeCache | None = None) -> Chunk:
    """The rows [begin, end) of the flattened batch (decode tokens first, then the sequences):
    cuts sequences, or the decode tokens, wherever the range does."""
    first = decode_tokens(decode)
    pieces = []
    for seq, (start, n) in enumerate(zip(sequence_starts(seq_lens, first), seq_lens)):
        lo, hi = max(begin, start), min(end, start + n)
        if lo < hi:
            pieces.append((seq, lo - start, hi - start))
    return make_chunk(seq_lens, pieces, begin, device, decode=decode, decode_range=(begin, min(end, first)))


def prefix_suffix(seq_lens: tuple[int, ...], prefix: list[int], device, decode: DecodeCache | None = None):
    """iso's layout: (chunk 1: the decode tokens (of `decode`, a DecodeCache, if given) and every sequence's
    first `prefix[i]` tokens, chunk 2: the rest, layout order).

    The layout puts the decode tokens and the prefixes first, then the suffixes; `order[j]` is
    the natural row of layout row j (None for one sequence: the layout is the natural one). The
    KV buffer follows chunk 1's prefix rows, so the prefixes lie back to back and chunk 2's
    prefix attention is one call.
    """
    d = decode_tokens(decode)
    kv_rows = sequence_starts(tuple(prefix))
    first = make_chunk(seq_lens, [(i, 0, c) for i, c in enumerate(prefix)], 0, device, kv_rows, decode, (0, d))
    second = make_chunk(seq_lens, [(i, c, n) for i, (c, n) in enumerate(zip(prefix, seq_lens))], first.end, device, kv_rows)
    order = None
    if len(seq_lens) > 1:
        starts = sequence_starts(seq_lens, d)
        rows = [torch.arange(d)] + [torch.arange(s, s + c) for s, c in zip(starts, prefix)]
        rows += [torch.arange(s + c, s + n) for s, c, n in zip(starts, prefix, seq_lens)]
        order = torch.cat(rows).to(device)
    return first, second, order


def layout(chunks: tuple[Rows | SequenceParts, ...], seq_lens: tuple[int, ...], device,
           decode: DecodeCache | None = None) -> tuple[tuple[Chunk, ...], torch.Tensor | None]:
    """A plan's chunks (model/schedule.py) as the rows the split runs, and the layout's order (None:
    the natural one): token_split's row ranges of the flattened batch, or iso's parts."""
    if isinstance(chunks[0], SequenceParts):
        first, second, order = prefix_suffix(seq_lens, list(chunks[0].prefixes), device, decode)
        return (first, second), order
    return tuple(token_range(seq_lens, c.begin, c.end, device, decode) for c in chunks), None


class KVBuffer:
    """Keys and values of the whole batch in its natural layout, for sequences split across chunks."""

    def __init__(self, tokens: int, kv_heads: int, head_dim: int, dtype, device) -> None:
        self.k = torch.empty(tokens, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)

    @classmethod
    def holding(cls, k: torch.Tensor, v: torch.Tensor) -> KVBuffer:
        """A buffer over keys and values already computed for the whole batch (natural layout)."""
        kv = cls.__new__(cls)
        kv.k, kv.v = k, v
        return kv

    def rows_of(self, chunk: Chunk) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Where a chunk's keys and values can be written straight into the buffer, as they are
        made: a chunk of one continued segment and no decode rows (token_split's first chunk of
        one sequence), whose rows are then a range of the buffer's; None otherwise (`store`)."""
        if chunk.decode is not None or len(chunk.segments) != 1 or not chunk.segments[0].continued:
            return None
        s = chunk.segments[0]
        rows = slice(s.kv_row + s.start, s.kv_row + s.start + s.length)
        return self.k[rows], self.v[rows]

    def store(self, chunk: Chunk, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep the keys and values that a later chunk reads: those of continued segments."""
        for s in chunk.segments:
            if s.continued:
                rows = slice(s.kv_row + s.start, s.kv_row + s.start + s.length)
                self.k[rows] = k[s.row : s.row + s.length]
                self.v[rows] = v[s.row : s.row + s.length]


def rope_positions(seq_lens: tuple[int, ...], decode: DecodeCache | tuple[int, int] | None) -> int:
    """Positions the RoPE table must cover: the longest sequence's, and a decode token's (its context)."""
    context = decode[1] if isinstance(decode, tuple) else (decode.context if decode is not None else -1)
    return max(max(seq_lens, default=1), context + 1)
