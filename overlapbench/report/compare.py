"""`--compare OLD NEW`: per point NEW/OLD with its interval; a regression only beyond both runs' noise."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from overlapbench import analysis, tune
from overlapbench.analysis import Measured, Store
from overlapbench.errors import UserError
from overlapbench.report.cells import SLOWER, Grid, Shown, fmt_ms, text_cell
from overlapbench.report.overview import column_order
from overlapbench.report.render import emit, stderr_console

# -- compare: NEW against OLD, point by point ----------------------------------------------


def compare_pairs(old: Store, new: Store) -> list[tuple[Measured, Measured]]:
    """(OLD, NEW) per point in both stores (matched by key), ordered by group, tokens, strategy."""
    before = {m.key: m for m in old.measured}
    pairs = [(before[m.key], m) for m in new.measured if m.key in before]
    if not pairs:
        raise UserError(
            f"--compare: {old.sources[0]} and {new.sources[0]} share no points "
            f"(matched by point key: workload, gemm, shape, tp, dtype, layers, seed, batch, decode, strategy, knobs)"
        )
    return sorted(pairs, key=lambda p: (p[1].group.label(), p[1].tokens, column_order(p[1].strategy)))


COMPARE_LEVEL = 0.99  # a gate compares many points at once: each one's false alarms must be rare


def compare_record(o: Measured, n: Measured, limit: float | None) -> dict:
    """NEW/OLD at one point, with its 99% interval from the noise of both runs (tune.gain: each
    run's samples resampled); a regression where the ratio exceeds `limit` and the interval lies
    above 1, so that a difference inside the noise of the two runs is never one."""
    g = tune.gain(o, n, COMPARE_LEVEL)  # "o over n": n.ms / o.ms
    ratio = n.ms / o.ms
    return n.group.fields() | {
        "tokens": n.tokens, "strategy": n.strategy, "knobs": n.knobs, "old_ms": o.ms, "new_ms": n.ms,
        "ratio": ratio, "ratio_ci": [g.lo, g.hi],
        "regression": limit is not None and ratio > limit and g.lo > 1,
    }


def compare_grid(pairs: list[tuple[Measured, Measured]], records: list[dict]) -> Grid:
    rows = []
    for (_, n), r in zip(pairs, records):
        rows.append([text_cell(_compared_group(n)), text_cell(str(r["tokens"])), text_cell(n.describe()),
                     text_cell(fmt_ms(r["old_ms"])), text_cell(fmt_ms(r["new_ms"])),
                     Shown((f"{r['ratio']:.3f}",), mark=SLOWER if r["regression"] else ""),
                     text_cell(f"[{r['ratio_ci'][0]:.3f}, {r['ratio_ci'][1]:.3f}]")])
    per = " / ".join(sorted({n.group.unit for _, n in pairs}))
    header = ["group", "tokens", "strategy", "old ms", "new ms", "new/old", f"{COMPARE_LEVEL:.0%} CI"]
    return Grid(f"NEW / OLD ms per {per}", header, rows)


def _compared_group(m: Measured) -> str:
    """The group, short: what was measured, TP and dtype (one comparison is on one machine)."""
    return f"{m.group.what()} tp{m.group.tp} {m.group.dtype}"


def compare(old: Path, new: Path, fmt: str, console: Console, fail_above: float | None) -> int:
    """Exit code 1 when some point got slower than OLD by more than `fail_above` percent."""
    limit = None if fail_above is None else 1 + fail_above / 100
    pairs = compare_pairs(analysis.read([old]), analysis.read([new]))
    records = [compare_record(o, n, limit) for o, n in pairs]
    regressions = [r for r in records if r["regression"]]
    legend = None if limit is None else (f"{SLOWER} slower than OLD by more than {fail_above:g}% (new/old > {limit:.3f}) "
                                         f"and beyond the noise of both runs ({COMPARE_LEVEL:.0%} CI of new/old above 1)")
    emit([compare_grid(pairs, records)], records, fmt, console, legend)
    if limit is not None:
        stderr_console().print(f"{len(regressions)} of {len(records)} points slower than OLD by more than {fail_above:g}% "
                        f"beyond the noise", highlight=False)
    for (_, n), r in zip(pairs, records):
        if r["regression"]:
            stderr_console().print(f"  regression: {_compared_group(n)}: {n.describe()} at {r['tokens']} tokens: "
                            f"{r['old_ms']:.4g} -> {r['new_ms']:.4g} ms ({r['ratio']:.3f}x)", highlight=False)
    return 1 if regressions else 0


