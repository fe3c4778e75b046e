"""Does a transfer that takes no SM slow the compute beside it through the power it draws? One
process, 2 GPUs (torch's devices 0 and 1, peer access), no torch.distributed, no multicast.

    python tests/probes/power_beside.py --out $OUT

The compute is a stream of bf16 GEMMs on GPU 0: a llama3-70b TP=2 MLP pass (`--tokens` x 8192 @
8192 x 28672, then x 14336 @ 14336 x 8192; `--shapes` for others), back to back. A transfer is a
side lane of back-to-back copies of `--copy-mib` MiB buffers, launching no SM kernel:
  peer_pull   GPU 0's copy engines read GPU 1's buffer over NVLink (cuMemcpyAsync on GPU 0's
              side stream, as the copy-engine transfers of the layer pull their peers' rows);
  peer_push   GPU 1's copy engines write GPU 0's buffer over NVLink (`dst.copy_(src_on_gpu1)`:
              torch queues a copy between devices on the source device's stream);
  local       GPU 0's copy engines copy within its own memory (HBM only, no NVLink).
A condition (`--conditions`; CONDITIONS) is the GEMMs alone, the GEMMs with one copy lane beside
them, or a copy lane alone (its own power). Each is held for `--settle-s` (the clocks reach the
sustained regime of the load and NVML's one-second power average follows it), then measured for
`--measure-s`; the host keeps every lane's queue `--ahead-ms` deep, so no lane idles. Rounds run
every condition once in a fresh random order, so a drift of the card cancels in each round's
pairs. Per window: the GEMMs' TFLOP/s and the copies' GB/s between CUDA events of units completed
inside it, and GPU 0's SM clock and power (GPU 1's power) from NVML samples taken over the same
span of host time (tests/probes/clock_sampler.py). Per condition: the medians and spreads over
rounds, and the GEMMs' rate and SM clock beside a lane relative to `gemm` alone in the same round.

Rows (a setup row, one per window, one per condition; each with run_id and git) go to
$OUT/power_beside.jsonl; a table is printed last.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.probes.clock_sampler import window_means

BASE = "gemm"  # the condition every other GEMM condition is paired with, round by round


@dataclass(frozen=True)
class Condition:
    name: str
    gemm: bool  # the GEMM stream runs on GPU 0
    copies: str | None  # the copy lane beside it (COPIES), or None
    what: str


COPIES = ("peer_pull", "peer_push", "local")
CONDITIONS = {c.name: c for c in (
    Condition(BASE, True, None, "the GEMM stream alone on GPU 0"),
    Condition("gemm+peer_pull", True, "peer_pull", "the GEMMs, GPU 0's copy engines pulling from GPU 1 beside them"),
    Condition("gemm+peer_push", True, "peer_push", "the GEMMs, GPU 1's copy engines pushing into GPU 0 beside them"),
    Condition("gemm+local", True, "local", "the GEMMs, GPU 0's copy engines copying within GPU 0 beside them"),
    Condition("peer_pull", False, "peer_pull", "GPU 0's copy engines pulling from GPU 1, nothing else"),
    Condition("peer_push", False, "peer_push", "GPU 1's copy engines pushing into GPU 0, nothing else"),
    Condition("local", False, "local", "GPU 0's copy engines copying within GPU 0, nothing else"),
)}
DEFAULT_CONDITIONS = "gemm,gemm+peer_pull,gemm+peer_push,gemm+local,peer_pull"


def parse_conditions(text: str) -> list[Condition]:
    """The conditions named in `text` (comma-separated, each once); ValueError naming the fix."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONDITIONS]
    if unknown or not names:
        raise ValueError(f"--conditions: unknown {', '.join(map(repr, unknown)) or 'empty list'}; "
                         f"choose from {', '.join(CONDITIONS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--conditions: {text!r} names a condition twice; name each once")
    if any(CONDITIONS[n].gemm for n in names if n != BASE) and BASE not in names:
        raise ValueError(f"--conditions: the GEMM conditions are paired with {BASE!r} (the GEMMs alone); add it")
    return [CONDITIONS[n] for n in names]


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'m,k,n;m,k,n' -> [(m, k, n), ...] (positive ints); ValueError naming the fix."""
    try:
        shapes = [tuple(int(x) for x in part.split(",")) for part in text.split(";") if part.strip()]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise ValueError(f"--shapes: {text!r} is not 'm,k,n;m,k,n' of positive integers (e.g. 16384,8192,28672)")
    return shapes  # type: ignore[return-value]


def round_orders(names: list[str], rounds: int, rng: random.Random) -> list[list[str]]:
    """Each round's order: every condition once, shuffled afresh."""
    orders = []
    for _ in range(rounds):
        order = names[:]
        rng.shuffle(order)
        orders.append(order)
    return orders


