"""NCCL's symmetric windows on ONE GPU: a smoke test of what nccl_symm runs on, for a machine
without a second GPU (the real check is tests/test_nccl_symm_gpu.py on two).

A world-size-1 NCCL group: windows allocated from the group backend's MemPool and registered
with symm=True (runtime.Runtime.window) under NCCL's own budget and exact ones (4, 16 CTAs);
each collective (all-reduce, all-gather, reduce-scatter, 64 MiB bf16) on views of them, checked
exactly, eager and replayed from a CUDA graph; every layer strategy that takes nccl_symm against
the reference (eager and replayed); then what NCCL's tuning log says. At world size 1 NCCL runs
no collective kernel (it copies locally), so the log is expected to show no kernel line: this
checks the API path, the registration, graph capture on registered memory and the log's
plumbing, not the symmetric kernels themselves.

    python tests/checks/nccl_symm_one_gpu.py [--out DIR]    # DIR: keep NCCL's log there

Prints one line per check and a verdict; exit code 1 if any check failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
from collections import Counter
from pathlib import Path

import torch

from overlapbench import strategies
from overlapbench.comm import buffers, paths
from overlapbench.comm import run as comm_run
from overlapbench.comm.cases import Case
from overlapbench.distributed import runtime
from overlapbench.launch import environment
from overlapbench.model.layer import reference_forward
from overlapbench.model.models import ModelShape
from overlapbench.model.rope import RopeTable
from overlapbench.model.weights import build_stack, random_input
from overlapbench.run import micro
from overlapbench.strategies.knobs import DEFAULT
from overlapbench.timing.cuda_graph import capture
from overlapbench.timing.measure import rel_err
from overlapbench.timing.step import BuildContext
from overlapbench.tuning.rows import Gemm, Point

SHAPE = ModelShape(hidden=512, ffn=1024, heads=8, kv_heads=4, head_dim=64)
BYTES = 64 * 2**20
SETTINGS = [
    ("baseline", {"nccl_symm": True}), ("baseline", {"nccl_symm": True, "nccl_max_ctas": 8}),
    ("token_split", {"comm": "nccl_symm", "comm_ctas_attn": 4, "comm_ctas_mlp": 16}),
    ("iso", {"comm": "nccl_symm", "comm_ctas": 8}), ("sp_baseline", {"nccl_symm": True, "nccl_max_ctas": 8}),
]


def graph_replay(fn):
    """fn's result from a CUDA-graph replay (cuda_graph.capture: warmed up on a side stream)."""
    out = {}
    graph = capture(lambda: out.update(y=fn()))
    graph.replay()
    torch.cuda.synchronize()
    return out["y"]


def collectives(rt: runtime.Runtime, report) -> None:
    for ctas in (DEFAULT, 4, 16):
        for op in paths.OPS:
            case = Case(op, "nccl_symm", "nccl", ctas, BYTES, BYTES // 2, "bf16", seed=5, window=True)
            try:
                bench = paths.build(rt, case, buffers.Buffers(rt, [case]))
                eager = comm_run.check(bench, case.seed, rt)
                graph = capture(bench.run)
                bench.fill(case.seed + 1)  # fresh inputs after the warm-up, then one replay
                graph.replay()
                torch.cuda.synchronize()
                replayed = bench.wrong(case.seed + 1)
                report(f"{op} on a window, ctas {ctas}", not eager and not replayed,
                       f"#wrong eager {eager}, replayed {replayed}")
            except Exception as e:
                report(f"{op} on a window, ctas {ctas}", False, f"{type(e).__name__}: {e}".splitlines()[0])


def layers(rt: runtime.Runtime, report) -> None:
    lens = (1000, 23)
    stack = build_stack(SHAPE, 2, 1, 0, torch.bfloat16, rt.device, seed=0)
    ref = reference_forward(SHAPE, 2, 1, lens, torch.bfloat16, rt.device)
    ctx = BuildContext(rt, stack, lens, RopeTable(SHAPE, max(lens), rt.device), 2048)
    x = random_input(sum(lens), SHAPE.hidden, 0, torch.bfloat16, rt.device)
    for name, knobs in SETTINGS:
        what = f"{name} {knobs}"
        try:
            cls = strategies.get(name)
            step = cls.build(ctx, cls.check_knobs(knobs, name))
            eager = rel_err(step.to_full(step.forward(x)), ref)
            replayed = rel_err(step.to_full(graph_replay(lambda s=step: s.forward(x))), ref)
            report(what, max(eager, replayed) < 1e-2, f"rel_err eager {eager:.2e}, replayed {replayed:.2e}")
        except Exception as e:
            report(what, False, f"{type(e).__name__}: {e}".splitlines()[0])
    for workload, n, k in (("gemm_ag", 1536, 1024), ("gemm_rs", 1024, 1536)):
        what = f"sp_baseline nccl_symm {workload}"
        try:
            point = Point("smoke", "custom", None, 1, "bf16", 1, 0, (1023,), "sp_baseline", {"nccl_symm": True},
                          workload, Gemm(n, k))
            mctx, mx = micro.build(rt, point, torch.bfloat16, 2048)
            mref = micro.reference(workload, 1023, n, k, 1, 0, torch.bfloat16, rt.device)[0]
            step = strategies.get("sp_baseline").build(mctx, {"nccl_max_ctas": DEFAULT, "nccl_symm": True})
            err = max(rel_err(step.to_full(step.forward(mx)), mref),
                      rel_err(step.to_full(graph_replay(lambda s=step, x=mx: s.forward(x))), mref))
            report(what, err < 1e-2, f"rel_err {err:.2e}")
        except Exception as e:
            report(what, False, f"{type(e).__name__}: {e}".splitlines()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="keep NCCL's tuning log in this folder")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port)}.items():
        os.environ.setdefault(name, value)
    rt = runtime.init(timeout_s=120, nccl_tuning_log=True)
    failures = []

    def report(what: str, ok: bool, detail: str) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {detail}", flush=True)
        if not ok:
            failures.append(what)

    print(f"overlapbench env nccl_windows: {environment.nccl_windows()}")
    print(f"versions: {environment.versions()}")
    unavailable = rt.nccl_windows_unavailable()
    report("windows can be registered here", unavailable is None, unavailable or "yes")
    if unavailable is None:
        collectives(rt, report)
        layers(rt, report)
    log = rt.tuning_log
    if log is None:
        print(f"NCCL tuning log: off ({'no NCCL here' if rt.backend != 'nccl' else 'NCCL_DEBUG* set by you'})")
    else:
        launches = log.since(0)
        kinds = Counter((x.op, x.kernel, x.channels) for x in launches)
        print(f"NCCL tuning log {log.path}: {len(launches)} launches logged "
              "(world size 1: NCCL copies locally and logs none, as expected)")
        for (op, kernel, channels), n in sorted(kinds.items()):
            print(f"  {n:5d} x {op} -> {kernel} on {channels} channels")
        text = log.path.read_text() if log.path.exists() else ""
        print("  last lines:\n" + "\n".join("    " + line for line in text.splitlines()[-5:]))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            shutil.copy(log.path, args.out / "nccl-tuning.log")
    print(f"smoke nccl_symm: {'FAILED: ' + ', '.join(failures) if failures else 'all checks passed'}")
    torch.distributed.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
