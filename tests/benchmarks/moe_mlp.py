"""The MoE MLP of one TP rank (overlapbench/model/moe.py) against a dense FFN of the same active FLOPs,
on one GPU: what routing, sorting and the grouped GEMMs cost beyond the arithmetic.

    python tests/benchmarks/moe_mlp.py --out $OUT/bench-moe.jsonl

For each preset's rank-0 shard at `--tp` and each token count it times, from CUDA-graph replays
(which also shows the path captures), `moe` (router, top-k, sort, two grouped GEMMs, weighted
sum), `experts` (the two grouped GEMMs and SwiGLU alone, on a fixed routing), and `dense` (one
FFN of width top_k * expert_ffn / tp: the same GEMM FLOPs in two plain GEMMs). TFLOP/s counts
the experts' GEMM FLOPs: 2 * tokens * top_k * 3 * hidden * expert_ffn / tp. The last lines
printed are a table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `kernels` and `overlapbench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from overlapbench.launch.environment import git_commit
from overlapbench.model import moe
from overlapbench.model.activation import swiglu
from overlapbench.model.models import preset
from overlapbench.model.weights import build_stack
from overlapbench.timing.bench import bench
from overlapbench.tuning.results import RunLog


def parse_args() -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",")]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="JSON lines, one per (model, tokens, path)")
    p.add_argument("--models", type=lambda s: s.split(","), default=["mixtral-8x7b", "qwen3-30b-a3b"])
    p.add_argument("--tokens", type=ints, default=[1, 64, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    return p.parse_args()


def time_graph(fn, iters: int) -> float:
    """Median ms (the upper one of an even count) of one replay of fn's CUDA graph, each replay
    from an idle GPU."""
    timed = bench(fn, 0.0, 0.0, graphs=True, iters=iters, before_each=torch.cuda.synchronize)
    return statistics.median_high(timed.samples_ms)


def point_rows(model: str, tokens: int, tp: int, iters: int) -> list[dict]:
    shape = preset(model)
    w = build_stack(shape, 1, tp, 0, torch.bfloat16, torch.device("cuda")).layers[0]
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, shape.hidden, generator=g, device="cuda").bfloat16()
    out = torch.empty_like(x)
    f = shape.expert_ffn // tp
    width = shape.top_k * f
    dense_up = torch.randn(2 * width, shape.hidden, device="cuda").bfloat16() * shape.hidden**-0.5
    dense_down = torch.randn(shape.hidden, width, device="cuda").bfloat16() * width**-0.5

    # A fixed routing for the experts alone: the sorted rows and offsets moe_partial would make.
    _, chosen = moe.route(x, w.router, shape.top_k)
    flat = chosen.flatten()
    order = flat.argsort(stable=True)
    offsets = torch.bincount(flat, minlength=shape.experts).cumsum(0).to(torch.int32)
    rows = x[order // shape.top_k].contiguous()

    paths = {
        "moe": lambda: moe.moe_partial(x, w.router, w.w_gate_up, w.w_down, shape.top_k, out=out),
        "experts": lambda: moe.grouped_mm(swiglu(moe.grouped_mm(rows, w.w_gate_up, offsets)), w.w_down, offsets),
        "dense": lambda: torch.matmul(swiglu(x @ dense_up.t()), dense_down.t(), out=out),
    }
    flops = 2 * tokens * shape.top_k * 3 * shape.hidden * f
    result = []
    for path, fn in paths.items():
        ms = time_graph(fn, iters)
        result.append({"model": model, "tp": tp, "tokens": tokens, "path": path, "ms": ms, "tflops": flops / ms / 1e9})
    return result


def main() -> None:
    args = parse_args()
    log = RunLog(args.out, git_commit())
    rows = []
    for model in args.models:
        for tokens in args.tokens:
            rows += [log.write(row) for row in point_rows(model, tokens, args.tp, args.iters)]
            torch.cuda.empty_cache()
    print(f"{'model':<15} {'tokens':>6} {'moe ms':>8} {'experts ms':>10} {'dense ms':>8} {'moe TF/s':>8} {'moe/dense':>9}")
    for model in args.models:
        for tokens in args.tokens:
            r = {row["path"]: row for row in rows if row["model"] == model and row["tokens"] == tokens}
            m, e, d = r["moe"], r["experts"], r["dense"]
            ratio = m["ms"] / d["ms"]
            print(f"{model:<15} {tokens:>6} {m['ms']:>8.3f} {e['ms']:>10.3f} {d['ms']:>8.3f} {m['tflops']:>8.1f} {ratio:>9.2f}")


if __name__ == "__main__":
    main()
