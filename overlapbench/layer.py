"""The workload: a stack of Llama-style pre-norm decoder layers, sharded Megatron style.

Every strategy runs the same arithmetic from this module; strategies only decide which rows are
computed when, on which stream, and how the row-parallel partial sums are reduced. A *chunk* is a
contiguous range of rows of the stack's token layout (all of them for the baseline, one half for a
split); its *segments* say which sequence each run of rows belongs to, so attention of a chunk
that continues a sequence sees the earlier chunk's keys and values.

Long because the layer's weights, batches and forward (attention and MLP blocks, the stack's
forward and its reference) are kept in one file that reads as one forward pass, as gpt-fast keeps
its model. The elementwise arithmetic lives beside it, each piece with its GPU kernel and its
torch oracle: `norms` (RMSNorm, residual add + RMSNorm), `rope` (q/k norms, RoPE), `activation`
(SwiGLU); the names are imported here for the modules that take them from the layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from overlapbench.activation import swiglu
from overlapbench.attention import ChunkPlan, causal_attention, decode_attention
from overlapbench.models import ModelShape
from overlapbench.moe import moe_partial
from overlapbench.norms import add_rms_norm, rms_norm
from overlapbench.rope import RopeTable
from overlapbench.rope import rope_qkv as rope_rows

# ---------------------------------------------------------------------------------------------
# Weights


@dataclass
class LayerWeights:
    """One layer's weights on one rank, nn.Linear layout ([out, in])."""

    attn_norm: torch.Tensor  # [hidden]
    wqkv: torch.Tensor  # [(heads + 2 kv_heads) / tp * head_dim, hidden]: this rank's q | k | v
    bqkv: torch.Tensor | None  # [(heads + 2 kv_heads) / tp * head_dim]: its bias (shape.qkv_bias), else None
    q_norm: torch.Tensor | None  # [head_dim], replicated: Qwen3's per-head q RMSNorm (shape.qk_norm), else None
    k_norm: torch.Tensor | None  # [head_dim], replicated: the same for k
    wo: torch.Tensor  # [hidden, heads / tp * head_dim]
    mlp_norm: torch.Tensor  # [hidden]
    w_gate_up: torch.Tensor  # [2 ffn / tp, hidden]: this rank's gate | up (MoE: [experts, 2 expert_ffn / tp, hidden])
    w_down: torch.Tensor  # [hidden, ffn / tp] (MoE: [experts, hidden, expert_ffn / tp])
    router: torch.Tensor | None = None  # MoE: [experts, hidden], the same on every rank


@dataclass
class Stack:
    """A rank's shard of the layer stack (tp=1: the whole, unsharded stack)."""

    shape: ModelShape
    tp: int
    layers: list[LayerWeights]
    final_norm: torch.Tensor

    @property
    def heads(self) -> int:
        return self.shape.heads // self.tp

    @property
    def kv_heads(self) -> int:
        return self.shape.kv_heads // self.tp

    @property
    def device(self) -> torch.device:
        return self.final_norm.device

    @property
    def dtype(self) -> torch.dtype:
        return self.final_norm.dtype

    def norm_after(self, layer: int) -> torch.Tensor:
        """The norm applied to the residual leaving `layer`: the next layer's, or the final one."""
        return self.layers[layer + 1].attn_norm if layer + 1 < len(self.layers) else self.final_norm


def seeded_randn(shape: tuple[int, ...], seed: int, device: torch.device, scale: float) -> torch.Tensor:
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=generator, device=device, dtype=torch.float32) * scale


def stable_seed(seed: int, layer: int, name: str, shard: int) -> int:
    """A stable per-(layer, weight, shard) seed, so shards can be made independently."""
    code = sum((i + 1) * ord(c) for i, c in enumerate(name))
    return (seed * 1_000_003 + layer * 10_007 + code * 101 + shard) % (2**62)


