"""Does compute run faster between idle gaps than back to back, because the power drawn falls in
the gaps and the SM clock rises? One process, one GPU (torch's device 0), no torch.distributed,
no communication, no multicast (NCCL_NVLS_ENABLE, TORCH_SYMM_MEM_DISABLE_MULTICAST and
NVSHMEM_DISABLE_NVLS are left as the environment sets them, and recorded).

    python tests/probes/gaps_beside.py --out $OUT

Why: in the CUDA-graph profiles of llama3-70b at TP=4 on 4x H200 (16K-32K tokens) the layer's
GEMMs took a median 3.5% and its attention 5.1% less time in `baseline` (a blocking NCCL all-reduce
after the attention and after the MLP, the SMs nearly idle meanwhile) than in `no_comm` (the same
compute back to back: docs/predict.md, "The baselines' compute"); at those sizes the GEMMs run
at the 700 W power cap (SM clock ~1410-1440 MHz, not 1980). `predict` times the compute as a
back-to-back chain, so it over-charges the baseline if the gaps make the compute between them
faster. This probe asks that on one GPU.

A pass is one rank's shard of the llama3-70b TP=4 layer's GEMMs at `--tokens` rows, bf16: qkv
(x 8192 @ 8192 x 2560), attn_out (x 2048 @ 2048 x 8192), gate_up (x 8192 @ 8192 x 14336), down
(x 7168 @ 7168 x 8192); `--shapes` names some of them or gives others ('m,k,n'). A condition is a
gap fraction g of `--gaps`: g = 0, the passes back to back; g > 0, after each pass the stream idles
for g / (1 - g) of the pass's time measured alone (back to back, after the warm-up), so that the
gap is a share g of the period. The gap is made on the GPU by torch.cuda._sleep(cycles), queued
behind the pass like any kernel, so the host never leaves the GPU starved: `_sleep` is one tiny
kernel spinning on the SM clock counter, occupying one SM and drawing near-idle power, roughly what
NCCL's ring kernel on a few CTAs does during a bandwidth-bound all-reduce (approximately: the ring
also moves data over NVLink and through HBM). Its cycles count SM clock cycles, so the cycles per ms
are calibrated once at the start with CUDA events, on `_sleep`s queued right after GEMM passes (in
the clock regime of a gap), and recorded; each window records the gap share it actually got.

Each condition is held for `--settle-s` (the clocks reach the sustained regime of the load and
NVML's one-second power average follows it), then measured for `--measure-s`; the host keeps the
queue `--ahead-ms` deep (tests/probes/power_beside.py's hold loop). Rounds run every condition once
in a fresh random order, so a drift of the card cancels in each round's pairs. Per window: the
GEMMs' TFLOP/s between CUDA events around each pass's GEMMs only (the gaps not counted), the gap
share got, and the SM clock and power from NVML samples over the same span of host time
(tests/probes/clock_sampler.py; means over the window, gaps included). Per condition: medians and
spreads over rounds, and the GEMMs' TFLOP/s, SM clock and power relative to g = 0 in the same round.

Rows (a setup row with the shapes and the calibration, one per window, one per condition; each with
run_id and git) go to $OUT/gaps_beside.jsonl; a table is printed last. The defaults (4 conditions x
5 rounds x (2 s + 2 s), 3 s of warm-up) take about 85 s of GPU time, inside the 150 s of
tests/checks/predict_gpu.sh's `gaps` step with torch's start.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from overlapbench.model.models import PRESETS
from tests.probes.clock_sampler import window_means
from tests.probes.power_beside import Lane, check_spans, hold, paired_ratios, round_orders, span_in_window, spread

MODEL, TP = "llama3-70b", 4  # the layer whose one rank's GEMMs make a pass
BASE = 0.0  # the gap fraction every other condition is paired with, round by round: back to back
DEFAULT_SHAPES = "qkv,attn_out,gate_up,down"
CALIBRATION_MHZ = 1500.0  # a guess of the clock in a gap, to size the calibration's _sleep near the gaps' length
NCCL_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


@dataclass(frozen=True)
class Gemm:
    """One GEMM of a pass: (m x k) @ (k x n), bf16."""

    name: str
    m: int
    k: int
    n: int

    @property
    def mkn(self) -> tuple[int, int, int]:
        return (self.m, self.k, self.n)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n


def layer_gemms(tokens: int, model: str = MODEL, tp: int = TP) -> dict[str, Gemm]:
    """One rank's GEMMs of the model's layer at TP=tp on `tokens` rows, by name, in the layer's order."""
    s = PRESETS[model].shard(tp)
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return {g.name: g for g in (Gemm("qkv", tokens, s.hidden, q + 2 * kv), Gemm("attn_out", tokens, q, s.hidden),
                                Gemm("gate_up", tokens, s.hidden, 2 * s.ffn), Gemm("down", tokens, s.ffn, s.hidden))}


