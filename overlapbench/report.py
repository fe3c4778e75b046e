"""Report: strategies compared per token count, in the terminal and in machine-readable forms.

Four views of the same rows (read as tune reads them, `analysis`):
- the overview: per group (a layer workload, or a micro workload's GEMM), one line per token
  count, a column per strategy at its best knob setting: ms per layer (per GEMM), speedup over the
  group's reference (baseline; micro: sp_baseline), share of the exposed communication hidden
  (layer: against no_comm); the choice by tune's rule starred, noisy cells flagged; failed and
  skipped rows counted below;
- `--sensitivity S --tokens N`: one strategy's knob grid at one token count;
- `--compare OLD NEW`: per point, NEW/OLD with its interval, and with `--fail-above PCT` exit 1
  on a regression (above PCT and beyond the noise of both runs);
- `--plot FILE.png`: time per layer or GEMM (or speedup) against tokens, one line per strategy.
Formats: `table` (rich), `markdown`, `csv` (pandas) and `json` (a list of records).

Long because the four views share one set of cell and legend helpers; each view is a function.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from overlapbench import analysis, printing, tune, tuned
from overlapbench.analysis import Group, Measured, Store
from overlapbench.errors import UserError, did_you_mean

FORMATS = ("table", "markdown", "csv", "json")
PLOT_METRICS = ("ms", "speedup")
STAR, NOISY, SLOWER = "★", "~", "▲"
NOISY_TEXT = f"{NOISY} noisy (cv > {analysis.NOISY_CV:.0%})"


def legend(views: dict[Group, dict[str, dict[str, Cell]]]) -> str:
    """The overview's legend; `hidden` explained where some cell shows it (a group with no_comm)."""
    name, which = references(views)
    cells = [c for points in views.values() for cells in points.values() for c in cells.values()]
    hidden = (f" · hidden = share of {name}'s exposed communication ({name.removeprefix('the ')} - no_comm) removed"
              if any(c.hidden is not None for c in cells) else "")
    return (f"{STAR} picked by tune's rule (faster than {name} beyond the noise, else {name}) · {NOISY_TEXT} · "
            f"speedup over {name} with default knobs{hidden} · each strategy at its best knobs{which}")


def sensitivity_legend(groups: Iterable[Group]) -> str:
    name, which = references(groups)
    return f"{STAR} fastest setting · {NOISY_TEXT} · speedup over {name} with default knobs{which}"


def references(groups: Iterable[Group]) -> tuple[str, str]:
    """What the legend calls the reference, and a note on which it is where groups of several
    workloads differ: ("baseline", "") or ("the reference", " · the reference: baseline (layer), ...")."""
    by_strategy: dict[str, list[str]] = {}
    for workload in sorted({g.workload for g in groups}):
        by_strategy.setdefault(analysis.REFERENCES[workload], []).append(workload)
    if len(by_strategy) == 1:
        return next(iter(by_strategy)), ""
    which = ", ".join(f"{s} ({', '.join(w)})" for s, w in sorted(by_strategy.items()))
    return "the reference", f" · the reference: {which}"


# -- what is shown -------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One strategy's best knob setting at one token count, with the figures derived from it."""

    m: Measured
    speedup: float | None
    hidden: float | None
    winner: bool
    speedup_ci: tuple[float, float] | None = None  # 95%, where timed interleaved with the reference

    def lines(self) -> list[str]:
        figures = [] if self.speedup is None else [f"{self.speedup:.3f}x"]
        if self.speedup_ci is not None and self.speedup_ci[1] > self.speedup_ci[0]:
            figures[0] += f" ±{(self.speedup_ci[1] - self.speedup_ci[0]) / 2 / self.speedup:.1%}"
        if self.hidden is not None and self.m.strategy != analysis.BOUND:
            figures.append(f"{round(self.hidden, 2) + 0.0:.0%} hidden")  # no "-0%"
        return [f"{_ms(self.m.ms)} ms", " ".join(figures), self.m.knob_text()]

    def record(self) -> dict:
        m = self.m
        return m.group.fields() | {
            "tokens": m.tokens, "batch": list(m.batch), "strategy": m.strategy, "knobs": m.knobs, "ms": m.ms,
            "p10_ms": m.p10_ms, "p90_ms": m.p90_ms, "cv": m.cv, "noisy": m.noisy,
            "speedup": self.speedup, "speedup_ci": None if self.speedup_ci is None else list(self.speedup_ci),
            "hidden": self.hidden, "winner": self.winner,
        }


