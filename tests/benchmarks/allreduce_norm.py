"""All-reduce + residual + RMSNorm engines (few CTAs, symmetric memory) against NCCL all-reduce
followed by the fused add + RMSNorm kernel, alone on the GPUs: the fused kernel v2, push
(kernels/allreduce_norm_v2.py), pull (v2pull) and pull + pushed output (v2pullpush; both in
kernels/allreduce_norm_pull.py), v1
(kernels/allreduce_norm.py) and the copy-engine path (kernels/copy_engine_norm.py, whose CTA
budget is its local add + norm kernel's).

    torchrun --nproc-per-node 2 tests/benchmarks/allreduce_norm.py --out bench.jsonl

Each variant is one CUDA graph (as the strategies run it); inputs are refilled before every
replay outside the timed events, so values never drift. Per iteration the slowest rank counts;
the table shows the median. busbw = tokens * hidden * 2 bytes * 2(n-1)/n / time.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `kernels` and `overlapbench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from overlapbench.distributed.runtime import SAFE_ENV

os.environ.update(SAFE_ENV)  # before NCCL or symmetric memory start: no NVLink multicast, ever

import torch
import torch.distributed as dist
import triton

from kernels.allreduce_norm import STEP_BYTES
from kernels.allreduce_norm_pull import FUSED_KERNELS
from kernels.copy_engine_norm import CopyEngineNorm
from kernels.rmsnorm import fused_add_rmsnorm
from overlapbench.comm.sizes import busbw
from overlapbench.distributed import runtime
from overlapbench.launch.environment import git_commit
from overlapbench.timing.bench import bench
from overlapbench.timing.cuda_graph import capture
from overlapbench.tuning.results import RunLog

EPS = 1e-5
ENGINES = FUSED_KERNELS | {"ce": CopyEngineNorm.allocate}


def parse_args() -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",")]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="JSON lines, one per (tokens, variant)")
    p.add_argument("--tokens", type=ints, default=[1024, 2048, 4096, 8192, 16384, 32768])
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--ctas", type=ints, default=[4, 8, 16, 32, 64], help="CTA budgets of the engines")
    p.add_argument("--engines", type=lambda s: s.split(","), default=list(ENGINES), help=f"of {', '.join(ENGINES)}")
    p.add_argument("--step-kib", type=ints, default=[STEP_BYTES // 1024], help="fused kernels' bytes per CTA step")
    p.add_argument("--nccl-ctas", type=int, default=8, help="also NCCL capped at this many CTAs (0: skip)")
    p.add_argument("--iters", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    return p.parse_args()


def timed_graph(step, refill, iters: int, warmup: int) -> torch.Tensor:
    """Per-iteration ms of one replay of `step` captured as a graph (its inputs refilled before
    every replay, outside the timed span), max over ranks."""
    refill()
    graph = capture(step, warmup=1)  # compile and warm NCCL outside the capture

    def queue_ahead():  # the CPU queues ahead while the GPU waits, so no launch gap is timed
        dist.barrier()
        torch.cuda._sleep(2_000_000)

    timed = bench(graph.replay, 0.0, 0.0, warmup=warmup, iters=iters, before_each=refill, before_loop=queue_ahead)
    ms = torch.tensor(timed.samples_ms, device="cuda")
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return ms.cpu()


def main() -> None:
    args = parse_args()
    rt = runtime.init(timeout_s=600)  # torchrun's group, NCCL, this rank's GPU
    dev, rank, world = rt.device, rt.rank, rt.world_size
    hidden, dtype, max_tokens = args.hidden, torch.bfloat16, max(args.tokens)
    engines = {name: ENGINES[name](dist.group.WORLD, max_tokens, hidden, dtype, dev, allocate=runtime.symmetric_buffer)
               for name in args.engines}
    groups = {"nccl": None}
    if args.nccl_ctas:
        opts = dist.ProcessGroupNCCL.Options()
        opts.config.max_ctas = args.nccl_ctas
        groups[f"nccl{args.nccl_ctas}"] = dist.new_group(backend="nccl", pg_options=opts)

    g = torch.Generator(device=dev).manual_seed(1 + rank)
    shared = torch.Generator(device=dev).manual_seed(0)
    p0 = torch.randn(max_tokens, hidden, generator=g, device=dev).to(dtype)
    r0 = torch.randn(max_tokens, hidden, generator=shared, device=dev).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=shared, device=dev)).to(dtype)
    x = torch.empty_like(p0)
    residual, out = torch.empty_like(r0), torch.empty_like(r0)
    meta = dict(bench="allreduce_norm", hidden=hidden, dtype="bfloat16", world_size=world,
                device=torch.cuda.get_device_name(dev), torch=torch.__version__, triton=triton.__version__,
                iters=args.iters)
    log = RunLog(args.out, git_commit()) if rank == 0 else None
    if rank == 0:
        print(f"{world}x {meta['device']}, hidden {hidden} bf16, median of {args.iters} (slowest rank each)")
        print(f"{'tokens':>7} {'variant':<20} {'ms':>8} {'p10':>8} {'p90':>8} {'busbw GB/s':>10} "
              f"{'vs nccl':>7} {'rel_err':>8}", flush=True)
    for n in args.tokens:
        res, o, xn = residual[:n], out[:n], x[:n]

        def refill_nccl(n=n, xn=xn, res=res):
            xn.copy_(p0[:n])
            res.copy_(r0[:n])

        def refill_engine(ar, n=n, res=res):
            ar.partial(0, n).copy_(p0[:n])
            res.copy_(r0[:n])

        variants = []  # (name, engine, ctas, step KiB, refill, step)
        for name, group in groups.items():
            variants.append((f"{name} AR", None, None, None, refill_nccl,
                             lambda xn=xn, group=group: dist.all_reduce(xn, group=group)))
            variants.append((f"{name} AR+norm", None, None, None, refill_nccl, lambda xn=xn, res=res, o=o, group=group: (
                dist.all_reduce(xn, group=group), fused_add_rmsnorm(xn, res, weight, EPS, out=o))))
        for engine, ar in engines.items():
            for kib in args.step_kib if hasattr(ar, "step_bytes") else [None]:
                for c in args.ctas:
                    variants.append((f"{engine} c={c}" + ("" if kib is None else f" {kib}K"), ar, c, kib,
                                     lambda ar=ar: refill_engine(ar),
                                     lambda n=n, res=res, o=o, c=c, ar=ar: ar(0, n, res, weight, EPS, o, c)))

        refill_nccl()  # the reference result, for the engines' error (on out: the v2s and ce keep a sharded residual)
        variants[1][5]()
        ref = o.float().clone()
        base_ms = None  # nccl AR+norm, measured before every engine
        for name, ar, ctas, kib, refill, step in variants:
            err = None
            if ar is not None:
                if kib is not None:
                    ar.step_bytes = kib * 1024  # read at launch, so also baked into the captured graph
                refill()
                o.fill_(float("nan"))
                step()
                err = ((o.float() - ref).norm() / ref.norm()).item()
            ms = timed_graph(step, refill, args.iters, args.warmup)
            med = ms.median().item()
            base_ms = med if name == "nccl AR+norm" else base_ms
            speedup = None if base_ms is None else base_ms / med
            bw = busbw("all_reduce", n * hidden * dtype.itemsize, med * 1e-3, world)
            row = dict(meta, tokens=n, variant=name, ctas=ctas, step_kib=kib, ms=med,
                       p10_ms=ms.quantile(0.1).item(), p90_ms=ms.quantile(0.9).item(), busbw_gbps=bw,
                       speedup_vs_nccl_norm=speedup, rel_err=err)
            if rank == 0:
                log.write(row)
                e = "" if err is None else f"{err:.1e}"
                sp = "" if speedup is None else f"{speedup:.2f}"
                print(f"{n:>7} {name:<20} {med:8.4f} {row['p10_ms']:8.4f} {row['p90_ms']:8.4f} {bw:10.1f} "
                      f"{sp:>7} {e:>8}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
