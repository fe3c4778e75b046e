"""How much of an idle gap is the baseline's blocking all-reduce, by the power it draws? Under
torchrun on 2 or more GPUs of one host, NVLink multicast off (NCCL_NVLS_ENABLE,
TORCH_SYMM_MEM_DISABLE_MULTICAST and NVSHMEM_DISABLE_NVLS are left as the environment sets them,
and recorded).

    python -m torch.distributed.run --standalone --nproc-per-node 4 tests/probes/allreduce_power.py --out $OUT

Why: at the 700 W power cap the GEMMs run faster between idle gaps (tests/probes/gaps_beside.py:
about 0.44 of the gap's share). Against the llama3-70b TP=4 study timed at each choice's own clock,
predict's baseline reads as if its all-reduce were 0.79 of an idle gap at 1K tokens and 0.27 at 32K
(docs/predict.md, "Why TP=4 misses"). Under a cap the compute gets the power its gaps leave: with
a share s of the time at power P_gap, (1 - s) P_compute + s P_gap = cap, so a gap of power P
counts as (cap - P) / (cap - P_sleep) of an idle one, P_sleep the power of the probe's idle gap
(torch.cuda._sleep on one SM). This probe measures both powers.

Loads, each on every rank at once, held back to back: `sleep` (one `_sleep` kernel after another,
about 1 ms each: the idle gap of the gaps probe), `gemm` (one rank's llama3-70b layer GEMMs, the
shard at TP = the ranks launched, at --gemm-tokens rows: the cap's regime) and `ar-<tokens>` for
each of --tokens: NCCL's all-reduce on the default group at NCCL's default algorithm and CTAs (the
default baseline's) of tokens x hidden bf16, the message a llama3-70b layer's all-reduce carries;
averaged, so that its values stay those of random data call after call, as an activation's do (NCCL
sums and scales once). Each load is held for --settle-s (NVML's power is a one-second average) and
measured for --measure-s; rounds run every load once in an order every rank draws alike (one seed).
A collective load's host loop stops on each rank after its own count; the ranks then agree on the
largest and even up before waiting (power_beside.hold).

Per window and rank: mean board power, SM clock and the share of samples held by the power cap
(tests/probes/clock_sampler.py), and the load's rate (GB/s of the message, or TFLOP/s). Per load:
the median over rounds of the ranks' mean power, and for each all-reduce its idle equivalence
(cap - P) / (cap - P_sleep), the cap NVML's enforced power limit, per round and rank, from the
windows that kept their queues full (a host-bound window, whose queue ran empty in over 1% of its
units, is counted and left out). Rows (setup,
window, load; each with run_id and git) go to $OUT/allreduce_power.jsonl on rank 0; a table is
printed last. The defaults (8 loads x 3 rounds x (2 s + 2 s)) take about 100 s with the start.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from overlapbench.model.models import PRESETS
from tests.probes.gaps_beside import MODEL, NCCL_ENV, layer_gemms, out_folder, sleep_calibration
from tests.probes.power_beside import check_spans, round_orders, spread

SLEEP, GEMM, AR = "sleep", "gemm", "ar-"
DEFAULT_TOKENS = "1024,2048,4096,8192,16384,32768"
SLEEP_MS = 1.0  # one _sleep unit
STARVED_SHARE = 0.01  # of a window's units: above it, the window is host-bound
BF16 = 2


def parse_tokens(text: str) -> list[int]:
    """The token counts of --tokens (comma-separated positive integers, each once); ValueError naming the fix."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items or not all(x.isdigit() and int(x) > 0 for x in items):
        raise ValueError(f"--tokens: {text!r} is not a comma-separated list of positive integers (e.g. {DEFAULT_TOKENS})")
    tokens = [int(x) for x in items]
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"--tokens: {text!r} names a token count twice; name each once")
    return tokens


def message_bytes(tokens: int, model: str = MODEL) -> int:
    """The bytes one all-reduce of the model's layer carries at `tokens` rows: the whole activation, bf16."""
    return tokens * PRESETS[model].hidden * BF16


def loads(tokens: list[int]) -> list[str]:
    return [SLEEP, GEMM] + [f"{AR}{t}" for t in tokens]


def idle_equivalence(cap_w: float, load_w: float, sleep_w: float) -> float | None:
    """How much of an idle gap a stretch at `load_w` is under a cap of `cap_w`: (cap - load) /
    (cap - sleep); None where the idle gap itself draws the cap (nothing to compare with)."""
    return (cap_w - load_w) / (cap_w - sleep_w) if cap_w > sleep_w else None


def host_bound(window: list[dict]) -> bool:
    """Whether a window's host loop let some rank's queue run empty in more than STARVED_SHARE of
    its units: its power then mixes the load's with idle time, and says nothing of the load."""
    return any(x.get("starved", 0) > STARVED_SHARE * max(x.get("units") or 0, 1) for x in window)