def span_in_window(seen: list[float], t0: float, t1: float) -> tuple[int, int] | None:
    """The first and last units whose completion the host saw inside [t0, t1] (`seen` ascending):
    the units after the first up to the last ran in between, back to back. None with fewer than two."""
    inside = [i for i, t in enumerate(seen) if t0 <= t <= t1]
    return (inside[0], inside[-1]) if len(inside) >= 2 else None


def spread(xs: list[float]) -> dict:
    """Median, lowest, highest and (highest - lowest) / median of values over rounds."""
    if not xs:
        return {"median": None, "min": None, "max": None, "rel_spread": None}
    med = statistics.median(xs)
    return {"median": med, "min": min(xs), "max": max(xs), "rel_spread": (max(xs) - min(xs)) / med if med else None}


def paired_ratios(rounds: list[dict[str, dict]], name: str, key: str, base: str = BASE) -> list[float]:
    """Per round, condition `name`'s `key` over `base`'s in the same round (rounds missing either skipped)."""
    out = []
    for by_condition in rounds:
        mine, theirs = by_condition.get(name, {}).get(key), by_condition.get(base, {}).get(key)
        if mine is not None and theirs:
            out.append(mine / theirs)
    return out


def summarize(rounds: list[dict[str, dict]], names: list[str]) -> list[dict]:
    """One row per condition: its windows' medians and spreads over rounds, and for a GEMM
    condition beside a lane its rate and SM clock over the GEMMs alone, paired by round."""
    rows = []
    for name in names:
        windows = [r[name] for r in rounds if name in r]
        row = {"kind": "condition", "condition": name, "rounds": len(windows)}
        for key in ("gemm_tflops", "copy_gbps", "sm_mhz", "power_w", "peer_power_w", "power_capped"):
            row[key] = spread([w[key] for w in windows if w.get(key) is not None])
        row["starved_windows"] = sum(1 for w in windows if w.get("starved"))
        if name != BASE and CONDITIONS[name].gemm:
            for key in ("gemm_tflops", "sm_mhz"):
                ratios = paired_ratios(rounds, name, key)
                row[f"{key}_vs_alone"] = spread([x - 1 for x in ratios])
                row[f"{key}_vs_alone"]["rounds"] = ratios
        rows.append(row)
    return rows


def table(rows: list[dict]) -> list[str]:
    """The summary as text lines: medians, the GEMMs' paired change against `gemm`, clocks, power."""
    num = lambda v, f: "-" if v is None else format(v, f)
    head = (f"{'condition':<16} {'rounds':>6} {'TFLOP/s':>8} {'spread':>7} {'vs alone':>9} {'[min, max]':>17} "
            f"{'SM MHz':>7} {'MHz vs':>7} {'W gpu0':>7} {'W gpu1':>7} {'capped':>6} {'copy GB/s':>9}")
    lines = [head]
    for r in rows:
        vs, mhz_vs = r.get("gemm_tflops_vs_alone", {}), r.get("sm_mhz_vs_alone", {})
        span = "" if vs.get("min") is None else f"[{vs['min']:+.2%}, {vs['max']:+.2%}]"
        lines.append(
            f"{r['condition']:<16} {r['rounds']:>6} {num(r['gemm_tflops']['median'], '.1f'):>8} "
            f"{num(r['gemm_tflops']['rel_spread'], '.2%'):>7} {num(vs.get('median'), '+.2%'):>9} {span:>17} "
            f"{num(r['sm_mhz']['median'], '.0f'):>7} {num(mhz_vs.get('median'), '+.2%'):>7} "
            f"{num(r['power_w']['median'], '.0f'):>7} {num(r['peer_power_w']['median'], '.0f'):>7} "
            f"{num(r['power_capped']['median'], '.0%'):>6} {num(r['copy_gbps']['median'], '.0f'):>9}")
    return lines


# --- on the GPUs -------------------------------------------------------------------------------

