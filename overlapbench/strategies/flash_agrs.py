"""`flash_agrs` (Flash-Overlap / CommFuse): the SP layer's all-gathers and reduce-scatters
decomposed into rank-ordered point-to-point pieces, each overlapped with the partial GEMM that
consumes or produces it. The mechanism is in flash_overlap.py, the ordering in sp_schedule.py;
here are the knobs and the choice of transport."""

from __future__ import annotations

from overlapbench.errors import UserError
from overlapbench.overlap.sp_schedule import ATTENTION_MODES, ORDERS
from overlapbench.strategies import register
from overlapbench.strategies.base import Knob, Needs, Strategy
from overlapbench.strategies.sp_baseline import SP_WORKLOADS

TRANSPORTS = ("copy_engine", "sm")


@register
class FlashAGRS(Strategy):
    name = "flash_agrs"
    simplicity = 60
    summary = "Flash-Overlap: AG/RS as rank-ordered P2P pieces interleaved with the partial GEMMs (SP layer)"
    knobs = (
        Knob("transport", str, "copy_engine",
             "copy_engine: memcpys between symmetric buffers on a side stream (no SMs); "
             "sm: a Triton P2P copy kernel on comm_ctas CTAs (CPU: gloo isend/irecv stands in for copy_engine)",
             choices=TRANSPORTS),
        Knob("comm_ctas", int, 16, "CTAs of the P2P copy kernel (transport=sm)", bounds=(1, 132), optional=True),
        Knob("chunks_per_rank", int, 1, "pieces each rank's shard is cut into (over-decomposition)", choices=(1, 2, 4)),
        Knob("order", str, "local_first_last",
             "local_first_last: own slice first for all-gather, last for reduce-scatter; "
             "ring: every rank in index order 0..world-1 (what the ordering buys)",
             choices=ORDERS),
        Knob("attention", str, "whole",
             "whole: one attention call over all rows, then the O-proj pieces; per_piece: each "
             "O-proj piece's query rows attended just before it, so attention overlaps the earlier "
             "pieces' transfers, but the pieces after the first need a lower-right causal mask, "
             "which PyTorch runs on a slower kernel (on H200 slower at every size measured, most at long "
             "sequences). Layer workload only",
             choices=ATTENTION_MODES),
    )
    needs = Needs(workloads=SP_WORKLOADS)

    @classmethod
    def check_combination(cls, knobs, where):
        if knobs["transport"] == "copy_engine":
            knobs["comm_ctas"] = None  # irrelevant: one point, not one per CTA count
        elif knobs["comm_ctas"] is None:
            raise UserError(f"{where}.comm_ctas: transport=sm needs a CTA budget; give an integer")

    @classmethod
    def skip_reason(cls, knobs, cuda):
        if knobs["transport"] == "sm" and not cuda:
            return "transport=sm needs CUDA GPUs (a Triton kernel over symmetric memory)"
        return None

    @classmethod
    def build(cls, ctx, knobs):
        from functools import partial

        import torch.distributed as dist

        from overlapbench.overlap import flash_overlap as fo
        from overlapbench.overlap.sequence_parallel import sp_io, sp_layout, sp_step
        from overlapbench.overlap.sp_schedule import Plan

        rt = ctx.runtime
        plan = Plan(sp_layout(ctx), knobs["chunks_per_rank"], knobs["order"])
        gather_width, scatter_width, dtype = sp_io(ctx)
        if not rt.is_cuda:
            transport = fo.GlooTransport(plan, rt.rank, gather_width, scatter_width, dtype, rt.device)
        else:
            max_shard = -(-ctx.max_tokens // rt.world_size)
            key = ("flash_agrs", max_shard, gather_width, scatter_width, dtype)
            buffers = rt.resource(
                key,
                lambda: fo.SymmetricBuffers.allocate(dist.group.WORLD, max_shard, gather_width, scatter_width, dtype, rt.device),
            )
            if knobs["transport"] == "sm":
                from kernels import p2p

                copy = partial(p2p.copy, num_ctas=knobs["comm_ctas"], anchor=buffers.sym.tensor)
            else:
                copy = lambda dst, src: dst.copy_(src)
            transport = fo.SymmetricTransport(buffers, plan, rt.rank, copy, rt.side_stream())
        exchange = fo.FlashExchange(plan, rt.rank, transport, gather_width, scatter_width, dtype, rt.device)
        return sp_step(ctx, exchange, knobs["attention"])