def summarize(rounds: list[dict[str, list[dict]]], names: list[str], cap_w: float) -> list[dict]:
    """One row per load: the median over rounds of its ranks' mean power, SM clock, capped share
    and rate, and how many of its windows were host-bound; for an all-reduce also its idle
    equivalence per round and rank against `sleep` in the same round and on the same rank, from
    the windows that were not host-bound, and their median."""
    rows = []
    for name in names:
        windows = [r[name] for r in rounds if name in r]
        row: dict = {"kind": "load", "load": name, "rounds": len(windows),
                     "host_bound": sum(host_bound(w) for w in windows)}
        for key in ("power_w", "sm_mhz", "power_capped", "rate"):
            means = [statistics.fmean(v) for w in windows if (v := [x[key] for x in w if x.get(key) is not None])]
            row[key] = spread(means)
        if name.startswith(AR):
            each = [idle_equivalence(cap_w, mine["power_w"], theirs["power_w"])
                    for r in rounds if name in r and SLEEP in r and not host_bound(r[name])
                    for mine, theirs in zip(r[name], r[SLEEP]) if mine.get("power_w") and theirs.get("power_w")]
            each = [e for e in each if e is not None]
            row["idle_equivalence"] = spread(each) | {"each": each}
        rows.append(row)
    return rows


def summarize_file(path: Path) -> tuple[list[dict], float]:
    """A committed allreduce_power.jsonl's loads summed up again by today's `summarize` (its
    setup and window rows; the file's own load rows are those of the code that ran), and the cap."""
    import json

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    (setup,) = [r for r in rows if r["kind"] == "setup"]
    windows = [r for r in rows if r["kind"] == "window"]
    rounds: list[dict[str, list[dict]]] = [{} for _ in range(1 + max(w["round"] for w in windows))]
    for w in windows:
        rounds[w["round"]][w["load"]] = w["ranks"]
    cap = min(setup["cap_w"])
    return summarize(rounds, loads(setup["tokens"]), cap), cap


def table(rows: list[dict], cap_w: float) -> list[str]:
    num = lambda v, f: "-" if v is None else format(v, f)
    lines = [f"cap {cap_w:.0f} W; idle equivalence (cap - W) / (cap - sleep's W), median [min, max] over rounds and ranks",
             f"host-bound: windows whose host loop let a queue run empty in over {STARVED_SHARE:.0%} of its units "
             "(left out of the idle equivalence)",
             f"{'load':<10} {'rounds':>6} {'power W':>8} {'SM MHz':>7} {'capped':>6} {'rate':>9} "
             f"{'idle equiv.':>11} {'[min, max]':>14} {'host-bound':>10}"]
    for r in rows:
        eq = r.get("idle_equivalence", {})
        span = "" if eq.get("min") is None else f"[{eq['min']:.2f}, {eq['max']:.2f}]"
        lines.append(f"{r['load']:<10} {r['rounds']:>6} {num(r['power_w']['median'], '.0f'):>8} "
                     f"{num(r['sm_mhz']['median'], '.0f'):>7} {num(r['power_capped']['median'], '.0%'):>6} "
                     f"{num(r['rate']['median'], '.1f'):>9} {num(eq.get('median'), '.2f'):>11} {span:>14} "
                     f"{r.get('host_bound') or '':>10}")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="folder for allreduce_power.jsonl (appended to); default $OUT")
    p.add_argument("--tokens", default=DEFAULT_TOKENS, help=f"the {MODEL} layer's token counts whose all-reduce is a load")
    p.add_argument("--gemm-tokens", type=int, default=16384, help="rows of the `gemm` load's GEMMs (a rank's shard)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--settle-s", type=float, default=2.0, help="seconds each load runs before it is measured")
    p.add_argument("--measure-s", type=float, default=2.0, help="seconds each load is measured")
    p.add_argument("--warmup-s", type=float, default=2.0, help="seconds of GEMMs before the first round")
    p.add_argument("--ahead-ms", type=float, default=20.0, help="work kept queued")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def fail(message: str) -> None:
    print(f"allreduce_power: {message}", file=sys.stderr)
    raise SystemExit(2)


