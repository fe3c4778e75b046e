"""`report`'s "per added layer (steady state)" section: where a run timed the same points through
stacks of two or more depths (a spec's `layers: [4, 8]`), what one more layer costs.

Why: a stack of L layers ends with a reduction that nothing overlaps (the last layer's), 1/L of
the stack's tails, where a deployment's 80 layers have 1/80. The marginal between the smallest and
largest depth measured, (T(L2) - T(L1)) / (L2 - L1), leaves the stack's ends out.

The estimates. Rows hold ms per layer (the stack's time over L), so a stack's time is T = L x ms.
The baseline's marginal is from its medians. A strategy's stack time at each depth is the
baseline's over the strategy's speedup there (paired round by round where both were timed
together, so the clock's drift cancels: tune.gain), so that, with rho = T_base(L2) / T_base(L1)
and s_i the strategy's speedup at L_i, the marginal speedup is

    S = (rho - 1) / (rho / s_2 - 1 / s_1)

and, with f_i no_comm's speedups, the hidden share of the marginal (base - s) / (base - no_comm)
is ((rho - 1) - (rho / s_2 - 1 / s_1)) / ((rho - 1) - (rho / f_2 - 1 / f_1)).

Only rho compares rows of two timings (each depth is timed in its own batch, minutes apart),
and the figures lean on it weakly: where the speedups at the two depths are near each other, a
drift of the clocks between the batches that moves rho by 2% moves S by about 0.2% (4 and 8
layers, the synthetic stacks of tests/test_depths.py). The ms column, from the baseline's
medians, carries that drift whole.

The intervals, conservative: each estimate a figure uses (s_1, s_2 and rho for the speedup; and
f_1, f_2 for the hidden share) gets its own interval at 1 - 0.05 / k for its k estimates (Bonferroni:
all of them hold together at least 95% of the time): a speedup's from its rounds as tune judges it
(paired, else the rank-sum interval over block means), rho's the rank-sum interval of the
baseline's samples at the two depths (never paired: each depth is timed in its own batch). The
figure's interval is its least and greatest value over the box of those intervals, taken at the
box's corners: each expression is linear-fractional in each estimate, so monotone in each
wherever its denominator keeps its sign, which it does on the whole box where it does at every
corner (the denominator is multilinear). Where a corner's denominator is <= 0, or an estimate has
no interval at that level (rows without per-round samples, too few of them, predicted rows),
the figure has none: it is wider than the paired intervals of the tables above, never narrower.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

from rich.console import Console
from rich.text import Text

from overlapbench.report.cells import Grid, Shown, fmt_ms, text_cell
from overlapbench.report.overview import column_order
from overlapbench.report.render import print_grid, to_markdown
from overlapbench.timing.intervals import LEVEL
from overlapbench.tuning import analysis, batches, tune
from overlapbench.tuning.analysis import Group, Measured

TITLE = "per added layer (steady state)"
NOTE = ("per added layer: (T(L2) - T(L1)) / (L2 - L1) between the smallest and largest depth measured, T a stack's "
        "median time; a strategy's T is the baseline's over its speedup at that depth (paired rounds) · speedup and "
        "hidden: of those marginals (hidden against no_comm's) · [lo, hi]: a 95% interval, Bonferroni over the "
        "estimates it uses (each speedup, the baseline's ratio across depths), its extremes over their intervals")
INTERVAL_METHODS = ("paired", "rank-sum")  # the gains whose interval is a confidence interval at the asked level

Interval = tuple[float, float]


@dataclass(frozen=True)
class Estimate:
    """A ratio and its interval at some level (None: none at that level)."""

    value: float
    interval: Interval | None


@dataclass(frozen=True)
class Marginal:
    """One setting's cost per added layer at one point: the ms, and where they can be had, its
    speedup over the baseline's marginal and the share of the exposed communication it hides."""

    m: Measured  # its row at the smallest depth (what the line names)
    ms: float
    speedup: Estimate | None
    hidden: Estimate | None


@dataclass(frozen=True)
class SteadyPoint:
    """A point timed at several depths: its marginals between the smallest and the largest."""

    label: str
    low: int
    high: int
    marginals: list[Marginal]


def ratio(challenger: Measured, incumbent: Measured, level: float) -> Estimate:
    """incumbent / challenger (a speedup) as tune judges it, with its interval at `level`."""
    if challenger is incumbent:
        return Estimate(1.0, (1.0, 1.0))
    g = tune.gain(challenger, incumbent, level)
    interval = (g.lo, g.hi) if g.decided and g.method in INTERVAL_METHODS else None
    return Estimate(g.speedup, interval)


def extremes(f: Callable[..., float | None], estimates: list[Estimate]) -> Estimate | None:
    """f at the estimates, and its least and greatest over the corners of their intervals'
    box; None where f has no value there, and no interval where an interval is missing or f
    has none at some corner (its denominator reaches zero)."""
    value = f(*(e.value for e in estimates))
    if value is None:
        return None
    if any(e.interval is None for e in estimates):
        return Estimate(value, None)
    corners = [f(*corner) for corner in itertools.product(*(e.interval for e in estimates))]
    if any(c is None for c in corners):
        return Estimate(value, None)
    return Estimate(value, (min(corners), max(corners)))


def _marginal_speedup(rho: float, s1: float, s2: float) -> float | None:
    denominator = rho / s2 - 1 / s1
    return (rho - 1) / denominator if denominator > 0 else None


def _marginal_hidden(rho: float, s1: float, s2: float, f1: float, f2: float) -> float | None:
    base, mine, free = rho - 1, rho / s2 - 1 / s1, rho / f2 - 1 / f1
    exposed = base - free
    return (base - mine) / exposed if exposed > 0 else None


