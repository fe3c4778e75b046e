"""Why communication stays exposed: one profiled forward's device kernels (timing/timeline.py),
its communication split into what compute hid and what it did not, each exposed stretch named.

Definitions (times from the forward's first kernel start to its last kernel end, the `wall`):
- a transfer is a kernel of kind `comm` (`profile.kind_of`: NCCL, the fused all-reduce kernels,
  the copy engines' peer copies, the symmetric-memory barriers); every other kernel is compute
  (GEMMs, attention, norms, elementwise work, local copies), on whatever stream it runs;
- compute busy, comm busy: the time at least one compute kernel (one transfer) runs, overlaps
  between streams counted once;
- comm hidden: the time a transfer runs while some compute kernel runs too; comm exposed: the
  time a transfer runs while no compute kernel runs (comm busy = hidden + exposed); idle: the
  time no kernel runs;
- an exposed interval is a maximal stretch of the wall in which no compute kernel runs and during
  which some transfer runs. Its `length` is the whole stretch (the compute streams wait that long:
  launch and event-wait latency around the transfer included), its `exposed` the part a transfer
  runs (summed over intervals: comm exposed). It names the transfer that runs longest inside it
  (with its stream and bytes: the size of its launching op's largest tensor, or what the profiler
  measured for a copy), the compute kernel whose end opened it (`after`: the last to end before
  it, on any stream, with its op's FLOPs), whether the transfer started while that kernel still
  ran (`beside`: compute hid its start, not its end) or after it (`behind`: it waited for that
  kernel, e.g. the GEMM producing its input), and the compute kernel that closed it (`then`: the
  first to start after it, the work that waited for the transfer).
A stream that waits for a transfer while another stream computes costs no wall time: that
transfer counts as hidden, and no interval names it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from overlapbench.errors import UserError
from overlapbench.report.cells import short
from overlapbench.report.profile import kind_of
from overlapbench.timing.timeline import SCHEMA

TRANSFER = "comm"
ITEM_BYTES = {  # torch.profiler's dtype names -> bytes per element
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
}
Span = tuple[float, float]


@dataclass(frozen=True)
class Kernel:
    """One device kernel of the forward (times in us from its first kernel)."""

    name: str
    kind: str
    stream: int
    start: float
    end: float
    op: str | None = None  # the launching op's name
    flops: int | None = None  # its op's FLOPs, where the profiler counts them (GEMMs)
    bytes: int | None = None  # for a transfer: its size, where known

    @property
    def is_transfer(self) -> bool:
        return self.kind == TRANSFER


@dataclass(frozen=True)
class Interval:
    """A stretch of the forward with a transfer running and no compute (module docstring)."""

    start: float
    length: float
    exposed: float
    transfer: Kernel
    transfers: int  # transfers running in it
    after: Kernel | None
    then: Kernel | None

    @property
    def relation(self) -> str | None:
        """`beside`: the transfer started while `after` ran; `behind`: it started once `after` ended."""
        if self.after is None:
            return None
        return "beside" if self.transfer.start < self.after.end else "behind"


@dataclass(frozen=True)
class Exposure:
    """The forward's totals (us) and its exposed intervals, longest exposed first."""

    wall: float
    compute: float
    comm: float
    hidden: float
    exposed: float
    idle: float
    streams: int
    kernels: int
    intervals: tuple[Interval, ...]

    def as_dict(self, top: int | None = None) -> dict:
        ms = {k: getattr(self, k) / 1e3 for k in ("wall", "compute", "comm", "hidden", "exposed", "idle")}
        return ({f"{k}_ms": v for k, v in ms.items()}
                | {"hidden_share": _share(self.hidden, self.comm), "exposed_share": _share(self.exposed, self.wall),
                   "streams": self.streams, "kernels": self.kernels, "intervals": len(self.intervals),
                   "longest": [_interval_dict(i) for i in self.intervals[:top]]})


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _kernel_dict(k: Kernel | None) -> dict | None:
    if k is None:
        return None
    return {"name": k.name, "kind": k.kind, "stream": k.stream, "op": k.op, "flops": k.flops, "bytes": k.bytes}


def _interval_dict(i: Interval) -> dict:
    return {"start_ms": i.start / 1e3, "length_ms": i.length / 1e3, "exposed_ms": i.exposed / 1e3,
            "transfer": _kernel_dict(i.transfer), "transfers": i.transfers, "relation": i.relation,
            "after": _kernel_dict(i.after), "then": _kernel_dict(i.then)}


# -- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timeline:
    """A timeline file as read: the device profiled, the host ops seen, the kernels in start
    order; whether it is a CUDA-graph replay's, and (for one) the kernel names that could not be
    linked to their ops (timeline.link_replay's `unmatched`: name, both counts, why); whose it is
    (`rank` of `world`; a file from before ranks wrote theirs: rank 0, world None), the
    profiler's timestamp of its time 0 (`origin_ns`; None where not recorded), and how many
    graph replays it holds back to back (`replays`: 1 for an eager forward's and older files)."""

    device: str
    host_ops: int
    kernels: list[Kernel]
    replay: bool = False
    unmatched: tuple[dict, ...] = ()
    rank: int = 0
    world: int | None = None
    origin_ns: int | None = None
    replays: int = 1


