"""A batch's candidates timed together, interleaved, in groups that fit in memory.

Every candidate of a batch (each strategy x knob setting still to do, with the reference, which
is timed even where its own row is done or not asked for) is built, checked against the
reference output and captured once; then a group of them is timed in rounds (interleave.py).
Candidates join the current group one by one; when one runs out of memory beside the others,
the group is timed and released, and a new group starts with the reference and that candidate.
A candidate that fails there too, or for any other reason, is its own failed row.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from overlapbench.timing import bench, interleave
from overlapbench.timing.interleave import Plan, Timed
from overlapbench.timing.phases import PointFailed, out_of_memory, phase
from overlapbench.tuning.rows import Point

WARMUP_ITERS = 2  # per candidate, to estimate its iteration time; whole rounds warm the clocks after


@dataclass
class Prepared:
    """A candidate built, checked and captured: what one timed iteration runs, and its row's
    fields so far (rel_err, tolerance, checked, graphs, graph_error)."""

    point: Point
    run: Callable[[], object]
    fields: dict
    step: Any = None  # the strategy's Step: what the sequential mode times, --profile profiles


# (point, crowded) -> a Prepared, or the point's final result (failed, skipped). `crowded`: other
# candidates hold memory beside the reference, so running out of it (in capture too) is a failure
# that a group of its own may cure; alone, a capture that fails falls back to eager, as ever.
Prepare = Callable[[Point, bool], "Prepared | dict"]


def measure_batch(
    rt, todo: list[Point], reference: Point, prepare: Prepare, plan: Plan, pairing: str,
    guard: Callable[..., AbstractContextManager] = lambda what, extra_s=0.0: nullcontext(),
    profile: Callable[[Prepared], dict] | None = None,
) -> Iterator[tuple[Point, dict]]:
    """(point, result fields) for every point of `todo` (all of one batch), as groups finish.
    `profile` (--profile): profiles a timed candidate, the fields it adds to the row."""
    with guard(f"building the reference {_describe(reference)}"):
        ref = prepare(reference, False)
    if isinstance(ref, dict):
        why = {"status": "failed", "error": f"the reference {reference.strategy} failed: {ref.get('error')}"}
        for point in todo:
            yield point, ref if point == reference else why
        return
    ref_timed, group, first_round = Timed([], [], 0), [], 0

    def time_group():
        nonlocal group, first_round
        done = _time_group(rt, ref, group, plan, pairing, first_round, guard, profile)
        if isinstance(done, dict):  # the timing itself failed: every member's row says so
            results = [(c.point, c.fields | done) for c in group]
        else:
            timed, results = done
            ref_timed.add(timed)
            first_round = (timed.round_ids[-1] + 1) if timed.round_ids else first_round
        group = []
        _release(rt)
        return results

    for point in (p for p in todo if p != reference):
        with guard(f"building {_describe(point)}"):
            got = prepare(point, bool(group))
        if isinstance(got, dict) and out_of_memory(got) and group:
            yield from time_group()  # it may fit beside the reference alone
            with guard(f"building {_describe(point)}"):
                got = prepare(point, False)
        if isinstance(got, dict):
            yield point, got
        else:
            group.append(got)
    if group or reference in todo:
        yield from time_group()
    if reference in todo:
        ref_timed.speedup, ref_timed.speedup_ci = 1.0, (1.0, 1.0)
        if not ref_timed.samples_ms:
            yield reference, ref.fields | {"status": "failed", "error": "the reference was not timed"}
            return
        yield reference, _profiled(ref, _fields(ref, ref_timed, pairing), profile)  # asked for: profiled as the others


def _time_group(rt, ref: Prepared, group: list[Prepared], plan: Plan, pairing: str, first_round: int,
                guard, profile) -> tuple[Timed, list[tuple[Point, dict]]] | dict:
    """Time the reference and `group` interleaved: the reference's Timed and each member's
    (point, result); or the failure of the timing as a result. Each candidate is warmed up on its
    own first: one that fails there (out of memory, a kernel error) is its own failed row, and
    the others are timed without it."""
    agree, gather = interleave.ranks_max(rt), interleave.ranks_gather(rt)
    align = interleave.ranks_barrier(rt)
    clock = bench.clock_for(rt.is_cuda)
    members, per_iter, dropped = [], [], []
    try:
        for c in [ref, *group]:
            try:
                with guard(f"warming up {_describe(c.point)}"):
                    per_iter.append(phase(rt, lambda c=c: bench.warm_up(c.run, WARMUP_ITERS, 0.0, clock)))
                members.append(c)
            except PointFailed as failure:
                if c is ref:
                    raise
                dropped.append((c.point, c.fields | failure.result))
        per_iter = agree(per_iter)
        what = f"{len(members)} candidates at {ref.point.tokens} tokens"
        with guard(f"timing {what} interleaved", interleave.longest_s(per_iter, plan)):
            runs = [c.run for c in members]
            timed = phase(rt, lambda: interleave.time_rounds(runs, per_iter, 0, plan, clock, gather, first_round, align))
    except PointFailed as failure:
        return failure.result
    results = []
    for c, t in zip(members[1:], timed[1:]):
        results.append((c.point, _profiled(c, _fields(c, t, pairing), profile)))
    return timed[0], results + dropped


def _profiled(c: Prepared, fields: dict, profile: Callable[[Prepared], dict] | None) -> dict:
    """A timed candidate's row fields with what its profile adds (`profile_error` where profiling
    failed: the row keeps its timing); a failed row where the failure left the device unusable."""
    if profile is None:
        return fields
    try:
        return fields | profile(c)
    except PointFailed as failure:
        return c.fields | failure.result


def _fields(c: Prepared, t: Timed, pairing: str) -> dict:
    """The row's result fields: absolute statistics over rounds (ms per layer, the slowest
    rank's in each round), as in the sequential mode, the speedup over the reference in the same
    rounds, and each rank's own median ms per layer over those rounds (`rank_ms`, rank order)."""
    per_layer = [s / c.point.layers for s in t.samples_ms]
    ci = None if t.speedup_ci is None else [round(v, 6) for v in t.speedup_ci]
    rank_ms = [round(m / c.point.layers, 6) for m in t.rank_medians()] or None
    return c.fields | bench.summarize(per_layer) | {
        "status": "ok", "error": None, "samples_ms": [round(s, 6) for s in per_layer], "rank_ms": rank_ms, "iters": t.iters,
        "timing": "interleaved", "pairing": pairing, "round_ids": list(t.round_ids),
        "speedup": None if t.speedup is None else round(t.speedup, 6), "speedup_ci": ci,
    }


def _release(rt) -> None:
    gc.collect()
    if rt.is_cuda:
        torch.cuda.empty_cache()


def _describe(point: Point) -> str:
    knobs = " ".join(f"{k}={v}" for k, v in point.knobs.items())
    return f"{point.strategy} tokens={point.tokens} {knobs}".strip()
