"""`--compare OLD NEW`: per point NEW/OLD with its interval; a regression only beyond both runs' noise.

Points match by key on one setup (device and world size, measured or predicted): OLD and NEW of
different devices, or a measurement and a prediction, are refused, since what differs there is
not the code; `--across-devices` compares them anyway (one setup a side), and says so in each
heading."""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

from rich.console import Console

from overlapbench.errors import UserError
from overlapbench.report.cells import SLOWER, Grid, Shown, fmt_ms, text_cell
from overlapbench.report.overview import column_order
from overlapbench.report.render import emit, stderr_console
from overlapbench.timing import intervals
from overlapbench.tuning import analysis
from overlapbench.tuning.analysis import Measured, Store

# -- compare: NEW against OLD, point by point ----------------------------------------------


def compare_pairs(old: Store, new: Store, across_devices: bool = False) -> list[tuple[Measured, Measured]]:
    """(OLD, NEW) per point in both stores, ordered by group, tokens, strategy: matched by key on
    one setup, or with `across_devices` by key alone (each store of one setup)."""
    olds, news = _setups(old), _setups(new)
    if across_devices:
        for side, store, found in (("OLD", old, olds), ("NEW", new, news)):
            if len(found) > 1:
                raise UserError(f"--across-devices: {side} ({store.sources[0]}) holds rows of {_names(found)}; "
                                f"compare one setup's rows with another's, a file a side")
    elif not olds & news:
        raise UserError(f"--compare: OLD holds rows of {_names(olds)}, NEW of {_names(news)}: what differs is not the "
                        f"code; compare two runs of one device, both measured, or pass --across-devices to compare them anyway")
    match = (lambda m: m.key) if across_devices else (lambda m: (m.key, m.group.setup))
    before = {match(m): m for m in old.measured}
    pairs = [(before[match(m)], m) for m in new.measured if match(m) in before]
    if not pairs:
        raise UserError(
            f"--compare: {old.sources[0]} and {new.sources[0]} share no points "
            f"(matched by point key: workload, gemm, shape, tp, dtype, layers, seed, batch, decode, strategy, knobs)"
        )
    return sorted(pairs, key=lambda p: (p[1].group.label(), p[1].tokens, column_order(p[1].strategy)))


def _setups(store: Store) -> set[tuple[str, int]]:
    return {m.group.setup for m in store.measured}


def _names(setups: set[tuple[str, int]], ranks: bool = True) -> str:
    return " and ".join(device + (f" on {world} ranks" if ranks else "") for device, world in sorted(setups))


def unmatched(old: Store, new: Store) -> str | None:
    """A note on the setups only one side holds (not compared), where both share another."""
    olds, news = _setups(old), _setups(new)
    alone = [f"{side}'s {_names(only)} rows" for side, only in (("OLD", olds - news), ("NEW", news - olds)) if only]
    return f"not compared (no rows of that setup on the other side): {'; '.join(alone)}" if alone else None


COMPARE_LEVEL = 0.99  # a gate compares many points at once: each one's false alarms must be rare
# Run-to-run noise: the sd of log(NEW/OLD) at one point between two runs of the same code, the
# least a comparison allows for. GPU: the three committed pairs of back-to-back sp-llama3-70b-tp2
# runs on the H200 (results/h200x2/{paired,a034cb8,3b4da9f}/, 54 points each) give 0.0046,
# 0.0035 and 0.0042. CPU: the demo eight times within four minutes on a 2-core machine shared
# with other work gave 0.35-0.87 (sd over its 18 points, per pair of runs; medians shifted by up
# to 0.39, single points bimodal: sp_baseline at 61 tokens took 2 ms in some runs, 8 in others):
# a CPU run is not a measurement of speed. 0.6, about their median, is the floor; with it none of
# the 1008 points of the 56 ordered pairs was flagged (tests/test_compare_noise.py keeps three).
RUN_TO_RUN_SD = {"cpu": 0.6}
RUN_TO_RUN_SD_GPU = 0.005
MIN_POINTS_FOR_SPREAD = 6  # points in common before their spread estimates the run-to-run noise


def run_to_run_sd(pairs: list[tuple[Measured, Measured]]) -> float:
    """The sd of log(NEW/OLD) a point of the two runs shows with nothing changed: the floor of
    the device, or the robust spread (1.4826 MAD about the median) of the comparison's own points,
    whichever is larger. A change at a few points stands out of that spread; the median's shift
    (every point slower alike) is judged against the floor."""
    import statistics

    floor = max(RUN_TO_RUN_SD.get(n.group.device, RUN_TO_RUN_SD_GPU) for _, n in pairs)
    logs = [math.log(n.ms / o.ms) for o, n in pairs]
    if len(logs) < MIN_POINTS_FOR_SPREAD:
        return floor
    centre = statistics.median(logs)
    return max(floor, 1.4826 * statistics.median(abs(x - centre) for x in logs))


