"""`fused_norm` (TokenWeave's fuse-only): no split; every all-reduce + residual add + RMSNorm
is one few-CTA symmetric-memory kernel that the row-parallel GEMMs write into directly
(`comm: fused`), or copy-engine transfers around a few-CTA local add+norm (`comm: copy_engine`,
each call's rows in `ce_chunks` pieces, its own output rows written as `ce_out` says)."""

from __future__ import annotations

from overlapbench.model.schedule import LayerPlan, Rows
from overlapbench.overlap import comm_methods
from overlapbench.strategies import register
from overlapbench.strategies.base import Needs, Step, Strategy, reset_copy_engine_knobs
from overlapbench.strategies.knobs import COPY_ENGINE_KNOBS, FUSED_COMM, comm_ctas


@register
class FusedNorm(Strategy):
    name = "fused_norm"
    simplicity = 10
    summary = "no split; each all-reduce fused with residual add + RMSNorm in one few-CTA kernel"
    knobs = (FUSED_COMM, comm_ctas("comm_ctas", "(every reduction)"), *COPY_ENGINE_KNOBS)
    needs = Needs(cuda=True, symmetric_memory=True)

    @classmethod
    def check_combination(cls, knobs, where):
        reset_copy_engine_knobs(knobs)

    @classmethod
    def plan(cls, knobs, batch):
        transfer = comm_methods.get(knobs["comm"]).transfer(knobs["comm_ctas"], ce_out=comm_methods.own_rows_writer(knobs))
        return LayerPlan((Rows(0, batch.tokens),), transfer, transfer)

    @classmethod
    def build(cls, ctx, knobs):
        from overlapbench.model.chunks import whole_batch
        from overlapbench.model.layer import forward_stack
        reducer = comm_methods.get(knobs["comm"]).build(ctx, knobs["comm_ctas"], knobs)
        chunk = whole_batch(ctx.seq_lens, ctx.runtime.device, ctx.decode)
        return Step(lambda x: forward_stack(ctx.stack, x, chunk, ctx.rope, reducer))
