"""How a chunk's row-parallel partial sum becomes the next normed input (see layer.Reducer).

`nccl`: an NCCL (gloo on CPU) all-reduce in place, then the fused residual add + RMSNorm.
`nccl_symm`: the same on rows of a registered NCCL window (runtime.Runtime.window), which the
GEMMs write their partial sums into, so that NCCL runs its symmetric kernel on exactly the
budget's CTAs (its own choice at `default`).
`one_shot` / `two_shot` (baseline's `allreduce`): PyTorch's symmetric-memory all-reduce on rows
of a rendezvoused buffer the GEMMs write into, then the fused add + RMSNorm: the peer-memory
kernels engines run below their size limits.
`fused`: one few-CTA Triton kernel over symmetric memory that reduces, adds and normalizes
(comm_methods.fused_kernel: kernel v2's pull variant, kernels/allreduce_norm_pull.py; the
residual token-sharded);
the GEMM writes its partial straight into the symmetric buffer, so no copy is made.
`copy_engine`: the copy engines reduce-scatter and all-gather between symmetric buffers, a
local few-CTA kernel adds and normalizes the rank's own rows (kernels/copy_engine_norm.py, its
chunked pipeline: the chunk count by size, or the `ce_chunks` knob's, and who writes the rank's
own output rows, the `ce_out` knob's, passed with every call, so reducers of different settings
share the run's one buffer); the residual stays token-sharded (see layer.Reducer).
`copy_engine_pull`: a deferred reducer (layer.DeferredReducer): the copy engines pull every
peer's whole partial of the chunk's rows on the split's side lane, and one full-width add + norm
runs on its main lane before the rows' next compute (kernels/copy_engine_pull.py); the residual
is complete on every rank.

Which of them a `comm` knob value builds is its record's (comm_methods.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

from overlapbench.distributed import DEFAULT
from overlapbench.distributed.nccl_windows import NcclWindow
from overlapbench.distributed.runtime import SymmetricBuffer, symmetric_buffer
from overlapbench.errors import UserError
from overlapbench.model.chunks import Chunk
from overlapbench.model.layer import LocalReducer
from overlapbench.model.norms import add_rms_norm
from overlapbench.timing.step import BuildContext


def collective(ctx: BuildContext, nccl_max_ctas=DEFAULT, high_priority: bool = False, symm: bool = False) -> LocalReducer:
    """NCCL's all-reduce under a CTA budget, then the fused add + RMSNorm; `symm`: on rows of a
    registered window (WindowReducer)."""
    if symm:  # rows for the run's largest batch (this one's, where that does not fit in memory)
        hidden = ctx.stack.shape.hidden
        window = ctx.runtime.window(max(ctx.max_tokens, ctx.tokens) * hidden, ctx.stack.dtype, nccl_max_ctas,
                                    high_priority, fallback=ctx.tokens * hidden)
        return WindowReducer(ctx.eps, partial(dist.all_reduce, group=window.group), window, hidden)
    group = ctx.runtime.group(nccl_max_ctas, high_priority)
    return LocalReducer(ctx.eps, partial(dist.all_reduce, group=group))


@dataclass
class WindowReducer(LocalReducer):
    """LocalReducer whose partial sums lie in a registered NCCL window, row r of the layout at
    row r of the window: the GEMMs write them there, NCCL all-reduces them in place."""

    window: NcclWindow | None = None
    hidden: int = 0

    def out_buffer(self, chunk: Chunk) -> torch.Tensor:
        return self.window.view(chunk.begin * self.hidden, (chunk.size, self.hidden))


@dataclass
class SymmMemReducer(LocalReducer):
    """PyTorch's symmetric-memory all-reduce (torch.ops.symm_mem, peer loads, no multicast) on
    partial sums the GEMMs wrote into `buffer`, row r of the layout at row r; the sum is then
    added and normed as LocalReducer does. `two_shot` reduce-scatters and all-gathers in place;
    `one_shot` has every rank read all its peers' rows into a new tensor. Both start at the
    buffer's first element (the ops find the allocation by the tensor's address), so a chunk
    must start the batch: baseline's whole batch does."""

    buffer: SymmetricBuffer | None = None
    hidden: int = 0
    kind: str = "two_shot"

    def out_buffer(self, chunk: Chunk) -> torch.Tensor:
        if chunk.begin:
            raise ValueError("the symmetric-memory all-reduce reduces a batch's rows from its first one")
        return self.buffer.view(0, (chunk.size, self.hidden))

    def __call__(self, partial, chunk, residual, weight, out=None):
        if self.kind == "two_shot":
            torch.ops.symm_mem.two_shot_all_reduce_(partial, "sum", self.buffer.group_name)
        else:
            partial = torch.ops.symm_mem.one_shot_all_reduce(partial, "sum", self.buffer.group_name)
        return add_rms_norm(partial, residual, weight, self.eps, out)


