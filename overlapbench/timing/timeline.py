"""One profiled forward's device kernels, kept as a small JSON file beside the point's kernel table.

`sweep --profile DIR` writes, per point, torch.profiler's kernel table (`<point>.txt`, see
`measure.profile_parts`) and this timeline (`<point>.timeline.json`): one more eager forward under
torch.profiler with `record_shapes` and `with_flops`, and of it only what `report --profile`'s
account of exposed communication reads (report/exposed.py), not the whole chrome trace:

    {"schema": "overlapbench/timeline-v1", "device": "cuda", "forwards": 1, "unit": "us",
     "host_ops": 812,                      # CPU ops the profiler saw (a CPU run has only these)
     "origin_ns": 1764201234567890123,     # the first kernel's profiler timestamp (below)
     "rank": 0, "world": 4,                # whose: the rank that recorded it, of how many
     "names": ["nvjet_...", ...],          # each kernel name once
     "ops": [{"name": "aten::mm", "shapes": [[2048, 8192], [8192, 3072]],
              "dtypes": ["c10::BFloat16", "c10::BFloat16"], "flops": 103079215104}, ...],
     "kernels": [{"name": 0, "stream": 7, "start": 0.0, "dur": 41.2, "op": 0}, ...]}

A kernel: its name (an index into `names`), the stream it ran on, its start (us from the
forward's first kernel) and duration, the op that launched it (an index into `ops`; null where
no op or profiler range was open at its launch, as for a Triton kernel called from plain Python)
and, where the profiler's record of a copy says it, its `bytes`. An op is the aten op (or
profiler range) innermost at the launch: its name, its FLOPs as `with_flops` counts them (GEMMs;
0 for the rest), and the input shapes and dtypes of the nearest op that recorded tensors
(`shapes_of` names that op where it is another: an NCCL kernel's launcher, `record_param_comms`,
records none; the async `nccl:<collective>` range it opens does, as torch 2.11 gave it on H200s,
results/h200x2/6fef580/profiler-comm-events.jsonl). Only device events that run work are kernels
(kernels, memcpys, memsets): the profiler's ranges drawn on the GPU (gpu_user_annotation) and
its stream waits are not. Torch is imported inside functions: `report` reads this module's
constants without it.

Where the point's step was timed as a CUDA-graph replay, a second file beside it,
`<point>.replay.timeline.json`, holds one replay of that graph under torch.profiler, in the same
schema plus `"replay": true`, `"linked"` and `"unmatched"` (`link_replay`): the timeline of the
step that was timed, where an eager forward at small token counts is host-bound and mostly idle.
The replay's kernels are launched by one `cudaGraphLaunch`, which records no op; each is linked to
its op through its twin in the eager forward (the same program issues the same kernels).

Every rank profiles the same forward and replay (they hold collectives), and every rank writes its
own: rank 0's files are the names above (what every reader and older folders know); rank k >= 1
writes `<point>.rank<k>.timeline.json` and `<point>.rank<k>.replay.timeline.json` (`file_name`, the
one place the names are made; every timeline still ends in SUFFIX, every replay's in
REPLAY_SUFFIX). Each file says whose it is, `"rank"` and `"world"` (the ranks that profiled it),
and where its time 0 lies, `"origin_ns"`: the profiler's own timestamp of the first kernel (null
without device kernels), so the ranks' timelines can be laid on one clock: rank k's kernel at
`start` us ran at `origin_ns / 1e3 + start` us, comparable with rank 0's.

How exact that is: torch.profiler gives every event in Unix-epoch nanoseconds of the host's
clock. Host events are read from a fast clock (the TSC) and converted by a calibration each
process makes for itself; device events are CUPTI's, which CUPTI maps from the GPU's timer onto
the same host clock (through Kineto's timestamp callback) by interpolation. So on one host the
ranks share a clock up to each process's conversion and CUPTI's mapping, assumed small beside the
waits compared (microseconds); nothing here measures it, and report/ranks.py checks only a
necessary condition (a barrier ends on every rank after the last rank reached it) and shows by
how much it fails. Across hosts nothing is assumed.
Files written before these fields (no `origin_ns`, `rank`, `world`) still read: they are rank 0's,
and cannot be aligned with another rank's.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SCHEMA = "overlapbench/timeline-v1"
SUFFIX = ".timeline.json"
REPLAY_SUFFIX = ".replay" + SUFFIX  # a graph replay's timeline: it ends in SUFFIX too
TABLE_SUFFIX = ".txt"
RANK_TAG = ".rank"  # rank k >= 1's timelines: `<point>.rank<k>` then the suffixes above
NOT_WORK = ("gpu_user_annotation", "user_annotation", "cuda_sync", "cuda_profiler_range")  # device events that run nothing
_BYTES = re.compile(r'"bytes"\s*:\s*(\d+)')
# The profiler's own host events: CUPTI's buffer request, opened inside the op whose launch it
# interrupts, can carry that launch's correlation id (seen on H100s, torch 2.11: the forward's
# first kernel linked to it). A kernel linked to one is the enclosing op's.
PROFILER_EVENTS = frozenset({"Activity Buffer Request"})


def file_name(point: str, replay: bool = False, rank: int = 0) -> str:
    """A point's timeline file: rank 0's `<point>.timeline.json` (its graph replay's
    `<point>.replay.timeline.json`); rank k's `<point>.rank<k>.timeline.json` (and
    `<point>.rank<k>.replay.timeline.json`)."""
    of_rank = f"{RANK_TAG}{rank}" if rank else ""
    return point + of_rank + (REPLAY_SUFFIX if replay else SUFFIX)


def beside(table: Path, replay: bool = False, rank: int = 0) -> Path:
    """The timeline's path beside a kernel table's (`<point>.txt` -> `<point>.timeline.json`;
    with `replay`, the graph replay's; with `rank`, that rank's: `file_name`)."""
    return table.with_name(file_name(table.name.removesuffix(TABLE_SUFFIX), replay, rank))


def prepare_for_graphs() -> None:
    """Start the profiler once, before any CUDA graph that a profile will replay is captured:
    a graph captured before the profiler's first use and replayed under it is a known source of
    errors and hangs (torch.profiler._utils._init_for_cuda_graphs, pytorch#75504)."""
    from torch.profiler import _utils

    init = getattr(_utils, "_init_for_cuda_graphs", None)
    if init is not None:
        init()
    else:
        from torch.autograd.profiler import profile

        with profile():
            pass


def record(forward, cuda: bool, rank: int = 0, world: int = 1, in_step: Callable[[], None] | None = None) -> dict:
    """Run `forward()` once under torch.profiler (shapes and FLOPs recorded, the device waited
    for) and return its timeline, as `rank` of `world` recorded it. Every rank calls it: the
    forward holds collectives. `in_step` (Runtime.in_step: the ranks' host barrier) runs under the
    profiler just before the forward, so every rank's forward starts at once, however long its
    profiler took to start; it launches no kernel, so the timeline is the forward's alone."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True, with_flops=True) as prof:
        if in_step is not None:
            in_step()
        forward()
        if cuda:
            torch.cuda.synchronize()
    return from_events(prof.profiler.kineto_results.events(), "cuda" if cuda else "cpu") | {"rank": rank, "world": world}


def write(timeline: dict, path: Path) -> None:
    path.write_text(json.dumps(timeline, separators=(",", ":")) + "\n")


def _call(event, method: str, default: Any) -> Any:
    """event.method(), or `default` where this torch's profiler events lack the method."""
    found = getattr(event, method, None)
    return found() if callable(found) else default


def _is_device(event) -> bool:
    return str(event.device_type()).rsplit(".", 1)[-1] != "CPU"


def _is_kernel(event) -> bool:
    return (_is_device(event) and not _call(event, "is_user_annotation", False)
            and _call(event, "activity_type", "") not in NOT_WORK)


def _has_tensors(shapes: list) -> bool:
    return any(isinstance(s, list) and len(s) > 0 for s in shapes)


def _enclosing(ops: list) -> dict[int, Any]:
    """Each op's innermost enclosing op on its thread (id(op) -> op), from their time ranges."""
    parent: dict[int, Any] = {}
    by_thread: dict[int, list] = defaultdict(list)
    for op in ops:
        by_thread[op.start_thread_id()].append(op)
    for thread_ops in by_thread.values():
        open_ops: list = []
        for op in sorted(thread_ops, key=lambda o: (o.start_ns(), -o.end_ns())):
            while open_ops and open_ops[-1].end_ns() < op.end_ns():
                open_ops.pop()
            if open_ops:
                parent[id(op)] = open_ops[-1]
            open_ops.append(op)
    return parent


def _opened_inside(op, ranges: list) -> Any | None:
    """The first of the async host `ranges` that `op` opened (same thread, started inside it) and
    that recorded tensors: a collective's `nccl:all_reduce` range holds the tensors that its
    launcher, `record_param_comms` (a TensorList the profiler records no shape of), does not."""
    return next((r for r in ranges if r.start_thread_id() == op.start_thread_id()
                 and op.start_ns() <= r.start_ns() <= op.end_ns() and _has_tensors(_call(r, "shapes", []))), None)


def _op_record(op, parent: dict[int, Any], ranges: list) -> dict:
    """The launching op: its name and FLOPs, and the shapes of the nearest op that recorded
    tensors: itself, else an async range it opened, else the same outwards."""
    shaped = op
    while shaped is not None and not _has_tensors(_call(shaped, "shapes", [])):
        opened = _opened_inside(shaped, ranges)
        shaped = opened if opened is not None else parent.get(id(shaped))
    found = {"name": op.name(), "flops": int(_call(op, "flops", 0) or 0)}
    if shaped is not None:
        found |= {"shapes": _call(shaped, "shapes", []), "dtypes": _call(shaped, "dtypes", [])}
        if shaped is not op:
            found["shapes_of"] = shaped.name()
    return found


def from_events(events: Iterable, device: str) -> dict:
    """The timeline of one forward from the profiler's events (torch's `_KinetoEvent`s: name(),
    device_type(), device_resource_id() (the stream), start_ns(), end_ns(), correlation_id(),
    linked_correlation_id() (a kernel's: its launching op's correlation_id), shapes(), dtypes(),
    flops(), start_thread_id())."""
    events = list(events)
    kernels = sorted((e for e in events if _is_kernel(e)), key=lambda e: (e.start_ns(), e.end_ns()))
    host = [e for e in events if not _is_device(e) and _call(e, "linked_correlation_id", 0) == 0
            and not _call(e, "is_async", False)]
    ranges = [e for e in events if not _is_device(e) and _call(e, "is_async", False)]
    by_correlation = {e.correlation_id(): e for e in host if e.name() not in PROFILER_EVENTS}
    internal = {e.correlation_id(): e for e in host if e.name() in PROFILER_EVENTS}
    parent = _enclosing(host)
    names: list[str] = []
    name_index: dict[str, int] = {}
    ops: list[dict] = []
    op_index: dict[str, int] = {}
    records = []
    origin = kernels[0].start_ns() if kernels else 0
    for k in kernels:
        name = k.name()
        if name not in name_index:
            name_index[name] = len(names)
            names.append(name)
        entry: dict[str, Any] = {"name": name_index[name], "stream": int(k.device_resource_id()),
                                 "start": round((k.start_ns() - origin) / 1e3, 3),
                                 "dur": round((k.end_ns() - k.start_ns()) / 1e3, 3), "op": None}
        linked = _call(k, "linked_correlation_id", 0)
        launcher = by_correlation.get(linked)
        if launcher is None and linked in internal:
            launcher = parent.get(id(internal[linked]))
        if launcher is not None:
            op = _op_record(launcher, parent, ranges)
            key = json.dumps(op, sort_keys=True)
            if key not in op_index:
                op_index[key] = len(ops)
                ops.append(op)
            entry["op"] = op_index[key]
        copied = _BYTES.search(_call(k, "metadata_json", "") or "")
        if copied:
            entry["bytes"] = int(copied.group(1))
        records.append(entry)
    return {"schema": SCHEMA, "device": device, "forwards": 1, "unit": "us", "host_ops": len(host),
            "origin_ns": origin if kernels else None, "names": names, "ops": ops, "kernels": records}


# -- a graph replay's kernels linked to the eager forward's -----------------------------------

COUNTS_DIFFER = "counts differ"
ORDER_UNSURE = "its eager kernels differ in op or size and run on several streams"


def _by_name(timeline: dict) -> dict[str, list[dict]]:
    """Each kernel name's kernels in start order (ties: the shorter first, then the stream)."""
    names = timeline["names"]
    found: dict[str, list[dict]] = defaultdict(list)
    for k in sorted(timeline["kernels"], key=lambda k: (k["start"], k["start"] + k["dur"], k["stream"])):
        found[names[k["name"]]].append(k)
    return found


def _why_unmatched(mine: list[dict], theirs: list[dict]) -> str | None:
    """Why a name's replay kernels cannot be paired one to one, in start order, with the eager
    forward's; None where they can. Where the eager kernels of the name all carry one op and one
    size, any pairing links right. Where they differ, the pairing by start order holds where they
    ran on one stream: a stream runs its kernels in issue order, and the graph captured from it
    chains them in that order, on whatever streams it replays them. Across streams it need not."""
    if len(mine) != len(theirs):
        return COUNTS_DIFFER
    if len({(k.get("op"), k.get("bytes")) for k in theirs}) > 1 and len({k["stream"] for k in theirs}) > 1:
        return ORDER_UNSURE
    return None


def link_replay(replay: dict, eager: dict, replays: int = 1) -> dict:
    """`replay` (the timeline of `replays` CUDA-graph replays back to back, `from_events`) with each
    kernel linked to its op through its twin in `eager` (an eager forward of the same step): per
    kernel name, the replay's i-th kernel in start order is the eager forward's i-th, counting
    the eager forward's kernels again for each replay (the replays of one stream run one after
    the other, so each name's kernels come replay by replay), and takes its op (name, FLOPs,
    shapes) and, where the replay's event recorded no size of its own (a memcpy node may not),
    its `bytes`. A name whose kernels cannot be paired surely (`_why_unmatched`: counts that
    differ, as where only the eager forward runs a kernel or the graph holds one it does not;
    twins that differ spread over streams) has none of its kernels linked, and is listed in
    `unmatched` with both counts and why; `linked` counts the kernels paired with a twin. The ops
    the replay's own profile linked (none, or the host call open at the graph's launch) are not
    the kernels' launchers and are dropped. Pure: neither argument is changed."""
    eager_ops = eager["ops"]
    ops: list[dict] = []
    op_index: dict[str, int] = {}

    def linked_op(twin: dict) -> int | None:
        if twin.get("op") is None:
            return None
        op = eager_ops[twin["op"]]
        key = json.dumps(op, sort_keys=True)
        if key not in op_index:
            op_index[key] = len(ops)
            ops.append(op)
        return op_index[key]

    kernels = [dict(k, op=None) for k in replay["kernels"]]
    copy_of = {id(k): c for k, c in zip(replay["kernels"], kernels)}
    theirs_by_name = _by_name(eager)
    unmatched, linked = [], 0
    for name, mine in _by_name(replay).items():
        theirs = theirs_by_name.get(name, []) * replays
        why = _why_unmatched(mine, theirs)
        if why is not None:
            unmatched.append({"name": name, "replay": len(mine), "eager": len(theirs) // replays, "why": why})
            continue
        for k, twin in zip(mine, theirs):
            copied = copy_of[id(k)]
            copied["op"] = linked_op(twin)
            if "bytes" not in copied and "bytes" in twin:
                copied["bytes"] = twin["bytes"]
        linked += len(mine)
    eager_only = {eager["names"][k["name"]] for k in eager["kernels"]} - set(replay["names"])
    for name in sorted(eager_only):
        unmatched.append({"name": name, "replay": 0, "eager": len(theirs_by_name[name]), "why": COUNTS_DIFFER})
    return replay | {"replay": True, "replays": replays, "ops": ops, "kernels": kernels, "linked": linked,
                     "unmatched": unmatched}
