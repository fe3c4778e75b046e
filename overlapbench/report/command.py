"""`overlapbench report`: read the stores, pick the view, emit it in the chosen format."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from overlapbench import printing
from overlapbench.errors import UserError, did_you_mean
from overlapbench.report.cards import card_notes
from overlapbench.report.cells import legend
from overlapbench.report.compare import compare
from overlapbench.report.exposed_view import TIMELINES, emit_sections, sections
from overlapbench.report.overview import footer, overview, overview_grid
from overlapbench.report.plot import plot
from overlapbench.report.profile import accounts, emit_unprofiled, profile_view
from overlapbench.report.render import emit, stderr_console
from overlapbench.report.rounds import rounds_view
from overlapbench.report.sensitivity import sensitivity_view
from overlapbench.report.steady import emit_steady
from overlapbench.tuning import analysis
from overlapbench.tuning.analysis import Store
from overlapbench.tuning.settling import unsettled_note

FORMATS = ("table", "markdown", "csv", "json")
PLOT_METRICS = ("ms", "speedup")


# -- the command ---------------------------------------------------------------------------


@dataclass(kw_only=True)
class Options:
    """Compare strategies per token count, a table per group (layer, or a micro workload's
    GEMM): ms per layer (per GEMM), speedup over the reference (baseline; micro: sp_baseline),
    share of the exposed communication hidden; the winner marked, noisy cells flagged."""

    results: Annotated[list[Path] | None, typer.Argument(metavar="RESULTS.jsonl", help="Results files, read in order (a later row for a point wins). Default: the newest in results/ holding a sweep's rows (layer or micro), else the newest.")] = None
    fmt: Annotated[str, typer.Option("--format", help="table | markdown | csv | json (csv/json: one record per cell, to stdout).")] = "table"
    sensitivity: Annotated[str | None, typer.Option("--sensitivity", metavar="STRATEGY", help="Show one strategy's knob grid (ms per setting) at --tokens.")] = None
    tokens: Annotated[int | None, typer.Option("--tokens", metavar="N", help="The token count for --sensitivity.")] = None
    plot: Annotated[Path | None, typer.Option("--plot", metavar="FILE.png", help="Also draw time per layer (micro: per GEMM) vs tokens to a PNG (needs the 'plot' extra: matplotlib).")] = None
    plot_metric: Annotated[str, typer.Option("--plot-metric", help="ms | speedup: what --plot draws.")] = "ms"
    compare: Annotated[tuple[Path, Path] | None, typer.Option("--compare", metavar="OLD NEW", help="Per point (matched by key) the ratio NEW/OLD of ms per layer (micro: per GEMM).")] = None
    fail_above: Annotated[float | None, typer.Option("--fail-above", metavar="PCT", help="With --compare: exit 1 when any point got slower by more than PCT percent.")] = None
    across_devices: Annotated[bool, typer.Option("--across-devices", help="With --compare: compare OLD and NEW of different devices, or measured against predicted (refused without it: the difference is not the code's).")] = False
    profile: Annotated[Path | None, typer.Option("--profile", metavar="DIR", help="Where each point's GPU time goes: the kernel tables `sweep --profile DIR` wrote, by kind of kernel, per layer, beside no_comm's; then, from each point's timeline, its exposed communication (which transfer runs with no compute, after which kernel).")] = None
    timeline: Annotated[str | None, typer.Option("--timeline", help="replay | eager: with --profile, which timeline a point's exposed communication is read from: its CUDA-graph replay's where the sweep kept one (the default; else the eager forward's), or the eager forward's always.")] = None
    rounds: Annotated[bool, typer.Option("--rounds", help="How noisy the paired timing's rounds were, per batch: rounds, the sd of per-round ratios, the widest interval.")] = False


def main(options: Options) -> int:
    """The files named (or the newest sweep's), then `run`: its exit code."""
    from overlapbench.tuning import results as results_mod
    from overlapbench.tuning.rows import WORKLOADS

    err_console = printing.console(stderr=True)

    def file_of(path: Path | None) -> Path:
        return results_mod.given_or_newest(path, WORKLOADS, lambda text: err_console.print(text, soft_wrap=True),
                                           fallback=True)

    o = options
    paths = [file_of(p) for p in o.results] if o.results else ([] if o.compare else [file_of(None)])
    compare_paths = None if o.compare is None else (file_of(o.compare[0]), file_of(o.compare[1]))
    return run(paths, o.fmt, printing.console(), sensitivity=o.sensitivity, tokens=o.tokens, plot_path=o.plot,
               plot_metric=o.plot_metric, compare_paths=compare_paths, fail_above=o.fail_above, profile_dir=o.profile,
               rounds=o.rounds, across_devices=o.across_devices, timeline=o.timeline)


@dataclass(frozen=True)
class View:
    """Which view of the rows, in which format: the options checked together because they
    constrain each other."""

    fmt: str = "table"
    sensitivity: str | None = None
    tokens: int | None = None
    plot_path: Path | None = None
    plot_metric: str = "ms"
    compare_paths: tuple[Path, Path] | None = None
    fail_above: float | None = None
    profile_dir: Path | None = None
    rounds: bool = False
    across_devices: bool = False
    timeline: str | None = None  # --timeline: None is "replay"

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
        if self.across_devices and self.compare_paths is None:
            raise UserError("--across-devices: only with --compare OLD NEW (a report keeps devices apart, a table each)")
        if self.timeline is not None and self.timeline not in TIMELINES:
            raise UserError(f"--timeline: '{self.timeline}' is not one of {', '.join(TIMELINES)}"
                            f"{did_you_mean(self.timeline, TIMELINES)}")
        if self.timeline is not None and self.profile_dir is None:
            raise UserError("--timeline: only with --profile DIR (it picks the timeline each profiled point is read from)")
        if self.fail_above is not None and not self.fail_above >= 0:
            raise UserError(f"--fail-above: a percentage >= 0, got {self.fail_above}")
        if self.compare_paths is not None and paths:
            raise UserError("--compare: takes its two files (--compare OLD NEW); leave out the RESULTS arguments")
        if self.compare_paths is not None and (self.sensitivity is not None or self.plot_path is not None):
            raise UserError("--compare: cannot be combined with --sensitivity or --plot")
        asked = {"--sensitivity": self.sensitivity is not None, "--compare": self.compare_paths is not None,
                 "--profile": self.profile_dir is not None, "--rounds": self.rounds}
        views = [name for name, on in asked.items() if on]
        if len(views) > 1:
            raise UserError(f"{' and '.join(views)}: one view at a time")


COMM = "comm"  # the workload of `overlapbench comm` rows


def comm_report(rows: list[dict], fmt: str, console: Console, opts: View) -> int:
    """A results file of collective microbenchmarks: comm's own nccl-tests table (no strategies
    to compare, so no overview)."""
    from overlapbench.comm import output as comm

    if opts.sensitivity is not None or opts.plot_path is not None:
        raise UserError("--sensitivity, --plot: compare layer or micro strategies; "
                        "these are comm results (shown as a table without them)")
    if fmt not in comm.FORMATS:
        raise UserError(f"--format: comm results come as {', '.join(comm.FORMATS)}, not {fmt}")
    comm.render(rows, fmt, console)
    (console if fmt == "table" else stderr_console()).print(comm.totals(rows))
    return 0


def _require_measured(store: Store) -> None:
    if not store.measured:
        first = next((e for _, e in store.errors() if e), "no rows")
        names = ", ".join(map(str, store.sources))
        raise UserError(f"{names}: no ok rows of the {analysis.COMPARED_TEXT} workloads to report "
                        f"({analysis.status_text(store.rows)}; first error: {first})")


def run(paths: Iterable[Path], fmt: str = "table", console: Console | None = None, **options) -> int:
    """The report command; returns the exit code (1: a regression above --fail-above).
    `options`: the fields of View (sensitivity, tokens, plot_path, plot_metric,
    compare_paths, fail_above, profile_dir, rounds, across_devices, timeline)."""
    console, paths, opts = console or printing.console(), list(paths), View(fmt, **options)
    opts.check(paths)
    if opts.compare_paths is not None:
        return compare(*opts.compare_paths, fmt, console, opts.fail_above, opts.across_devices)
    store = analysis.read(paths, require_ok=False)
    if opts.rounds:  # views of one run's rows, not of strategies compared
        grids, records, note = rounds_view(store.rows)
        emit(grids, records, fmt, console, note)
        return 0
    if opts.profile_dir is not None:  # the kernel tables, then each point's exposed communication
        found, missing = accounts(store.rows, opts.profile_dir)
        parts = []
        if found:
            grids, records, note = profile_view(found)
            parts, exposure = sections(found, opts.profile_dir, opts.timeline or TIMELINES[0])
            emit(grids, [r | exposure[r["table"]] for r in records], fmt, console, note)
        emit_unprofiled(missing, fmt, console)  # the points whose profile failed in the sweep
        emit_sections(parts, fmt, console)
        return 0
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
        notes = [*card_notes(store.measured), *filter(None, [unsettled_note(store.rows)]), *footer(store)]
        emit(grids, records, fmt, console, legend(views), notes)
        emit_steady(store.measured, fmt, console)  # points timed at several depths: what one more layer costs
    if opts.plot_path is not None:
        written = plot(views, opts.plot_path, opts.plot_metric)
        (console if fmt == "table" else stderr_console()).print(f"wrote {written}", highlight=False)
    return 0