def compare_record(o: Measured, n: Measured, limit: float | None, run_sd: float, points: int = 1) -> dict:
    """NEW/OLD at one point with its 99% interval, and a verdict. The interval joins the noise
    within each run (the exact rank-sum interval of the shift between the two rows' log times,
    intervals.shift_interval) and between runs (`run_sd`, at 1 - 1%/`points`: the comparison
    of all its points together is at 99%), in quadrature on each side: a
    regression is a ratio above `limit` whose interval lies above 1, so that a difference inside
    the noise of two runs is never one. Too few samples for the level: no interval, no verdict."""
    ratio = n.ms / o.ms
    within = _within(o, n)
    z = NormalDist().inv_cdf(1 - (1 - COMPARE_LEVEL) / 2 / points) * run_sd
    ci = None
    if within is not None:
        r = math.log(ratio)
        lo, hi = min(within[0], r), max(within[1], r)
        ci = [math.exp(r - math.hypot(r - lo, z)), math.exp(r + math.hypot(hi - r, z))]
    return n.group.fields() | {
        "old_device": o.group.device_label, "old_timing": o.timing, "new_timing": n.timing,
        "old_run_id": o.run_id, "new_run_id": n.run_id,
        "tokens": n.tokens, "strategy": n.strategy, "knobs": n.knobs, "old_ms": o.ms, "new_ms": n.ms,
        "ratio": ratio, "ratio_ci": ci, "run_to_run_sd": run_sd,
        "verdict": _verdict(ratio, ci, limit),
        "regression": limit is not None and ci is not None and ratio > limit and ci[0] > 1,
    }


def _within(o: Measured, n: Measured) -> tuple[float, float] | None:
    """The interval of log(NEW/OLD) from each run's own samples (p10/p90 where a row has none)."""
    if len(o.samples) >= 2 and len(n.samples) >= 2:
        return intervals.shift_interval(n.samples, o.samples, COMPARE_LEVEL)
    o_lo, o_hi = (o.p10_ms or o.ms), (o.p90_ms or o.ms)
    n_lo, n_hi = (n.p10_ms or n.ms), (n.p90_ms or n.ms)
    return math.log(n_lo / o_hi), math.log(n_hi / o_lo)


def _verdict(ratio: float, ci: list[float] | None, limit: float | None) -> str:
    if ci is None:
        return "too few samples"
    if ci[0] > 1:
        return "slower" if limit is None or ratio > limit else "slower, under the limit"
    return "faster" if ci[1] < 1 else "same within noise"


def compare_grids(pairs: list[tuple[Measured, Measured]], records: list[dict]) -> list[Grid]:
    """A table per group, its heading naming the device (both, where they differ), each strategy's
    knob setting in its cell (moved under the table where it is too wide)."""
    grids: dict[str, list[list[Shown]]] = {}
    per = " / ".join(sorted({n.group.unit for _, n in pairs}))
    for (o, n), r in zip(pairs, records):
        ci = "too few samples" if r["ratio_ci"] is None else f"[{r['ratio_ci'][0]:.3f}, {r['ratio_ci'][1]:.3f}]"
        grids.setdefault(_heading(o, n, per), []).append([
            text_cell(str(r["tokens"])), Shown((n.strategy,), knobs=n.knob_text()),
            text_cell(fmt_ms(r["old_ms"])), text_cell(fmt_ms(r["new_ms"])),
            Shown((f"{r['ratio']:.3f}",), mark=SLOWER if r["regression"] else ""), text_cell(ci)])
    header = ["tokens", "strategy", "old ms", "new ms", "new/old", f"{COMPARE_LEVEL:.0%} CI"]
    return [Grid(heading, header, rows) for heading, rows in grids.items()]


def _heading(o: Measured, n: Measured, per: str) -> str:
    """`llama3-8b tp2 NVIDIA H200 bf16: NEW / OLD ms per layer`; across devices, both named on a
    second line."""
    if o.group.setup == n.group.setup:
        return f"{n.group.label()}: NEW / OLD ms per {per}"
    g, ranks = n.group, o.group.world_size != n.group.world_size
    return (f"{g.what()} tp{g.tp} {g.dtype}: NEW / OLD ms per {per}, across devices\n"
            f"NEW: {_names({g.setup}, ranks)}; OLD: {_names({o.group.setup}, ranks)}")


def compare(old: Path, new: Path, fmt: str, console: Console, fail_above: float | None,
            across_devices: bool = False) -> int:
    """Exit code 1 when some point got slower than OLD by more than `fail_above` percent."""
    limit = None if fail_above is None else 1 + fail_above / 100
    before, after = analysis.read([old]), analysis.read([new])
    pairs = compare_pairs(before, after, across_devices)
    run_sd = run_to_run_sd(pairs)
    records = [compare_record(o, n, limit, run_sd, len(pairs)) for o, n in pairs]
    regressions = [r for r in records if r["regression"]]
    noise = (f"{COMPARE_LEVEL:.0%} CI: each run's own noise and the noise between runs (sd of log(new/old) "
             f"per point {run_sd:.2g}) together, for all {len(records)} points at once")
    legend = noise if limit is None else (f"{SLOWER} slower than OLD by more than {fail_above:g}% (new/old > {limit:.3f}) "
                                          f"and beyond the noise (the CI of new/old above 1) · {noise}")
    notes = [] if across_devices else list(filter(None, [unmatched(before, after)]))
    emit(compare_grids(pairs, records), records, fmt, console, legend, notes)
    if limit is not None:
        stderr_console().print(f"{len(regressions)} of {len(records)} points slower than OLD by more than {fail_above:g}% "
                        f"beyond the noise", highlight=False)
    for (_, n), r in zip(pairs, records):
        if r["regression"]:
            stderr_console().print(f"  regression: {n.group.label()}: {n.describe()} at {r['tokens']} tokens: "
                            f"{r['old_ms']:.4g} -> {r['new_ms']:.4g} ms ({r['ratio']:.3f}x)", highlight=False)
    return 1 if regressions else 0


