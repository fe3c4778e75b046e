"""The point loop, on every rank: build each batch's workload, check each point, time it, store its row."""

from __future__ import annotations

import dataclasses
import gc
import itertools
from collections.abc import Callable
from pathlib import Path

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column

from overlapbench import printing, strategies
from overlapbench.distributed import runtime
from overlapbench.launch import launch_log
from overlapbench.launch.watchdog import Watchdog
from overlapbench.model import attention
from overlapbench.run import paired
from overlapbench.run.workload import Workload, build_workload, reference_setting
from overlapbench.specs.spec import SweepSpec
from overlapbench.timing import bench, interleave, measure, timeline
from overlapbench.timing.phases import PointFailed, out_of_memory
from overlapbench.timing.phases import phase as _phase
from overlapbench.tuning import results
from overlapbench.tuning.rows import Point, make_row


def _skip_reason(cls: type[strategies.Strategy], rt: runtime.Runtime, point: Point) -> str | None:
    if point.workload not in cls.needs.workloads:
        return f"{cls.name} does not run the {point.workload} workload"
    if cls.needs.cuda and not rt.is_cuda:
        return f"{cls.name} needs CUDA GPUs"
    if cls.needs.min_world_size > rt.world_size:
        return f"{cls.name} needs at least {cls.needs.min_world_size} ranks"
    reason = cls.skip_reason(point.knobs, rt.is_cuda)
    if reason is None and cls.uses_nccl_windows(point.knobs):
        reason = rt.nccl_windows_unavailable()  # collective the first time: every rank builds the same points
    return reason


def prepare_point(rt: runtime.Runtime, point: Point, work: Workload, spec: SweepSpec, capture: bool = False,
                  crowded: bool = False, status: Callable[[str], None] = lambda phase: None) -> paired.Prepared | dict:
    """Build the point's step and check its output against the reference; with `capture`, also
    capture what a timed iteration runs (`crowded`: a capture that runs out of memory fails the
    point rather than fall back to eager, see paired.Prepare). A Prepared, or the point's final
    result (skipped, failed). `status` hears each phase's name as it starts (the progress line)."""
    cls = strategies.get(point.strategy)
    reason = _skip_reason(cls, rt, point)
    if reason:
        return {"status": "skipped", "error": reason}
    if work.reference is None:
        return {"status": "failed", "error": work.reference_error}
    is_reference = (point.strategy, point.knobs) == reference_setting(point.workload)
    checked = cls.is_checked(point.knobs)
    tolerance = spec.tolerance(point.dtype)
    fields = {"rel_err": None, "tolerance": tolerance, "checked": checked, "attention": None,
              "check": "baseline" if work.truth is None else "fp32"}
    try:
        with attention.recording() as ran:  # which attention kernels this strategy's forward runs
            status("building")
            step = _phase(rt, lambda: cls.build(work.ctx, point.knobs))
            status("checking")
            out = _phase(rt, lambda: step.to_full(step.forward(work.x)))
        fields["attention"] = attention.describe(ran)
        if checked and (not is_reference or work.truth is not None):
            local_err, fields["tolerance"] = _phase(rt, lambda out=out: work.local_check(out, tolerance))
            fields["rel_err"] = rt.max_over_ranks(local_err)
        del out
        tolerance = fields["tolerance"]
        if fields["rel_err"] is not None and not fields["rel_err"] <= tolerance:
            error = f"wrong result: rel_err {fields['rel_err']:.3g} > tolerance {tolerance:g}"
            if fields["check"] == "baseline":  # two correct bf16 schedules can differ this much by rounding
                error += " of baseline's output (measure.check: fp32 checks against the fp32 truth)"
            return fields | {"status": "failed", "error": error}
        run = lambda: step.forward(work.x)
        if capture:
            status("capturing")
            run, graphs, graph_error = _phase(rt, lambda: measure.runner(step, work.x, spec.measure.graphs))
            if crowded:
                _phase(rt, lambda: _raise_out_of_memory(graph_error))  # every rank learns it was memory
            fields |= {"graphs": graphs, "graph_error": graph_error}
    except PointFailed as failure:
        return fields | failure.result
    return paired.Prepared(point, run, fields, step)


def _raise_out_of_memory(capture_error: str | None) -> None:
    if capture_error is not None and out_of_memory({"status": "failed", "error": capture_error}):
        raise torch.OutOfMemoryError(f"capture: {capture_error}")


