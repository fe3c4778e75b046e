"""`baseline`: how engines run TP today, and the reference every strategy is checked against."""

from __future__ import annotations

from functools import partial

from overlapbench.knobs import NCCL_MAX_CTAS
from overlapbench.strategies import register
from overlapbench.strategies.base import Step, Strategy


@register
class Baseline(Strategy):
    name = "baseline"
    simplicity = 0
    summary = "compute, blocking all-reduce, then residual add + RMSNorm (vLLM/Megatron)"
    knobs = (NCCL_MAX_CTAS,)

    @classmethod
    def build(cls, ctx, knobs):
        import torch.distributed as dist

        from overlapbench.layer import LocalReducer, forward_stack, whole_batch

        group = ctx.runtime.group(knobs["nccl_max_ctas"])
        reducer = LocalReducer(ctx.eps, partial(dist.all_reduce, group=group))
        chunk = whole_batch(ctx.seq_lens, ctx.runtime.device, ctx.decode)
        return Step(lambda x: forward_stack(ctx.stack, x, chunk, ctx.rope, reducer))