@dataclass(frozen=True)
class Shown:
    """A grid cell as text lines, bold and starred when best, with a warning mark (NOISY, SLOWER)."""

    lines: tuple[str, ...]
    best: bool = False
    mark: str = ""
    knobs: str = ""  # the knob setting: the last line, or a tag explained under a narrow table

    def all_lines(self) -> list[str]:
        return [line for line in (*self.lines, self.knobs) if line]


@dataclass(frozen=True)
class Grid:
    """A titled table of Shown cells: rendered by rich or as markdown."""

    title: str
    header: list[str]
    rows: list[list[Shown]]


def _ms(x: float) -> str:
    return f"{x:.4g}"


def _shown(text: str) -> Shown:
    return Shown((text,))


def cells_at(rows: list[Measured]) -> dict[str, Cell]:
    """Per strategy at one point: tune's choice where it is that strategy, else its best knobs."""
    ref, free, choice = analysis.reference(rows), analysis.bound(rows), tune.pick(rows)
    best = analysis.best_per_strategy(rows)
    if choice is not None:
        best[choice.chosen.strategy] = choice.chosen
    return {
        s: Cell(m, analysis.speedup(m, ref), analysis.hidden(m, ref, free), choice is not None and m is choice.chosen,
                None if m is ref else analysis.speedup_ci(m, ref))
        for s, m in sorted(best.items(), key=lambda item: column_order(item[0]))
    }


def column_order(strategy: str) -> tuple:
    """Simplest first, as tune prefers them; the bound last."""
    return (strategy == analysis.BOUND, *tune.simplicity(strategy))


def overview(store: Store) -> dict[Group, dict[str, dict[str, Cell]]]:
    """Cells per group and point; a point is a token count, or a token count and its batch
    where several sequences make it up (batches are never compared with each other)."""
    return {
        group: {
            analysis.batch_label(batch_rows[0]): cells_at(batch_rows)
            for rows in points.values()
            for batch_rows in analysis.by_batch(rows).values()
        }
        for group, points in analysis.by_point(store.measured).items()
    }


def overview_grid(group: Group, points: dict[str, dict[str, Cell]]) -> Grid:
    strategies = sorted({s for cells in points.values() for s in cells}, key=column_order)
    rows = []
    for label, cells in points.items():
        shown = [_overview_cell(cells.get(s)) for s in strategies]
        rows.append([_shown(label), *shown])
    return Grid(group.label(), ["tokens", *strategies], rows)


def _overview_cell(cell: Cell | None) -> Shown:
    if cell is None:
        return _shown("-")
    *figures, knobs = cell.lines()
    return Shown(tuple(figures), cell.winner, NOISY if cell.m.noisy else "", knobs)


def footer(store: Store) -> list[str]:
    """Counts by status, and the distinct reasons rows failed or were skipped."""
    counts = store.statuses()
    lines = [", ".join(f"{counts[s]} {s}" for s in ("ok", "failed", "skipped") if counts[s]) + " rows"]
    others = Counter(analysis.workload_of(r) for r in store.rows if not analysis.compared(r))
    if others:
        lines[0] += f" ({', '.join(f'{n} of the {w} workload' for w, n in others.items())}, not shown)"
    reasons: dict[str, list[str]] = {}
    for row, error in store.errors():
        reasons.setdefault(f"{row.get('status')}: {error}", []).append(f"{row.get('strategy')}@{row.get('tokens')}")
    for reason, where in list(reasons.items())[:8]:
        lines.append(f"  {reason} ({', '.join(where[:4])}{' ...' if len(where) > 4 else ''})")
    return lines


# -- sensitivity: one strategy's knob grid at one token count -------------------------------


