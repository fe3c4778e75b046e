"""What a grid cell shows: a strategy's figures at one point, the marks, and the legends."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from overlapbench.tuning import analysis
from overlapbench.tuning.analysis import Group, Measured

STAR, NOISY, SLOWER = "★", "~", "▲"
NOISY_TEXT = f"{NOISY} noisy (cv > {analysis.NOISY_CV:.0%})"
RATE_TEXT = ("TF/s = the layer's GEMM and attention FLOPs on one rank per second, and its share of the device's "
             "dense bf16 peak (the rows' peak_tflops, peak_source)")
PREDICTED_TEXT = ("(predicted): `overlapbench predict`'s rows, not measurements; their ± is the model's assumed error "
                  "(predict --error), not a measured interval")




def legend(views: dict[Group, dict[str, dict[str, Cell]]]) -> str:
    """The overview's legend; `hidden` explained where some cell shows it (a group with no_comm)."""
    name, which = references(views)
    cells = [c for points in views.values() for cells in points.values() for c in cells.values()]
    hidden = (f" · hidden = share of {name}'s exposed communication ({name.removeprefix('the ')} - no_comm) removed"
              if any(c.hidden is not None for c in cells) else "")
    rate = f" · {RATE_TEXT}" if any(c.m.peak_frac is not None for c in cells) else ""
    predicted = f" · {PREDICTED_TEXT}" if any(c.m.predicted for c in cells) else ""
    vs_best = (f" · vs best = speedup over {name}'s fastest knob setting at that point, where that is not its default"
               if any(c.vs_best_text() for c in cells) else "")
    return (f"{STAR} picked by tune's rule (faster than {name} beyond the noise, else {name}) · {NOISY_TEXT} · "
            f"speedup over {name} with default knobs{vs_best}{hidden}{rate}{predicted} · each strategy at its best knobs{which}")


def sensitivity_legend(groups: Iterable[Group]) -> str:
    name, which = references(groups)
    return (f"{STAR} fastest correct setting · bound: not a correct result (comm: none), never picked · {NOISY_TEXT} · "
            f"speedup over {name} with default knobs{which}")


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
    # Over the reference strategy's fastest setting at this point (analysis.best_reference), and
    # that row; shown where it is not the default reference.
    vs_best: float | None = None
    best: Measured | None = None

    @property
    def best_differs(self) -> bool:
        """The fastest reference setting is not the default one: `vs best` says more than `speedup`."""
        return self.best is not None and not analysis.default_knobs(self.best.knobs)

    def speedup_text(self) -> str:
        if self.speedup is None:
            return ""
        text = f"{self.speedup:.3f}x"
        if self.speedup_ci is not None and self.speedup_ci[1] > self.speedup_ci[0]:
            text += f" ±{(self.speedup_ci[1] - self.speedup_ci[0]) / 2 / self.speedup:.1%}"
        return text

    def vs_best_text(self) -> str:
        return "" if self.vs_best is None or not self.best_differs else f"{self.vs_best:.3f}x"

    def hidden_text(self) -> str:
        if self.hidden is None or self.m.strategy == analysis.BOUND:
            return ""
        return f"{round(self.hidden, 2) + 0.0:.0%}"  # no "-0%"

    def rate_text(self) -> str:
        return "" if self.m.peak_frac is None else f"{self.m.tflops:.0f} TF/s {self.m.peak_frac:.0%}"

    def lines(self) -> list[str]:
        figures = [t for t in (self.speedup_text(), self.hidden_text() and f"{self.hidden_text()} hidden") if t]
        vs_best = [f"{self.vs_best_text()} vs best"] if self.vs_best_text() else []
        rate = f" {self.rate_text()}" if self.rate_text() else ""
        return [f"{fmt_ms(self.m.ms)} ms{rate}", " ".join(figures), *vs_best, self.m.knob_text()]

    def record(self) -> dict:
        """The cell as a CSV/JSON record: `hidden_pct` in percent as the table shows it; a
        predicted row's `timing` says so, and its p10/p90/cv/noisy are null (nothing was measured)."""
        m = self.m
        return m.group.fields() | {
            "tokens": m.tokens, "batch": list(m.batch), "layers": m.layers,
            "decode": None if m.decode is None else {"tokens": m.decode[0], "context": m.decode[1]},
            "strategy": m.strategy, "knobs": m.knobs, "timing": m.timing, "ms": m.ms,
            "p10_ms": m.p10_ms, "p90_ms": m.p90_ms, "cv": m.cv, "noisy": None if m.predicted else m.noisy,
            "speedup": self.speedup, "speedup_ci": None if self.speedup_ci is None else list(self.speedup_ci),
            "hidden_pct": None if self.hidden is None else self.hidden * 100, "winner": self.winner,
            "tflops": m.tflops, "peak_frac": m.peak_frac,
            "speedup_vs_best": self.vs_best, "best_reference": None if self.best is None else self.best.knobs,
            "run_id": m.run_id,
        }


@dataclass(frozen=True)
class Shown:
    """A grid cell as text lines, bold and starred when best, with a warning mark (NOISY, SLOWER)."""

    lines: tuple[str, ...]
    best: bool = False
    mark: str = ""
    knobs: str = ""  # the knob setting: the last line, or a tag explained under a narrow table
    right: bool = False  # a number: right-aligned where its column is (stacked tables)
    knobs_inline: bool = False  # the knob setting (or its tag) on the last line, not a line of its own

    def all_lines(self) -> list[str]:
        if self.knobs_inline and self.knobs:
            return [*self.lines[:-1], f"{self.lines[-1]} {self.knobs}"]
        return [line for line in (*self.lines, self.knobs) if line]


@dataclass(frozen=True)
class Grid:
    """A titled table of Shown cells: rendered by rich or as markdown."""

    title: str
    header: list[str]
    rows: list[list[Shown]]
    stacked: Grid | None = None  # the same, a line per cell, for a console too narrow for this one
    compact: bool = False  # drawn without lines (printing.COMPACT): a stacked grid's columns need every one


def fmt_ms(x: float) -> str:
    return f"{x:.4g}"


NAME_WIDTH = 56  # kernel names cut to this many characters in a table (json keeps them whole)


def short(name: str) -> str:
    """A kernel name as a table shows it: no `void `, no argument list, at most NAME_WIDTH characters."""
    name = name.removeprefix("void ")
    if name.endswith(")") and "(" in name:
        name = name[: name.index("(")] or name
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"


def text_cell(text: str) -> Shown:
    return Shown((text,))


def number_cell(text: str) -> Shown:
    """A figure already formatted, aligned right."""
    return Shown((text,), right=True)