def parse_shapes(text: str, tokens: int) -> list[Gemm]:
    """A pass's GEMMs: parts separated by ';', each either names of the layer's GEMMs at `tokens`
    (comma-separated) or one 'm,k,n' of positive integers; ValueError naming the fix."""
    named = layer_gemms(tokens)
    fix = f"choose from {', '.join(named)} or give 'm,k,n' of positive integers (e.g. {tokens},8192,2560)"
    out: list[Gemm] = []
    for part in (p.strip() for p in text.split(";")):
        items = [x.strip() for x in part.split(",") if x.strip()]
        if items and all(x.lstrip("+-").isdigit() for x in items):
            if len(items) != 3 or min(int(x) for x in items) < 1:
                raise ValueError(f"--shapes: {part!r} is not 'm,k,n' of positive integers; {fix}")
            m, k, n = (int(x) for x in items)
            out.append(Gemm(f"{m}x{k}x{n}", m, k, n))
            continue
        unknown = [x for x in items if x not in named]
        if unknown:
            raise ValueError(f"--shapes: unknown {', '.join(map(repr, unknown))}; {fix}")
        out += [named[x] for x in items]
    if not out:
        raise ValueError(f"--shapes: {text!r} names no GEMM; {fix}")
    return out


def parse_gaps(text: str) -> list[float]:
    """The gap fractions in `text` (comma-separated, each in [0, 1) and once, 0 among them: the
    others are paired with it); ValueError naming the fix."""
    try:
        gaps = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--gaps: {text!r} is not a comma-separated list of numbers (e.g. 0,0.1,0.2,0.3)") from None
    bad = [g for g in gaps if not 0 <= g < 1]
    if bad:
        raise ValueError(f"--gaps: {', '.join(f'{g:g}' for g in bad)} outside [0, 1); a gap fraction is the gap's "
                         "share of the period, 0 (back to back) up to below 1")
    if len(set(gaps)) != len(gaps):
        raise ValueError(f"--gaps: {text!r} names a gap fraction twice; name each once")
    if BASE not in gaps:
        raise ValueError(f"--gaps: {text!r} lacks 0: the other gaps are paired with the passes back to back; add 0")
    return gaps


def gap_ms(fraction: float, pass_ms: float) -> float:
    """The idle time after a pass of `pass_ms` that makes it the share `fraction` of the period."""
    return fraction / (1.0 - fraction) * pass_ms


def gap_cycles(fraction: float, pass_ms: float, cycles_per_ms: float) -> int:
    """torch.cuda._sleep's cycles for that gap (0: none)."""
    return round(gap_ms(fraction, pass_ms) * cycles_per_ms)


def sleep_calibration(gemms, stream, clock, trial_cycles: int, trials: int = 5) -> list[float]:
    """The ms `torch.cuda._sleep(trial_cycles)` took, `trials` times, each queued on `stream` right
    after a pass of `gemms` (comm.contention.GemmStream), in the clock regime a gap meets: its
    cycles count SM clock cycles, so a gap's cycles per ms come from these."""
    import torch

    from overlapbench.timing.bench import timed_span

    sleeps = []
    with torch.cuda.stream(stream):
        for _ in range(trials):
            gemms.run(1)
            sleeps.append(timed_span(clock, lambda: torch.cuda._sleep(trial_cycles)))
    sleeps[-1][1].synchronize()
    return [clock.elapsed_ms(*span) for span in sleeps]


