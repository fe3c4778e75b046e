"""`sp_baseline` (Megatron SP): the sequence-parallel stack with blocking NCCL all-gather and
reduce-scatter (gloo on CPU): the reference the decomposed SP strategies are measured against,
and the one that computes the micro workloads' reference."""

from __future__ import annotations

from overlapbench.knobs import NCCL_MAX_CTAS
from overlapbench.strategies import register
from overlapbench.strategies.base import Needs, Strategy

SP_WORKLOADS = ("layer", "gemm_ag", "gemm_rs")  # the SP strategies also run the micro workloads


@register
class SPBaseline(Strategy):
    name = "sp_baseline"
    simplicity = 40
    summary = "sequence-parallel layer: blocking NCCL all-gather before, reduce-scatter after the GEMMs (Megatron SP)"
    knobs = (NCCL_MAX_CTAS,)
    needs = Needs(workloads=SP_WORKLOADS)

    @classmethod
    def build(cls, ctx, knobs):
        from overlapbench.overlap.sequence_parallel import CollectiveExchange, sp_layout, sp_step

        group = ctx.runtime.group(knobs["nccl_max_ctas"])
        return sp_step(ctx, CollectiveExchange(sp_layout(ctx), group))
