"""Floating-point operations of one decoder layer on one TP rank: what a layer row's `flops` counts.

Counted (a multiply-add is 2 FLOPs), per layer and rank, for T tokens (prefill plus decode) of a
shape sharded over `tp` ranks (heads, kv_heads and the MLP width divided by tp):

  GEMMs      QKV     2 T hidden (heads + 2 kv_heads) head_dim / tp
             O       2 T (heads head_dim / tp) hidden
             MLP     dense: 2 T hidden (2 ffn / tp) + 2 T (ffn / tp) hidden
                     MoE: top_k times that at expert_ffn (the routed experts each token runs),
                     plus the router 2 T hidden experts, replicated on every rank
  attention  4 head_dim (heads / tp) per (query, key) pair that is computed (QK^T and PV):
             a prefill query at position p attends p + 1 keys (the causal half, diagonal in),
             so a sequence of S rows has S (S + 1) / 2 pairs; a decode token attends its
             context + 1 keys

Not counted: norms, RoPE, SwiGLU, softmax, residual adds (elementwise, memory-bound). A row's
`tflops` is flops / ms; `peak_frac` is that over the device's dense bf16 peak (overlapbench/timing/peak.py).
The count is the batch's, whatever the strategy: a split's chunks together compute exactly the
whole's pairs (`segment_pairs` of the pieces add up to the sequence's). Imports no torch.
"""

from __future__ import annotations

from overlapbench.model.models import ModelShape


def segment_pairs(start: int, length: int) -> int:
    """(query, key) pairs of the causal rows at positions [start, start + length) of a sequence:
    sum of (p + 1) over those positions (its prefix's keys and its own, causally)."""
    return length * start + length * (length + 1) // 2


def attention_pairs(batch: tuple[int, ...], decode: tuple[int, int] | None = None) -> int:
    """Pairs of a batch of whole prefill sequences and `decode` (tokens, context) decode tokens."""
    prefill = sum(segment_pairs(0, n) for n in batch)
    return prefill + (0 if decode is None else decode[0] * (decode[1] + 1))


def attention_flops(shape: ModelShape, tp: int, pairs: int) -> int:
    return 4 * shape.head_dim * (shape.heads // tp) * pairs


def gemm_flops(shape: ModelShape, tp: int, tokens: int) -> int:
    """The layer's GEMMs (and a MoE router) on `tokens` rows, one rank's shard."""
    q, kv = shape.heads // tp * shape.head_dim, shape.kv_heads // tp * shape.head_dim
    attention = 2 * tokens * shape.hidden * (q + 2 * kv) + 2 * tokens * q * shape.hidden
    width = shape.mlp_width // tp
    mlp = 2 * tokens * shape.hidden * 2 * width + 2 * tokens * width * shape.hidden
    if shape.moe:
        mlp = shape.top_k * mlp + 2 * tokens * shape.hidden * shape.experts
    return attention + mlp


def layer_flops(shape: ModelShape, tp: int, batch: tuple[int, ...], decode: tuple[int, int] | None = None) -> int:
    """One layer on one rank: GEMMs on every token, attention of the prefill sequences and the
    decode tokens."""
    tokens = sum(batch) + (0 if decode is None else decode[0])
    return gemm_flops(shape, tp, tokens) + attention_flops(shape, tp, attention_pairs(batch, decode))


def tflops(flops: int, ms: float) -> float:
    """FLOPs done in `ms` milliseconds, in TFLOP/s."""
    return flops / ms / 1e9


def row_fields(shape: ModelShape, tp: int, batch: tuple[int, ...], decode, ms: float | None, peak) -> dict:
    """A layer row's compute figures: `flops` (per layer and rank), `tflops` (null without a
    time), `peak_frac` (tflops / peak_tflops) and the peak: `peak_tflops`, `peak_source`,
    `burst_tflops`, `sustained_tflops` (overlapbench/timing/peak.py; null on CPU). `decode`: None or a
    mixed batch's decode tokens (`tokens`, `context`); `peak`: None or a peak.Peak."""
    flops = layer_flops(shape, tp, batch, None if decode is None else (decode.tokens, decode.context))
    achieved = tflops(flops, ms) if ms else None
    frac = achieved / peak.tflops if achieved is not None and peak is not None else None
    known = {} if peak is None else {"peak_tflops": peak.tflops, "peak_source": peak.source,
                                      "burst_tflops": peak.burst_tflops, "sustained_tflops": peak.sustained_tflops}
    return {"flops": flops, "tflops": achieved, "peak_frac": None if frac is None else round(frac, 4),
            "peak_tflops": None, "peak_source": None, "burst_tflops": None, "sustained_tflops": None} | known