def gemm_window(lane: Lane, spans: list[tuple], t0: float, t1: float, flops: float) -> dict:
    """What the passes completed inside [t0, t1] say (the host saw the first and last complete
    there; those after the first up to the last ran in between): the GEMMs' TFLOP/s by the events
    around each pass's GEMMs (`spans`, in the lane's order), the mean GEMM, gap and period ms, the
    share of the period the GEMMs did not run, and the host span; None values with too few."""
    span = span_in_window(lane.seen, t0, t1)
    if span is None:
        return dict.fromkeys(("passes", "gemm_tflops", "pass_ms", "gap_ms", "period_ms", "gap_share", "host_span"))
    i, j = span
    gemm = [start.elapsed_time(end) for start, end in spans[i + 1:j + 1]]
    gaps = [spans[u][1].elapsed_time(lane.events[u]) for u in range(i + 1, j + 1)]
    period = lane.events[i].elapsed_time(lane.events[j])
    return {"passes": j - i, "gemm_tflops": (j - i) * flops / sum(gemm) / 1e9, "pass_ms": statistics.fmean(gemm),
            "gap_ms": statistics.fmean(gaps), "period_ms": period / (j - i), "gap_share": 1.0 - sum(gemm) / period,
            "host_span": (lane.seen[i], lane.seen[j])}


def window_row(fraction: float, lane: Lane, spans: list[tuple], t0: float, t1: float, samples, flops: float) -> dict:
    """A window's row: gemm_window's numbers, and the SM clock and power over the host span of the
    passes timed (the measured span where too few completed)."""
    row = {"kind": "window", "gap": fraction} | gemm_window(lane, spans, t0, t1, flops)
    clock = window_means(samples, *(row.pop("host_span") or (t0, t1)))
    return row | {"sm_mhz": clock["sm_mhz"], "sm_mhz_min": clock["sm_mhz_min"], "power_w": clock["power_w"],
                  "power_capped": clock["power_capped"], "samples": clock["samples"], "units": len(lane.events),
                  "starved": lane.starved}


PAIRED = ("gemm_tflops", "sm_mhz", "power_w")  # relative to back to back, round by round


def summarize(rounds: list[dict[float, dict]], gaps: list[float]) -> list[dict]:
    """One row per gap fraction: its windows' medians and spreads over rounds, and for g > 0 the
    GEMMs' TFLOP/s, SM clock and power over back to back's in the same round (rounds lacking either skipped)."""
    rows = []
    for g in gaps:
        windows = [r[g] for r in rounds if g in r]
        row: dict = {"kind": "condition", "gap": g, "rounds": len(windows)}
        for key in ("gemm_tflops", "pass_ms", "gap_share", "sm_mhz", "power_w", "power_capped"):
            row[key] = spread([w[key] for w in windows if w.get(key) is not None])
        row["starved_windows"] = sum(1 for w in windows if w.get("starved"))
        if g != BASE:
            for key in PAIRED:
                ratios = paired_ratios(rounds, g, key, base=BASE)
                row[f"{key}_vs_back_to_back"] = spread([x - 1 for x in ratios]) | {"rounds": ratios}
        rows.append(row)
    return rows