def check(args: argparse.Namespace) -> tuple[list[int], Path]:
    """The token counts and the output folder; ValueError naming the flag."""
    for flag, value in (("--gemm-tokens", args.gemm_tokens), ("--rounds", args.rounds)):
        if value < 1:
            raise ValueError(f"{flag}: {value} is below 1; pass 1 or more")
    check_spans(args)
    return parse_tokens(args.tokens), out_folder(args)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        tokens, out = check(args)
    except ValueError as e:
        fail(str(e))
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available() or "LOCAL_RANK" not in os.environ:
        fail("needs CUDA GPUs and torchrun: python -m torch.distributed.run --standalone --nproc-per-node N "
             "tests/probes/allreduce_power.py --out DIR")

    from overlapbench.comm.contention import GemmStream
    from overlapbench.launch.environment import git_commit
    from overlapbench.timing.bench import CudaClock, timed_span
    from overlapbench.tuning.results import RunLog
    from tests.probes.clock_sampler import ClockSampler
    from tests.probes.power_beside import Lane, hold, lane_rate

    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    host = dist.new_group(backend="gloo")  # the hosts' agreements, off the GPUs
    rank, world = dist.get_rank(), dist.get_world_size()
    stream, clock = torch.cuda.Stream(dev), CudaClock()
    gemms = GemmStream.make(dev, [g.mkn for g in layer_gemms(args.gemm_tokens, tp=world).values()])
    messages = {t: torch.randn(message_bytes(t) // BF16, device=dev, dtype=torch.bfloat16) for t in tokens}

    def unit(name: str):
        """One unit of a load, queued on `stream`, and what it does (FLOPs or bytes)."""
        if name == SLEEP:
            return lambda: torch.cuda._sleep(sleep_cycles), 0.0
        if name == GEMM:
            return gemms.run, gemms.flops
        buffer = messages[int(name[len(AR):])]  # averaged, not summed: the values stay random-looking (a sum
        # repeated overflows bf16 within a hundred calls, and constant bits draw less power than an activation's)
        return (lambda: dist.all_reduce(buffer, op=dist.ReduceOp.AVG)), float(buffer.numel() * BF16)

    def unit_ms(name: str, count: int) -> float:
        """One unit's time, after one untimed unit: the first all-reduce of a size sets NCCL up
        (tens of ms), and a lane sized by that time queues too little to keep the GPU busy."""
        run, _ = unit(name)
        with torch.cuda.stream(stream):
            run()
            span = timed_span(clock, run, count)
        span[1].synchronize()
        return clock.elapsed_ms(*span) / count

    def largest(count: int) -> int:
        agreed = torch.tensor([count])
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=host)
        return int(agreed)

    trial = 1_500_000  # about 1 ms at the cap's clock
    sleep_cycles = round(trial / statistics.median(sleep_calibration(gemms, stream, clock, trial)) * SLEEP_MS)
    per_ms = {name: unit_ms(name, 3) for name in loads(tokens)}

    def lane_for(name: str) -> Lane:
        run, work = unit(name)

        def enqueue() -> None:
            with torch.cuda.stream(stream):
                run()

        depth = min(200, max(2, round(args.ahead_ms / per_ms[name])))
        return Lane(name, enqueue, stream, work, depth)

    def even(lane: Lane) -> int:
        return largest(lane.enqueued) - lane.enqueued if lane.name.startswith(AR) else 0

    sampler = ClockSampler(dev.index, every_s=0.05).start()
    caps = [None] * world
    dist.all_gather_object(caps, sampler.power_limit_w(), group=host)
    if None in caps:
        fail(f"needs NVML's power readings on every GPU ({sampler.error or 'another rank has none'}): "
             "pip install 'overlapbench[nvml]'")
    log = RunLog(out / "allreduce_power.jsonl", git_commit()) if rank == 0 else None
    names = loads(tokens)
    orders = round_orders(names, args.rounds, random.Random(args.seed))
    if log:
        log.write({"kind": "setup", "device": torch.cuda.get_device_name(dev), "world": world, "torch": torch.__version__,
                   "nccl": str(torch.cuda.nccl.version()), "model": MODEL, "tokens": tokens,
                   "message_bytes": {t: message_bytes(t) for t in tokens}, "gemm_tokens": args.gemm_tokens, "gemm_tp": world,
                   "cap_w": caps, "unit_ms": per_ms, "sleep_cycles": sleep_cycles, "orders": orders,
                   "settle_s": args.settle_s, "measure_s": args.measure_s, "env": {k: os.environ.get(k) for k in NCCL_ENV},
                   "nvml_error": sampler.error})
        print(f"{len(names)} loads x {args.rounds} rounds on {world} GPUs, about "
              f"{len(names) * args.rounds * (args.settle_s + args.measure_s):.0f} s; unit ms: "
              + ", ".join(f"{n} {ms:.3f}" for n, ms in per_ms.items()), flush=True)
    dist.barrier(group=host)
    hold([lane_for(GEMM)], args.warmup_s, 0.0)

    rounds: list[dict[str, list[dict]]] = []
    for r, order in enumerate(orders):
        by_load = {}
        for position, name in enumerate(order):
            dist.barrier(group=host)
            lane = lane_for(name)
            t0, t1 = hold([lane], args.settle_s, args.measure_s, even=even)
            rate, span = lane_rate(lane, t0, t1)
            mine = sampler.between(*(span or (t0, t1))) | {
                "rank": rank, "rate": rate / (1e12 if name == GEMM else 1e9) if rate and lane.work else None,
                "units": lane.enqueued, "starved": lane.starved}
            every = [None] * world
            dist.all_gather_object(every, mine, group=host)
            by_load[name] = every
            if log:
                log.write({"kind": "window", "load": name, "round": r, "position": position, "ranks": every})
        rounds.append(by_load)
        if log:
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{n} {statistics.fmean(x['power_w'] or 0 for x in by_load[n]):.0f} W" for n in order), flush=True)
    sampler.stop()
    if log:
        cap = min(caps)
        summary = summarize(rounds, names, cap)
        for row in summary:
            log.write(row)
        print("\n".join(table(summary, cap)))
    dist.barrier(group=host)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