def sensitivity_rows(store: Store, strategy: str, tokens: int) -> list[dict]:
    compared = [r for r in store.rows if analysis.compared(r)]
    measured = sorted({r["strategy"] for r in compared})
    if strategy not in measured:
        raise UserError(f"--sensitivity: '{strategy}' is not in the results{did_you_mean(strategy, measured)}; "
                        f"measured: {', '.join(measured)}")
    rows = [r for r in compared if r["strategy"] == strategy and r.get("tokens") == tokens]
    if not rows:
        counts = sorted({r.get("tokens") for r in compared if r["strategy"] == strategy})
        raise UserError(f"--tokens: {strategy} was measured at {', '.join(map(str, counts))} tokens, not at {tokens}")
    return rows


def varying(knob_sets: list[dict]) -> list[str]:
    """The knobs whose value differs between settings: the grid's axes."""
    names = list(dict.fromkeys(k for knobs in knob_sets for k in knobs))
    return [k for k in names if len({json.dumps(knobs.get(k)) for knobs in knob_sets}) > 1]


def _value_order(v) -> tuple:
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def sensitivity_grid(group: Group, rows: list[dict], ref: Measured | None) -> Grid:
    """A line per combination of the varying knobs but the last, a column per value of the
    last (one `ms` column when only one knob varies, one cell when none does)."""
    axes = varying([r["knobs"] for r in rows])
    outer, inner = (axes[:-1], axes[-1:]) if len(axes) > 1 else (axes, [])
    fastest = min((r["ms"] for r in rows if r.get("status") == "ok"), default=None)
    cols = _sorted_coords({_coord(r, inner) for r in rows})
    grid_rows = []
    for line in _sorted_coords({_coord(r, outer) for r in rows}):
        label = _label(outer, line) or analysis.knob_text(rows[0]["knobs"]) or "defaults"
        cells = [_knob_cell([r for r in rows if _coord(r, outer) == line and _coord(r, inner) == col], ref, fastest)
                 for col in cols]
        grid_rows.append([_shown(label), *cells])
    header = [" / ".join(outer) or "knobs", *(f"{inner[0]}={_label(inner, col)}" if inner else "ms" for col in cols)]
    return Grid(f"{group.label()}: {rows[0]['strategy']} at {rows[0]['tokens']} tokens", header, grid_rows)


def _coord(row: dict, names: list[str]) -> tuple[str, ...]:
    """A row's position along some knob axes (JSON text, so any value type compares)."""
    return tuple(json.dumps(row["knobs"].get(k)) for k in names)


def _sorted_coords(coords: set[tuple[str, ...]]) -> list[tuple[str, ...]]:
    return sorted(coords, key=lambda c: [_value_order(json.loads(v)) for v in c])


def _label(names: list[str], coord: tuple[str, ...]) -> str:
    """`128` on a single axis (its name is in the header), `a=1 b=2` on several."""
    values = [json.loads(v) for v in coord]
    return str(values[0]) if len(names) == 1 else " ".join(f"{k}={v}" for k, v in zip(names, values))


def _knob_cell(match: list[dict], ref: Measured | None, fastest: float | None) -> Shown:
    ok = [r for r in match if r.get("status") == "ok"]
    if not ok:
        return _shown(match[0]["status"] if match else "-")
    best = min(ok, key=lambda r: r["ms"])
    speedup = [] if ref is None else [f"{ref.ms / best['ms']:.3f}x"]
    noisy = best.get("cv") is not None and best["cv"] > analysis.NOISY_CV
    return Shown((f"{_ms(best['ms'])} ms", *speedup), best["ms"] == fastest, NOISY if noisy else "")


def sensitivity_record(row: dict, ref: Measured | None) -> dict:
    ok = row.get("status") == "ok"
    return Group.of(row).fields() | {
        "tokens": row["tokens"], "strategy": row["strategy"], "knobs": row["knobs"], "status": row["status"],
        "ms": row.get("ms"), "cv": row.get("cv"),
        "speedup": ref.ms / row["ms"] if ok and ref is not None else None, "error": row.get("error"),
    }


