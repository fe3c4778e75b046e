"""The sequence-parallel (SP) variant of the stack, written once for every SP strategy.

Between blocks each rank holds only its shard of the token rows (sp_schedule.ShardLayout:
contiguous blocks, the last padded with zero rows). Each block is

    all-gather(normed shard) -> column-parallel GEMM -> ... -> row-parallel GEMM -> reduce-scatter

followed by the residual add and RMSNorm on the shard. The arithmetic is layer.py's; the
strategies differ only in the `Exchange`: how a block's all-gather feeds its first GEMM and
how its last GEMM feeds the reduce-scatter (blocking collectives, PyTorch's fused async-TP
ops, or Flash-Overlap's rank-ordered point-to-point decomposition).

A MoE layer's MLP block has no single GEMM to fuse a collective into (its experts are grouped
GEMMs over the tokens each expert drew, after a router), so it runs all-gather -> router +
experts -> reduce-scatter through the Exchange's `gather` and `scatter`; the attention block
keeps its fused exchange. Routing is per token, so an Exchange that scatters piece by piece
(flash_agrs) computes the experts of one piece while the previous piece is pushed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist

from overlapbench.distributed import nccl_windows
from overlapbench.distributed.nccl_windows import NcclWindow
from overlapbench.model.activation import swiglu
from overlapbench.model.chunks import KVBuffer, token_range, whole_batch
from overlapbench.model.layer import attend, rope_qkv
from overlapbench.model.moe import moe_partial
from overlapbench.model.norms import add_rms_norm, rms_norm
from overlapbench.overlap.sp_schedule import ATTENTION_MODES, ShardLayout
from overlapbench.timing.step import BuildContext, Step

ATTENTION, MLP = 0, 1  # the two blocks of a layer; an Exchange may keep separate buffers for each

RowSource = Callable[[int, int], torch.Tensor]  # (lo, hi) -> the GEMM input's rows [lo, hi)

# torch 2.13 renamed the single-tensor collectives (the old names warn on every call); older
# torch has only the old names.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Exchange(Protocol):
    """A block's all-gather -> GEMM and GEMM -> reduce-scatter along the token rows.

    Weights are in nn.Linear layout ([out, in]); tensors span the padded layout.
    """

    layout: ShardLayout

    def shard_buffer(self, block: int) -> torch.Tensor | None:
        """Where the block's input shard should be written (its gather reads it there), or None."""

    def gather_matmul(self, block: int, shard: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """all_gather(shard) @ weight.T: [padded, out]."""

    def scatter_rows(self) -> list[tuple[int, int]]:
        """The row ranges `matmul_scatter` asks its source for, so callers can prepare them."""

    def matmul_scatter(self, block: int, rows: RowSource, weight: torch.Tensor) -> torch.Tensor:
        """reduce_scatter(A @ weight.T) over ranks, this rank's shard: [shard, out]. A's rows
        come from `rows(lo, hi)`, asked for in the ranges of `scatter_rows()`, in that order."""

    def gather(self, block: int, shard: torch.Tensor) -> torch.Tensor:
        """all_gather(shard) alone (a MoE block's input): [padded, width]."""

    def scatter(self, block: int, rows: RowSource) -> torch.Tensor:
        """reduce_scatter of the partial sums `rows(lo, hi)` gives, asked for in the ranges of
        `scatter_rows()`, in that order (a MoE block's output): [shard, width]."""

    def fence(self) -> None:
        """Order this rank's next writes into shared buffers after every peer's reads of them.
        The layer needs none (its two blocks alternate buffers, each guarded by the other's
        synchronization); a call that reuses one block's buffers back to back does."""


def gather_rows(shard: torch.Tensor, layout: ShardLayout, group=None) -> torch.Tensor:
    """Every rank's shard, concatenated and cut to the real rows: [tokens, width]."""
    full = shard.new_empty(layout.padded, shard.shape[1])
    all_gather_single(full, shard.contiguous(), group=group)
    return full[: layout.tokens]


class SequenceParallelForward:
    """The stack forward with token-sharded activations between blocks.

    `attention`: `whole` attends every row in one call, then the O-proj pieces run on its
    output; `per_piece` attends the query rows of each O-proj piece just before that piece's
    GEMM, so the attention of later pieces overlaps the earlier pieces' transfers. Pieces after
    the first start mid-sequence, so their causal mask is aligned lower-right: two calls of the
    whole-sequence kernel merged by their log-sum-exps (overlapbench/model/attention.py), one more
    call and a merge per piece; `whole` is the default (measured before that change).
    """

    def __init__(self, ctx: BuildContext, exchange: Exchange, attention: str = "whole") -> None:
        if attention not in ATTENTION_MODES:
            raise ValueError(f"unknown attention mode {attention!r}; expected one of {ATTENTION_MODES}")
        self.ctx, self.ex = ctx, exchange
        layout, stack, device = exchange.layout, ctx.stack, ctx.runtime.device
        self.layout, self.tokens = layout, layout.tokens
        self.own = layout.real_rows(ctx.runtime.rank)
        hidden, dtype = stack.shape.hidden, stack.dtype
        self.residual = torch.zeros(layout.shard, hidden, dtype=dtype, device=device)
        # Attention output of the padded layout: its padding rows stay zero, so the O-proj
        # sends zero partial sums for them.
        self.attn = torch.zeros(layout.padded, stack.heads * stack.shape.head_dim, dtype=dtype, device=device)
        self.positions = whole_batch(ctx.seq_lens, device, ctx.decode).positions
        # Query chunks of the rows attended at once, made now: not while capturing.
        self.attend_by_piece = attention == "per_piece"
        ranges = exchange.scatter_rows() if self.attend_by_piece else [(0, layout.padded)]
        self.query_chunks = {
            (lo, hi): token_range(ctx.seq_lens, lo, min(hi, self.tokens), device, ctx.decode)
            for lo, hi in ranges
            if lo < self.tokens
        }

    def _normed_into(self, block: int, normed: torch.Tensor) -> torch.Tensor:
        target = self.ex.shard_buffer(block)
        return normed if target is None else target.copy_(normed)

    def _attention(self, layer: int, normed: torch.Tensor) -> torch.Tensor:
        stack, w = self.ctx.stack, self.ctx.stack.layers[layer]
        qkv = self.ex.gather_matmul(ATTENTION, normed, w.wqkv)[: self.tokens]
        q, k, v = rope_qkv(stack, w, qkv, self.positions, self.ctx.rope, add_bias=True)  # the GEMM took no bias
        kv = KVBuffer.holding(k, v)

        def attend_rows(lo: int, hi: int) -> None:
            end = min(hi, self.tokens)
            if lo < end:
                chunk = self.query_chunks[(lo, hi)]
                attend(stack, q[lo:end], k[lo:end], v[lo:end], chunk, kv, out=self.attn[lo:end], layer=layer)

        def attended(lo: int, hi: int) -> torch.Tensor:
            if self.attend_by_piece:
                attend_rows(lo, hi)
            return self.attn[lo:hi]

        if not self.attend_by_piece:
            attend_rows(0, self.layout.padded)
        return self.ex.matmul_scatter(ATTENTION, attended, w.wo)

    def _mlp(self, layer: int, normed: torch.Tensor) -> torch.Tensor:
        w = self.ctx.stack.layers[layer]
        if w.router is not None:
            full, top_k = self.ex.gather(MLP, normed), self.ctx.stack.shape.top_k
            return self.ex.scatter(MLP, lambda lo, hi: moe_partial(full[lo:hi], w.router, w.w_gate_up, w.w_down, top_k))
        act = swiglu(self.ex.gather_matmul(MLP, normed, w.w_gate_up))
        return self.ex.matmul_scatter(MLP, lambda lo, hi: act[lo:hi], w.w_down)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: the full [tokens, hidden] input on every rank -> this rank's normed output shard."""
        stack, eps = self.ctx.stack, self.ctx.eps
        lo, hi = self.own
        self.residual[: hi - lo].copy_(x[lo:hi])  # the padding rows were zeroed once and stay so
        normed = self._normed_into(ATTENTION, rms_norm(self.residual, stack.layers[0].attn_norm, eps))
        for i, w in enumerate(stack.layers):
            partial = self._attention(i, normed)
            normed = add_rms_norm(partial, self.residual, w.mlp_norm, eps, self.ex.shard_buffer(MLP))
            partial = self._mlp(i, normed)
            normed = add_rms_norm(partial, self.residual, stack.norm_after(i), eps, self.ex.shard_buffer(ATTENTION))
        return normed


@dataclass
class CollectiveExchange:
    """sp_baseline: a blocking all-gather into one tensor, then one GEMM; one GEMM, then a
    blocking reduce-scatter (NCCL on GPUs, gloo on CPU)."""

    layout: ShardLayout
    group: dist.ProcessGroup | None = None  # None: the world

    def shard_buffer(self, block: int) -> None:
        return None

    def gather_matmul(self, block: int, shard: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.gather(block, shard) @ weight.t()

    def scatter_rows(self) -> list[tuple[int, int]]:
        return [(0, self.layout.padded)]

    def matmul_scatter(self, block: int, rows: RowSource, weight: torch.Tensor) -> torch.Tensor:
        return self.scatter(block, lambda lo, hi: rows(lo, hi) @ weight.t())

    def gather(self, block: int, shard: torch.Tensor) -> torch.Tensor:
        full = shard.new_empty(self.layout.padded, shard.shape[1])
        all_gather_single(full, shard, group=self.group)
        return full

    def scatter(self, block: int, rows: RowSource) -> torch.Tensor:
        partial = rows(0, self.layout.padded)
        out = partial.new_empty(self.layout.shard, partial.shape[1])
        reduce_scatter_single(out, partial, group=self.group)
        return out

    def fence(self) -> None:
        pass


@dataclass
class WindowExchange(CollectiveExchange):
    """sp_baseline with nccl_symm: the same blocking collectives, every buffer they touch in a
    registered NCCL window, so that NCCL runs its symmetric kernels: per block, the shard it
    gathers (the norm writes it there), the gathered rows, the GEMM's partial sums (the GEMM
    writes them there) and the scattered shard, each on a page of its own (window_regions)."""

    window: NcclWindow | None = None
    widths: tuple[int, int] = (0, 0)  # row widths of the gathered input and of the scattered output

    def __post_init__(self) -> None:
        views = window_regions(self.layout, self.widths, self.window.tensor.element_size())[0]
        self.regions = [[self.window.view(start, shape) for start, shape in block] for block in views]

    def shard_buffer(self, block: int) -> torch.Tensor | None:
        return self.regions[block][0] if self.widths[0] else None

    def gather(self, block: int, shard: torch.Tensor) -> torch.Tensor:
        source, full = self.regions[block][:2]
        if shard.data_ptr() != source.data_ptr():  # a shard written elsewhere (a MoE block's router input)
            source.copy_(shard)
        all_gather_single(full, source, group=self.group)
        return full

    def matmul_scatter(self, block: int, rows: RowSource, weight: torch.Tensor) -> torch.Tensor:
        torch.matmul(rows(0, self.layout.padded), weight.t(), out=self.regions[block][2])
        return self._reduce_scatter(block)

    def scatter(self, block: int, rows: RowSource) -> torch.Tensor:
        self.regions[block][2].copy_(rows(0, self.layout.padded))
        return self._reduce_scatter(block)

    def _reduce_scatter(self, block: int) -> torch.Tensor:
        partial, out = self.regions[block][2:]
        reduce_scatter_single(out, partial, group=self.group)
        return out


def window_regions(layout: ShardLayout, widths: tuple[int, int], element_size: int) -> tuple[list, int]:
    """(start, shape) of each block's regions in a WindowExchange's window (shard to gather,
    gathered rows, partial sums, scattered shard), and the elements the window must hold."""
    gather, scatter = widths
    shapes = [(layout.shard, gather), (layout.padded, gather), (layout.padded, scatter), (layout.shard, scatter)]
    starts, total = nccl_windows.layout([rows * width for rows, width in shapes] * 2, element_size)
    blocks = [list(zip(starts[4 * b : 4 * b + 4], shapes)) for b in (ATTENTION, MLP)]
    return blocks, total


def window_exchange(ctx, max_ctas) -> WindowExchange:
    """sp_baseline's exchange on a registered window of its group (nccl_max_ctas, exact), sized
    for the run's largest batch (this point's, where that does not fit in memory)."""
    gather_width, scatter_width, dtype = sp_io(ctx)
    widths, size = (gather_width, scatter_width), dtype.itemsize
    world = ctx.runtime.world_size
    most = window_regions(ShardLayout(max(ctx.max_tokens, ctx.tokens), world), widths, size)[1]
    layout = sp_layout(ctx)
    window = ctx.runtime.window(most, dtype, max_ctas, fallback=window_regions(layout, widths, size)[1])
    return WindowExchange(layout, window.group, window, widths)


@dataclass
class FusedExchange:
    """async_tp: PyTorch's symmetric-memory ops, which decompose the all-gather / reduce-scatter
    into copy-engine transfers pipelined with the GEMM's row blocks, one per rank."""

    layout: ShardLayout
    group_name: str
    ops: object = field(default_factory=lambda: torch.ops.symm_mem)  # (tests: PyTorch's reference versions)

    def shard_buffer(self, block: int) -> None:
        return None

    def gather_matmul(self, block: int, shard: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # return_A stays True: without it, PyTorch may take its NVLink-multicast path.
        _, (out,) = self.ops.fused_all_gather_matmul(shard, [weight.t()], 0, self.group_name, return_A=True)
        return out

    def scatter_rows(self) -> list[tuple[int, int]]:
        return [(0, self.layout.padded)]

    def matmul_scatter(self, block: int, rows: RowSource, weight: torch.Tensor) -> torch.Tensor:
        a = rows(0, self.layout.padded)
        return self.ops.fused_matmul_reduce_scatter(a, weight.t(), "sum", 0, self.group_name)

    # A MoE block has no GEMM for the fused ops: plain NCCL collectives on the world group
    # (the group `group_name` names, runtime.enable_symmetric_memory), nothing overlapped.
    def gather(self, block: int, shard: torch.Tensor) -> torch.Tensor:
        return CollectiveExchange(self.layout).gather(block, shard)

    def scatter(self, block: int, rows: RowSource) -> torch.Tensor:
        return CollectiveExchange(self.layout).scatter(block, rows)

    def fence(self) -> None:
        pass  # the fused ops synchronize their own workspace


def sp_layout(ctx) -> ShardLayout:
    """The token sharding of a point (the layer's tokens, or a micro workload's M)."""
    return ShardLayout(ctx.tokens, ctx.runtime.world_size)


def sp_io(ctx) -> tuple[int, int, torch.dtype]:
    """Row widths of the all-gathered input and the reduce-scattered output, and the dtype. A
    context other than the layer's (a micro workload's) states its own."""
    if not isinstance(ctx, BuildContext):
        return (*ctx.widths, ctx.dtype)
    hidden = ctx.stack.shape.hidden
    return hidden, hidden, ctx.stack.dtype


def sp_step(ctx, exchange: Exchange, attention: str = "whole") -> Step:
    """The step of an SP strategy: the layer stack, or the step a micro workload's context
    builds around the exchange (`attention`: see SequenceParallelForward)."""
    if not isinstance(ctx, BuildContext):
        return ctx.step(exchange)
    forward = SequenceParallelForward(ctx, exchange, attention)
    return Step(forward, lambda y: gather_rows(y, exchange.layout))
