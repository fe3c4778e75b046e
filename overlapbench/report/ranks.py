"""Across ranks: one profiled forward (or graph replay) as every rank recorded it, laid on one
clock, and for rank 0's longest barrier waits the rank it waited for and what that rank ran.

Every rank writes its timelines (timing/timeline.py `file_name`); each carries `origin_ns`, the
profiler's timestamp of its first kernel, so rank r's kernel at `start` ran at `start + shift[r]`
on rank 0's axis, `shift[r] = (origin_ns[r] - origin_ns[0]) / 1e3` us (how exact that is:
timeline.py's docstring). On that axis:

- per rank, its totals as report/exposed.py defines them (wall, comm exposed) and its barrier
  wait: the time a symmetric-memory barrier kernel (`BARRIER` in its name) runs on it (several at
  once counted once), and of it the part no compute kernel of that rank runs beside (exposed);
- barriers are matched by their order on their stream: the i-th barrier to start on a stream of
  one rank is the i-th on that stream of each other (the same program issues them in the same
  order on each stream, and every rank's CUDA-graph replay numbers its streams alike), so two
  barriers on two streams that start in one order on one rank and the other order on another
  still match. Where the ranks' barriers are not on the same streams as often (eager forwards
  number their streams per process), they are matched by their order of start across streams,
  and the check below shows where that pairs the wrong ones. Where the ranks' counts differ none
  is matched, and the reason says so;
- a barrier kernel cannot end on any rank before every rank has reached its own (each waits for
  every peer's signal). A matched barrier that ends on some rank before another rank's started is
  impossible on a shared clock: the largest such gap (`disagreement`) is a lower bound on how far
  the clocks (or the matching by order) are off, and the count of such barriers says how often;
- a wait: one of rank 0's barriers, the longest exposed first (then the longest), with every
  rank's matching barrier and the rank that arrived last (its barrier started latest on the
  shared axis; rank 0 itself where every peer was earlier), and the compute kernel that rank ran
  just before it: the last to end at or before its barrier's start, on any of its streams (as
  exposed.py's `after`), with that kernel's op and FLOPs.

Pure: no files, no torch; report/ranks_view.py reads the files and prints this.
"""

from __future__ import annotations

from dataclasses import dataclass

from overlapbench.report.exposed import (
    Kernel,
    Timeline,
    analyze,
    compute_gaps,
    last_compute_before,
    measure,
    overlap,
    union,
)

BARRIER = "barrier_kernel"  # c10d::symmetric_memory::barrier_kernel: a rank waiting for its peers
WAITS = 4  # rank 0's barrier waits named per point


def is_barrier(k: Kernel) -> bool:
    return k.is_transfer and BARRIER in k.name.lower()


@dataclass(frozen=True)
class RankTotals:
    """One rank's forward (us; `shift`: where its time 0 lies on rank 0's axis)."""

    rank: int
    shift: float
    wall: float
    exposed: float
    barrier: float
    barrier_exposed: float
    barriers: int


@dataclass(frozen=True)
class Arrival:
    """A rank's barrier matched to one of rank 0's: `late` (us) is how long after rank 0's it
    started on the shared axis (negative: before); `before` the compute kernel that rank ran just
    before it, `idle` the time from that kernel's end to the barrier's start."""

    rank: int
    barrier: Kernel
    late: float
    before: Kernel | None
    idle: float | None


@dataclass(frozen=True)
class Wait:
    """One of rank 0's barriers (`index`: its place in rank 0's order), the part of it with no
    compute on rank 0 (`exposed`, us), every rank's arrival (rank order), the last to arrive."""

    index: int
    barrier: Kernel
    exposed: float
    arrivals: tuple[Arrival, ...]

    @property
    def last(self) -> Arrival:
        return max(self.arrivals, key=lambda a: (a.late, -a.rank))