def measure_point(rt: runtime.Runtime, point: Point, work: Workload, spec: SweepSpec, profile_dir: Path | None = None,
                  status: Callable[[str], None] = lambda phase: None) -> dict:
    """Build, check, then time one point on its own; the result fields of its row (the same on every rank)."""
    prepared = prepare_point(rt, point, work, spec, status=status)
    if isinstance(prepared, dict):
        return prepared
    step, fields = prepared.step, prepared.fields
    del prepared
    try:
        m = spec.measure
        status("timing")
        timing = _phase(rt, lambda: measure.time_step(step, work.x, m.warmup, m.iters, m.graphs, m.warmup_s, m.min_time_s))
        if profile_dir is not None:
            status("profiling")
        profiled = _profile(rt, point, step, work, profile_dir, timing.replay, m.profile_replays)
    except PointFailed as failure:
        return fields | failure.result
    per_layer = [s / point.layers for s in timing.samples_ms]
    return fields | bench.summarize(per_layer) | {
        "status": "ok",
        "error": None,
        "samples_ms": [round(s, 6) for s in per_layer],
        "rank_ms": [round(m / point.layers, 6) for m in timing.rank_medians_ms] or None,
        "graphs": timing.graphs,
        "graph_error": timing.graph_error,
        "timing": "sequential",
    } | profiled


def _profile(rt: runtime.Runtime, point: Point, step, work: Workload, profile_dir: Path | None,
             replay: Callable[[], object] | None = None, replays: int = 1) -> dict:
    """With --profile, the point's kernel table and timeline, and where it was timed as a graph
    replay (`replay`) the timeline of `replays` replays back to back (measure.profile_parts;
    the spec's measure.profile_replays), the ranks agreeing after
    each part: the fields the profile adds to the point's row. The command refuses --profile on
    CPU; the rank code profiles any device (on CPU: host ops, a timeline without device kernels,
    no replay).

    A profile is a diagnostic of a point already timed: where a part fails on some rank, every
    rank stops the profile there and the row keeps its timing, with `profile_error` saying which
    part failed and why. The folder then holds the parts before it, whole; the failed part's file
    and the later parts' are removed, each rank removing its own (rank 0's table and timelines,
    rank k's timelines), so none of them is an earlier run's. Where the
    device no longer works after the failure (a probe fails on some rank: a CUDA error the
    process cannot recover from), the point fails as any phase's failure fails it (PointFailed):
    its timing is not trusted, and the points after it fail as well, each saying why."""
    if profile_dir is None:
        return {}
    name = results.profile_name(point.strategy, point.tokens, point.knobs, point.decode.as_dict() if point.decode else None,
                                point.layers)
    parts = measure.profile_parts(step, work.x, profile_dir / f"{name}.txt", replay=replay, rank=rt.rank,
                                  world=rt.world_size, in_step=rt.in_step, replays=replays)
    for i, part in enumerate(parts):
        try:
            _phase(rt, part.run)
        except PointFailed as failure:
            error = f"profiling {part.what} failed: {failure.result['error']}"
            for unfinished in parts[i:]:
                if unfinished.file is not None:
                    unfinished.file.unlink(missing_ok=True)
            try:
                _phase(rt, lambda: _probe_device(rt))
            except PointFailed as broken:
                dead = f"{error}; then the device failed: {broken.result['error']}"
                raise PointFailed(broken.result | {"error": dead}) from None
            return {"profile_error": error}
    return {}


def _probe_device(rt: runtime.Runtime) -> None:
    """Raises where this rank's GPU no longer runs work (a sticky CUDA error: an illegal address,
    a device-side assert, a lost device); running out of memory is not one. Nothing on CPU."""
    if rt.is_cuda:
        torch.cuda.synchronize(rt.device)
        torch.ones(1, device=rt.device).add_(1).item()


def measure_batch(rt: runtime.Runtime, todo: list[Point], work: Workload, spec: SweepSpec, pairing: str,
                  watchdog: Watchdog, profile_dir: Path | None = None):
    """The batch's points timed interleaved (paired.py): (point, result) as groups finish."""
    if work.reference is None:  # the batch could not be built: each point says why (or why it is skipped)
        return ((point, prepare_point(rt, point, work, spec)) for point in todo)
    name, knobs = reference_setting(todo[0].workload)
    reference = dataclasses.replace(todo[0], strategy=name, knobs=knobs)
    m = spec.measure
    plan = interleave.Plan(m.span_ms, m.rounds, m.ci_target, m.warmup_s, seed=todo[0].seed, settle_ms=m.settle_ms,
                           iters=m.iters, min_time_s=m.min_time_s, budget_factor=m.time_factor)

    def prepare(point: Point, crowded: bool):
        return prepare_point(rt, point, work, spec, capture=True, crowded=crowded, status=_logged(rt))

    def profile(c: paired.Prepared) -> dict:  # c.run: the graph's replay where it was captured
        with watchdog.guard(f"profiling {_describe(c.point)}"):
            return _profile(rt, c.point, c.step, work, profile_dir, c.run if c.fields.get("graphs") else None,
                            spec.measure.profile_replays)

    return paired.measure_batch(rt, todo, reference, prepare, plan, pairing, watchdog.guard, profile)


def _describe(point: Point) -> str:
    """`strategy tokens=N knob=value ...`; knobs left unset (null) are not shown."""
    knobs = " ".join(f"{k}={v}" for k, v in point.knobs.items() if v is not None)
    decode = f" decode={point.decode.tokens}@{point.decode.context}" if point.decode else ""
    return f"{point.strategy} tokens={point.tokens}{decode} {knobs}".strip()


