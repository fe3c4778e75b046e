"""The decode kernels of a mixed batch, on one GPU: each candidate of
attention_kernels.DECODE_PATHS (flash_decode, cudnn_decode, sdpa_decode), checked against the
float32 reference and timed from a CUDA graph, for each model's per-rank heads at TP=2, decode
tokens and context. Which one overlapbench picks is the first that passes its check, in that
order; this says whether that order is also the fastest.

    python tests/benchmarks/decode_attention.py --out $OUT/bench-decode.jsonl

GB/s counts the K and V bytes read (tokens x (context + 1) x kv_heads x head_dim x 2 x 2 bytes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `kernels` and `overlapbench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from overlapbench.launch.environment import git_commit
from overlapbench.model import attention_kernels
from overlapbench.model.models import preset
from overlapbench.timing.bench import bench
from overlapbench.tuning.results import RunLog

TP = 2


def replay_ms(fn, tensors, iters: int) -> float:
    """Milliseconds per call of fn(*tensors), replayed from a CUDA graph: one sample of `iters`
    replays back to back."""
    return bench(lambda: fn(*tensors), 0.0, 0.0, graphs=True, iters=1, calls_per_sample=iters).samples_ms[0]


def main() -> None:
    ints = lambda s: [int(x) for x in s.split(",")]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--models", type=lambda s: s.split(","), default=["llama3-70b", "llama3-8b"])
    p.add_argument("--tokens", type=ints, default=[64, 128, 256, 512])
    p.add_argument("--contexts", type=ints, default=[4096])
    p.add_argument("--iters", type=int, default=50)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_decode: needs a CUDA GPU")
    log = RunLog(args.out, git_commit())
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for model in args.models:
        shape = preset(model)
        hq, hkv, d = shape.heads // TP, shape.kv_heads // TP, shape.head_dim
        for context in args.contexts:
            for n in args.tokens:
                q = torch.randn(n, hq, d, generator=g, device="cuda").bfloat16()
                k = torch.randn(n, context + 1, hkv, d, generator=g, device="cuda").bfloat16()
                v = torch.randn(n, context + 1, hkv, d, generator=g, device="cuda").bfloat16()
                ref = attention_kernels.decode_reference(q, k, v).float()
                for name, fn in attention_kernels.DECODE_PATHS.items():
                    row = {"model": model, "heads": hq, "kv_heads": hkv, "tokens": n, "context": context, "path": name}
                    try:
                        out = fn(q, k, v).float()
                        row["rel_err"] = ((out - ref).norm() / ref.norm()).item()
                        row["ms"] = replay_ms(fn, (q, k, v), args.iters)
                        row["gb_s"] = 2 * k.numel() * k.element_size() / row["ms"] / 1e6
                    except Exception as e:  # a path this torch or GPU cannot run
                        row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                    rows.append(log.write(row))
    print(f"{'model':<12} {'tokens':>6} {'context':>7} {'path':<13} {'ms':>8} {'GB/s':>7} {'rel_err':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<12} {r['tokens']:>6} {r['context']:>7} {r['path']:<13} {r['error'][:60]}")
        else:
            print(f"{r['model']:<12} {r['tokens']:>6} {r['context']:>7} {r['path']:<13} {r['ms']:>8.4f} "
                  f"{r['gb_s']:>7.0f} {r['rel_err']:>8.1e}")


if __name__ == "__main__":
    main()
