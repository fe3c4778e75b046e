"""The overview: per group, one line per token count, a column per strategy at its best knobs."""

from __future__ import annotations

from collections import Counter

from overlapbench.report.cells import NOISY, Cell, Grid, Shown, fmt_ms, text_cell
from overlapbench.tuning import analysis, batches, origin, tune
from overlapbench.tuning.analysis import Group, Measured, Store


def cells_at(rows: list[Measured]) -> dict[str, Cell]:
    """Per strategy at one point: tune's choice where it is that strategy, else its best knobs."""
    ref, free, choice = analysis.reference(rows), analysis.bound(rows), tune.pick(rows)
    strongest = analysis.best_reference(rows)
    best = analysis.best_per_strategy(rows)
    if choice is not None:
        best[choice.chosen.strategy] = choice.chosen
    return {
        s: Cell(m, analysis.speedup(m, ref), analysis.hidden(m, ref, free), choice is not None and m is choice.chosen,
                None if m is ref else analysis.speedup_ci(m, ref), analysis.speedup(m, strongest), strongest)
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
            batches.batch_label(batch_rows[0]): cells_at(batch_rows)
            for rows in points.values()
            for batch_rows in batches.by_batch(rows).values()
        }
        for group, points in analysis.by_point(store.measured).items()
    }


def overview_grid(group: Group, points: dict[str, dict[str, Cell]]) -> Grid:
    strategies = sorted({s for cells in points.values() for s in cells}, key=column_order)
    rows = []
    for label, cells in points.items():
        shown = [_overview_cell(cells.get(s)) for s in strategies]
        rows.append([text_cell(label), *shown])
    return Grid(group.label(), ["tokens", *strategies], rows, stacked_grid(group, points))


def stacked_grid(group: Group, points: dict[str, dict[str, Cell]]) -> Grid:
    """The overview a line per strategy and point, its figures in columns: what fits a narrow
    console (80 columns) however many strategies were measured. Columns no cell fills are left out."""
    cells = [(label, c) for label, by_strategy in points.items() for c in by_strategy.values()]
    columns = {
        "ms": lambda c: fmt_ms(c.m.ms), "speedup": Cell.speedup_text, "vs best": Cell.vs_best_text,
        "hidden": Cell.hidden_text, "TF/s": Cell.rate_text,
    }
    shown = [name for name, text in columns.items() if any(text(c) for _, c in cells)]
    rows, previous = [], None
    for label, c in cells:
        strategy = Shown((c.m.strategy,), c.winner, NOISY if c.m.noisy else "", c.m.knob_text(), knobs_inline=True)
        numbers = [Shown((columns[name](c) or "-",), right=True) for name in shown]
        rows.append([text_cell(label if label != previous else ""), strategy, *numbers])
        previous = label
    return Grid(group.label(), ["tokens", "strategy", *shown], rows, compact=True)


def _overview_cell(cell: Cell | None) -> Shown:
    if cell is None:
        return text_cell("-")
    *figures, knobs = cell.lines()
    return Shown(tuple(figures), cell.winner, NOISY if cell.m.noisy else "", knobs)


def footer(store: Store) -> list[str]:
    """Counts by status, the setups kept apart (several devices, or measured and predicted), and
    the distinct reasons rows failed or were skipped, each with its places per model (and device,
    where the rows are of several)."""
    counts = store.statuses()
    lines = [", ".join(f"{counts[s]} {s}" for s in ("ok", "failed", "skipped") if counts[s]) + " rows"]
    others = Counter(analysis.workload_of(r) for r in store.rows if not analysis.compared(r))
    if others:
        lines[0] += f" ({', '.join(f'{n} of the {w} workload' for w, n in others.items())}, not shown)"
    lines += filter(None, [analysis.separated(store.measured)])
    whose = _whose(store.rows)
    reasons: dict[str, dict[str, list[str]]] = {}
    for row, error in store.errors():
        places = reasons.setdefault(f"{row.get('status')}: {error}", {}).setdefault(whose(row), [])
        places.append(f"{row.get('strategy')}@{row.get('tokens')}")
    for reason, by_whom in list(reasons.items())[:8]:
        where = "; ".join((f"{who}: " if who else "") + _first(places) for who, places in by_whom.items())
        lines.append(f"  {reason} ({where})")
    return lines


def _first(places: list[str]) -> str:
    return ", ".join(places[:4]) + (" ..." if len(places) > 4 else "")


def _whose(rows: list[dict]):
    """What names a row's model and device in a failure's places: those of them that differ
    among the rows (nothing for rows of one model on one device)."""
    def parts(row: dict) -> tuple[str, str]:
        predicted = origin.kind_of(row) == origin.PREDICTED
        return str(row.get("model") or "custom"), origin.device_label(str(row.get("device")), predicted)

    varying = [i for i in (0, 1) if len({parts(r)[i] for r in rows}) > 1]
    return lambda row: " ".join(parts(row)[i] for i in varying)
