"""What a split's transfers cost its compute: a profiled point against its twin (the same split
with `comm: none`, which runs the same compute kernels), from the graph-replay timelines that
`overlapbench sweep --profile` writes (timing/timeline.py `file_name`; read by report/exposed.py).

Per rank, in ms per layer (a timeline's total / (its `replays` x the layers per forward)):
1. the wall (exposed.py `analyze`) of point and twin, and their difference;
2. the compute stretch: each compute kernel of the point matched with its twin's, summed by kind
   (gemm; attention with the log-sum-exp merge; other compute), and the GEMMs' median stretch in %;
3. the point's GEMM time beside (a) an SM kernel of the transfer path on another stream, (b) only
   copy-engine copies of it on another stream, (c) none of the transfer path;
4. order: for each pair of an SM transfer kernel (NCCL, nccl_symm, the fused all-reduce kernels;
   not the one-CTA barriers) and a GEMM it overlaps on another stream, whether the transfer started
   first (before, or within FIRST_US after, the GEMM's start), shortly after it, or INTO_US or more
   into it; with the median stretch of the GEMMs in each class. A GEMM an SM kernel started beside
   shares the SMs from its start; one that queued behind the GEMM's blocks does not.

How a kernel's kind is decided: exposed.py's (`profile.kind_of` on its name) says compute or
transfer and, for compute, gemm / attention / the rest. A point kernel is of the transfer path where
exposed.py calls it a transfer, or where its (name, op, FLOPs) never occurs in the twin (e.g. the
copy-engine path's `_add_norm_kernel` and its local Memcpy DtoD, which exposed.py counts as
compute): the twin runs all of the model's compute. A transfer-path kernel named Memcpy/Memset is a
copy (copy engine), any other an SM kernel. Twins: the point's and the twin's compute kernels with
one (name, op, FLOPs) are paired in start order where both timelines hold the same count of that
key; keys whose counts differ stay unmatched (counted, left out of the stretch).

Run: python tests/checks/twin_stretch.py FOLDER POINT TWIN [--ranks all] [--layers N]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from overlapbench.errors import UserError
from overlapbench.report.exposed import Kernel, Timeline, analyze, overlap, read, union
from overlapbench.report.ranks import is_barrier
from overlapbench.timing.timeline import file_name

FIRST_US, INTO_US = 0.5, 20.0
STRETCH_KINDS = ("gemm", "attention", "other")
ORDERS = ("transfer first", "< 20 us after", ">= 20 us into")
BESIDE = ("SM transfer kernel", "copies only", "nothing")


def stretch_kind(k: Kernel) -> str:
    return {"gemm": "gemm", "attention": "attention", "lse_merge": "attention"}.get(k.kind, "other")


def key(k: Kernel) -> tuple:
    return k.name, k.op, k.flops


def is_copy(k: Kernel) -> bool:
    return k.name.startswith(("Memcpy", "Memset"))


@dataclass(frozen=True)
class RankStretch:
    """One rank's answer (module docstring); times in ms per layer, GEMM stretches by order in us."""

    rank: int
    wall: tuple[float, float]  # point, twin
    stretch: dict[str, float]
    gemm_median_pct: float | None
    matched: int
    unmatched: int
    beside: dict[str, float]
    orders: dict[str, list[float]]


def match(point: list[Kernel], twin: list[Kernel]) -> dict[int, Kernel]:
    """Index of a point compute kernel -> its twin (module docstring)."""
    mine, theirs = defaultdict(list), defaultdict(list)
    for i, k in enumerate(point):
        if not k.is_transfer:
            mine[key(k)].append(i)
    for k in twin:
        if not k.is_transfer:
            theirs[key(k)].append(k)
    return {i: t for kk, idx in mine.items() if len(idx) == len(theirs[kk]) for i, t in zip(idx, theirs[kk])}


