"""`no_comm`: the baseline with every collective removed. The ideal bound (TokenWeave's
"nocomm"): what hiding communication alone could ever buy. Not a correct result, so never checked
and never a tuned choice."""

from __future__ import annotations

from overlapbench.model.schedule import LayerPlan, Rows, Transfer
from overlapbench.strategies import register
from overlapbench.strategies.base import Step, Strategy


@register
class NoComm(Strategy):
    name = "no_comm"
    summary = "baseline with every collective removed: the ideal bound, not a correct result"
    checked = False
    simplicity = 5  # never a choice (tune leaves bounds out): the rank only lists it beside the baseline

    @classmethod
    def plan(cls, knobs, batch):
        return LayerPlan((Rows(0, batch.tokens),), Transfer(None), Transfer(None))

    @classmethod
    def build(cls, ctx, knobs):
        from overlapbench.model.chunks import whole_batch
        from overlapbench.model.layer import LocalReducer, forward_stack

        reducer = LocalReducer(ctx.eps)
        chunk = whole_batch(ctx.seq_lens, ctx.runtime.device, ctx.decode)
        return Step(lambda x: forward_stack(ctx.stack, x, chunk, ctx.rope, reducer))