@dataclass
class Lane:
    """One stream of back-to-back units: `enqueue` queues one; its completion is an event on `stream`."""

    name: str
    enqueue: Callable[[], None]
    stream: object  # torch.cuda.Stream
    work: float  # FLOPs or bytes of one unit
    depth: int = 2  # units kept queued
    events: list = field(default_factory=list)  # completion events, in order
    enqueued: int = 0  # units queued so far
    seen: list[float] = field(default_factory=list)  # host time each completion was first seen
    starved: int = 0  # polls inside the measured span that found nothing queued


def cuda_mark(stream):
    """A timing event recorded on `stream`: where the work queued on it so far ends."""
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record(stream)
    return event


def hold(lanes: list[Lane], settle_s: float, measure_s: float, mark: Callable = cuda_mark,
         even: Callable[[Lane], int] | None = None) -> tuple[float, float]:
    """Keep every lane `depth` units ahead for settle_s + measure_s of host time, noting when each
    unit's completion (`mark(stream)`'s event) is first seen; then let the queued units finish
    (not counted). Where a lane's units are collectives, each rank's loop stops after its own
    count: `even(lane)` says how many more units this rank queues first so that every rank has
    queued as many (its ranks agree on the largest count). Returns the measured span of host time."""
    start = time.perf_counter()
    t0, t1 = start + settle_s, start + settle_s + measure_s
    queued = {lane.name: deque() for lane in lanes}

    def enqueue(lane: Lane) -> None:
        lane.enqueue()
        lane.enqueued += 1
        queued[lane.name].append(mark(lane.stream))

    while True:
        for lane in lanes:
            q = queued[lane.name]
            while q and q[0].query():
                lane.events.append(q.popleft())
                lane.seen.append(time.perf_counter())
        now = time.perf_counter()
        if now >= t1:
            break
        for lane in lanes:
            q = queued[lane.name]
            if not q and now >= t0:
                lane.starved += 1
            while len(q) < lane.depth:
                enqueue(lane)
        time.sleep(1e-4)
    for lane in lanes:
        for _ in range(even(lane) if even else 0):
            enqueue(lane)
    for q in queued.values():
        for event in q:
            event.synchronize()
    return t0, t1


def lane_rate(lane: Lane, t0: float, t1: float) -> tuple[float | None, tuple[float, float] | None]:
    """Work per second (FLOP/s or B/s) of the lane's units completed inside [t0, t1], by CUDA
    events, and the host span they cover; (None, None) with too few."""
    span = span_in_window(lane.seen, t0, t1)
    if span is None:
        return None, None
    i, j = span
    ms = lane.events[i].elapsed_time(lane.events[j])
    return (j - i) * lane.work / (ms * 1e-3), (lane.seen[i], lane.seen[j])