def symm_mem(ctx: BuildContext, kind: str) -> SymmMemReducer:
    """Baseline's `allreduce: one_shot | two_shot` on the run's buffer, rows for its largest
    batch (this one's where that does not fit)."""
    hidden, dtype, rt = ctx.stack.shape.hidden, ctx.stack.dtype, ctx.runtime

    def make(tokens: int):
        return lambda: symmetric_buffer(tokens * hidden, dtype, rt.device)

    buffer = _run_sized(ctx, ("symm_mem_allreduce", hidden, dtype), make, lambda b: b.tensor.numel() // hidden)
    return SymmMemReducer(ctx.eps, buffer=buffer, hidden=hidden, kind=kind)


@dataclass
class SymmetricReducer:
    """A symmetric-memory all-reduce + residual + RMSNorm on `num_ctas` CTAs; `chunks`: the
    pieces the copy-engine kernel cuts each call's rows into (None: the kernel's own count; the
    fused kernel takes none); `sm_out`: whether the copy-engine kernel's add + norm writes the
    rank's own output rows itself instead of a copy (None: the kernel's own choice; the fused
    kernel takes none). Both go with every call, not into the kernel object, which the run's
    reducers share: every rank issues the same calls with the same count, so the kernel's
    barriers pair up."""

    kernel: object  # kernels.allreduce_norm.AllReduceNorm or kernels.copy_engine_norm.CopyEngineNorm
    eps: float
    num_ctas: int
    chunks: int | None = None
    sm_out: bool | None = None

    def out_buffer(self, chunk: Chunk) -> torch.Tensor:
        return self.kernel.partial(chunk.begin, chunk.end)

    def __call__(self, partial, chunk, residual, weight, out=None):
        if out is None and not getattr(self.kernel, "returns_view", False):
            out = torch.empty_like(residual)
        asked = {name: value for name, value in (("chunks", self.chunks), ("sm_out", self.sm_out)) if value is not None}
        return self.kernel(chunk.begin, chunk.end, residual, weight, self.eps, out, self.num_ctas, **asked)


def _engine(ctx: BuildContext, comm: str, make_kernel):
    """The run's symmetric buffers of `comm` (`fused`, `copy_engine`, `copy_engine_pull`), made by `make_kernel`
    (the kernel's constructor, as `(group, tokens, hidden, dtype, device, allocate=...)`): made
    once, sized for its largest batch. Where that batch does not fit in memory, sized for this one
    (and grown when a later point needs more)."""
    from kernels.allreduce_norm import MAX_WORLD

    shape, rt = ctx.stack.shape, ctx.runtime
    if not 2 <= rt.world_size <= MAX_WORLD:  # a point this run cannot hold: skipped with the reason
        raise UserError(f"comm={comm} runs its symmetric-memory kernels on 2 to {MAX_WORLD} ranks; this run has {rt.world_size}")
    key = (comm, shape.hidden, ctx.stack.dtype)

    def make(tokens: int):
        args = (dist.group.WORLD, tokens, shape.hidden, ctx.stack.dtype, rt.device)
        return lambda: make_kernel(*args, allocate=symmetric_buffer)

    return _run_sized(ctx, key, make, lambda kernel: kernel.max_tokens)


def _run_sized(ctx: BuildContext, key: tuple, make, capacity):
    """The run's object under `key`, made by `make(tokens)()` for its largest batch once; where
    that does not fit in memory, for this batch (and made again, larger, when a later one needs
    more). `capacity(obj)`: the tokens it holds."""
    rt = ctx.runtime
    made = rt.cached(key)
    if made is not None and capacity(made) >= ctx.tokens:
        return made
    if made is None and ctx.max_tokens > ctx.tokens:
        try:
            return rt.replace_resource(key, make(ctx.max_tokens))
        except (torch.OutOfMemoryError, RuntimeError) as e:  # symmetric memory: "CUDA driver error: out of memory"
            if "out of memory" not in str(e):
                raise
    return rt.replace_resource(key, make(ctx.tokens))


def symmetric(ctx: BuildContext, num_ctas: int, comm: str, make_kernel, chunks: int | None = None,
              sm_out: bool | None = None) -> SymmetricReducer:
    """`comm`'s kernel (made by `make_kernel`, once per run) on `num_ctas` CTAs, each call cut
    into `chunks` pieces (None: the kernel's own count), its own output rows written by its
    kernel where `sm_out` (None: the kernel's own choice)."""
    return SymmetricReducer(_engine(ctx, comm, make_kernel), ctx.eps, num_ctas, chunks, sm_out)


@dataclass
class PullReducer:
    """A deferred reducer (layer.DeferredReducer) on the run's copy-engine pull buffer
    (kernels/copy_engine_pull.CopyEnginePull): the GEMM writes the chunk's partial into this rank's
    region, `transfer` pulls the peers' partials of its rows, `finish` adds and normalizes every
    row (the residual complete and the same on every rank). No CTA budget: the transfer runs no
    SM kernel but the barriers, the finish runs at full width."""

    kernel: object  # kernels.copy_engine_pull.CopyEnginePull
    eps: float

    def out_buffer(self, chunk: Chunk) -> torch.Tensor:
        return self.kernel.partial(chunk.begin, chunk.end)

    def transfer(self, partial, chunk):
        self.kernel.transfer(chunk.begin, chunk.end)

    def finish(self, chunk, residual, weight, out):
        return self.kernel.finish(chunk.begin, chunk.end, residual, weight, self.eps, out)

    def __call__(self, partial, chunk, residual, weight, out=None):
        self.transfer(partial, chunk)
        return self.finish(chunk, residual, weight, torch.empty_like(residual) if out is None else out)


def copy_engine_pull(ctx: BuildContext) -> PullReducer:
    """`comm: copy_engine_pull`'s reducer on the run's buffer (made once, sized for its largest batch)."""
    from kernels.copy_engine_pull import CopyEnginePull

    return PullReducer(_engine(ctx, "copy_engine_pull", CopyEnginePull.allocate), ctx.eps)
