"""The copy-engine all-reduce + norm (kernels/copy_engine_norm.py): serial (chunks=1) against the
chunked pipeline, and the kernel writing `out` itself (sm_out) against the copy engine copying
it from the published rows, per CTA budget of the local kernel; NCCL all-reduce alone beside it.

    PYTHONPATH=. torchrun --nproc-per-node 2 tests/benchmarks/copy_engine_norm.py   # writes $OUT/

Each variant is one CUDA graph; the inputs are exact small integers (overlapbench.comm.patterns,
as `overlapbench comm`), refilled before every replay outside the timed events. #wrong: elements
of `out` (every row) and of the residual (this rank's rows) off the reference, summed over the
ranks, once eagerly and once after the timed replays. busbw = rows * hidden * 2 B * 2(n-1)/n /
time (nccl-tests' all-reduce); per replay the slowest rank counts; the median is shown.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `kernels` and `overlapbench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from overlapbench.distributed.runtime import SAFE_ENV
from tests.benchmarks.allreduce_norm import timed_graph

os.environ.update(SAFE_ENV)
import torch
import torch.distributed as dist

from kernels.copy_engine_norm import CopyEngineNorm
from kernels.rmsnorm import add_rmsnorm_reference
from overlapbench.comm.patterns import count_wrong, pattern, pattern_sum
from overlapbench.comm.sizes import busbw
from overlapbench.distributed import runtime
from overlapbench.launch.environment import git_commit
from overlapbench.tuning.results import RunLog

EPS = 1e-5
MiB = 1 << 20


def parse_args() -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",")]
    out = Path(os.environ.get("OUT", "results")) / "bench_copy_engine_norm.jsonl"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=out, help=f"JSON lines, one per variant (default {out})")
    p.add_argument("--mib", type=ints, default=[64, 256], help="sizes of the rows x hidden tensor, MiB")
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--ctas", type=ints, default=[4, 8, 16, 32], help="CTA budgets of the local kernel")
    p.add_argument("--chunks", type=ints, default=[1, 2, 4, 8])
    p.add_argument("--sm-out", type=lambda s: [x == "1" for x in s.split(",")], default=[False, True],
                   help="0: out's own rows copied by the copy engine; 1: written by the kernel (0,1: both)")
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    rt = runtime.init(timeout_s=600)  # torchrun's group, NCCL, this rank's GPU
    dev, rank, world = rt.device, rt.rank, rt.world_size
    hidden, dtype = args.hidden, torch.bfloat16
    sizes = {mib: mib * MiB // (hidden * 2) for mib in args.mib}  # rows of each size
    engine = CopyEngineNorm.allocate(dist.group.WORLD, max(sizes.values()), hidden, dtype, dev,
                                    allocate=runtime.symmetric_buffer)
    weight = (torch.arange(hidden, device=dev) % 3 + 1).to(dtype)
    meta = dict(bench="copy_engine_norm", hidden=hidden, dtype="bfloat16", world_size=world,
                device=torch.cuda.get_device_name(dev), torch=torch.__version__, iters=args.iters)
    log = RunLog(args.out, git_commit()) if rank == 0 else None
    if rank == 0:
        print(f"{world}x {meta['device']}, hidden {hidden} bf16, median of {args.iters} (slowest rank each) -> {args.out}")
    table = []
    for mib, n in sizes.items():
        seed = mib
        partial, kept = engine.partial(0, n), slice(*engine.own_rows(0, n))
        residual = torch.empty(n, hidden, dtype=dtype, device=dev)
        out = torch.empty_like(residual)
        nccl_buf = torch.empty_like(residual)
        mine = pattern(rank, 0, n * hidden, seed, dtype, dev).view(n, hidden)
        given = pattern(world, 0, n * hidden, seed, dtype, dev).view(n, hidden)  # the residual: one more source
        ref_res = given.clone()
        ref_out = add_rmsnorm_reference(pattern_sum(range(world), 0, n * hidden, seed, torch.float32, dev).view(n, hidden),
                                        ref_res, weight, EPS)  # ref_res += the sum

        def refill(partial=partial, residual=residual, mine=mine, given=given) -> None:
            partial.copy_(mine)
            residual.copy_(given)

        def wrong(out=out, residual=residual, kept=kept, ref_res=ref_res, ref_out=ref_out) -> int:
            off = ~torch.isclose(out.float(), ref_out.float(), rtol=torch.finfo(dtype).eps, atol=1e-6)
            count = torch.tensor([count_wrong(residual[kept], ref_res[kept]) + int(off.sum())], device=dev)
            dist.all_reduce(count)
            return int(count.item())

        variants = [("nccl AR", None, None, None, lambda b=nccl_buf: dist.all_reduce(b))]
        variants += [(f"ce c={c} k={k}{' sm_out' if s else ''}", c, k, s,
                      lambda n=n, c=c, k=k, r=residual, o=out: engine(0, n, r, weight, EPS, o, c, chunks=k))
                     for s in args.sm_out for k in args.chunks for c in args.ctas]
        for name, ctas, chunks, sm_out, step in variants:
            wrong_eager = wrong_graph = None
            if ctas is not None:
                engine.sm_out = sm_out  # read at each call, so also baked into the captured graph
                refill()
                out.fill_(float("nan"))
                step()
                torch.cuda.synchronize()
                wrong_eager = wrong()
            ms = timed_graph(step, refill if ctas is not None else (lambda b=nccl_buf: b.fill_(1)), args.iters, args.warmup)
            if ctas is not None:
                wrong_graph = wrong()  # the last replay's result
            med = ms.median().item()
            bw = busbw("all_reduce", n * hidden * dtype.itemsize, med * 1e-3, world)
            row = dict(meta, mib=mib, rows=n, variant=name, ctas=ctas, chunks=chunks, sm_out=sm_out,
                       chunks_used=None if chunks is None else engine.chunk_count(n, chunks), ms=med,
                       p10_ms=ms.quantile(0.1).item(), p90_ms=ms.quantile(0.9).item(), busbw_gbps=bw,
                       wrong_eager=wrong_eager, wrong_graph=wrong_graph)
            table.append(row)
            if rank == 0:
                log.write(row)
                print(f"{mib:>4} MiB {name:<22} {med:8.4f} ms  busbw {bw:7.1f} GB/s  "
                      f"#wrong {wrong_eager} / {wrong_graph}", flush=True)
    if rank == 0:
        print_table(table, args)
    dist.barrier()
    dist.destroy_process_group()


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    """busbw (GB/s) per CTA budget x chunk count, per size and sm_out; #wrong summed over all."""
    print("\nbusbw GB/s (rows: CTAs, columns: chunks); #wrong = eager + after replays, all ranks")
    for mib in args.mib:
        nccl = next(r["busbw_gbps"] for r in rows if r["mib"] == mib and r["ctas"] is None)
        for sm_out in args.sm_out:
            print(f"{mib} MiB, {'sm_out (kernel writes out)' if sm_out else 'out by copy engine'}; nccl AR alone {nccl:.1f}")
            print(f"{'ctas':>6} " + " ".join(f"{'k=' + str(k):>8}" for k in args.chunks))
            for c in args.ctas:
                cells = [next(r for r in rows if (r["mib"], r["ctas"], r["chunks"], r["sm_out"]) == (mib, c, k, sm_out))
                         for k in args.chunks]
                print(f"{c:>6} " + " ".join(f"{r['busbw_gbps']:8.1f}" for r in cells))
    wrong = sum((r["wrong_eager"] or 0) + (r["wrong_graph"] or 0) for r in rows)
    print(f"#wrong total: {wrong}")


if __name__ == "__main__":
    main()
