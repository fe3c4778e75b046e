"""`sp_baseline` (Megatron SP): the sequence-parallel stack with blocking NCCL all-gather and
reduce-scatter (gloo on CPU): the reference the decomposed SP strategies are measured against,
and the one that computes the micro workloads' reference."""

from __future__ import annotations

from overlapbench.strategies import register
from overlapbench.strategies.base import NcclStrategy, Needs
from overlapbench.strategies.knobs import NCCL_MAX_CTAS, NCCL_SYMM

SP_WORKLOADS = ("layer", "gemm_ag", "gemm_rs")  # the SP strategies also run the micro workloads


@register
class SPBaseline(NcclStrategy):
    name = "sp_baseline"
    simplicity = 40
    summary = "sequence-parallel layer: blocking NCCL all-gather before, reduce-scatter after the GEMMs (Megatron SP)"
    knobs = (NCCL_MAX_CTAS, NCCL_SYMM)
    needs = Needs(workloads=SP_WORKLOADS)

    @classmethod
    def build(cls, ctx, knobs):
        from overlapbench.overlap.sequence_parallel import CollectiveExchange, sp_layout, sp_step, window_exchange

        if cls.uses_nccl_windows(knobs):
            return sp_step(ctx, window_exchange(ctx, knobs["nccl_max_ctas"]))
        group = ctx.runtime.group(knobs["nccl_max_ctas"])
        return sp_step(ctx, CollectiveExchange(sp_layout(ctx), group))
