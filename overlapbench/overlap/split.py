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
`SplitPlan`); the schedule is written once, here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from overlapbench.chunks import Chunk, KVBuffer
from overlapbench.layer import Reducer, attention_partial, mlp_partial
from overlapbench.norms import rms_norm
from overlapbench.runtime import BuildContext
from overlapbench.step import Step


@dataclass
class SplitPlan:
    """Chunks (two or more, in schedule order) covering the batch's rows in the split layout.

    `order[j]` is the natural row (sequences back to back) of layout row j, or None when the
    layout is the natural one (cuts of the flattened batch).
    """

    chunks: tuple[Chunk, ...]
    order: torch.Tensor | None = None

    def __post_init__(self) -> None:
        ends = [c.end for c in self.chunks]
        if len(self.chunks) < 2 or [c.begin for c in self.chunks] != [0, *ends[:-1]] or any(c.size < 1 for c in self.chunks):
            raise ValueError(f"a split needs 2 or more non-empty chunks back to back from row 0, got rows "
                             f"{[(c.begin, c.end) for c in self.chunks]}")


class Lanes:
    """Compute on the current stream, communication on the side stream, ordered by events.

    On CPU both lanes run inline, in program order: the same arithmetic, no overlap.
    """

    def __init__(self, ctx: BuildContext) -> None:
        self.cuda = ctx.runtime.is_cuda
        self.side = ctx.runtime.side_stream() if self.cuda else None
        self.ready: dict[int, object] = {}  # chunk index -> event after its last reduction
        self.produced: dict[int, object] = {}  # chunk index -> event after its last GEMM

    def _record(self, stream=None):
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def compute(self, chunk: int, fn):
        if self.cuda and chunk in self.ready:
            torch.cuda.current_stream().wait_event(self.ready[chunk])
        result = fn()
        self.produced[chunk] = self._record()
        return result

    def communicate(self, chunk: int, fn) -> None:
        if not self.cuda:
            fn()
            return
        self.side.wait_event(self.produced[chunk])
        with torch.cuda.stream(self.side):
            fn()
        self.ready[chunk] = self._record(self.side)

    def join(self) -> None:
        if self.cuda:
            torch.cuda.current_stream().wait_stream(self.side)


class SplitForward:
    """The stack forward over the plan's chunks with the interleaved schedule above.

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

    def _partial_out(self, reducer: Reducer, chunk: Chunk) -> torch.Tensor:
        """Where a GEMM writes the partial sums `reducer` will reduce: its buffer (a symmetric
        one, which the two reducers share unless their CTA budgets give them NCCL windows of
        two groups), or the chunk's rows of `partials`."""
        buffer = reducer.out_buffer(chunk)
        return self.partials[chunk.rows] if buffer is None else buffer

    def _attention(self, layer: int, chunk: Chunk) -> torch.Tensor:
        stack, rope, out = self.ctx.stack, self.ctx.rope, self._partial_out(self.after_attention, chunk)
        return attention_partial(stack, layer, self.normed[chunk.rows], chunk, rope, self.kv, out)

    def _mlp(self, layer: int, chunk: Chunk) -> torch.Tensor:
        return mlp_partial(self.ctx.stack, layer, self.normed[chunk.rows], self._partial_out(self.after_mlp, chunk))

    def _reduce(self, reducer: Reducer, partial: torch.Tensor, chunk: Chunk, weight: torch.Tensor) -> None:
        rows = chunk.rows
        reducer(partial, chunk, self.residual[rows], weight, self.normed[rows])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        stack, chunks, order = self.ctx.stack, self.plan.chunks, self.plan.order
        self.residual.copy_(x if order is None else x[order])
        rms_norm(self.residual, stack.layers[0].attn_norm, stack.shape.eps, out=self.normed)
        lanes = Lanes(self.ctx)
        attn, mlp = self.after_attention, self.after_mlp
        for i, w in enumerate(stack.layers):
            # Each compute, then its reduction on the side lane, beside the next compute (the last
            # chunk's MLP reduction beside the next layer's first attention).
            for k, c in enumerate(chunks):
                partial = lanes.compute(k, lambda c=c: self._attention(i, c))
                lanes.communicate(k, lambda p=partial, c=c: self._reduce(attn, p, c, w.mlp_norm))
            for k, c in enumerate(chunks):
                partial = lanes.compute(k, lambda c=c: self._mlp(i, c))
                lanes.communicate(k, lambda p=partial, c=c: self._reduce(mlp, p, c, stack.norm_after(i)))
        lanes.join()
        if order is None:
            return self.normed
        out = torch.empty_like(self.normed)
        out[order] = self.normed
        return out


def split_step(ctx: BuildContext, plan: SplitPlan, reducers: tuple[Reducer, Reducer]) -> Step:
    return Step(SplitForward(ctx, plan, reducers))
