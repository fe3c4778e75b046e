"""The split overlap that `token_split` and `iso` share.

The batch's rows are cut into chunks (two, A and B, unless a strategy's `chunks` knob asks for
more). Compute runs on the main stream, communication on a high-priority side stream, so one
chunk's reduction hides under the next chunk's compute. Per layer (TokenWeave's schedule):

    comm: reduce(B, previous MLP)   ||  compute: attention(A)
    comm: reduce(A, attention)      ||  compute: attention(B)
    comm: reduce(B, attention)      ||  compute: MLP(A)
    comm: reduce(A, MLP)            ||  compute: MLP(B)

so B's MLP reduction is carried into the next layer, and only the last one is exposed. With N
chunks C1..CN the same pipeline runs over the sequence attention(C1..CN), MLP(C1..CN): each
compute is issued, then its reduction, which runs beside the next compute; the exposed tail is
CN's last MLP reduction, 1/N of the batch. A later chunk's attention reads the earlier chunks'
keys and values where a sequence straddles a cut. Strategies differ only in how they cut (a
`SplitPlan`); the schedule is written once, as data (schedule.split), which `Lanes` runs here and
`overlapbench predict` simulates.

A deferred reducer (layer.DeferredReducer: `comm: copy_engine_pull`) splits each reduction in
two: its reduce task issues only the transfer on the side lane, and the chunk's next compute task
on the main lane first issues the pending finish (add + norm into the chunk's residual and normed
rows), which its wait for the reduce task's event orders after the transfer. The finishes still
pending after the last task (the stack's last reductions) run on the main lane before the forward
returns.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from overlapbench.model.chunks import Chunk, KVBuffer
from overlapbench.model.layer import DeferredReducer, Reducer, compute_block, norm_weight
from overlapbench.model.norms import rms_norm
from overlapbench.model.schedule import ATTENTION, COMPUTE, SIDE, Task, behind_next_compute, gated_by, previous_of_chunk, split
from overlapbench.timing.step import BuildContext, Step


@dataclass
class SplitPlan:
    """Chunks (two or more, in schedule order) covering the batch's rows in the split layout.

    `order[j]` is the natural row (sequences back to back) of layout row j, or None when the
    layout is the natural one (cuts of the flattened batch).
    """

    chunks: tuple[Chunk, ...]
    order: torch.Tensor | None = None
    gemm_carveout: int = 0  # SMs the GEMMs leave free while the forward runs (gemm_sm_carveout)
    after_next_gemm: bool = False  # each reduction waits for the next compute's first GEMM (reduce_start)

    def __post_init__(self) -> None:
        ends = [c.end for c in self.chunks]
        if len(self.chunks) < 2 or [c.begin for c in self.chunks] != [0, *ends[:-1]] or any(c.size < 1 for c in self.chunks):
            raise ValueError(f"a split needs 2 or more non-empty chunks back to back from row 0, got rows "
                             f"{[(c.begin, c.end) for c in self.chunks]}")


class Lanes:
    """Runs a schedule's tasks (model/schedule.py) on two streams: the main lane on the current
    stream, the side lane on the runtime's high-priority side stream; a task whose chunk's
    previous task ran on the other lane waits for that task's event (schedule.previous_of_chunk),
    and a reduction gated by a compute (schedule.gated_by) for the event that compute records
    after its first GEMM (`first_gemm_done`).

    On CPU both lanes run inline, in program order: the same arithmetic, no overlap.
    """

    def __init__(self, ctx: BuildContext, tasks: list[Task]) -> None:
        self.cuda = ctx.runtime.is_cuda
        self.side = ctx.runtime.side_stream() if self.cuda else None
        self.tasks, self.previous, self.gates = tasks, previous_of_chunk(tasks), gated_by(tasks)
        self.done: list[object] = [None] * len(tasks)  # each task's event, where another lane waits for it
        self.first_gemm: dict[int, object] = {}  # a gating compute's index -> its event after its first GEMM
        self.gating = {g for g in self.gates if g is not None}

    def first_gemm_done(self, j: int):
        """What compute task j calls once its first GEMM is issued: where a reduction waits for
        it, record an event on its stream; else None (nothing to call)."""
        if not self.cuda or j not in self.gating:
            return None

        def record() -> None:
            self.first_gemm[j] = torch.cuda.Event()
            self.first_gemm[j].record(torch.cuda.current_stream())

        return record

    def run(self, j: int, fn):
        if not self.cuda:
            return fn()
        task, before, gate = self.tasks[j], self.previous[j], self.gates[j]
        stream = self.side if task.lane == SIDE else torch.cuda.current_stream()
        if before is not None and self.tasks[before].lane != task.lane:
            stream.wait_event(self.done[before])
        if gate is not None:
            stream.wait_event(self.first_gemm[gate])
        with torch.cuda.stream(stream):
            result = fn()
            self.done[j] = torch.cuda.Event()
            self.done[j].record(stream)
        return result

    def join(self) -> None:
        if self.cuda:
            torch.cuda.current_stream().wait_stream(self.side)


class SplitForward:
    """The stack forward over the plan's chunks with the pipelined schedule above
    (schedule.split, run by Lanes).

    Buffers that cross streams (residual, normed input, partial sums) are made once, at build,
    so the caching allocator never hands a block in use on one stream to the other.
    """

    def __init__(self, ctx: BuildContext, plan: SplitPlan, reducers: tuple[Reducer, Reducer]) -> None:
        self.ctx, self.plan = ctx, plan
        self.after_attention, self.after_mlp = reducers
        tokens, hidden = ctx.tokens, ctx.stack.shape.hidden
        make = lambda: torch.empty(tokens, hidden, dtype=ctx.stack.dtype, device=ctx.runtime.device)
        self.residual, self.normed, self.partials = make(), make(), make()
        self.kv = KVBuffer(tokens, ctx.stack.kv_heads, ctx.stack.shape.head_dim, ctx.stack.dtype, ctx.runtime.device)
        tasks = split(len(ctx.stack.layers), len(plan.chunks))
        self.tasks = behind_next_compute(tasks) if plan.after_next_gemm else tasks
        self.pending: dict[int, Task] = {}  # chunk -> its reduce task whose finish is still to run (deferred reducers)

    def _reducer(self, task: Task) -> Reducer:
        return self.after_attention if task.block == ATTENTION else self.after_mlp

    def _compute(self, task: Task, after_first_gemm=None) -> torch.Tensor:
        """The block's partial sum, written where its reducer will reduce it: the reducer's
        buffer (a symmetric one, which the two reducers share unless their CTA budgets give them
        NCCL windows of two groups), or the chunk's rows of `partials`. First the chunk's pending
        finish, where a deferred reducer left one: it writes the normed rows this compute reads."""
        self._finish(task.chunk)
        chunk = self.plan.chunks[task.chunk]
        buffer = self._reducer(task).out_buffer(chunk)
        out = self.partials[chunk.rows] if buffer is None else buffer
        return compute_block(self.ctx.stack, task, self.normed[chunk.rows], chunk, self.ctx.rope, self.kv, out,
                             after_first_gemm)

    def _reduce(self, task: Task, partial: torch.Tensor) -> None:
        chunk, reducer = self.plan.chunks[task.chunk], self._reducer(task)
        if isinstance(reducer, DeferredReducer):
            reducer.transfer(partial, chunk)
            self.pending[task.chunk] = task
            return
        rows = chunk.rows
        reducer(partial, chunk, self.residual[rows], norm_weight(self.ctx.stack, task), self.normed[rows])

    def _finish(self, k: int) -> None:
        """Chunk k's pending finish (a deferred reducer's add + norm), on the current lane; nothing
        where none is pending."""
        task = self.pending.pop(k, None)
        if task is None:
            return
        chunk = self.plan.chunks[k]
        rows = chunk.rows
        self._reducer(task).finish(chunk, self.residual[rows], norm_weight(self.ctx.stack, task), self.normed[rows])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with gemm_sm_carveout(self.plan.gemm_carveout):
            return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        stack, order = self.ctx.stack, self.plan.order
        self.residual.copy_(x if order is None else x[order])
        rms_norm(self.residual, stack.layers[0].attn_norm, stack.shape.eps, out=self.normed)
        lanes = Lanes(self.ctx, self.tasks)
        self.pending.clear()
        partials: dict[int, torch.Tensor] = {}  # chunk -> its latest partial sum
        for j, task in enumerate(self.tasks):
            if task.work == COMPUTE:
                partials[task.chunk] = lanes.run(j, lambda t=task, k=j: self._compute(t, lanes.first_gemm_done(k)))
            else:
                lanes.run(j, lambda t=task: self._reduce(t, partials[t.chunk]))
        lanes.join()
        for k in range(len(self.plan.chunks)):  # the stack's last reductions, on the main lane
            self._finish(k)
        if order is None:
            return self.normed
        out = torch.empty_like(self.normed)
        out[order] = self.normed
        return out


@contextmanager
def gemm_sm_carveout(sms: int) -> Iterator[None]:
    """cuBLAS's GEMMs launched (or captured) inside leave `sms` SMs free: torch's SM carveout,
    which sets cuBLAS's SM count target to the device's SMs minus `sms`. The setting is the
    process's; it is restored on the way out, so no other point's GEMMs see it."""
    if not sms:
        yield
        return
    before = torch._C._get_sm_carveout_experimental()
    torch._C._set_sm_carveout_experimental(sms)
    try:
        yield
    finally:
        torch._C._set_sm_carveout_experimental(before)


def split_step(ctx: BuildContext, plan: SplitPlan, reducers: tuple[Reducer, Reducer]) -> Step:
    return Step(SplitForward(ctx, plan, reducers))
