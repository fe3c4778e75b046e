"""Attention of a split against whole-sequence attention, on one GPU, through overlapbench's own
attention path (overlapbench/model/attention.py).

    python tests/benchmarks/attention_split.py --out bench-attention.jsonl

For each model's per-rank head counts at TP=2, token count and cut (token_split's aligned
half, and ISO's FLOP-balanced ratio), it times: `whole` (one causal call over all tokens),
`first` (chunk 1: a causal square call), `second` (chunk 2: its prefix call + its own causal
call + the log-sum-exp merge) and `store` (chunk 1's K/V into the KV buffer), each replayed
from a CUDA graph, per kernel (`--kernels`: cudnn is the pick on Hopper; sdpa is the old path,
one lower-right SDPA call with K/V repeated). TFLOP/s counts the (query, key) pairs the causal
mask keeps: 4 * heads * head_dim FLOPs each. `split/whole` = (first + second) / whole.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `kernels` and `overlapbench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from overlapbench.launch.environment import git_commit
from overlapbench.model import attention, attention_kernels
from overlapbench.model.chunks import KVBuffer, prefix_suffix, token_range, whole_batch
from overlapbench.model.models import preset
from overlapbench.overlap.balance import balanced_ratio
from overlapbench.strategies import iso
from overlapbench.strategies.token_split import split_point
from overlapbench.timing.bench import bench
from overlapbench.timing.cuda_graph import capture
from overlapbench.tuning.results import RunLog

TP = 2


def batch(text: str) -> tuple[int, ...]:
    if "x" in text:
        count, length = (int(x) for x in text.split("x"))
        return (length,) * count
    return tuple(int(x) for x in text.split("+"))


def parse_args() -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",")]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="JSON lines, one per (model, tokens, cut, kernel)")
    p.add_argument("--models", type=lambda s: s.split(","), default=["llama3-70b", "llama3-8b"])
    p.add_argument("--tokens", type=ints, default=[1024, 2048, 4096, 8192, 16384, 32768])
    p.add_argument("--batches", type=lambda s: [batch(b) for b in s.split(";") if b],
                   default=[batch("16x512"), batch("8x2048"), batch("2048+2048+4096"), batch("300+700+77+1000")],
                   help="batches, iso-cut: '16x512' (16 sequences of 512) or '2048+2048+4096'")
    p.add_argument("--kernels", type=lambda s: s.split(","), default=["cudnn", "sdpa"])
    p.add_argument("--align", type=int, default=64, help="cut alignment, as the strategies' align knob")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    return p.parse_args()


def timed_graph(fn, iters: int, warmup: int) -> tuple[float, float, float]:
    """(median, p10, p90) ms of one replay of fn captured as a CUDA graph (on CPU, of fn: a
    smoke test of the script, not a measurement)."""
    if torch.cuda.is_available():
        timed = bench(capture(fn, warmup=1).replay, 0.0, 0.0, warmup=warmup, iters=iters,
                      before_loop=lambda: torch.cuda._sleep(1_000_000))  # the CPU queues ahead: no launch gap is timed
    else:
        timed = bench(fn, 0.0, 0.0, iters=iters)
    ms = torch.tensor(timed.samples_ms)
    return ms.median().item(), ms.quantile(0.1).item(), ms.quantile(0.9).item()


def use_kernel(name: str) -> None:
    os.environ[attention_kernels.ENV] = name  # select() checks each kernel once, then keeps it


def split_of(seq_lens: tuple[int, ...], cut: str, align: int, model: str, dev):
    """(first, second, order, first tokens): token_split's aligned half of the flattened batch,
    or ISO's cut of every sequence at the FLOP-balanced ratio."""
    n = sum(seq_lens)
    if cut == "half":
        c = split_point(n, align)
        return token_range(seq_lens, 0, c, dev), token_range(seq_lens, c, n, dev), torch.arange(n, device=dev), c
    prefix = iso.cuts(seq_lens, balanced_ratio(preset(model), TP, seq_lens), align)
    first, second, order = prefix_suffix(seq_lens, prefix, dev)
    return first, second, (torch.arange(n, device=dev) if order is None else order), first.size