def table(rows: list[dict]) -> list[str]:
    """The summary as text lines: per gap fraction the share got, the GEMMs' TFLOP/s and their
    paired change against back to back (median, [min, max] over rounds), SM clock, power."""
    num = lambda v, f: "-" if v is None else format(v, f)
    lines = [f"{'gap':>5} {'got':>6} {'rounds':>6} {'GEMM TFLOP/s':>12} {'vs back to back':>15} {'[min, max]':>17} "
             f"{'SM MHz':>7} {'MHz vs':>7} {'power W':>7} {'capped':>6}"]
    for r in rows:
        vs, mhz = r.get("gemm_tflops_vs_back_to_back", {}), r.get("sm_mhz_vs_back_to_back", {})
        span = "" if vs.get("min") is None else f"[{vs['min']:+.2%}, {vs['max']:+.2%}]"
        lines.append(
            f"{r['gap']:>5.2f} {num(r['gap_share']['median'], '.3f'):>6} {r['rounds']:>6} "
            f"{num(r['gemm_tflops']['median'], '.1f'):>12} {num(vs.get('median'), '+.2%'):>15} {span:>17} "
            f"{num(r['sm_mhz']['median'], '.0f'):>7} {num(mhz.get('median'), '+.2%'):>7} "
            f"{num(r['power_w']['median'], '.0f'):>7} {num(r['power_capped']['median'], '.0%'):>6}")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="folder for gaps_beside.jsonl (appended to); default $OUT")
    p.add_argument("--tokens", type=int, default=16384, help=f"rows of the {MODEL} TP={TP} layer's GEMMs")
    p.add_argument("--shapes", default=DEFAULT_SHAPES,
                   help="a pass's GEMMs: names of the layer's (comma-separated) and/or 'm,k,n', parts separated by ';'")
    p.add_argument("--gaps", default="0,0.1,0.2,0.3", help="gap fractions: each gap's share of the period, in [0, 1); 0 needed")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--settle-s", type=float, default=2.0, help="seconds each condition runs before it is measured")
    p.add_argument("--measure-s", type=float, default=2.0, help="seconds each condition is measured")
    p.add_argument("--warmup-s", type=float, default=3.0, help="seconds of passes back to back before the pass is timed alone")
    p.add_argument("--ahead-ms", type=float, default=40.0, help="work (passes and gaps) kept queued")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def fail(message: str) -> None:
    print(f"gaps_beside: {message}", file=sys.stderr)
    raise SystemExit(2)


def out_folder(args: argparse.Namespace) -> Path:
    """--out, or $OUT without it; ValueError where neither is given."""
    if args.out is None and not os.environ.get("OUT"):
        raise ValueError("--out: no folder given and $OUT is unset; pass --out DIR")
    return args.out or Path(os.environ["OUT"])


