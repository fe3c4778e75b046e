"""The layer's arithmetic: a stack of Llama-style pre-norm decoder layers, sharded Megatron style.

Every strategy runs the same arithmetic from this module; strategies only decide which rows are
computed when (`chunks`), on which stream, and how the row-parallel partial sums are reduced (a
`Reducer`). The weights are `weights.py`'s; the elementwise pieces live beside, each with its GPU
kernel and its torch oracle: `norms` (RMSNorm, residual add + RMSNorm), `rope` (q/k norms, RoPE),
`activation` (SwiGLU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from overlapbench.model.activation import swiglu
from overlapbench.model.attention import causal_attention
from overlapbench.model.chunks import Chunk, KVBuffer, build_decode_cache, decode_tokens, rope_positions, whole_batch
from overlapbench.model.models import ModelShape
from overlapbench.model.moe import moe_partial
from overlapbench.model.norms import add_rms_norm, rms_norm
from overlapbench.model.rope import RopeTable
from overlapbench.model.rope import rope_qkv as rope_rows
from overlapbench.model.schedule import ATTENTION, COMPUTE, Task, serial
from overlapbench.model.weights import LayerWeights, Stack, build_stack, random_input


def qkv_projection(w: LayerWeights, normed: torch.Tensor) -> torch.Tensor:
    """normed @ Wqkv^T, plus the QKV bias where the layer has one (in the GEMM, as engines do)."""
    return normed @ w.wqkv.t() if w.bqkv is None else torch.addmm(w.bqkv, normed, w.wqkv.t())


def rope_qkv(
    stack: Stack, w: LayerWeights, qkv: torch.Tensor, positions: torch.Tensor, rope: RopeTable, add_bias: bool = False,
    kv_out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of the QKV projection -> q [rows, heads, head_dim], k and v [rows, kv_heads, head_dim]:
    the layer's QKV bias added here with `add_bias` (for a GEMM that took none), its per-head
    q/k RMSNorms where it has them (Qwen3), then RoPE on q and k (overlapbench/model/rope.py); k and v
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
    segment's own keys are the chunk's k and v (overlapbench/model/attention.py). Decode rows write
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
    after_first_gemm: Callable[[], None] | None = None,
) -> torch.Tensor:
    """QKV (+ bias) -> q/k norms -> RoPE -> causal attention -> O-proj of one chunk: this
    rank's partial sum. `after_first_gemm` is called once the QKV GEMM is issued."""
    w = stack.layers[layer]
    into = None if kv is None else kv.rows_of(chunk)
    qkv = qkv_projection(w, normed)
    if after_first_gemm is not None:
        after_first_gemm()
    q, k, v = rope_qkv(stack, w, qkv, chunk.positions, rope, kv_out=into)
    if kv is not None and into is None:
        kv.store(chunk, k, v)
    return torch.matmul(attend(stack, q, k, v, chunk, kv, layer=layer), w.wo.t(), out=out)


def mlp_partial(
    stack: Stack, layer: int, normed: torch.Tensor, out: torch.Tensor | None = None,
    after_first_gemm: Callable[[], None] | None = None,
) -> torch.Tensor:
    """gate/up -> SiLU * up -> down of one chunk: this rank's partial sum (a MoE layer: router,
    then every token's experts, overlapbench/model/moe.py). `after_first_gemm` is called once the
    gate/up GEMM is issued (a MoE layer's: before its router, which runs no GEMM of the chunk's size)."""
    w = stack.layers[layer]
    if w.router is not None:
        if after_first_gemm is not None:
            after_first_gemm()
        return moe_partial(normed, w.router, w.w_gate_up, w.w_down, stack.shape.top_k, out)
    gate_up = normed @ w.w_gate_up.t()
    if after_first_gemm is not None:
        after_first_gemm()
    return torch.matmul(swiglu(gate_up), w.w_down.t(), out=out)


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


@runtime_checkable
class DeferredReducer(Reducer, Protocol):
    """A Reducer whose work a split forward (overlap/split.py) issues in two halves on its two
    lanes: `transfer` on the side lane (the communication only: no SM kernel beside the compute
    but barriers), `finish` on the main lane just before the chunk's next compute needs its rows
    (the add into `residual` and the norm into `out`, at full width). The call does both, one
    after the other, on the current stream.

    Between a chunk's `transfer` and its `finish` nothing may write its partial or run another
    transfer of its rows; the split's schedule keeps that (the chunk's next compute comes between).
    """

    def transfer(self, partial: torch.Tensor, chunk: Chunk) -> None: ...

    def finish(self, chunk: Chunk, residual: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor: ...


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


def compute_block(
    stack: Stack, task: Task, normed: torch.Tensor, chunk: Chunk, rope: RopeTable, kv: KVBuffer | None,
    out: torch.Tensor | None = None, after_first_gemm: Callable[[], None] | None = None,
) -> torch.Tensor:
    """A compute task of a schedule (model/schedule.py): its block's partial sum of the chunk;
    `after_first_gemm` is called once the block's first GEMM is issued (QKV, gate/up)."""
    if task.block == ATTENTION:
        return attention_partial(stack, task.layer, normed, chunk, rope, kv, out, after_first_gemm)
    return mlp_partial(stack, task.layer, normed, out, after_first_gemm)


def norm_weight(stack: Stack, task: Task) -> torch.Tensor:
    """The RMSNorm weight a reduce task normalizes with: the MLP's after attention, the next
    layer's attention norm (the final norm after the last layer) after the MLP."""
    return stack.layers[task.layer].mlp_norm if task.block == ATTENTION else stack.norm_after(task.layer)


def forward_stack(
    stack: Stack, x: torch.Tensor, chunk: Chunk, rope: RopeTable, reduce: Reducer
) -> torch.Tensor:
    """The plain TP forward (schedule.serial): compute, reduce, add + norm, block after block, on
    one stream; returns the final normed hidden states."""
    residual = x.clone()
    normed = rms_norm(residual, stack.layers[0].attn_norm, stack.shape.eps)
    for task in serial(len(stack.layers)):
        if task.work == COMPUTE:
            partial = compute_block(stack, task, normed, chunk, rope, None, reduce.out_buffer(chunk))
        else:
            normed = reduce(partial, chunk, residual, norm_weight(stack, task))
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
