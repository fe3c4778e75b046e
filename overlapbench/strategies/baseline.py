"""`baseline`: how engines run TP today, and the reference every strategy is checked against."""

from __future__ import annotations

from overlapbench.knobs import NCCL_MAX_CTAS, NCCL_SYMM
from overlapbench.strategies import register
from overlapbench.strategies.base import NcclStrategy, Step


@register
class Baseline(NcclStrategy):
    name = "baseline"
    simplicity = 0
    summary = "compute, blocking all-reduce, then residual add + RMSNorm (vLLM/Megatron)"
    knobs = (NCCL_MAX_CTAS, NCCL_SYMM)

    @classmethod
    def build(cls, ctx, knobs):
        from overlapbench.chunks import whole_batch
        from overlapbench.layer import forward_stack
        from overlapbench.overlap import reducers

        reducer = reducers.collective(ctx, knobs["nccl_max_ctas"], symm=cls.uses_nccl_windows(knobs))
        chunk = whole_batch(ctx.seq_lens, ctx.runtime.device, ctx.decode)
        return Step(lambda x: forward_stack(ctx.stack, x, chunk, ctx.rope, reducer))