@dataclass(frozen=True)
class Across:
    """The ranks' totals (rank order), rank 0's longest barrier waits (longest exposed first),
    why barriers were not matched (None where they were), and how many matched barriers end on
    some rank before another rank's started, by at most `disagreement` us."""

    totals: tuple[RankTotals, ...]
    waits: tuple[Wait, ...]
    unmatched: str | None
    matched: int
    impossible: int
    disagreement: float

    def as_dict(self) -> dict:
        kernel = lambda k: None if k is None else {"name": k.name, "kind": k.kind, "stream": k.stream, "op": k.op,
                                                   "flops": k.flops}
        ms = lambda us: None if us is None else us / 1e3
        return {
            "ranks": [{"rank": t.rank, "shift_ms": ms(t.shift), "wall_ms": ms(t.wall), "exposed_ms": ms(t.exposed),
                       "barrier_ms": ms(t.barrier), "barrier_exposed_ms": ms(t.barrier_exposed), "barriers": t.barriers}
                      for t in self.totals],
            "barriers_matched": self.matched, "unmatched": self.unmatched,
            "impossible": self.impossible, "disagreement_ms": ms(self.disagreement),
            "waits": [{"index": w.index, "start_ms": ms(w.barrier.start), "wait_ms": ms(w.barrier.end - w.barrier.start),
                       "exposed_ms": ms(w.exposed), "last": w.last.rank,
                       "arrivals": [{"rank": a.rank, "late_ms": ms(a.late), "before": kernel(a.before),
                                     "idle_ms": ms(a.idle)} for a in w.arrivals]} for w in self.waits]}


def _totals(rank: int, t: Timeline, shift: float) -> RankTotals:
    e = analyze(t.kernels)
    spans = union([(k.start, k.end) for k in t.kernels if is_barrier(k)])
    exposed_barrier = sum(overlap(spans, gap) for gap in compute_gaps(t.kernels))
    return RankTotals(rank, shift, e.wall, e.exposed, measure(spans), exposed_barrier,
                      sum(1 for k in t.kernels if is_barrier(k)))


def _by_stream(barriers: list[list[Kernel]]) -> list[list[Kernel]]:
    """Every rank's barriers (each rank's in order of start) reordered so that position i holds,
    on each rank, the same stream's same occurrence, in rank 0's order of start (the module says
    why); as they are where the ranks' barriers are not on the same streams as often."""
    def keyed(ks: list[Kernel]) -> list[tuple[int, int]]:
        seen: dict[int, int] = {}
        keys = []
        for k in ks:
            keys.append((k.stream, seen.get(k.stream, 0)))
            seen[k.stream] = keys[-1][1] + 1
        return keys

    keys = [keyed(ks) for ks in barriers]
    if any(sorted(k) != sorted(keys[0]) for k in keys[1:]):
        return barriers
    at = [dict(zip(k, ks)) for k, ks in zip(keys, barriers)]
    return [[mine[key] for key in keys[0]] for mine in at]


def across(timelines: list[Timeline], waits: int = WAITS) -> Across | None:
    """The ranks' timelines (index: rank; each with device kernels and `origin_ns`) on one axis
    (module docstring); None where fewer than two are given."""
    if len(timelines) < 2:
        return None
    zero = timelines[0].origin_ns
    shifts = [(t.origin_ns - zero) / 1e3 for t in timelines]
    totals = tuple(_totals(r, t, s) for r, (t, s) in enumerate(zip(timelines, shifts)))
    barriers = [sorted((k for k in t.kernels if is_barrier(k)), key=lambda k: (k.start, k.end)) for t in timelines]
    counts = [len(b) for b in barriers]
    if len(set(counts)) > 1:
        why = "barrier counts differ: " + ", ".join(f"rank {r} {n}" for r, n in enumerate(counts))
        return Across(totals, (), why, 0, 0, 0.0)
    barriers = _by_stream(barriers)
    impossible, disagreement = 0, 0.0
    for matched in zip(*barriers):
        arrived = max(k.start + s for k, s in zip(matched, shifts))
        gap = max(arrived - (k.end + s) for k, s in zip(matched, shifts))
        if gap > 0:
            impossible += 1
            disagreement = max(disagreement, gap)
    zero_gaps = compute_gaps(timelines[0].kernels)
    exposed_of = [sum(overlap([(b.start, b.end)], g) for g in zero_gaps) for b in barriers[0]]
    order = sorted(range(len(barriers[0])), key=lambda i: (-exposed_of[i], -(barriers[0][i].end - barriers[0][i].start), i))
    found = []
    for i in order[:waits]:
        arrivals = []
        for r, (t, s) in enumerate(zip(timelines, shifts)):
            b = barriers[r][i]
            before = last_compute_before(t.kernels, b.start)
            arrivals.append(Arrival(r, b, (b.start + s) - barriers[0][i].start, before,
                                    None if before is None else b.start - before.end))
        found.append(Wait(i, barriers[0][i], exposed_of[i], tuple(arrivals)))
    return Across(totals, tuple(found), None, counts[0], impossible, disagreement)