def check_numbers(args: argparse.Namespace) -> None:
    """ValueError naming the flag, for counts and spans a run cannot use."""
    for flag, value in (("--tokens", args.tokens), ("--rounds", args.rounds)):
        if value < 1:
            raise ValueError(f"{flag}: {value} is below 1; pass 1 or more")
    check_spans(args)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        check_numbers(args)
        gaps = parse_gaps(args.gaps)
        shapes = parse_shapes(args.shapes, args.tokens)
        out = out_folder(args)
    except ValueError as e:
        fail(str(e))
    import torch

    started = time.perf_counter()
    if not torch.cuda.is_available():
        fail("needs a CUDA GPU and torch sees none: run it on a GPU machine (tests/checks/predict_gpu.sh, STEPS=gaps)")

    from overlapbench.comm.contention import GemmStream
    from overlapbench.launch.environment import git_commit
    from overlapbench.timing.bench import CudaClock, timed_span
    from overlapbench.tuning.results import RunLog
    from tests.probes.clock_sampler import ClockSampler

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    gemms = GemmStream.make(dev, [g.mkn for g in shapes])
    stream, clock = torch.cuda.Stream(dev), CudaClock()

    def lane_for(fraction: float, cycles: int, depth: int) -> tuple[Lane, list[tuple]]:
        """A lane of passes, each followed by a _sleep of `cycles`; the events around each pass's GEMMs."""
        spans: list[tuple] = []

        def enqueue() -> None:
            with torch.cuda.stream(stream):
                spans.append(timed_span(clock, gemms.run))
                if cycles:
                    torch.cuda._sleep(cycles)

        return Lane(f"gap {fraction:g}", enqueue, stream, gemms.flops, depth), spans

    def passes_ms(count: int) -> float:
        with torch.cuda.stream(stream):
            span = timed_span(clock, gemms.run, count)
        span[1].synchronize()
        return clock.elapsed_ms(*span) / count

    passes_ms(2)
    rough_ms = passes_ms(3)
    depth = lambda fraction: min(200, max(2, math.ceil(args.ahead_ms * (1 - fraction) / rough_ms)))
    sampler = ClockSampler(0).start()
    hold([lane_for(BASE, 0, depth(BASE))[0]], args.warmup_s, 0.0)  # into the sustained regime first
    pass_ms = passes_ms(max(5, math.ceil(300 / rough_ms)))  # about 0.3 s back to back: the pass alone

    trial = round(max(1.0, max(gap_ms(g, pass_ms) for g in gaps)) * CALIBRATION_MHZ * 1e3)
    sleep_ms = sleep_calibration(gemms, stream, clock, trial)
    cycles_per_ms = trial / statistics.median(sleep_ms)
    cycles = {g: gap_cycles(g, pass_ms, cycles_per_ms) for g in gaps}
    depths = {g: depth(g) for g in gaps}

    orders = round_orders(gaps, args.rounds, random.Random(args.seed))
    log = RunLog(out / "gaps_beside.jsonl", git_commit())
    wall = args.rounds * len(gaps) * (args.settle_s + args.measure_s)
    device = torch.cuda.get_device_name(dev)
    log.write({"kind": "setup", "device": device, "torch": torch.__version__, "model": MODEL, "tp": TP,
               "tokens": args.tokens, "shapes": [asdict(g) for g in shapes], "pass_flops": gemms.flops,
               "pass_ms_alone": pass_ms, "pass_tflops_alone": gemms.flops / pass_ms / 1e9,
               "calibration": {"trial_cycles": trial, "sleep_ms": sleep_ms, "cycles_per_ms": cycles_per_ms},
               "gap_ms_target": {g: gap_ms(g, pass_ms) for g in gaps}, "gap_cycles": cycles, "depth": depths,
               "orders": orders, "settle_s": args.settle_s, "measure_s": args.measure_s, "warmup_s": args.warmup_s,
               "ahead_ms": args.ahead_ms, "env": {k: os.environ.get(k) for k in NCCL_ENV}, "nvml_error": sampler.error})
    print(f"{len(gaps)} gap fractions x {args.rounds} rounds, about {wall:.0f} s; a pass alone {pass_ms:.3f} ms "
          f"({gemms.flops / pass_ms / 1e9:.1f} TFLOP/s); _sleep {cycles_per_ms / 1e3:.0f} cycles per us after a pass", flush=True)

    rounds: list[dict[float, dict]] = []
    for r, order in enumerate(orders):
        by_gap = {}
        for position, g in enumerate(order):
            lane, spans = lane_for(g, cycles[g], depths[g])
            t0, t1 = hold([lane], args.settle_s, args.measure_s)
            row = window_row(g, lane, spans, t0, t1, sampler.samples, gemms.flops) | {"round": r, "position": position}
            by_gap[g] = log.write(row)
        rounds.append(by_gap)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"gap {g:g} {by_gap[g].get('gemm_tflops') or 0:.1f}" for g in order), flush=True)
    sampler.stop()
    summary = summarize(rounds, gaps)
    for row in summary:
        log.write(row)
    print(f"{device}; a pass: " + ", ".join(f"{g.name} {g.m}x{g.k}x{g.n}" for g in shapes) + " bf16")
    print(f"pass alone {pass_ms:.3f} ms; _sleep {cycles_per_ms / 1e3:.0f} cycles/us (after a pass), gaps "
          + ", ".join(f"{g:g}: {gap_ms(g, pass_ms):.2f} ms" for g in gaps if g))
    print(f"{args.settle_s} s settle + {args.measure_s} s measured per window; {time.perf_counter() - started:.0f} s in all"
          + (f"; nvml: {sampler.error}" if sampler.error else ""))
    print("\n".join(table(summary)))


if __name__ == "__main__":
    main()
