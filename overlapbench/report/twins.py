"""What a split's transfers cost its compute: a profiled point against its twin, the same point
with `comm: none` (the same chunks and compute kernels, no transfer; profile.twin_row finds it),
from their timelines.

Why: against `no_comm` a split's extra wall time is compute busy time, exposed transfers and idle
time (exposed.py), and most of it is often the compute running longer beside the transfers; the
twin says which compute, by how much, and what ran beside it. Per timeline, in ms per layer (its
total over its replays x the layers per forward):

- the wall of point and twin;
- the compute stretch: each compute kernel of the point matched with its twin's, summed by kind
  (gemm; attention with the log-sum-exp merge; the rest), and the GEMMs' median stretch in %;
- the point's GEMM time beside (a) an SM kernel of the transfer path on another stream, (b) only
  its copy-engine copies, (c) none of it;
- order: for each pair of an SM transfer kernel (NCCL's, the fused all-reduce kernels; not the
  one-CTA barriers) and a GEMM it overlaps on another stream, whether the transfer started first
  (before, or within FIRST_US after, the GEMM's start), shortly after, or INTO_US or more into it,
  with the median stretch of the GEMMs in each class: a transfer whose CTAs take SMs before a GEMM
  lengthens it by about its own time, one queued behind the GEMM's blocks costs it nothing
  (docs/predict.md, "Why TP=4 misses", item 2).

A kernel's kind: exposed.py's (`profile.kind_of` on its name) says compute or transfer and, for
compute, gemm / attention / the rest. A point kernel is of the transfer path where exposed.py calls
it a transfer, or where its (name, op, FLOPs) never occurs in the twin (the copy-engine path's add +
norm kernel and its local copy, which exposed.py counts as compute): the twin runs all of the
layer's compute. A transfer-path kernel named Memcpy/Memset is a copy, any other an SM kernel.
Twins: kernels of one (name, op, FLOPs) are paired in start order where both timelines hold the
same count of it; keys whose counts differ stay unmatched (counted, left out of the stretch).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from overlapbench.errors import UserError
from overlapbench.report.exposed import Kernel, Timeline, analyze, overlap, union
from overlapbench.report.ranks import is_barrier

FIRST_US, INTO_US = 0.5, 20.0
KINDS = ("gemm", "attention", "other")
ORDERS = ("transfer first", f"< {INTO_US:.0f} us after", f">= {INTO_US:.0f} us into")
BESIDE = ("SM transfer kernel", "copies only", "nothing")


@dataclass(frozen=True)
class Stretch:
    """One timeline's answer (module docstring): times in ms per layer, the GEMM stretches by order in us."""

    wall: tuple[float, float]  # point, twin
    stretch: dict[str, float]  # by KINDS
    gemm_median_pct: float | None
    matched: int
    unmatched: int
    beside: dict[str, float]  # by BESIDE
    orders: dict[str, list[float]]  # by ORDERS

    def as_dict(self) -> dict:
        return {"wall_ms": list(self.wall), "stretch_ms": self.stretch, "gemm_median_pct": self.gemm_median_pct,
                "matched": self.matched, "unmatched": self.unmatched, "gemm_beside_ms": self.beside,
                "orders": {k: {"count": len(v), "gemm_stretch_median_us": statistics.median(v) if v else None}
                           for k, v in self.orders.items()}}


def _kind(k: Kernel) -> str:
    return {"gemm": "gemm", "attention": "attention", "lse_merge": "attention"}.get(k.kind, "other")


def _key(k: Kernel) -> tuple:
    return k.name, k.op, k.flops


def _is_copy(k: Kernel) -> bool:
    return k.name.startswith(("Memcpy", "Memset"))


def match(point: list[Kernel], twin: list[Kernel]) -> dict[int, Kernel]:
    """Index of a point compute kernel -> its twin (module docstring)."""
    mine, theirs = defaultdict(list), defaultdict(list)
    for i, k in enumerate(point):
        if not k.is_transfer:
            mine[_key(k)].append(i)
    for k in twin:
        if not k.is_transfer:
            theirs[_key(k)].append(k)
    return {i: t for key, idx in mine.items() if len(idx) == len(theirs[key]) for i, t in zip(idx, theirs[key])}


