"""`baseline`: how engines run TP today, and the reference every strategy is checked against.

Its all-reduce is a choice, because engines do not all run NCCL's ring: `allreduce: one_shot` or
`two_shot` is PyTorch's symmetric-memory all-reduce (the peer-memory kernels vLLM and
TensorRT-LLM run below their size limits), `nccl_symm` NCCL's symmetric kernels on a CTA budget.
`report` and `tune` measure every strategy against the default setting and the fastest one."""

from __future__ import annotations

from overlapbench.model.schedule import LayerPlan, Rows, Transfer
from overlapbench.strategies import register
from overlapbench.strategies.base import NcclStrategy, Step
from overlapbench.strategies.knobs import ALLREDUCE, DEFAULT, NCCL_MAX_CTAS, NCCL_SYMM


@register
class Baseline(NcclStrategy):
    name = "baseline"
    simplicity = 0
    summary = "compute, blocking all-reduce, then residual add + RMSNorm (vLLM/Megatron)"
    knobs = (NCCL_MAX_CTAS, NCCL_SYMM, ALLREDUCE)

    @classmethod
    def check_combination(cls, knobs, where):
        """NCCL's knobs do not apply to PyTorch's all-reduce: reset, so a grid over both does
        not measure one setting twice."""
        if knobs["allreduce"] != "nccl":
            knobs["nccl_max_ctas"], knobs["nccl_symm"] = DEFAULT, False

    @classmethod
    def skip_reason(cls, knobs, cuda):
        if knobs.get("allreduce", "nccl") != "nccl" and not cuda:
            return f"allreduce={knobs['allreduce']} is PyTorch's symmetric-memory all-reduce and needs CUDA GPUs"
        return super().skip_reason(knobs, cuda)

    @classmethod
    def plan(cls, knobs, batch):
        kind = knobs.get("allreduce", "nccl")
        if kind != "nccl":
            transfer = Transfer(f"symm_{kind}")
        else:
            transfer = Transfer("nccl_symm" if cls.uses_nccl_windows(knobs) else "nccl", knobs["nccl_max_ctas"])
        return LayerPlan((Rows(0, batch.tokens),), transfer, transfer)

    @classmethod
    def build(cls, ctx, knobs):
        from overlapbench.model.chunks import whole_batch
        from overlapbench.model.layer import forward_stack
        from overlapbench.overlap import reducers

        if knobs.get("allreduce", "nccl") != "nccl":
            reducer = reducers.symm_mem(ctx, knobs["allreduce"])
        else:
            reducer = reducers.collective(ctx, knobs["nccl_max_ctas"], symm=cls.uses_nccl_windows(knobs))
        chunk = whole_batch(ctx.seq_lens, ctx.runtime.device, ctx.decode)
        return Step(lambda x: forward_stack(ctx.stack, x, chunk, ctx.rope, reducer))
