"""One profiled forward's device kernels, kept as a small JSON file beside the point's kernel table.

`sweep --profile DIR` writes, per point, torch.profiler's kernel table (`<point>.txt`, see
`measure.profile_step`) and this timeline (`<point>.timeline.json`): one more eager forward under
torch.profiler with `record_shapes` and `with_flops`, and of it only what `report --profile`'s
account of exposed communication reads (report/exposed.py), not the whole chrome trace:

    {"schema": "overlapbench/timeline-v1", "device": "cuda", "forwards": 1, "unit": "us",
     "host_ops": 812,                      # CPU ops the profiler saw (a CPU run has only these)
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
its stream waits are not. The file is rank 0's. Torch is imported inside functions: `report`
reads this module's constants without it.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SCHEMA = "overlapbench/timeline-v1"
SUFFIX = ".timeline.json"
TABLE_SUFFIX = ".txt"
NOT_WORK = ("gpu_user_annotation", "user_annotation", "cuda_sync", "cuda_profiler_range")  # device events that run nothing
_BYTES = re.compile(r'"bytes"\s*:\s*(\d+)')
# The profiler's own host events: CUPTI's buffer request, opened inside the op whose launch it
# interrupts, can carry that launch's correlation id (seen on H100s, torch 2.11: the forward's
# first kernel linked to it). A kernel linked to one is the enclosing op's.
PROFILER_EVENTS = frozenset({"Activity Buffer Request"})


def beside(table: Path) -> Path:
    """The timeline's path beside a kernel table's (`<point>.txt` -> `<point>.timeline.json`)."""
    return table.with_name(table.name.removesuffix(TABLE_SUFFIX) + SUFFIX)


def record(forward, cuda: bool) -> dict:
    """Run `forward()` once under torch.profiler (shapes and FLOPs recorded, the device waited
    for) and return its timeline. Every rank calls it: the forward holds collectives."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True, with_flops=True) as prof:
        forward()
        if cuda:
            torch.cuda.synchronize()
    return from_events(prof.profiler.kineto_results.events(), "cuda" if cuda else "cpu")


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
            "names": names, "ops": ops, "kernels": records}