def measure_points(rt: runtime.Runtime, spec: SweepSpec, todo: list[Point], max_tokens: int,
                   store: results.ResultStore | None, run_id: str, env: dict, watchdog: Watchdog,
                   profile_dir: Path | None = None) -> int:
    """The point loop on this rank: per batch, its workload built once, its points checked and
    timed (interleaved on GPUs, one by one on CPU), a row each into `store` (rank 0's; None on
    the others); the rows written. `max_tokens`: the run's largest batch (buffers are sized once)."""
    console = printing.console(quiet=rt.rank != 0)
    written = 0
    if profile_dir is not None and rt.is_cuda:  # before the first capture: its replays are profiled
        timeline.prepare_for_graphs()
    # The status line stays 2 columns short of the terminal: the ^C a terminal echoes then never
    # wraps it onto a second line, which the display would not know to clear when it stops.
    status_console = printing.console(quiet=rt.rank != 0, width=max(40, console.width - 2))
    description = Column(no_wrap=True, overflow="ellipsis")  # the phase first, then the point, cut at the end
    columns = (TextColumn("{task.description}", markup=False, table_column=description), BarColumn(bar_width=20),
               MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=status_console, transient=True) as progress:
        task = progress.add_task("sweep", total=len(todo))
        stacks: dict = {}  # the current shape's layer stack (workload.weights)
        for batch, (_, group) in enumerate(itertools.groupby(todo, key=lambda p: p.workload_key)):
            group = list(group)
            first = group[0]
            progress.update(task, description=f"building the workload: {first.tokens} tokens", refresh=True)
            with watchdog.guard(f"building the workload of {_describe(first)}"):
                truth = spec.measure.checks_against_fp32(first.tp, first.shape.moe, first.dtype, first.layers)
                work = build_workload(rt, first, stacks, max_tokens, truth)
            if spec.measure.interleaved(rt.is_cuda):
                progress.update(task, description=f"{first.tokens} tokens: {len(group)} points interleaved", refresh=True)
                measured = measure_batch(rt, group, work, spec, f"{run_id}/{batch}", watchdog, profile_dir)
            else:
                measured = _one_by_one(rt, group, work, spec, watchdog, profile_dir, progress, task)
            for point, result in measured:
                if store is not None:
                    store.append(make_row(point, result, run_id, env, spec.measure))
                    written += 1
                progress.advance(task)
                progress.console.print(_summary_line(point, result, progress.tasks[0]))
                _release(rt)
            del work, measured
            _release(rt)
    return written


def _one_by_one(rt, group, work, spec, watchdog, profile_dir, progress, task):
    """The sequential mode: each point built, checked and timed on its own."""
    for point in group:
        def status(phase: str, point: Point = point) -> None:  # what runs within a long point
            _logged(rt)(phase)
            progress.update(task, description=f"{phase}: {_describe(point)}", refresh=True)

        with watchdog.guard(f"point '{_describe(point)}'"):
            result = measure_point(rt, point, work, spec, profile_dir, status)
        yield point, result


def _logged(rt: runtime.Runtime) -> Callable[[str], None]:
    """A point's phases as events of the launch log: the paragraph of a run that dies names the
    phase (building, checking, capturing, timing, profiling) of the point it died in."""
    return lambda phase: launch_log.event("phase", rank=rt.rank, phase=phase)


def _release(rt: runtime.Runtime) -> None:
    gc.collect()
    if rt.is_cuda:
        torch.cuda.empty_cache()


def header(spec: SweepSpec, count: int, rt: runtime.Runtime, out: Path):
    """What is about to run: points, processes, where the rows go."""
    where = "GPUs" if rt.is_cuda else "CPU processes"
    return printing.styled((spec.name, "bold"), f": {count} points on {rt.world_size} {where} ({rt.backend}); rows go to {out}")


def _summary_line(point: Point, result: dict, task=None):
    """One finished point: `  [k/N]      ok strategy tokens=... knobs: 0.1234 ms/layer ...`, and where its
    profile failed, ` · profiling the kernel table failed: ...`."""
    total = int(task.total) if task is not None else 0
    count = f"  [{int(task.completed):>{len(str(total))}}/{total}]" if task is not None else " "
    if result["status"] != "ok":
        return printing.styled(count, (f" {result['status']:>7}", "yellow"), f" {_describe(point)}: {result['error']}")
    err = "" if result.get("rel_err") is None else f" err {result['rel_err']:.1e}"
    timing = f" {_describe(point)}: {result['ms']:.4f} ms/layer cv {result['cv']:.1%}{err}"
    profile = (f" · {result['profile_error']}", "yellow") if result.get("profile_error") else ""
    return printing.styled(count, (f" {'ok':>7}", "green"), timing, profile)