def _shard(shape: ModelShape, tp: int, layer: int, shard: int, seed: int, num_layers: int, device) -> dict:
    """Shard `shard` of `tp` of one layer's weights, in fp32.

    Weights are N(0, 1/fan_in); the output projections (O, down) are scaled down by
    sqrt(2 * num_layers) as in Megatron's and GPT-2's initialization, so each block adds a
    small update to a residual stream that dominates, as in trained models. (With unscaled
    outputs, bf16 rounding differences between two correct schedules compound to ~1e-2.)
    """
    h, d = shape.hidden, shape.head_dim
    q, kv, f = shape.heads // tp * d, shape.kv_heads // tp * d, shape.mlp_width // tp
    out_scale = (2 * num_layers) ** -0.5

    def make(name: str, rows: int, cols: int, scale: float = 1.0, base: int = seed) -> torch.Tensor:
        return seeded_randn((rows, cols), stable_seed(base, layer, name, shard), device, scale * cols**-0.5)

    biases = {}
    if shape.qkv_bias:  # N(0, 0.5^2) against q, k, v of unit scale: a bias that matters, as Qwen2's do
        for name, rows in (("bq", q), ("bk", kv), ("bv", kv)):
            biases[name] = seeded_randn((rows,), stable_seed(seed, layer, name, shard), device, 0.5)
    weights = {"wq": make("wq", q, h), "wk": make("wk", kv, h), "wv": make("wv", kv, h), **biases,
               "wo": make("wo", h, q, out_scale)}
    if not shape.moe:
        return weights | {"gate": make("gate", f, h), "up": make("up", f, h), "down": make("down", h, f, out_scale)}
    # Expert e's shard is seeded from (layer, e, shard): shards are made independently, as above.
    bases = [stable_seed(seed, layer, "expert", e) for e in range(shape.experts)]
    return weights | {
        "gate": torch.stack([make("gate", f, h, base=b) for b in bases]),
        "up": torch.stack([make("up", f, h, base=b) for b in bases]),
        "down": torch.stack([make("down", h, f, out_scale, base=b) for b in bases]),
    }


def _norm_weight(hidden: int, seed: int, layer: int, name: str, device) -> torch.Tensor:
    return 1.0 + seeded_randn((hidden,), stable_seed(seed, layer, name, 0), device, 0.1)


def _layer(shape: ModelShape, tp: int, layer: int, shards, seed: int, num_layers: int, device) -> LayerWeights:
    """One layer's weights: the given shards joined along their sharded dimension."""
    parts = [_shard(shape, tp, layer, s, seed, num_layers, device) for s in shards]

    def cat(name: str, dim: int = 0) -> torch.Tensor:
        return torch.cat([p[name] for p in parts], dim=dim)

    e = 1 if shape.moe else 0  # MoE: [experts, ...], every dimension one further
    return LayerWeights(
        attn_norm=_norm_weight(shape.hidden, seed, layer, "attn_norm", device),
        wqkv=torch.cat([cat("wq"), cat("wk"), cat("wv")]),
        bqkv=torch.cat([cat("bq"), cat("bk"), cat("bv")]) if shape.qkv_bias else None,
        q_norm=_norm_weight(shape.head_dim, seed, layer, "q_norm", device) if shape.qk_norm else None,
        k_norm=_norm_weight(shape.head_dim, seed, layer, "k_norm", device) if shape.qk_norm else None,
        wo=cat("wo", dim=1),
        mlp_norm=_norm_weight(shape.hidden, seed, layer, "mlp_norm", device),
        w_gate_up=torch.cat([cat("gate", e), cat("up", e)], dim=e),
        w_down=cat("down", dim=1 + e),
        router=_router(shape, seed, layer, device) if shape.moe else None,
    )


def _router(shape: ModelShape, seed: int, layer: int, device) -> torch.Tensor:
    """The MoE router [experts, hidden]: one seed for all ranks (it is replicated, not sharded).
    N(0, 1/hidden) like the other weights: logits of about unit spread, a soft top-k."""
    return seeded_randn((shape.experts, shape.hidden), stable_seed(seed, layer, "router", 0), device, shape.hidden**-0.5)


def build_stack(
    shape: ModelShape,
    num_layers: int,
    tp: int,
    rank: int | None,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
) -> Stack:
    """Rank `rank`'s shard of the stack; `rank=None` builds the unsharded stack from all shards.

    The full stack is the concatenation of the tp shards, so the single-process reference and
    the sharded ranks compute the same function from the same seed.
    """
    shape.check_tp(tp)
    shards = range(tp) if rank is None else [rank]
    layers = [_layer(shape, tp, i, shards, seed, num_layers, device) for i in range(num_layers)]
    final = _norm_weight(shape.hidden, seed, num_layers, "final_norm", device)
    stack = Stack(shape, 1 if rank is None else tp, layers, final)
    for w in stack.layers:
        for name, t in vars(w).items():
            if t is not None:  # absent attention details (no QKV bias, no q/k norms)
                setattr(w, name, t.to(dtype).contiguous())
    stack.final_norm = final.to(dtype)
    return stack