def read(path: Path) -> Timeline:
    """A timeline file (timing/timeline.py); a file that is not one is a UserError naming it."""
    try:
        data = json.loads(path.read_text())
        if data.get("schema") != SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}, not {SCHEMA}")
        names, ops = data["names"], data["ops"]
        kernels = sorted((_kernel(k, names, ops) for k in data["kernels"]), key=lambda k: (k.start, k.end))
        unmatched = tuple({"name": str(u["name"]), "replay": int(u["replay"]), "eager": int(u["eager"]),
                           "why": str(u.get("why", ""))} for u in data.get("unmatched", []))
        world, origin = data.get("world"), data.get("origin_ns")
        return Timeline(str(data["device"]), int(data["host_ops"]), kernels, bool(data.get("replay", False)), unmatched,
                        int(data.get("rank", 0)), None if world is None else int(world),
                        None if origin is None else int(origin), int(data.get("replays", 1)))
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise UserError(f"--profile: {path} is not a timeline of `sweep --profile` ({e}); "
                        "delete it, or profile the point again") from None


def _kernel(entry: dict, names: list[str], ops: list[dict]) -> Kernel:
    name = names[entry["name"]]
    op = ops[entry["op"]] if entry.get("op") is not None else {}
    start, dur = float(entry["start"]), float(entry["dur"])
    if not (math.isfinite(start) and math.isfinite(dur) and dur >= 0):
        raise ValueError(f"kernel {name}: start {start}, dur {dur}")
    kind = kind_of(name)
    moved = None
    if kind == TRANSFER:
        moved = entry["bytes"] if "bytes" in entry else _largest_tensor(op.get("shapes", []), op.get("dtypes", []))
    return Kernel(name, kind, int(entry["stream"]), start, start + dur, op.get("name"), op.get("flops") or None, moved)


def _largest_tensor(shapes: list, dtypes: list) -> int | None:
    """Bytes of the largest tensor among an op's inputs (what a collective moves: the reduced
    buffer, the gathered output), where shapes and dtypes were recorded."""
    sizes = [math.prod(s) * ITEM_BYTES[d] for s, d in zip(shapes, dtypes)
             if isinstance(s, list) and s and all(isinstance(n, int) for n in s) and d in ITEM_BYTES]
    return max(sizes) if sizes else None


# -- the analysis ------------------------------------------------------------------------------


def union(spans: list[Span]) -> list[Span]:
    """Sorted, disjoint spans covering the same time as `spans`."""
    merged: list[list[float]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def measure(spans: list[Span]) -> float:
    return sum(b - a for a, b in union(spans))


def overlap(spans: list[Span], window: Span) -> float:
    """Time of `spans` (disjoint) inside `window`."""
    return sum(max(0.0, min(b, window[1]) - max(a, window[0])) for a, b in spans)


def gaps(covered: list[Span], window: Span) -> list[Span]:
    """The stretches of `window` that `covered` (disjoint, sorted) leaves free."""
    free, at = [], window[0]
    for a, b in covered:
        if a > at:
            free.append((at, min(a, window[1])))
        at = max(at, b)
    if at < window[1]:
        free.append((at, window[1]))
    return [g for g in free if g[1] > g[0]]


def label(k: Kernel | None, relation: str | None = None) -> str:
    """A kernel as a table names it: `[relation ]kind: short name (s<stream>)`, `-` for none."""
    if k is None:
        return "-"
    return f"{relation + ' ' if relation else ''}{k.kind}: {short(k.name)} (s{k.stream})"


def compute_gaps(kernels: list[Kernel]) -> list[Span]:
    """The stretches of the kernels' span in which no compute kernel runs."""
    window = (min(k.start for k in kernels), max(k.end for k in kernels))
    return gaps(union([(k.start, k.end) for k in kernels if not k.is_transfer]), window)


def last_compute_before(kernels: list[Kernel], at: float) -> Kernel | None:
    """The compute kernel that ended last at or before `at`, on any stream (an interval's `after`)."""
    return max((k for k in kernels if not k.is_transfer and k.end <= at), key=lambda k: (k.end, k.start), default=None)


def analyze(kernels: list[Kernel]) -> Exposure | None:
    """The forward's exposure (module docstring); None where it ran no device kernel (a CPU run)."""
    if not kernels:
        return None
    window = (min(k.start for k in kernels), max(k.end for k in kernels))
    compute = [k for k in kernels if not k.is_transfer]
    transfers = [k for k in kernels if k.is_transfer]
    busy = union([(k.start, k.end) for k in compute])
    comm = union([(k.start, k.end) for k in transfers])
    hidden = sum(overlap(comm, span) for span in busy)
    intervals = []
    for gap in gaps(busy, window):
        exposed = overlap(comm, gap)
        if exposed <= 0:
            continue
        inside = [k for k in transfers if overlap([(k.start, k.end)], gap) > 0]
        transfer = max(inside, key=lambda k: (overlap([(k.start, k.end)], gap), -k.start))
        after = last_compute_before(compute, gap[0])
        then = min((k for k in compute if k.start >= gap[1]), key=lambda k: (k.start, k.end), default=None)
        intervals.append(Interval(gap[0] - window[0], gap[1] - gap[0], exposed, transfer, len(inside), after, then))
    intervals.sort(key=lambda i: (-i.exposed, i.start))
    total_comm = measure([(k.start, k.end) for k in transfers])
    return Exposure(
        wall=window[1] - window[0], compute=measure([(k.start, k.end) for k in compute]), comm=total_comm,
        hidden=hidden, exposed=total_comm - hidden,
        idle=(window[1] - window[0]) - measure([(k.start, k.end) for k in kernels]),
        streams=len({k.stream for k in kernels}), kernels=len(kernels), intervals=tuple(intervals))
