"""Where to cut a batch so that its chunks cost the same FLOPs: the cost model behind
`split_ratio: balanced` of `iso` and `token_split`, counted as overlapbench/model/flops.py counts.

One rank's layer costs g per row (its GEMMs) plus a per (query, key) pair: a prefill row at
position p attends p + 1 keys, a decode row context + 1. Causal attention makes later rows of a
sequence dearer, so at long prompts an equal-token cut is far from an equal-FLOP one: at 32K
tokens of llama3-70b (TP=2) the second half's attention is 3x the first's. Imports no torch.
"""

from __future__ import annotations

from overlapbench.model import flops
from overlapbench.model.models import ModelShape


def layer_flops(shape: ModelShape, tp: int) -> tuple[int, int]:
    """(GEMM FLOPs per token, attention FLOPs per query-key pair) of one layer on one rank.
    A MoE layer's token runs its top_k experts' FFN shards and the (replicated) router."""
    return flops.gemm_flops(shape, tp, 1), flops.attention_flops(shape, tp, 1)


def balanced_ratio(shape: ModelShape, tp: int, seq_lens: tuple[int, ...], decode: tuple[int, int] = (0, 0)) -> float:
    """iso's cut: the fraction r of every prefill sequence that gives chunk 1 (the prefixes and the
    `decode` (tokens, context) decode tokens) the FLOPs of chunk 2 (the suffixes).

    A prefix of c tokens of a sequence of L costs  g*c + a*c^2/2,  its suffix
    g*(L-c) + a*(L^2-c^2)/2; r solves  sum over sequences of (prefix - suffix) + decode = 0  by
    bisection, where decode = d * (g + a * (context + 1)) for d decode tokens."""
    g, a = layer_flops(shape, tp)
    tokens, context = decode

    def imbalance(r: float) -> float:
        total = tokens * (g + a * (context + 1)) if tokens else 0.0
        for n in seq_lens:
            c = r * n
            total += (g * c + a * c * c / 2) - (g * (n - c) + a * (n * n - c * c) / 2)
        return total

    lo, hi = 0.0, 1.0  # imbalance rises with r: negative at 0, positive at 1
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if imbalance(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def leading_flops(shape: ModelShape, tp: int, seq_lens: tuple[int, ...], decode: tuple[int, int], rows: int) -> int:
    """FLOPs of the first `rows` rows of the flattened batch (the decode tokens, then the
    sequences back to back): what token_split's chunks before a cut at `rows` compute."""
    tokens, context = decode
    taken = min(rows, tokens)
    pairs, left = taken * (context + 1), rows - taken
    for n in seq_lens:
        if left <= 0:
            break
        pairs += flops.segment_pairs(0, min(left, n))
        left -= n
    g, a = layer_flops(shape, tp)
    return g * min(rows, tokens + sum(seq_lens)) + a * pairs


def balanced_rows(shape: ModelShape, tp: int, seq_lens: tuple[int, ...], decode: tuple[int, int], chunks: int) -> list[int]:
    """token_split's cuts: the `chunks - 1` row counts of the flattened batch at which its
    FLOPs come nearest to 1/chunks, 2/chunks, ... of the whole (unaligned; ties to the
    earlier row)."""
    total_rows = decode[0] + sum(seq_lens)
    whole = leading_flops(shape, tp, seq_lens, decode, total_rows)
    cuts = []
    for k in range(1, chunks):
        target = whole * k / chunks
        lo, hi = 0, total_rows  # the first row count whose FLOPs reach the target (they rise with rows)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if leading_flops(shape, tp, seq_lens, decode, mid) < target else (lo, mid)
        below = leading_flops(shape, tp, seq_lens, decode, lo - 1) if lo > 0 else None
        nearer_below = below is not None and target - below <= leading_flops(shape, tp, seq_lens, decode, lo) - target
        cuts.append(lo - 1 if nearer_below else lo)
    return cuts
