"""The one timing primitive: `bench(fn, warmup_ms, rep_ms, graphs) -> Timing`, in the spirit of
triton's `do_bench`, and the pieces it is made of.

`bench` warms `fn` up (at least `warmup` calls and `warmup_ms` of them), estimates one call's
time from the warm-up, runs at least `iters` timed samples and as many more as fill `rep_ms`
(at most `max_iters`), and returns each sample's ms per call. Budgets (ms) and counts are both
minimums, so a caller that needs exact counts passes budgets of 0. A sample is `calls_per_sample`
calls of `fn` between two marks of a `Clock`: CUDA events on the current stream on GPUs,
`time.perf_counter` on CPU (where work runs as it is issued). With `graphs=True`, `fn` is
captured once in a CUDA graph (cuda_graph.capture) and its replay is what runs.

Who times with it: `measure.time_step` (the sequential mode; its ranks agree on counts through
`agree` and meet in a barrier through `before_loop` or `before_each`), `peak.py`, `run/pieces.py`,
`comm/contention.py`'s compute alone, and the scripts under tests/benchmarks/ and tests/probes/.
`run/paired.py` estimates its candidates' call times with `warm_up`.

What cannot call `bench` uses its pieces, so each idea has one piece of code: interleaved rounds
(interleave.py, tests/probes/clock_regimes.py) mark each candidate's span with `timed_span` on the
same clocks, but read a round's spans only after queueing the next round, where `bench` waits for
its own samples before it returns; `comm/contention.py`'s windows mark spans on two streams at
once, one side covering the other.

No torch at import (it is imported where a CUDA clock or a graph is used), so interleave.py, which
imports the clocks from here, loads no torch either.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

MAX_ITERS = 2000  # the most samples a rep_ms budget adds (never fewer than `iters`)
FLOOR_MS = 1e-3  # a call estimated faster than this counts as this long (no division by zero)


class Clock(Protocol):
    """Marks on the device's timeline: where the work queued so far ends."""

    def mark(self) -> Any: ...

    def elapsed_ms(self, start: Any, end: Any) -> float: ...

    def wait(self, mark: Any) -> None:
        """Block the host until the work before `mark` is done."""

    def sync(self) -> None:
        """Block the host until all the device's queued work is done."""


class WallClock:
    """CPU: work runs as it is issued, so a mark is the host's time."""

    def mark(self) -> float:
        return time.perf_counter()

    def elapsed_ms(self, start: float, end: float) -> float:
        return (end - start) * 1e3

    def wait(self, mark: float) -> None:
        pass

    def sync(self) -> None:
        pass


class CudaClock:
    """GPU: CUDA events on the current stream."""

    def mark(self):
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed_ms(self, start, end) -> float:
        return start.elapsed_time(end)

    def wait(self, mark) -> None:
        mark.synchronize()

    def sync(self) -> None:
        import torch

        torch.cuda.synchronize()


def clock_for(cuda: bool) -> Clock:
    return CudaClock() if cuda else WallClock()


def default_clock() -> Clock:
    """CUDA events where torch sees a GPU, else the wall clock."""
    import torch

    return clock_for(torch.cuda.is_available())


@dataclass
class Timing:
    """Per-sample times (ms per call of the function timed; where ranks time together, the
    callers' max over ranks) and how they were taken."""

    samples_ms: list[float]
    graphs: bool = False  # whether CUDA-graph replays were timed
    graph_error: str | None = None  # why capture failed, where it fell back to eager
    # the CUDA graph's replay that was timed, where graphs: --profile records one more (its graph
    # lives as long as this Timing); not a statistic, so neither compared nor shown
    replay: Callable[[], object] | None = field(default=None, compare=False, repr=False)
    rank_medians_ms: list[float] = field(default_factory=list)  # where ranks time together: each rank's own median, rank order

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    @property
    def max_ms(self) -> float:
        return max(self.samples_ms)

    def summary(self, per: int = 1) -> dict:
        """summarize(samples_ms, per): the statistics a row carries."""
        return summarize(self.samples_ms, per)


def summarize(samples_ms: list[float], per: int = 1) -> dict:
    """Median, p10, p90, IQR (ms, divided by `per`, e.g. the layer count) and CV of samples."""
    xs = sorted(s / per for s in samples_ms)
    if len(xs) == 1:
        return {"ms": xs[0], "p10_ms": xs[0], "p90_ms": xs[0], "iqr_ms": 0.0, "cv": 0.0}
    q = statistics.quantiles(xs, n=20, method="inclusive")  # 5% steps
    quartiles = statistics.quantiles(xs, n=4, method="inclusive")
    mean = statistics.fmean(xs)
    return {
        "ms": statistics.median(xs),
        "p10_ms": q[1],
        "p90_ms": q[17],
        "iqr_ms": quartiles[2] - quartiles[0],
        "cv": statistics.stdev(xs) / mean if mean > 0 else 0.0,
    }