def compare(point: Timeline, twin: Timeline, layers: int) -> Stretch:
    """The point's timeline against its twin's (one rank, one kind: both replays or both eager)."""
    if point.replays != twin.replays:
        raise UserError(f"replays: the point's timeline holds {point.replays}, its twin's {twin.replays}; "
                        "compare timelines of one sweep --profile")
    per_layer = point.replays * layers * 1e3  # us of the timelines -> ms per layer
    ks = point.kernels
    twins = match(ks, twin.kernels)
    twin_keys = {_key(k) for k in twin.kernels if not k.is_transfer}
    on_path = {i for i, k in enumerate(ks) if k.is_transfer or _key(k) not in twin_keys}
    path = [ks[i] for i in sorted(on_path)]
    stretch_us = {i: ks[i].end - ks[i].start - (t.end - t.start) for i, t in twins.items()}
    stretch = dict.fromkeys(KINDS, 0.0)
    for i, s in stretch_us.items():
        stretch[_kind(ks[i])] += s / per_layer
    pct = [100 * s / (twins[i].end - twins[i].start) for i, s in stretch_us.items()
           if ks[i].kind == "gemm" and twins[i].end > twins[i].start]
    compute = [i for i in range(len(ks)) if i not in on_path]
    gemms = [i for i in compute if ks[i].kind == "gemm"]
    beside = dict.fromkeys(BESIDE, 0.0)
    for i in gemms:
        g = ks[i]
        others = [k for k in path if k.stream != g.stream and k.end > g.start and k.start < g.end]
        on_sm = overlap(union([(k.start, k.end) for k in others if not _is_copy(k)]), (g.start, g.end))
        on_any = overlap(union([(k.start, k.end) for k in others]), (g.start, g.end))
        for name, us in zip(BESIDE, (on_sm, on_any - on_sm, g.end - g.start - on_any)):
            beside[name] += us / per_layer
    orders: dict[str, list[float]] = {o: [] for o in ORDERS}
    for t in (k for k in path if k.is_transfer and not _is_copy(k) and not is_barrier(k)):
        for i in gemms:
            g = ks[i]
            if g.stream == t.stream or min(g.end, t.end) <= max(g.start, t.start) or i not in stretch_us:
                continue
            late = t.start - g.start
            orders[ORDERS[0] if late < FIRST_US else ORDERS[2] if late >= INTO_US else ORDERS[1]].append(stretch_us[i])
    walls = tuple(analyze(t.kernels).wall / per_layer for t in (point, twin))
    return Stretch(walls, stretch, statistics.median(pct) if pct else None, len(twins), len(compute) - len(twins),
                   beside, orders)


def lines(s: Stretch) -> list[str]:
    """The stretch as report lines (indented, under a point's line)."""
    (p, t), signed = s.wall, (lambda x: f"{x:+.3f}")
    gemm_time = sum(s.beside.values()) or 1.0
    median = "" if s.gemm_median_pct is None else f" (GEMM median {s.gemm_median_pct:+.1f}%)"
    out = [f"  against its comm: none twin: wall {signed(p - t)} ms per layer; compute kernels longer by "
           + ", ".join(f"{k} {signed(v)}" for k, v in s.stretch.items()) + median
           + f" ({s.matched} kernels matched, {s.unmatched} not)",
           "  its GEMMs' time beside " + ", ".join(f"{k} {100 * v / gemm_time:.1f}%" for k, v in s.beside.items())]
    if any(s.orders.values()):
        out.append("  SM transfers beside a GEMM: " + ", ".join(
            f"{k} {len(v)}" + (f" (GEMM {statistics.median(v):+.1f} us median)" if v else "") for k, v in s.orders.items()))
    return out