def cast(stack: Stack, dtype: torch.dtype) -> Stack:
    """A copy of the stack with every weight in `dtype`: the fp32 truth of a bf16 stack computes
    with the very weights the bf16 one rounded to."""

    def convert(value):
        return value.to(dtype) if isinstance(value, torch.Tensor) else value

    layers = [replace(w, **{name: convert(v) for name, v in vars(w).items()}) for w in stack.layers]
    return Stack(stack.shape, stack.tp, layers, convert(stack.final_norm))


def random_input(tokens: int, hidden: int, seed: int, dtype, device) -> torch.Tensor:
    """The stack's input hidden states: the same on every rank for the same seed and tokens."""
    return seeded_randn((tokens, hidden), stable_seed(seed, tokens, "input", 0), device, 1.0).to(dtype)


# ---------------------------------------------------------------------------------------------
# Batches, chunks and segments


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
    attention: ChunkPlan  # its prefill rows' attention geometry, planned once (overlapbench/attention.py)
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


# ---------------------------------------------------------------------------------------------
# Arithmetic


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


def qkv_projection(w: LayerWeights, normed: torch.Tensor) -> torch.Tensor:
    """normed @ Wqkv^T, plus the QKV bias where the layer has one (in the GEMM, as engines do)."""
    return normed @ w.wqkv.t() if w.bqkv is None else torch.addmm(w.bqkv, normed, w.wqkv.t())