class DriverCopy:
    """cuMemcpyAsync from the CUDA driver (libcuda): a copy between any two device pointers,
    queued on the given stream and run by that stream's GPU's copy engines; torch only queues a
    copy between devices on the source device's stream."""

    def __init__(self) -> None:
        self._fn = ctypes.CDLL("libcuda.so.1").cuMemcpyAsync
        self._fn.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
        self._fn.restype = ctypes.c_int

    def __call__(self, dst, src, stream) -> None:
        rc = self._fn(dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size(), stream.cuda_stream)
        if rc:
            raise RuntimeError(f"cuMemcpyAsync failed with CUresult {rc}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for power_beside.jsonl (appended to)")
    p.add_argument("--tokens", type=int, default=16384, help="rows of the llama3-70b TP=2 MLP GEMMs")
    p.add_argument("--shapes", help="the GEMMs of one pass instead, 'm,k,n;m,k,n' (bf16)")
    p.add_argument("--copy-mib", type=int, default=256, help="MiB moved by one copy")
    p.add_argument("--conditions", default=DEFAULT_CONDITIONS, help=f"from: {', '.join(CONDITIONS)}")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--settle-s", type=float, default=1.0, help="seconds each condition runs before it is measured")
    p.add_argument("--measure-s", type=float, default=1.0, help="seconds each condition is measured")
    p.add_argument("--warmup-s", type=float, default=2.0, help="seconds of GEMMs before the first round")
    p.add_argument("--ahead-ms", type=float, default=40.0, help="work kept queued on each lane")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def fail(message: str) -> None:
    print(f"power_beside: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_numbers(args: argparse.Namespace) -> None:
    """ValueError naming the flag, for counts and spans a run cannot use."""
    for flag, value, least in (("--tokens", args.tokens, 1), ("--copy-mib", args.copy_mib, 1), ("--rounds", args.rounds, 1)):
        if value < least:
            raise ValueError(f"{flag}: {value} is below {least}; pass {least} or more")
    check_spans(args)


def check_spans(args: argparse.Namespace) -> None:
    """ValueError naming the flag, for the hold loop's spans (--measure-s, --ahead-ms above 0;
    --settle-s, --warmup-s not below 0); the probes that hold lanes share it."""
    for flag, value, positive in (("--measure-s", args.measure_s, True), ("--ahead-ms", args.ahead_ms, True),
                                  ("--settle-s", args.settle_s, False), ("--warmup-s", args.warmup_s, False)):
        if not (value > 0 if positive else value >= 0):
            fix = "not above 0; pass a positive number" if positive else "negative; pass 0 or more"
            raise ValueError(f"{flag}: {value} is {fix}")


def main(argv: list[str] | None = None) -> None:
    from overlapbench.comm.contention import GemmStream, mlp_shapes

    args = parse_args(argv)
    try:
        conditions = parse_conditions(args.conditions)
        shapes = parse_shapes(args.shapes) if args.shapes else mlp_shapes(args.tokens)
        check_numbers(args)
    except ValueError as e:
        fail(str(e))
    import torch

    started = time.perf_counter()
    if torch.cuda.device_count() < 2:
        fail(f"needs 2 GPUs, torch sees {torch.cuda.device_count()}: run it where CUDA devices 0 and 1 are visible")
    peer = any(c.copies in ("peer_pull", "peer_push") for c in conditions)
    if peer and not (torch.cuda.can_device_access_peer(0, 1) and torch.cuda.can_device_access_peer(1, 0)):
        fail("CUDA devices 0 and 1 have no peer access: the peer conditions need two GPUs linked by NVLink")
    pull = None
    if any(c.copies == "peer_pull" for c in conditions):
        try:
            pull = DriverCopy()
        except (OSError, AttributeError) as e:
            fail(f"--conditions: peer_pull needs libcuda's cuMemcpyAsync ({e}); leave the peer_pull conditions out")

    from overlapbench.launch.environment import git_commit
    from overlapbench.tuning.results import RunLog
    from tests.probes.clock_sampler import ClockSampler

    dev0, dev1 = torch.device("cuda", 0), torch.device("cuda", 1)
    torch.cuda.set_device(dev0)
    for a, b in ((dev0, dev1), (dev1, dev0)) if peer else ():  # torch enables peer access on a first copy each way
        torch.ones(8, device=a).copy_(torch.ones(8, device=b))
    numel = args.copy_mib * 2**20 // 2
    src1 = torch.randn(numel, device=dev1, dtype=torch.bfloat16)
    src0 = torch.randn(numel, device=dev0, dtype=torch.bfloat16)
    dst0 = torch.empty(numel, device=dev0, dtype=torch.bfloat16)
    gemms = GemmStream.make(dev0, shapes)
    gemm0, side0, push1 = torch.cuda.Stream(dev0), torch.cuda.Stream(dev0), torch.cuda.Stream(dev1)
    nbytes = float(numel * 2)

    def gemm_unit() -> None:
        with torch.cuda.stream(gemm0):
            gemms.run(1)

    def push_unit() -> None:  # queued on GPU 1's current stream, which waits on GPU 0's and back
        with torch.cuda.stream(side0), torch.cuda.stream(push1):
            dst0.copy_(src1, non_blocking=True)

    def local_unit() -> None:
        with torch.cuda.stream(side0):
            dst0.copy_(src0, non_blocking=True)

    units = {"gemm": (gemm_unit, gemm0, gemms.flops), "peer_push": (push_unit, push1, nbytes),
             "local": (local_unit, side0, nbytes)}
    if pull is not None:
        units["peer_pull"] = (lambda: pull(dst0, src1, side0), side0, nbytes)
    torch.cuda.synchronize(dev0)
    torch.cuda.synchronize(dev1)

    def unit_ms(name: str, count: int) -> float:
        enqueue, stream, _ = units[name]
        for _ in range(2):
            enqueue()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(count):
            enqueue()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / count

    used = ["gemm", *sorted({c.copies for c in conditions if c.copies})]
    alone_ms = {name: unit_ms(name, 3 if name == "gemm" else 8) for name in used}
    depth = {name: min(200, max(2, math.ceil(args.ahead_ms / ms))) for name, ms in alone_ms.items()}

    def lanes_for(cond: Condition) -> list[Lane]:
        kinds = ["gemm"] * cond.gemm + ([cond.copies] if cond.copies else [])
        return [Lane(k, units[k][0], units[k][1], units[k][2], depth[k]) for k in kinds]

    names = [c.name for c in conditions]
    orders = round_orders(names, args.rounds, random.Random(args.seed))
    log = RunLog(args.out / "power_beside.jsonl", git_commit())
    samplers = (ClockSampler(0).start(), ClockSampler(1).start())
    wall = args.warmup_s + args.rounds * len(names) * (args.settle_s + args.measure_s)
    log.write({"kind": "setup", "devices": [torch.cuda.get_device_name(d) for d in (dev0, dev1)],
               "torch": torch.__version__, "gemm_shapes": shapes, "gemm_flops": gemms.flops, "copy_bytes": nbytes,
               "unit_ms_alone": alone_ms, "depth": depth, "conditions": {c.name: c.what for c in conditions}, "orders": orders,
               "settle_s": args.settle_s, "measure_s": args.measure_s, "nvml_error": [s.error for s in samplers]})
    print(f"{len(names)} conditions x {args.rounds} rounds, about {wall:.0f} s; one unit alone: "
          + ", ".join(f"{k} {v:.3f} ms" for k, v in alone_ms.items()), flush=True)

    hold(lanes_for(CONDITIONS[BASE]), args.warmup_s, 0.0)  # into the sustained regime first
    rounds: list[dict[str, dict]] = []
    for r, order in enumerate(orders):
        by_condition = {}
        for position, name in enumerate(order):
            lanes = lanes_for(CONDITIONS[name])
            t0, t1 = hold(lanes, args.settle_s, args.measure_s)
            row = window_row(CONDITIONS[name], lanes, t0, t1, samplers) | {"round": r, "position": position}
            by_condition[name] = log.write(row)
        rounds.append(by_condition)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{n} {by_condition[n].get('gemm_tflops') or 0:.1f}" for n in order if CONDITIONS[n].gemm), flush=True)
    for sampler in samplers:
        sampler.stop()
    summary = summarize(rounds, names)
    for row in summary:
        log.write(row)
    errors = {s.error for s in samplers if s.error}
    print(f"{torch.cuda.get_device_name(dev0)} x2; GEMMs {shapes} bf16 on GPU 0; copies of {args.copy_mib} MiB; "
          f"{args.settle_s} s settle + {args.measure_s} s measured per window; {time.perf_counter() - started:.0f} s in all"
          + (f"; nvml: {'; '.join(errors)}" if errors else ""))
    print("\n".join(table(summary)))


def window_row(cond: Condition, lanes: list[Lane], t0: float, t1: float, samplers) -> dict:
    """A window's row: the GEMMs' TFLOP/s and the copies' GB/s inside the measured span, and GPU 0's
    clock and power (GPU 1's power) over the host span of the units timed (the GEMMs' where they ran)."""
    row: dict = {"kind": "window", "condition": cond.name}
    host = None
    for lane in reversed(lanes):  # the GEMM lane, first, sets the host span where it ran
        rate, span = lane_rate(lane, t0, t1)
        key, scale = ("gemm_tflops", 1e12) if lane.name == "gemm" else ("copy_gbps", 1e9)
        row[key] = None if rate is None else rate / scale
        host = span or host
    gpu0, gpu1 = (window_means(s.samples, *(host or (t0, t1))) for s in samplers)
    row |= {"sm_mhz": gpu0["sm_mhz"], "sm_mhz_min": gpu0["sm_mhz_min"], "power_w": gpu0["power_w"],
            "power_capped": gpu0["power_capped"], "samples": gpu0["samples"], "peer_power_w": gpu1["power_w"],
            "peer_sm_mhz": gpu1["sm_mhz"], "units": {lane.name: len(lane.events) for lane in lanes},
            "starved": {lane.name: lane.starved for lane in lanes if lane.starved}}
    return row


if __name__ == "__main__":
    main()