def pairs_of(chunk) -> int:
    """(query, key) pairs a causal mask keeps for a chunk's rows (their earlier positions included)."""
    return sum(s.length * s.start + s.length * (s.length + 1) // 2 for s in chunk.segments)


def bench_point(model: str, seq_lens: tuple[int, ...], cut_name: str, kernel: str, args, meta: dict) -> dict:
    shape = preset(model)
    hq, hkv, d = shape.heads // TP, shape.kv_heads // TP, shape.head_dim
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    n = sum(seq_lens)
    g = torch.Generator(device=dev).manual_seed(n)
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=g, device=dev).to(dtype)
    first, second, order, cut = split_of(seq_lens, cut_name, args.align, model, dev)
    whole = whole_batch(seq_lens, dev)
    laid = qkv[order]  # the split's layout (natural for token_split)

    def heads(t):  # q, k contiguous, v a strided view, as the layer makes them
        q = t[:, : hq * d].reshape(-1, hq, d).contiguous()
        return q, t[:, hq * d : (hq + hkv) * d].reshape(-1, hkv, d).contiguous(), t[:, (hq + hkv) * d :].view(-1, hkv, d)

    natural, split = heads(qkv), heads(laid)
    kv = KVBuffer(n, hkv, d, dtype, dev)
    outs = [torch.empty(c.size, hq * d, dtype=dtype, device=dev) for c in (whole, first, second)]

    def run(i, c, src):
        q, k, v = (t[c.rows] for t in src)
        return lambda: attention.causal_attention(c.attention, q, k, v, kv.k, kv.v, out=outs[i])

    use_kernel(kernel)
    store = lambda: kv.store(first, split[1][first.rows], split[2][first.rows])
    store()
    with attention.recording() as ran:
        run(1, first, split)(), run(2, second, split)()
    run(0, whole, natural)()
    got = torch.empty_like(outs[0])
    got[order] = torch.cat([outs[1], outs[2]])
    rel_err = ((got.float() - outs[0].float()).norm() / outs[0].float().norm()).item()
    parts = {"whole": (run(0, whole, natural), pairs_of(whole)), "first": (run(1, first, split), pairs_of(first)),
             "second": (run(2, second, split), pairs_of(second)), "store": (store, 0)}
    row = dict(meta, model=model, heads=hq, kv_heads=hkv, tokens=n, batch=list(seq_lens), cut=cut_name,
               first_tokens=cut, kernel=kernel, ran=attention.describe(ran), rel_err_split_vs_whole=rel_err)
    for name, (fn, p) in parts.items():
        med, p10, p90 = timed_graph(fn, args.iters, args.warmup)
        row[f"{name}_ms"], row[f"{name}_p10_ms"], row[f"{name}_p90_ms"] = med, p10, p90
        row[f"{name}_tflops"] = 4 * hq * d * p / (med * 1e-3) / 1e12 if p else None
    row["split_over_whole"] = (row["first_ms"] + row["second_ms"]) / row["whole_ms"]
    return row


def label(seq_lens: tuple[int, ...]) -> str:
    if len(seq_lens) == 1:
        return str(seq_lens[0])
    return f"{len(seq_lens)}x{seq_lens[0]}" if len(set(seq_lens)) == 1 else "+".join(map(str, seq_lens))


def main() -> None:
    args = parse_args()
    log = RunLog(args.out, git_commit())
    import triton

    cuda = torch.cuda.is_available()
    meta = dict(bench="attention", tp=TP, dtype="bfloat16" if cuda else "float32",
                device=torch.cuda.get_device_name() if cuda else "cpu",
                torch=torch.__version__, triton=triton.__version__, cudnn=torch.backends.cudnn.version(),
                iters=args.iters, align=args.align)
    print(f"{meta['device']}, torch {meta['torch']}, cuDNN {meta['cudnn']}; ms median of {args.iters} graph replays")
    header = f"{'model':<11} {'tokens':>16} {'cut':<9} {'kernel':<6} {'whole':>8} {'first':>8} {'second':>8} {'store':>7} " \
             f"{'split/w':>7} {'TF/s w':>7} {'TF/s 2nd':>8} {'rel_err':>8}  ran"
    lines = []
    for model in args.models:
        points = [((n,), cut) for n in args.tokens for cut in ("half", "balanced")]
        points += [(seq_lens, "balanced") for seq_lens in args.batches]
        for seq_lens, cut_name in points:
            for kernel in args.kernels:
                try:
                    row = bench_point(model, seq_lens, cut_name, kernel, args, meta)
                except Exception as e:
                    row = dict(meta, model=model, tokens=sum(seq_lens), batch=list(seq_lens), cut=cut_name, kernel=kernel,
                               error=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
                log.write(row)
                what = f"{model:<11} {label(seq_lens):>16} {cut_name:<9} {kernel:<6}"
                if "error" in row:
                    line = f"{what} FAILED {row['error']}"
                else:
                    line = (f"{what} {row['whole_ms']:8.3f} {row['first_ms']:8.3f} {row['second_ms']:8.3f} "
                            f"{row['store_ms']:7.3f} {row['split_over_whole']:7.2f} {row['whole_tflops']:7.0f} "
                            f"{row['second_tflops']:8.0f} {row['rel_err_split_vs_whole']:8.1e}  {row['ran']}")
                print(line, flush=True)
                lines.append(line)
            torch.cuda.empty_cache()
    print("\n" + header)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
