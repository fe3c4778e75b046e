"""`--plot FILE.png`: time per layer or GEMM (or speedup) against tokens, one line per strategy."""

from __future__ import annotations

import io
from pathlib import Path

from overlapbench import tuned
from overlapbench.errors import UserError
from overlapbench.report.cells import Cell
from overlapbench.report.overview import column_order
from overlapbench.tuning import analysis
from overlapbench.tuning.analysis import Group

# -- plot ----------------------------------------------------------------------------------


def plot(views: dict[Group, dict[str, dict[str, Cell]]], path: Path, metric: str) -> Path:
    """One panel per group: ms per layer or GEMM (or speedup) against tokens on a log2 axis, one
    line per strategy at its best knobs; no_comm dashed, as the bound. Rows of several stack
    depths: the deepest's, the title says which."""
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
    # Lines run over single-sequence prefill batches only: a line through batches of different
    # shapes would mix workloads (a store of other batches only is plotted as it is).
    single = {label: cells for label, cells in points.items()
              if all(len(c.m.batch) == 1 and c.m.decode is None for c in cells.values())}
    points = single or points
    # Several stack depths (layers: [4, 8]): the lines run through the deepest's points alone.
    depths = sorted({c.m.layers for cells in points.values() for c in cells.values() if c.m.layers is not None})
    deepest = f" ({depths[-1]} layers)" if len(depths) > 1 else ""
    if deepest:
        points = {label: cells for label, cells in points.items()
                  if all(c.m.layers == depths[-1] for c in cells.values())}
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
    ax.set_title(group.label() + deepest)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


