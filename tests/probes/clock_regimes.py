"""How long must each candidate run, per round, for interleaved timing to measure the sustained
clock regime? One GPU, no communication.

    python tests/probes/clock_regimes.py --out $OUT

Two CUDA graphs of bf16 GEMM chains, A (`--a-len` GEMMs) and B (`--b-len` of the same GEMM), so
the true B/A is close to b_len/a_len. Their ratio is measured
  (i)  sequentially: runs of >= `--seq-s` seconds each, in ABBA order, before and after the rest;
  (ii) interleaved: rounds in which each candidate replays back to back for a span of S ms, in a
       fresh random order, the next round queued before the host waits on the last one, so the GPU
       never idles; S from `--spans`, each span twice (ascending, then descending pass).
Per span: the median over rounds of B/A in the same round, its 95% bootstrap interval, the
per-round spread, and the two passes' medians; the sustained ratio is the one of the long runs.
A background thread samples the SM clock (tests/probes/clock_sampler.py: pynvml, if installed) so the
regimes can be told apart.
Writes probe_clock.json (summary + raw per-round ratios) under --out; prints a table last.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from overlapbench.launch.environment import git_commit
from overlapbench.timing.bench import CudaClock, bench, timed_span, warm_up
from overlapbench.timing.cuda_graph import capture
from overlapbench.tuning.results import new_run_id
from tests.probes.clock_sampler import ClockSampler


def parse_args() -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",")]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for probe_clock.json")
    p.add_argument("--m", type=int, default=2048, help="GEMM rows (tokens)")
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--k", type=int, default=8192)
    p.add_argument("--a-len", type=int, default=8, help="GEMMs in graph A")
    p.add_argument("--b-len", type=int, default=7, help="GEMMs in graph B")
    p.add_argument("--spans", type=ints, default=[10, 25, 50, 100, 200, 400], help="ms per candidate per round")
    p.add_argument("--span-budget-s", type=float, default=5.0, help="wall seconds per span (both passes)")
    p.add_argument("--seq-s", type=float, default=1.0, help="seconds of one sequential run")
    p.add_argument("--seq-pairs", type=int, default=3, help="ABBA blocks per sequential phase (2 pairs each)")
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def build(length: int, m: int, n: int, k: int, dev) -> tuple[torch.cuda.CUDAGraph, list]:
    """A graph of `length` GEMMs (m x k) @ (k x n) into separate outputs; buffers kept alive."""
    g = torch.Generator(device=dev).manual_seed(1234 + length)
    a = torch.randn(m, k, generator=g, device=dev).to(torch.bfloat16)
    w = torch.randn(k, n, generator=g, device=dev).to(torch.bfloat16) / math.sqrt(k)
    outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(2)]

    def chain():
        for i in range(length):
            torch.matmul(a, w, out=outs[i % 2])

    return capture(chain, warmup=2), [a, w, outs]


def per_replay_ms(graph, seconds: float) -> float:
    """Replays for `seconds` (the host waiting every 4), and the mean ms of one."""
    return warm_up(graph.replay, 4, seconds * 1e3, CudaClock())


def timed_run(graph, count: int) -> tuple[float, list[float]]:
    """`count` back-to-back replays after an idle host sync: mean ms and per-replay ms."""
    each = bench(graph.replay, 0.0, 0.0, iters=count, clock=CudaClock()).samples_ms
    return statistics.fmean(each), each


def sequential(graphs, per_ms, seq_s: float, pairs: int, sampler) -> dict:
    """ABBA blocks of long runs; the ratio of each adjacent (A, B) pair; plus the settling profile."""
    ratios, profile, clocks = [], {"A": [], "B": []}, {"A": [], "B": []}
    for _ in range(pairs):
        block = {}
        for name in ("A", "B", "B", "A"):
            count = max(1, math.ceil(seq_s * 1e3 / per_ms[name]))
            t0 = time.perf_counter()
            mean, each = timed_run(graphs[name], count)
            clocks[name].append(sampler.between(t0, time.perf_counter()).get("sm_mhz"))
            block.setdefault(name, []).append(mean)
            profile[name].append(each)
        ratios += [block["B"][0] / block["A"][0], block["B"][1] / block["A"][1]]
    return {"ratios": ratios, "profile": profile, "clocks": clocks}


def interleaved(graphs, per_ms, span_ms: float, rounds: int, rng: random.Random) -> list[float]:
    """Per-round B/A: each round replays every candidate for `span_ms` in a fresh random order;
    round r+1 is queued before the host waits on round r, so the GPU never idles."""
    names = list(graphs)
    counts = {nm: max(1, round(span_ms / per_ms[nm])) for nm in names}
    clock, pending, ratios = CudaClock(), None, []

    def enqueue():  # the spans are bench.timed_span's; read a round later, so not bench.bench
        order = names[:]
        rng.shuffle(order)
        return order, [timed_span(clock, graphs[nm].replay, counts[nm]) for nm in order]

    def collect(order, spans):
        clock.wait(spans[-1][1])
        ms = {nm: clock.elapsed_ms(*span) / counts[nm] for nm, span in zip(order, spans)}
        ratios.append(ms["B"] / ms["A"])

    torch.cuda.synchronize()
    for _ in range(rounds):
        queued = enqueue()
        if pending is not None:
            collect(*pending)
        pending = queued
    collect(*pending)
    return ratios


def bootstrap_ci(xs: list[float], rng: random.Random, n: int = 2000) -> tuple[float, float]:
    if len(xs) < 2:
        return (xs[0], xs[0])
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def settling(profiles: list[list[float]]) -> dict:
    """Mean per-replay ms in windows of time since the run started, relative to the last window."""
    edges = [0, 10, 25, 50, 100, 200, 400, 700, 1e9]
    sums = [[0.0, 0] for _ in edges[:-1]]
    for each in profiles:
        t = 0.0
        for ms in each:
            mid = t + ms / 2
            for j in range(len(edges) - 1):
                if edges[j] <= mid < edges[j + 1]:
                    sums[j][0] += ms
                    sums[j][1] += 1
            t += ms
    means = [s / c if c else None for s, c in sums]
    last = next(m for m in reversed(means) if m is not None)
    return {f"{int(edges[j])}-{'end' if edges[j + 1] > 1e8 else str(int(edges[j + 1])) + 'ms'}":
            (None if means[j] is None else means[j] / last) for j in range(len(means))}


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    rng = random.Random(args.seed)
    t_start = time.perf_counter()
    sampler = ClockSampler(0).start()
    graphs, keep = {}, []
    for name, length in (("A", args.a_len), ("B", args.b_len)):
        graphs[name], bufs = build(length, args.m, args.n, args.k, dev)
        keep.append(bufs)
    per_replay_ms(graphs["A"], args.warmup_s)  # clocks to a steady load first
    per_ms = {nm: per_replay_ms(g, 0.3) for nm, g in graphs.items()}

    seq_before = sequential(graphs, per_ms, args.seq_s, args.seq_pairs, sampler)
    spans = {s: [] for s in args.spans}
    passes = {s: [] for s in args.spans}
    span_clock = {s: [] for s in args.spans}
    for order in (args.spans, list(reversed(args.spans))):
        for span in order:
            rounds = max(6, math.ceil(args.span_budget_s / 2 * 1e3 / (span * len(graphs))))
            t0 = time.perf_counter()
            got = interleaved(graphs, per_ms, span, rounds, rng)
            span_clock[span].append(sampler.between(t0, time.perf_counter()).get("sm_mhz"))
            spans[span] += got
            passes[span].append(statistics.median(got))
    seq_after = sequential(graphs, per_ms, args.seq_s, args.seq_pairs, sampler)
    sampler.stop()

    seq_ratios = seq_before["ratios"] + seq_after["ratios"]
    seq_med = statistics.median(seq_ratios)
    rows = []
    for span in args.spans:
        xs = spans[span]
        lo, hi = bootstrap_ci(xs, rng)
        med = statistics.median(xs)
        clocks = [c for c in span_clock[span] if c is not None]
        rows.append({"span_ms": span, "rounds": len(xs), "ratio": med, "ci": [lo, hi],
                     "sd_round": statistics.stdev(xs) if len(xs) > 1 else 0.0, "passes": passes[span],
                     "vs_long": med / seq_med - 1, "sm_mhz": statistics.fmean(clocks) if clocks else None,
                     "ratios": xs})
    seq_clocks = [c for ph in (seq_before, seq_after) for nm in "AB" for c in ph["clocks"][nm] if c is not None]
    summary = {
        "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
        "gemm": [args.m, args.n, args.k], "a_len": args.a_len, "b_len": args.b_len,
        "per_replay_ms": per_ms, "clock_rate_mhz": _clock_rate(dev), "nvml_error": sampler.error,
        "sequential": {"ratios_before": seq_before["ratios"], "ratios_after": seq_after["ratios"],
                       "median": seq_med, "sd": statistics.stdev(seq_ratios),
                       "sm_mhz": statistics.fmean(seq_clocks) if seq_clocks else None,
                       "settling_A": settling(seq_before["profile"]["A"] + seq_after["profile"]["A"]),
                       "settling_B": settling(seq_before["profile"]["B"] + seq_after["profile"]["B"])},
        "interleaved": rows, "wall_s": time.perf_counter() - t_start,
    }
    summary = {"run_id": new_run_id(), "git": git_commit()} | summary
    (args.out / "probe_clock.json").write_text(json.dumps(summary, indent=1) + "\n")

    print(f"{summary['device']}; GEMM {args.m}x{args.n}x{args.k} bf16; A = {args.a_len} GEMMs "
          f"({per_ms['A']:.3f} ms), B = {args.b_len} ({per_ms['B']:.3f} ms); clock_rate {summary['clock_rate_mhz']} MHz"
          f"{'' if sampler.error is None else '; nvml: ' + sampler.error}; {summary['wall_s']:.0f} s")
    st = summary["sequential"]
    print("settling of long runs (per-replay ms / last window), A: "
          + ", ".join(f"{k} {v:.4f}" for k, v in st["settling_A"].items() if v is not None))
    print(f"{'mode':<18} {'rounds':>6} {'B/A':>8} {'95% CI':>19} {'sd/round':>9} {'passes':>17} "
          f"{'vs long':>8} {'SM MHz':>7}")
    allseq = ", ".join(f"{r:.4f}" for r in seq_ratios)
    mhz = lambda v: "" if v is None else f"{v:.0f}"
    print(f"{'long runs ' + str(args.seq_s) + ' s':<18} {len(seq_ratios):>6} {seq_med:8.4f} {'':>19} "
          f"{st['sd']:9.4f} {'':>17} {'':>8} {mhz(st['sm_mhz']):>7}   ({allseq})")
    for r in rows:
        print(f"{'span ' + str(r['span_ms']) + ' ms':<18} {r['rounds']:>6} {r['ratio']:8.4f} "
              f"[{r['ci'][0]:.4f}, {r['ci'][1]:.4f}] {r['sd_round']:9.4f} "
              f"{', '.join(f'{p:.4f}' for p in r['passes']):>17} {r['vs_long']:+8.2%} {mhz(r['sm_mhz']):>7}")


def _clock_rate(dev):
    try:
        return torch.cuda.clock_rate(dev)
    except Exception:
        return None


if __name__ == "__main__":
    main()