def compare(point: Timeline, twin: Timeline, layers: int) -> RankStretch:
    if point.replays != twin.replays:
        raise UserError(f"replays: the point's timeline holds {point.replays}, its twin's {twin.replays}; "
                        "compare timelines of one sweep --profile")
    per_layer = point.replays * layers
    ks = point.kernels
    twins = match(ks, twin.kernels)
    twin_keys = {key(k) for k in twin.kernels if not k.is_transfer}
    on_path = {i for i, k in enumerate(ks) if k.is_transfer or key(k) not in twin_keys}
    path = [ks[i] for i in sorted(on_path)]
    stretch_us = {i: ks[i].end - ks[i].start - (t.end - t.start) for i, t in twins.items()}

    stretch = dict.fromkeys(STRETCH_KINDS, 0.0)
    for i, s in stretch_us.items():
        stretch[stretch_kind(ks[i])] += s / per_layer / 1e3
    pct = [100 * s / (twins[i].end - twins[i].start) for i, s in stretch_us.items()
           if ks[i].kind == "gemm" and twins[i].end > twins[i].start]
    compute = [i for i in range(len(ks)) if i not in on_path]

    beside = dict.fromkeys(BESIDE, 0.0)
    gemms = [i for i in compute if ks[i].kind == "gemm"]
    for i in gemms:
        g = ks[i]
        others = [k for k in path if k.stream != g.stream and k.end > g.start and k.start < g.end]
        sm = union([(k.start, k.end) for k in others if not is_copy(k)])
        either = union([(k.start, k.end) for k in others])
        on_sm, on_any = overlap(sm, (g.start, g.end)), overlap(either, (g.start, g.end))
        for name, us in zip(BESIDE, (on_sm, on_any - on_sm, g.end - g.start - on_any)):
            beside[name] += us / per_layer / 1e3

    orders: dict[str, list[float]] = {o: [] for o in ORDERS}
    for t in (k for k in path if k.is_transfer and not is_copy(k) and not is_barrier(k)):
        for i in gemms:
            g = ks[i]
            if g.stream == t.stream or min(g.end, t.end) <= max(g.start, t.start):
                continue
            late = t.start - g.start
            order = ORDERS[0] if late < FIRST_US else ORDERS[2] if late >= INTO_US else ORDERS[1]
            if i in stretch_us:
                orders[order].append(stretch_us[i])
    walls = tuple(analyze(t.kernels).wall / per_layer / 1e3 for t in (point, twin))
    return RankStretch(point.rank, walls, stretch, statistics.median(pct) if pct else None, len(twins),
                       len(compute) - len(twins), beside, orders)


def layers_of(point: str, layers: int | None) -> int:
    if layers is not None:
        return layers
    found = re.search(r"-(\d+)layers$", point)
    if not found:
        raise UserError(f"--layers: {point} does not end in -<N>layers; pass --layers N")
    return int(found.group(1))


def load(folder: Path, point: str, rank: int) -> Timeline:
    path = folder / file_name(point, replay=True, rank=rank)
    if not path.is_file():
        raise UserError(f"POINT/TWIN: no timeline {path}; name a point whose replay timeline the folder holds")
    return read(path)


def ranks_of(folder: Path, point: str, which: str) -> list[int]:
    if which == "all":
        return list(range(load(folder, point, 0).world or 1))
    try:
        return [int(r) for r in which.split(",")]
    except ValueError:
        raise UserError(f"--ranks: {which!r} is not 'all' or a list like 0,1") from None


def show(r: RankStretch) -> str:
    (p, t), signed = r.wall, (lambda x: f"{x:+.3f}")
    gemm_time = sum(r.beside.values()) or 1.0
    lines = [f"rank {r.rank}",
             f"  wall ms/layer: point {p:.3f}  twin {t:.3f}  difference {signed(p - t)}",
             "  compute stretch ms/layer: " + "  ".join(f"{k} {signed(v)}" for k, v in r.stretch.items())
             + f"  total {signed(sum(r.stretch.values()))};  GEMM median "
             + ("-" if r.gemm_median_pct is None else f"{r.gemm_median_pct:+.1f}%")
             + f"  ({r.matched} kernels matched, {r.unmatched} unmatched)",
             "  GEMM time beside, ms/layer: " + "  ".join(
                 f"{k} {v:.3f} ({100 * v / gemm_time:.1f}%)" for k, v in r.beside.items()),
             "  SM transfer vs the GEMM beside it: " + "  ".join(
                 f"{k}: {len(v)}" + (f" (GEMM stretch median {statistics.median(v):+.1f} us)" if v else "")
                 for k, v in r.orders.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("point")
    parser.add_argument("twin")
    parser.add_argument("--ranks", default="0", help="'all', or ranks like 0,1 (default 0)")
    parser.add_argument("--layers", type=int, default=None, help="layers per forward (default: the -<N>layers suffix)")
    args = parser.parse_args(argv)
    try:
        layers = layers_of(args.point, args.layers)
        print(f"{args.point}\n  vs twin {args.twin}  ({layers} layers per forward)")
        for rank in ranks_of(args.folder, args.point, args.ranks):
            print(show(compare(load(args.folder, args.point, rank), load(args.folder, args.twin, rank), layers)))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
