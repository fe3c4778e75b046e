"""`fused_norm` (TokenWeave's fuse-only): no split; every all-reduce + residual add + RMSNorm
is one few-CTA symmetric-memory kernel that the row-parallel GEMMs write into directly."""

from __future__ import annotations

from overlapbench.strategies import register
from overlapbench.strategies.base import Needs, Step, Strategy
from overlapbench.knobs import comm_ctas


@register
class FusedNorm(Strategy):
    name = "fused_norm"
    simplicity = 10
    summary = "no split; each all-reduce fused with residual add + RMSNorm in one few-CTA kernel"
    knobs = (comm_ctas("comm_ctas", "(every reduction)"),)
    needs = Needs(cuda=True, symmetric_memory=True)

    @classmethod
    def build(cls, ctx, knobs):
        from overlapbench.layer import forward_stack, whole_batch
        from overlapbench.overlap import reducers

        reducer = reducers.symmetric(ctx, knobs["comm_ctas"])
        chunk = whole_batch(ctx.seq_lens, ctx.runtime.device)
        return Step(lambda x: forward_stack(ctx.stack, x, chunk, ctx.rope, reducer))