def rope_qkv(
    stack: Stack, w: LayerWeights, qkv: torch.Tensor, positions: torch.Tensor, rope: RopeTable, add_bias: bool = False,
    kv_out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of the QKV projection -> q [rows, heads, head_dim], k and v [rows, kv_heads, head_dim]:
    the layer's QKV bias added here with `add_bias` (for a GEMM that took none), its per-head
    q/k RMSNorms where it has them (Qwen3), then RoPE on q and k (overlapbench/rope.py); k and v
    written into `kv_out` where given (a KV buffer's rows: the store in the same pass)."""
    return rope_rows(qkv, positions, rope, stack.heads, stack.kv_heads, stack.shape.head_dim, stack.shape.eps,
                     w.bqkv if add_bias else None, w.q_norm, w.k_norm, kv_out)


def attend(
    stack: Stack,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    chunk: Chunk,
    kv: KVBuffer | None,
    out: torch.Tensor | None = None,
    layer: int | None = None,
) -> torch.Tensor:
    """Causal attention of a chunk's rows over their sequences -> [rows, heads * head_dim].

    Segments that continue a sequence read its earlier keys and values from `kv`; every
    segment's own keys are the chunk's k and v (overlapbench/attention.py). Decode rows write
    their keys and values into layer `layer`'s KV cache and attend over it, in one call.
    """
    kv_k, kv_v = (None, None) if kv is None else (kv.k, kv.v)
    if chunk.decode is None:
        return causal_attention(chunk.attention, q, k, v, kv_k, kv_v, out)
    if layer is None:
        raise ValueError("attend: a chunk with decode rows needs its layer (for that layer's KV cache)")
    n = chunk.decode.length
    if out is None:
        out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
    chunk.decode.cache.attend(layer, chunk.decode, q[:n], k[:n], v[:n], out[:n])
    causal_attention(chunk.attention, q[n:], k[n:], v[n:], kv_k, kv_v, out[n:])
    return out


def attention_partial(
    stack: Stack,
    layer: int,
    normed: torch.Tensor,
    chunk: Chunk,
    rope: RopeTable,
    kv: KVBuffer | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """QKV (+ bias) -> q/k norms -> RoPE -> causal attention -> O-proj of one chunk: this
    rank's partial sum."""
    w = stack.layers[layer]
    into = None if kv is None else kv.rows_of(chunk)
    q, k, v = rope_qkv(stack, w, qkv_projection(w, normed), chunk.positions, rope, kv_out=into)
    if kv is not None and into is None:
        kv.store(chunk, k, v)
    return torch.matmul(attend(stack, q, k, v, chunk, kv, layer=layer), w.wo.t(), out=out)


def mlp_partial(
    stack: Stack, layer: int, normed: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """gate/up -> SiLU * up -> down of one chunk: this rank's partial sum (a MoE layer: router,
    then every token's experts, overlapbench/moe.py)."""
    w = stack.layers[layer]
    if w.router is not None:
        return moe_partial(normed, w.router, w.w_gate_up, w.w_down, stack.shape.top_k, out)
    return torch.matmul(swiglu(normed @ w.w_gate_up.t()), w.w_down.t(), out=out)


# ---------------------------------------------------------------------------------------------
# The unsplit stack forward, with a pluggable reduction


class Reducer(Protocol):
    """Turns a chunk's row-parallel partial sum into the next normed input.

    `out_buffer` says where the GEMM should write the partial (a symmetric-memory buffer, say),
    None to let it allocate. The call sums the partial over ranks, adds it into `residual` (the
    chunk's rows, in place) and returns rmsnorm(residual) * weight for those rows, the same on
    every rank.

    The residual may stay token-sharded (TokenWeave's contract): a reducer may read and update
    only the rows of `residual` that this rank owns, the same rows in every call on the same
    chunk, and leave the others stale. So the forwards never read `residual` except through a
    reducer; only the normed output (complete on every rank) leaves a forward.
    """

    def out_buffer(self, chunk: Chunk) -> torch.Tensor | None: ...

    def __call__(
        self,
        partial: torch.Tensor,
        chunk: Chunk,
        residual: torch.Tensor,
        weight: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


@dataclass
class LocalReducer:
    """A reduction through `all_reduce` (in place on the partial), then the fused add + norm.

    Without `all_reduce`: the single-process reference, and the no_comm bound.
    """

    eps: float
    all_reduce: Callable[[torch.Tensor], object] | None = None

    def out_buffer(self, chunk: Chunk) -> torch.Tensor | None:
        return None

    def __call__(self, partial, chunk, residual, weight, out=None):
        if self.all_reduce is not None:
            self.all_reduce(partial)
        return add_rms_norm(partial, residual, weight, self.eps, out)


def forward_stack(
    stack: Stack, x: torch.Tensor, chunk: Chunk, rope: RopeTable, reduce: Reducer
) -> torch.Tensor:
    """The plain TP forward: compute, reduce, add + norm, layer after layer; returns the final
    normed hidden states."""
    residual = x.clone()
    normed = rms_norm(residual, stack.layers[0].attn_norm, stack.shape.eps)
    for i in range(len(stack.layers)):
        partial = attention_partial(stack, i, normed, chunk, rope, None, reduce.out_buffer(chunk))
        normed = reduce(partial, chunk, residual, stack.layers[i].mlp_norm)
        partial = mlp_partial(stack, i, normed, reduce.out_buffer(chunk))
        normed = reduce(partial, chunk, residual, stack.norm_after(i))
    return normed


def reference_forward(
    shape: ModelShape,
    num_layers: int,
    tp: int,
    seq_lens: tuple[int, ...],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    decode: tuple[int, int] | None = None,
) -> torch.Tensor:
    """The unsharded stack on one process: what every TP strategy must reproduce. `decode`:
    (tokens, context) of a mixed batch's decode tokens, with their KV cache."""
    device = torch.device(device)
    stack = build_stack(shape, num_layers, tp, None, dtype, device, seed)
    cache = None if decode is None else build_decode_cache(shape, num_layers, tp, None, *decode, dtype, device, seed)
    x = random_input(sum(seq_lens) + decode_tokens(cache), shape.hidden, seed, dtype, device)
    rope = RopeTable(shape, rope_positions(seq_lens, cache), device)
    return forward_stack(stack, x, whole_batch(seq_lens, device, cache), rope, LocalReducer(shape.eps))


def rope_positions(seq_lens: tuple[int, ...], decode: DecodeCache | tuple[int, int] | None) -> int:
    """Positions the RoPE table must cover: the longest sequence's, and a decode token's (its context)."""
    context = decode[1] if isinstance(decode, tuple) else (decode.context if decode is not None else -1)
    return max(max(seq_lens, default=1), context + 1)