def steady_point(at: dict[int, list[Measured]], level: float = LEVEL) -> SteadyPoint | None:
    """The marginals of one composition's rows by depth (at least two depths with a baseline of
    the same setting), for every setting timed at the smallest and the largest; else None."""
    refs = {layers: analysis.reference(rows) for layers, rows in at.items()}
    depths = sorted(layers for layers, ref in refs.items() if ref is not None)
    if len(depths) < 2 or refs[depths[0]].setting != refs[depths[-1]].setting:
        return None
    low, high = depths[0], depths[-1]
    b1, b2 = refs[low], refs[high]
    base_ms = (high * b2.ms - low * b1.ms) / (high - low)
    speedup_level, hidden_level = 1 - (1 - level) / 3, 1 - (1 - level) / 5
    rho = {lv: _scaled(ratio(b1, b2, lv), high / low) for lv in (speedup_level, hidden_level)}
    free = _pair(analysis.bound(at[low]), analysis.bound(at[high]), b1, b2, hidden_level)
    by_setting = {lv: {m.setting: m for m in at[lv]} for lv in (low, high)}
    marginals = []
    for setting, m1 in sorted(by_setting[low].items(), key=lambda item: (column_order(item[0][0]), item[0][1])):
        m2 = by_setting[high].get(setting)
        if m2 is None:
            continue
        s = _pair(m1, m2, b1, b2, speedup_level)
        ms = (high * b2.ms / s[1].value - low * b1.ms / s[0].value) / (high - low)
        speedup = hidden = None
        if base_ms <= 0:  # the baseline's marginal is lost in the noise: nothing to compare to
            pass
        elif m1 is b1:  # the reference itself: 1x and nothing hidden, by definition (as the overview says)
            speedup, hidden = Estimate(1.0, None), None if free is None else Estimate(0.0, None)
        else:
            speedup = extremes(_marginal_speedup, [rho[speedup_level], *s])
            if free is not None and m1.strategy != analysis.BOUND:
                hidden = extremes(_marginal_hidden, [rho[hidden_level], *_pair(m1, m2, b1, b2, hidden_level), *free])
        marginals.append(Marginal(m1, ms, speedup, hidden))
    label = batches.batch_label(replace(b1, depth_named=False))
    return SteadyPoint(label, low, high, marginals) if marginals else None


def _pair(m1: Measured | None, m2: Measured | None, b1: Measured, b2: Measured, level: float) -> list[Estimate] | None:
    """A setting's speedups over the baseline at the two depths (None without both rows)."""
    if m1 is None or m2 is None:
        return None
    return [ratio(m1, b1, level), ratio(m2, b2, level)]


def _scaled(e: Estimate, factor: float) -> Estimate:
    """T_base(L2) / T_base(L1) from the ratio of the per-layer times: times L2 / L1."""
    interval = None if e.interval is None else (e.interval[0] * factor, e.interval[1] * factor)
    return Estimate(e.value * factor, interval)


def steady(measured: list[Measured]) -> dict[Group, list[SteadyPoint]]:
    """Per group, the points (token count and composition) timed at two or more depths."""
    out: dict[Group, list[SteadyPoint]] = {}
    for group, points in analysis.by_point(measured).items():
        for rows in points.values():
            by_make_up: dict[tuple, dict[int, list[Measured]]] = {}
            for m in rows:
                if m.layers is not None:
                    by_make_up.setdefault((m.batch, m.decode), {}).setdefault(m.layers, []).append(m)
            for at in by_make_up.values():
                point = steady_point(at) if len(at) > 1 else None
                if point is not None:
                    out.setdefault(group, []).append(point)
    return out


# -- shown ---------------------------------------------------------------------------------


def _figure(e: Estimate | None, text: Callable[[float], str]) -> str:
    if e is None:
        return "-"
    return text(e.value) + ("" if e.interval is None else f" [{text(e.interval[0])}, {text(e.interval[1])}]")


def _speedup(x: float) -> str:
    return f"{x:.3f}x"


def _share(x: float) -> str:
    return f"{round(x, 2) + 0.0:.0%}"  # no "-0%"


def steady_grids(found: dict[Group, list[SteadyPoint]]) -> list[Grid]:
    """A grid per group and pair of depths: a line per point and setting."""
    grids = []
    for group, points in found.items():
        for (low, high), same in itertools.groupby(points, key=lambda p: (p.low, p.high)):
            rows = []
            for p in same:
                for i, mg in enumerate(p.marginals):
                    name = mg.m.strategy + ("" if mg.m.checked or mg.m.strategy == analysis.BOUND else " (bound)")
                    rows.append([text_cell(p.label if i == 0 else ""), Shown((name,), knobs=mg.m.knob_text()),
                                 *(Shown((t,), right=True) for t in (fmt_ms(mg.ms), _figure(mg.speedup, _speedup),
                                                                     _figure(mg.hidden, _share)))])
            title = f"{group.label()}: {TITLE}, {low} -> {high} layers"
            grids.append(Grid(title, ["tokens", "setting", "ms/layer", "speedup", "hidden"], rows))
    return grids


def emit_steady(measured: list[Measured], fmt: str, console: Console) -> None:
    """The section under the overview (table and markdown), where some point was timed at two or
    more depths; nothing otherwise."""
    grids = steady_grids(steady(measured))
    if not grids or fmt not in ("table", "markdown"):
        return
    if fmt == "table":
        console.print()
        for grid in grids:
            print_grid(grid, console)
        console.print(Text(NOTE, style="dim"), soft_wrap=False)
    else:
        text = f"\n## {TITLE}\n\n" + "\n".join(to_markdown(g) for g in grids)
        console.out(text + f"\n{NOTE}\n", highlight=False)