def timed_span(clock: Clock, fn: Callable[[], object], calls: int = 1) -> tuple[Any, Any]:
    """`calls` calls of `fn` between two marks of `clock`; ms per call, once the work before the
    end mark is done: clock.elapsed_ms(*span) / calls."""
    start = clock.mark()
    for _ in range(calls):
        fn()
    return start, clock.mark()


def _nothing() -> None:
    pass


def _same(count: int) -> int:
    return count


def warm_up(fn: Callable[[], object], warmup: int = 1, warmup_ms: float = 0.0, clock: Clock | None = None,
            agree: Callable[[int], int] | None = None, before_each: Callable[[], None] | None = None) -> float:
    """Run `warmup` calls (one at least), then as many more as fill `warmup_ms`; returns the ms
    one call took (host time, with the device's work done). `agree` turns the count this rank
    wants into the one every rank runs (their max): a call that holds collectives must run as
    often on every rank, or one would wait for the others forever."""
    clock = clock or default_clock()
    agree = agree or _same
    before_each = before_each or _nothing
    clock.sync()
    t0 = time.perf_counter()
    first = max(warmup, 1)
    for _ in range(first):
        before_each()
        fn()
    clock.sync()
    per_call_ms = (time.perf_counter() - t0) * 1e3 / first
    more = 0
    if warmup_ms > 0:
        more = agree(math.ceil(max(0.0, warmup_ms - first * per_call_ms) / max(per_call_ms, FLOOR_MS)))
    for done in range(1, more + 1):
        before_each()
        fn()
        if done % 4 == 0:
            clock.sync()  # the host stays close to the device: clocks see a steady load
    clock.sync()
    return (time.perf_counter() - t0) * 1e3 / (first + more)


def samples_for(iters: int, rep_ms: float, per_sample_ms: float, max_iters: int = MAX_ITERS) -> int:
    """Samples that fill `rep_ms` at `per_sample_ms` each (at most `max_iters`), `iters` at least."""
    return max(iters, min(max_iters, int(rep_ms / max(per_sample_ms, FLOOR_MS)) + 1))


def bench(
    fn: Callable[[], object],
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    graphs: bool = False,
    *,
    warmup: int = 0,
    iters: int = 1,
    calls_per_sample: int = 1,
    max_iters: int = MAX_ITERS,
    clock: Clock | None = None,
    agree: Callable[[int], int] | None = None,
    before_each: Callable[[], None] | None = None,
    before_loop: Callable[[], None] | None = None,
) -> Timing:
    """Time `fn` (see the module's docstring); its samples in the order taken.

    warmup_ms, warmup: the warm-up runs at least `warmup` calls and `warmup_ms` of them (none
        when both are 0 and rep_ms is 0: nothing needs an estimate).
    rep_ms, iters, max_iters: at least `iters` samples, and as many as fill `rep_ms` (at most
        `max_iters`).
    graphs: capture `fn` in a CUDA graph and time its replays (CUDA only; a failed capture raises).
    calls_per_sample: calls of `fn` between a sample's two marks; the sample is ms per call.
    clock: default_clock() when None.
    agree: each count a budget gives goes through it (every rank runs the same count).
    before_each: called before each warm-up call and each sample, outside the timed span
        (refill what `fn` consumes, synchronize, meet the other ranks).
    before_loop: called once after the warm-up, before the first sample (a barrier, or queueing a
        sleep on the device so the host runs ahead and no launch gap is timed).
    """
    _check(fn, warmup_ms, rep_ms, warmup, iters, calls_per_sample, max_iters)
    clock = clock or default_clock()
    run = fn
    if graphs:
        if not isinstance(clock, CudaClock):
            raise ValueError("bench: graphs=True replays a CUDA graph, which needs CUDA and its clock; "
                             "pass graphs=False to time fn itself")
        from overlapbench.timing.cuda_graph import capture

        run = capture(fn).replay  # the bound method keeps the graph alive
    per_call_ms = None
    if warmup > 0 or warmup_ms > 0 or rep_ms > 0:
        per_call_ms = warm_up(run, warmup, warmup_ms, clock, agree, before_each)
    count = iters
    if rep_ms > 0:
        count = samples_for(iters, rep_ms, per_call_ms * calls_per_sample, max_iters)
        count = (agree or _same)(count)
    clock.sync()
    (before_loop or _nothing)()
    each = before_each or _nothing
    spans = []
    for _ in range(count):
        each()
        spans.append(timed_span(clock, run, calls_per_sample))
    clock.sync()
    return Timing([clock.elapsed_ms(start, end) / calls_per_sample for start, end in spans], graphs=graphs)


def _check(fn, warmup_ms, rep_ms, warmup, iters, calls_per_sample, max_iters) -> None:
    if not callable(fn):
        raise TypeError(f"bench: fn must be a callable of no arguments, got {type(fn).__name__}")
    for name, value in (("warmup_ms", warmup_ms), ("rep_ms", rep_ms)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"bench: {name} must be a finite number of ms >= 0, got {value!r}")
    for name, value, least in (("warmup", warmup, 0), ("iters", iters, 1), ("calls_per_sample", calls_per_sample, 1),
                               ("max_iters", max_iters, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"bench: {name} must be an integer >= {least}, got {value!r}")
