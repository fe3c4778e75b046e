"""`--plot FILE.png`: time per layer or GEMM (or speedup) against tokens, one line per strategy.

What is drawn is chosen here without matplotlib (`lines`), so that the choice is testable on any
machine; `plot` only draws it."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

from overlapbench import tuned
from overlapbench.errors import UserError
from overlapbench.report.cells import Cell
from overlapbench.report.overview import column_order
from overlapbench.tuning import analysis
from overlapbench.tuning.analysis import Group

# -- what is drawn -------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One strategy's line in a panel: (tokens, ms or speedup) per point, in the points' order."""

    strategy: str
    xs: tuple[int, ...]
    ys: tuple[float, ...]

    @property
    def bound(self) -> bool:
        return self.strategy == analysis.BOUND


def lines(points: dict[str, dict[str, Cell]], metric: str) -> tuple[list[Line], int | None]:
    """A panel's lines, and the depth they were read at where the group holds several (None
    where it holds one).

    Lines run over single-sequence prefill batches only: a line through batches of different
    shapes would mix workloads (a store of other batches only is plotted as it is). Of several
    stack depths (`layers: [4, 8]`), the lines run through the deepest's points alone, each
    speedup over that depth's own reference: a line through two depths would join workloads
    whose last layer's unhidden reduction weighs differently. A depth not recorded (rows written
    before `layers` was) counts as one of its own, never the deepest."""
    single = {label: cells for label, cells in points.items()
              if all(len(c.m.batch) == 1 and c.m.decode is None for c in cells.values())}
    points = single or points
    depths = {c.m.layers for cells in points.values() for c in cells.values()}
    deepest = max((d for d in depths if d is not None), default=None) if len(depths) > 1 else None
    if deepest is not None:
        points = {label: cells for label, cells in points.items() if all(c.m.layers == deepest for c in cells.values())}
    out = []
    for s in sorted({s for cells in points.values() for s in cells}, key=column_order):
        shown = [cells[s] for cells in points.values() if s in cells]
        ys = [c.m.ms if metric == "ms" else c.speedup for c in shown]
        if metric == "speedup" and None in ys:
            continue
        out.append(Line(s, tuple(c.m.tokens for c in shown), tuple(ys)))
    return out, deepest


# -- plot ----------------------------------------------------------------------------------


def plot(views: dict[Group, dict[str, dict[str, Cell]]], path: Path, metric: str) -> Path:
    """One panel per group: ms per layer or GEMM (or speedup) against tokens on a log2 axis, one
    line per strategy at its best knobs (`lines`); no_comm dashed, as the bound. Rows of several
    stack depths: the deepest's, the title says which."""
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


def title(group: Group, depth: int | None) -> str:
    """A panel's title: the group, and the depth its lines were read at where it holds several."""
    return group.label() + ("" if depth is None else f" ({depth} layers)")


def _panel(ax, group: Group, points: dict[str, dict[str, Cell]], metric: str) -> None:
    drawn, depth = lines(points, metric)
    for line in drawn:
        ax.plot(line.xs, line.ys, linestyle="--" if line.bound else "-", marker="" if line.bound else "o",
                color="gray" if line.bound else None, label=f"{line.strategy} (bound)" if line.bound else line.strategy)
    if metric == "speedup":
        ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens")
    ax.set_ylabel(f"ms per {group.unit}" if metric == "ms" else f"speedup over {group.reference_strategy}")
    ax.set_title(title(group, depth))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