def sensitivity_view(store: Store, strategy: str, tokens: int) -> tuple[list[Grid], list[dict], str]:
    """The grids, their records and their legend."""
    rows = sensitivity_rows(store, strategy, tokens)
    points = analysis.by_point(store.measured)
    grids, records = [], []
    groups = sorted({Group.of(r) for r in rows}, key=lambda g: g.label())
    for group in groups:
        mine = [r for r in rows if Group.of(r) == group]
        batch = tuple(mine[0].get("batch") or (tokens,))  # the reference must be of the same batch
        ref = analysis.reference(m for m in points.get(group, {}).get(tokens, []) if m.batch == batch)
        grids.append(sensitivity_grid(group, mine, ref))
        records += [sensitivity_record(r, ref) for r in mine]
    return grids, records, sensitivity_legend(groups)


# -- compare: NEW against OLD, point by point ----------------------------------------------


def compare_pairs(old: Store, new: Store) -> list[tuple[Measured, Measured]]:
    """(OLD, NEW) per point in both stores (matched by key), ordered by group, tokens, strategy."""
    before = {m.key: m for m in old.measured}
    pairs = [(before[m.key], m) for m in new.measured if m.key in before]
    if not pairs:
        raise UserError(
            f"--compare: {old.sources[0]} and {new.sources[0]} share no points "
            f"(matched by point key: workload, gemm, shape, tp, dtype, layers, seed, batch, strategy, knobs)"
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
        rows.append([_shown(_compared_group(n)), _shown(str(r["tokens"])), _shown(n.describe()),
                     _shown(_ms(r["old_ms"])), _shown(_ms(r["new_ms"])),
                     Shown((f"{r['ratio']:.3f}",), mark=SLOWER if r["regression"] else ""),
                     _shown(f"[{r['ratio_ci'][0]:.3f}, {r['ratio_ci'][1]:.3f}]")])
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
        _stderr().print(f"{len(regressions)} of {len(records)} points slower than OLD by more than {fail_above:g}% "
                        f"beyond the noise", highlight=False)
    for (_, n), r in zip(pairs, records):
        if r["regression"]:
            _stderr().print(f"  regression: {_compared_group(n)}: {n.describe()} at {r['tokens']} tokens: "
                            f"{r['old_ms']:.4g} -> {r['new_ms']:.4g} ms ({r['ratio']:.3f}x)", highlight=False)
    return 1 if regressions else 0


# -- rendering -----------------------------------------------------------------------------


def to_rich(grid: Grid) -> Table:
    multiline = any(len(c.all_lines()) > 1 for row in grid.rows for c in row)
    table = Table(title=Text(grid.title, style="bold"), title_justify="left", show_lines=multiline)
    for i, name in enumerate(grid.header):  # squeezed, a cell wraps (folds), never cuts
        table.add_column(name, justify="right" if i == 0 else "left", overflow="fold")
    for row in grid.rows:
        table.add_row(*(_rich_cell(c) for c in row))
    return table


def _rich_cell(cell: Shown) -> Text:
    text = Text("\n".join(cell.all_lines()), style="bold" if cell.best else "")
    if cell.best:
        text.append(f" {STAR}", style="bold green")
    if cell.mark:
        text.append(f" {cell.mark}", style="yellow" if cell.mark == NOISY else "bold red")
    return text


def to_markdown(grid: Grid) -> str:
    def cell(c: Shown) -> str:
        body = ", ".join(c.all_lines()).replace("|", "\\|")
        body = f"**{body}** {STAR}" if c.best else body
        return body + (f" {c.mark}" if c.mark else "")

    lines = ["| " + " | ".join(grid.header) + " |", "|" + "|".join(["---:"] + ["---"] * (len(grid.header) - 1)) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in grid.rows]
    return f"### {grid.title}\n\n" + "\n".join(lines) + "\n"


def to_csv(records: list[dict]) -> str:
    import pandas as pd

    flat = [{k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()} for r in records]
    return pd.DataFrame(flat).to_csv(index=False)


def emit(grids: list[Grid], records: list[dict], fmt: str, console: Console,
         legend: str | None = None, notes: Iterable[str] = ()) -> None:
    """Print in the asked format. The legend and notes (row counts, failures) go under tables;
    with csv and json stdout holds the data alone and the notes go to stderr."""
    notes = list(notes)
    if fmt == "table":
        for grid in grids:
            print_grid(grid, console)
        for note in ([legend] if legend else []) + notes:
            console.print(Text(note, style="dim"), soft_wrap=False)  # prose: word-wrapped at the width
    elif fmt == "markdown":
        text = "\n".join(to_markdown(g) for g in grids)
        text += f"\n{legend}\n" if legend else ""
        text += "".join(f"\n- {n.strip()}" for n in notes)
        console.out(text, highlight=False)
    else:
        text = to_csv(records) if fmt == "csv" else json.dumps(records, indent=2, default=str) + "\n"
        console.file.write(text)
        console.file.flush()
        for note in notes:
            _stderr().print(note, highlight=False)


def print_grid(grid: Grid, console: Console) -> None:
    """The table in full. Where it is wider than the console (a pipe counts as 80 columns), the
    knob settings move under it (a tag in the cell, its meaning below): the cells that stay need
    little width, and whatever is still too wide wraps, or goes to a pipe unsqueezed."""
    table = to_rich(grid)
    if printing.fits(console, table):
        console.print(table)
        return
    tagged, legend = knobs_below(grid)
    printing.print_table(console, to_rich(tagged))
    if legend:
        console.print(Text("knob settings of the cells:", style="dim"))
    for tag, knobs in legend.items():
        console.print(Text(f"  {tag}: {knobs}"), soft_wrap=False, overflow="fold")


def knobs_below(grid: Grid) -> tuple[Grid, dict[str, str]]:
    """The grid with each cell's knob setting replaced by a short tag (k1, k2, ...), and the tags'
    meanings."""
    tags: dict[str, str] = {}
    for row in grid.rows:
        for cell in row:
            if cell.knobs and cell.knobs not in tags:
                tags[cell.knobs] = f"k{len(tags) + 1}"
    rows = [[replace(c, knobs=tags[c.knobs]) if c.knobs else c for c in row] for row in grid.rows]
    return replace(grid, rows=rows), {tag: knobs for knobs, tag in tags.items()}


def _stderr() -> Console:
    return printing.console(stderr=True)


# -- plot ----------------------------------------------------------------------------------


def plot(views: dict[Group, dict[str, dict[str, Cell]]], path: Path, metric: str) -> Path:
    """One panel per group: ms per layer or GEMM (or speedup) against tokens on a log2 axis, one
    line per strategy at its best knobs; no_comm dashed, as the bound."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError("--plot: needs matplotlib; pip install 'overlapbench[plot]' (or pip install matplotlib)") from None
    fig = Figure(figsize=(8, 4.5 * len(views)), layout="constrained")
    FigureCanvasAgg(fig)
    for ax, (group, points) in zip(fig.subplots(len(views), 1, squeeze=False)[:, 0], views.items()):
        _panel(ax, group, points, metric)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    return tuned.write_atomic(path, buffer.getvalue())


def _panel(ax, group: Group, points: dict[str, dict[str, Cell]], metric: str) -> None:
    # Lines run over single-sequence batches only: a line through batches of different shapes
    # would mix workloads (a store of multi-sequence batches only is plotted as it is).
    single = {label: cells for label, cells in points.items() if all(len(c.m.batch) == 1 for c in cells.values())}
    points = single or points
    strategies = sorted({s for cells in points.values() for s in cells}, key=column_order)
    for s in strategies:
        xs = [cells[s].m.tokens for cells in points.values() if s in cells]
        ys = [cells[s].m.ms if metric == "ms" else cells[s].speedup for cells in points.values() if s in cells]
        if metric == "speedup" and None in ys:
            continue
        bound = s == analysis.BOUND
        ax.plot(xs, ys, linestyle="--" if bound else "-", marker="" if bound else "o",
                color="gray" if bound else None, label=f"{s} (bound)" if bound else s)
    if metric == "speedup":
        ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens")
    ax.set_ylabel(f"ms per {group.unit}" if metric == "ms" else f"speedup over {group.reference_strategy}")
    ax.set_title(group.label())
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


# -- the command ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """The report command's options, checked together because they constrain each other."""

    fmt: str = "table"
    sensitivity: str | None = None
    tokens: int | None = None
    plot_path: Path | None = None
    plot_metric: str = "ms"
    compare_paths: tuple[Path, Path] | None = None
    fail_above: float | None = None

    def check(self, paths: list[Path]) -> None:
        if self.fmt not in FORMATS:
            raise UserError(f"--format: '{self.fmt}' is not one of {', '.join(FORMATS)}{did_you_mean(self.fmt, FORMATS)}")
        if self.plot_metric not in PLOT_METRICS:
            raise UserError(f"--plot-metric: '{self.plot_metric}' is not one of {', '.join(PLOT_METRICS)}")
        if (self.sensitivity is None) != (self.tokens is None):
            raise UserError("--sensitivity and --tokens go together: --sensitivity STRATEGY --tokens N")
        if self.plot_path is not None and self.plot_path.suffix.lower() != ".png":
            raise UserError(f"--plot: {self.plot_path} must end in .png")
        if self.fail_above is not None and self.compare_paths is None:
            raise UserError("--fail-above: only with --compare OLD NEW")
        if self.fail_above is not None and not self.fail_above >= 0:
            raise UserError(f"--fail-above: a percentage >= 0, got {self.fail_above}")
        if self.compare_paths is not None and paths:
            raise UserError("--compare: takes its two files (--compare OLD NEW); leave out the RESULTS arguments")
        if self.compare_paths is not None and (self.sensitivity is not None or self.plot_path is not None):
            raise UserError("--compare: cannot be combined with --sensitivity or --plot")


COMM = "comm"  # the workload of `overlapbench comm` rows


def comm_report(rows: list[dict], fmt: str, console: Console, opts: Options) -> int:
    """A results file of collective microbenchmarks: comm's own nccl-tests table (no strategies
    to compare, so no overview)."""
    from overlapbench.comm import output as comm

    if opts.sensitivity is not None or opts.plot_path is not None:
        raise UserError("--sensitivity, --plot: compare layer or micro strategies; "
                        "these are comm results (shown as a table without them)")
    if fmt not in comm.FORMATS:
        raise UserError(f"--format: comm results come as {', '.join(comm.FORMATS)}, not {fmt}")
    comm.render(rows, fmt, console)
    (console if fmt == "table" else _stderr()).print(comm.totals(rows))
    return 0


def _require_measured(store: Store) -> None:
    if not store.measured:
        first = next((e for _, e in store.errors() if e), "no rows")
        names = ", ".join(map(str, store.sources))
        raise UserError(f"{names}: no ok rows of the {analysis.COMPARED_TEXT} workloads to report "
                        f"({dict(store.statuses())}; first error: {first})")


def run(paths: Iterable[Path], fmt: str = "table", console: Console | None = None, **options) -> int:
    """The report command; returns the exit code (1: a regression above --fail-above).
    `options`: the fields of Options (sensitivity, tokens, plot_path, plot_metric,
    compare_paths, fail_above)."""
    console, paths, opts = console or printing.console(), list(paths), Options(fmt, **options)
    opts.check(paths)
    if opts.compare_paths is not None:
        return compare(*opts.compare_paths, fmt, console, opts.fail_above)
    store = analysis.read(paths, require_ok=False)
    comm_rows = [r for r in store.rows if analysis.workload_of(r) == COMM]
    if not store.measured and comm_rows:
        return comm_report(comm_rows, fmt, console, opts)
    _require_measured(store)
    views = overview(store)
    if opts.sensitivity is not None:
        grids, records, note = sensitivity_view(store, opts.sensitivity, opts.tokens)
        emit(grids, records, fmt, console, note)
    else:
        grids = [overview_grid(group, points) for group, points in views.items()]
        records = [c.record() for points in views.values() for cells in points.values() for c in cells.values()]
        emit(grids, records, fmt, console, legend(views), footer(store))
    if opts.plot_path is not None:
        written = plot(views, opts.plot_path, opts.plot_metric)
        (console if fmt == "table" else _stderr()).print(f"wrote {written}", highlight=False)
    return 0
