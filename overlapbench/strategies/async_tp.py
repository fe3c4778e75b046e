"""`async_tp` (PyTorch async-TP): the sequence-parallel stack through PyTorch's own
symmetric-memory `fused_all_gather_matmul` / `fused_matmul_reduce_scatter`: the peer that
`flash_agrs` has to match and beat."""

from __future__ import annotations

from overlapbench.strategies import register
from overlapbench.strategies.base import Needs, Strategy
from overlapbench.strategies.sp_baseline import SP_WORKLOADS


@register
class AsyncTP(Strategy):
    name = "async_tp"
    simplicity = 50
    summary = "sequence-parallel layer through torch.ops.symm_mem fused all-gather+matmul / matmul+reduce-scatter"
    needs = Needs(cuda=True, symmetric_memory=True, min_world_size=2, workloads=SP_WORKLOADS)

    @classmethod
    def build(cls, ctx, knobs):
        from overlapbench.distributed.runtime import enable_symmetric_memory
        from overlapbench.overlap.sequence_parallel import FusedExchange, sp_layout, sp_step

        group_name = enable_symmetric_memory()
        return sp_step(ctx, FusedExchange(sp_layout(ctx), group_name))
