"""Why communication stays exposed (`report --profile DIR`'s second part): a profiled forward's
device kernels kept as a timeline (timing/timeline.py), its exposed communication found and named
(report/exposed.py), printed per point (report/exposed_view.py). Timelines are built from fake
profiler events with fresh random durations and placements whose exposed intervals are known by
construction; the CPU sweep writes real (device-less) ones."""

from __future__ import annotations

import io
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rich.console import Console
from torch.autograd import DeviceType

from overlapbench import report
from overlapbench.errors import UserError
from overlapbench.report import exposed
from overlapbench.report.exposed_view import short
from overlapbench.timing import timeline
from overlapbench.tuning.results import profile_name, read_rows
from tests import distributed, synthetic
from tests.test_report_diagnostics import profiler_table

GEMM, NORM, ATTENTION = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NNT", "_fused_add_rmsnorm_kernel", "flash_fwd_kernel"
NCCL, PEER_COPY = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "Memcpy PtoP (Device -> Device)"
MAIN, COMM, SIDE = 7, 13, 21  # streams


@dataclass
class Event:
    """A torch.profiler event (`_KinetoEvent`) as timeline.from_events reads it."""

    label: str
    device: DeviceType
    start: int  # ns
    end: int
    corr: int = 0
    linked: int = 0
    stream: int = 0
    thread: int = 1
    in_shapes: list = field(default_factory=list)
    in_dtypes: list = field(default_factory=list)
    op_flops: int = 0
    annotation: bool = False
    activity: str = "kernel"

    def name(self): return self.label
    def device_type(self): return self.device
    def device_resource_id(self): return self.stream
    def start_ns(self): return self.start
    def end_ns(self): return self.end
    def correlation_id(self): return self.corr
    def linked_correlation_id(self): return self.linked
    def start_thread_id(self): return self.thread
    def shapes(self): return self.in_shapes
    def dtypes(self): return self.in_dtypes
    def flops(self): return self.op_flops
    def is_user_annotation(self): return self.annotation
    def activity_type(self): return self.activity
    def is_async(self): return False
    def metadata_json(self): return ""


@dataclass
class Planned:
    """A kernel to lay out: what it is, where it runs (us), what its op says."""

    name: str
    stream: int
    start: int
    dur: int
    flops: int = 0
    bytes: int | None = None  # a transfer's buffer: [tokens, hidden] bf16


class Trace:
    """Fake profiler events for planned kernels: each kernel linked to a host op that launched
    it; a GEMM's op records shapes and FLOPs, a transfer's launching range records nothing and
    the collective op around it its buffer; plus what must not become a kernel or an op (a
    range drawn on the GPU, the runtime's launch calls)."""

    def __init__(self, origin_ns: int):
        self.events: list[Event] = []
        self.origin, self.host, self.ids = origin_ns, 10_000, 0

    def _id(self) -> int:
        self.ids += 1
        return self.ids

    def add(self, k: Planned) -> None:
        host, self.host = self.host, self.host + 100
        launch = self._id()
        if k.bytes is not None:  # c10d::allreduce_ (the buffer) > nccl:all_reduce (launches, no shapes)
            outer = Event("c10d::allreduce_", DeviceType.CPU, host, host + 50, corr=self._id(),
                          in_shapes=[[k.bytes // 2]], in_dtypes=["c10::BFloat16"])
            self.events.append(outer)
            self.events.append(Event("nccl:all_reduce", DeviceType.CPU, host + 5, host + 40, corr=launch,
                                     annotation=True, activity="user_annotation"))
        else:
            self.events.append(Event("aten::mm", DeviceType.CPU, host, host + 50, corr=launch,
                                     in_shapes=[[64, 32], [32, 48]], in_dtypes=["float", "float"], op_flops=k.flops))
        self.events.append(Event("cudaLaunchKernel", DeviceType.CPU, host + 10, host + 20, corr=self._id(), linked=launch,
                                 activity="cuda_runtime"))
        start, end = self.origin + k.start * 1000, self.origin + (k.start + k.dur) * 1000
        self.events.append(Event(k.name, DeviceType.CUDA, start, end, linked=launch, stream=k.stream))
        if k.bytes is not None:  # the range as the GPU draws it: not work
            self.events.append(Event("nccl:all_reduce", DeviceType.CUDA, start, end, linked=launch, stream=k.stream,
                                     activity="gpu_user_annotation"))


def test_a_kernel_linked_to_the_profiler_s_buffer_request_is_the_enclosing_op_s():
    """The forward's first kernel as torch.profiler gave it on H100s: linked, not to its aten op,
    to CUPTI's "Activity Buffer Request" opened inside that op with the launch's id."""
    rng = random.Random()  # fresh: seeded from the OS
    trace = Trace(origin_ns=rng.randrange(10**12, 10**13))
    flops = 2 * rng.randrange(1, 64) * 8192 * 8192
    trace.add(Planned(GEMM, MAIN, 0, rng.randrange(50, 500), flops=flops))
    op = next(e for e in trace.events if e.label == "aten::mm")
    trace.events.append(Event("Activity Buffer Request", DeviceType.CPU, op.start + 2, op.start + 8, corr=op.corr))
    data = timeline.from_events(trace.events, "cuda")
    (kernel,) = data["kernels"]
    assert data["ops"][kernel["op"]]["name"] == "aten::mm" and data["ops"][kernel["op"]]["flops"] == flops
    alone = Trace(origin_ns=rng.randrange(10**12, 10**13))  # the id taken by the request alone
    alone.add(Planned(GEMM, MAIN, 0, rng.randrange(50, 500), flops=flops))
    op = next(e for e in alone.events if e.label == "aten::mm")
    request = Event("Activity Buffer Request", DeviceType.CPU, op.start + 2, op.start + 8, corr=op.corr)
    op.corr = 10**6
    alone.events.append(request)
    data = timeline.from_events(alone.events, "cuda")
    assert data["ops"][data["kernels"][0]["op"]]["name"] == "aten::mm"


RECORDED = Path(__file__).parent.parent / "results/h200x2/6fef580/profiler-comm-events.jsonl"


class Recorded:
    """A `_KinetoEvent` as tests/checks/profiler_comm_events.py printed it on 2x H200 (torch 2.11)."""

    def __init__(self, fields: dict):
        self.fields = fields

    def __getattr__(self, name: str):
        value = self.__dict__["fields"].get(name, "<absent>")
        if value == "<absent>":
            raise AttributeError(name)
        if name == "device_type":
            return lambda: getattr(DeviceType, value.rsplit(".", 1)[-1])
        return lambda: value


def test_an_nccl_kernel_takes_its_bytes_from_the_range_its_launcher_opened(tmp_path):
    """As torch.profiler records a blocking all-reduce: the kernel is linked to `record_param_comms`
    (a TensorList: no shapes), inside `c10d::allreduce_` (none either); the async `nccl:all_reduce`
    range opened inside the launcher holds the tensor. Fails where only enclosing ops are searched."""
    events = [Recorded(json.loads(line)) for line in RECORDED.read_text().splitlines()[1:]]
    data = timeline.from_events(events, "cuda")
    names = data["names"]
    (nccl,) = [k for k in data["kernels"] if names[k["name"]].startswith("ncclDevKernel_AllReduce")]
    op = data["ops"][nccl["op"]]
    assert op["name"] == "record_param_comms" and op["shapes_of"] == "nccl:all_reduce"
    assert op["shapes"] == [[2048, 4096]] and op["dtypes"] == ["c10::BFloat16"]
    (gemm,) = [k for k in data["kernels"] if names[k["name"]].startswith("nvjet")]
    assert data["ops"][gemm["op"]]["name"] == "aten::mm"
    path = tmp_path / f"recorded{timeline.SUFFIX}"
    timeline.write(data, path)
    kernels = exposed.read(path).kernels
    # (the recording lacks is_user_annotation, so the range drawn on the GPU is not told from work here)
    (transfer,) = [k for k in kernels if k.is_transfer and k.name.startswith("ncclDevKernel")]
    assert transfer.bytes == 2048 * 4096 * 2


def timeline_of(kernels: list[Planned], rng: random.Random) -> dict:
    trace = Trace(origin_ns=rng.randrange(10**12, 10**13))
    for k in rng.sample(kernels, len(kernels)):  # the profiler's order is no order
        trace.add(k)
    return timeline.from_events(trace.events, "cuda")


def analyzed(tmp_path: Path, kernels: list[Planned], rng: random.Random) -> exposed.Exposure:
    """Through the file: written as the sweep writes it, read as the report reads it."""
    path = tmp_path / f"p{rng.random()}{timeline.SUFFIX}"
    timeline.write(timeline_of(kernels, rng), path)
    return exposed.analyze(exposed.read(path).kernels)


def gemm(rng: random.Random, stream: int, start: int, dur: int) -> Planned:
    return Planned(GEMM, stream, start, dur, flops=2 * rng.randrange(1, 64) * 8192 * 8192)


def buffer(rng: random.Random) -> int:
    return rng.randrange(16, 4096) * 8192 * 2


@pytest.mark.parametrize("seed", range(5))
def test_a_transfer_that_outlasts_the_gemm_beside_it_is_exposed_from_the_gemm_s_end(tmp_path, seed):
    rng = random.Random(seed)
    g0, gd = rng.randrange(1, 50), rng.randrange(50, 400)
    c0 = g0 + rng.randrange(1, gd)  # starts while the GEMM runs ...
    cd = g0 + gd - c0 + rng.randrange(5, 200)  # ... and ends after it
    latency, nd = rng.randrange(1, 20), rng.randrange(5, 50)
    size = buffer(rng)
    first = Planned(NORM, MAIN, 0, g0)
    g = gemm(rng, MAIN, g0, gd)
    comm = Planned(NCCL, COMM, c0, cd, bytes=size)
    after = Planned(NORM, MAIN, c0 + cd + latency, nd)
    e = analyzed(tmp_path, [first, g, comm, after], rng)
    wall = c0 + cd + latency + nd
    assert e.wall == pytest.approx(wall) and e.streams == 2 and e.kernels == 4
    assert e.comm == pytest.approx(cd)
    assert e.hidden == pytest.approx(g0 + gd - c0)
    assert e.exposed == pytest.approx(c0 + cd - (g0 + gd))
    assert e.compute == pytest.approx(g0 + gd + nd)
    assert e.idle == pytest.approx(latency)
    [i] = e.intervals
    assert i.start == pytest.approx(g0 + gd) and i.length == pytest.approx(c0 + cd + latency - (g0 + gd))
    assert i.exposed == pytest.approx(e.exposed)
    assert (i.transfer.name, i.transfer.stream, i.transfer.bytes, i.transfers) == (NCCL, COMM, size, 1)
    assert (i.after.name, i.after.stream, i.after.flops, i.relation) == (GEMM, MAIN, g.flops, "beside")
    assert (i.then.name, i.then.start) == (NORM, pytest.approx(after.start))


@pytest.mark.parametrize("seed", range(5))
def test_a_main_stream_that_waits_for_a_transfer_names_the_kernel_it_waited_behind(tmp_path, seed):
    rng = random.Random(100 + seed)
    gd, delay, cd, latency = rng.randrange(50, 400), rng.randrange(1, 30), rng.randrange(20, 300), rng.randrange(1, 30)
    g = gemm(rng, MAIN, 0, gd)
    copy = Planned(PEER_COPY, COMM, gd + delay, cd, bytes=buffer(rng))
    attention = Planned(ATTENTION, MAIN, gd + delay + cd + latency, rng.randrange(10, 100))
    hidden_side = Planned(NCCL, SIDE, rng.randrange(1, gd - 10), 5, bytes=buffer(rng))  # under the GEMM: hidden
    e = analyzed(tmp_path, [g, copy, attention, hidden_side], rng)
    assert e.comm == pytest.approx(cd + 5) and e.hidden == pytest.approx(5) and e.exposed == pytest.approx(cd)
    assert e.idle == pytest.approx(delay + latency)
    [i] = e.intervals
    assert i.start == pytest.approx(gd) and i.length == pytest.approx(delay + cd + latency)
    assert i.transfer.name == PEER_COPY and i.transfer.bytes == copy.bytes
    assert (i.after.name, i.relation, i.after.flops) == (GEMM, "behind", g.flops)
    assert i.then.name == ATTENTION


@pytest.mark.parametrize("seed", range(3))
def test_an_interval_names_the_transfer_that_runs_longest_in_it(tmp_path, seed):
    rng = random.Random(200 + seed)
    gd, short_copy = rng.randrange(50, 300), rng.randrange(2, 20)
    g = gemm(rng, MAIN, 0, gd)
    copy = Planned(PEER_COPY, SIDE, gd + 1, short_copy, bytes=buffer(rng))  # first, and short
    reduce = Planned(NCCL, COMM, gd + 2, short_copy + rng.randrange(5, 100), bytes=buffer(rng))
    norm = Planned(NORM, MAIN, reduce.start + reduce.dur + rng.randrange(1, 9), rng.randrange(5, 30))
    e = analyzed(tmp_path, [g, copy, reduce, norm], rng)
    [i] = e.intervals
    assert (i.transfer.name, i.transfer.bytes, i.transfers) == (NCCL, reduce.bytes, 2)
    assert i.exposed == pytest.approx(reduce.start + reduce.dur - copy.start)


def test_hidden_communication_has_no_interval(tmp_path):
    rng = random.Random(7)
    gd = rng.randrange(100, 500)
    start = rng.randrange(1, gd // 2)
    e = analyzed(tmp_path, [gemm(rng, MAIN, 0, gd), Planned(NCCL, COMM, start, rng.randrange(1, gd - start), bytes=64)], rng)
    assert e.intervals == () and e.exposed == 0 and e.hidden == e.comm > 0


def random_schedule(rng: random.Random, layers: int) -> list[Planned]:
    """Layers of a GEMM on the main stream, each with a transfer placed at random (under it, past
    its end, or after a delay); sometimes a side stream computes meanwhile; the next layer starts
    after the transfer ends, or does not wait for it."""
    kernels, at = [], 0
    for _ in range(layers):
        gd = rng.randrange(20, 300)
        kernels.append(gemm(rng, MAIN, at, gd))
        transfer = Planned(NCCL, COMM, at + rng.randrange(0, gd + 40), rng.randrange(5, 200), bytes=buffer(rng))
        kernels.append(transfer)
        if rng.random() < 0.4:
            kernels.append(Planned(NORM, SIDE, at + gd + rng.randrange(0, 60), rng.randrange(5, 80)))
        at += gd + rng.randrange(0, 20)
        if rng.random() < 0.5:
            at = max(at, transfer.start + transfer.dur + rng.randrange(1, 15))
    return kernels


def oracle(kernels: list[Planned]) -> dict:
    """The same quantities from 1-us cells (every time here is a whole us)."""
    end = max(k.start + k.dur for k in kernels)
    origin = min(k.start for k in kernels)
    compute = [any(k.start <= t < k.start + k.dur for k in kernels if k.bytes is None) for t in range(end)]
    comm = [any(k.start <= t < k.start + k.dur for k in kernels if k.bytes is not None) for t in range(end)]
    runs, t = [], origin
    while t < end:
        if compute[t]:
            t += 1
            continue
        first = t
        while t < end and not compute[t]:
            t += 1
        if any(comm[first:t]):
            runs.append((first, t, sum(comm[first:t])))
    cells = range(origin, end)
    return {"comm": sum(comm[t] for t in cells), "compute": sum(compute[t] for t in cells),
            "hidden": sum(comm[t] and compute[t] for t in cells), "exposed": sum(comm[t] and not compute[t] for t in cells),
            "idle": sum(not comm[t] and not compute[t] for t in cells), "runs": runs, "wall": end - origin}


@pytest.mark.parametrize("seed", range(8))
def test_random_schedules_agree_with_counting_microseconds(tmp_path, seed):
    rng = random.Random(1000 + seed)
    kernels = random_schedule(rng, layers=rng.randrange(2, 7))
    e, want = analyzed(tmp_path, kernels, rng), oracle(kernels)
    for total in ("wall", "compute", "comm", "hidden", "exposed", "idle"):
        assert getattr(e, total) == pytest.approx(want[total]), total
    assert e.comm == pytest.approx(e.hidden + e.exposed)
    assert sorted((i.start, i.start + i.length, i.exposed) for i in e.intervals) == [
        pytest.approx(r) for r in want["runs"]]
    assert [i.exposed for i in e.intervals] == sorted((i.exposed for i in e.intervals), reverse=True)
    compute = [k for k in kernels if k.bytes is None]
    for i in e.intervals:
        last = max(k.start + k.dur for k in compute if k.start + k.dur <= i.start) if i.after else None
        assert i.after is None or i.after.end == pytest.approx(last)
        assert i.then is None or i.then.start == pytest.approx(min(k.start for k in compute if k.start >= i.start + i.length))


def test_the_timeline_keeps_kernels_only_each_with_its_launching_op(tmp_path):
    rng = random.Random(3)
    g, comm = gemm(rng, MAIN, 0, rng.randrange(50, 100)), Planned(NCCL, COMM, 120, rng.randrange(10, 90), bytes=buffer(rng))
    data = timeline_of([g, comm], rng)
    assert data["schema"] == timeline.SCHEMA and data["device"] == "cuda" and data["forwards"] == 1
    assert [data["names"][k["name"]] for k in data["kernels"]] == [GEMM, NCCL]  # no range drawn on the GPU
    assert [k["stream"] for k in data["kernels"]] == [MAIN, COMM]
    assert [k["start"] for k in data["kernels"]] == [0, 120] and data["kernels"][1]["dur"] == comm.dur
    mm, nccl = (data["ops"][k["op"]] for k in data["kernels"])
    assert mm["name"] == "aten::mm" and mm["flops"] == g.flops and mm["shapes"] == [[64, 32], [32, 48]]
    assert nccl["name"] == "nccl:all_reduce" and nccl["shapes_of"] == "c10d::allreduce_"
    assert nccl["shapes"] == [[comm.bytes // 2]] and nccl["dtypes"] == ["c10::BFloat16"]
    assert data["host_ops"] == 3  # aten::mm, c10d::allreduce_, nccl:all_reduce; not the launch calls


def test_the_timeline_keeps_the_profiler_s_timestamp_of_its_first_kernel():
    """Times are from the first kernel; `origin_ns` says where that lies on the profiler's clock."""
    rng = random.Random()
    origin, first = rng.randrange(10**12, 10**13), rng.randrange(1, 10**4)  # us after the trace's origin
    trace = Trace(origin_ns=origin)
    planned = [gemm(rng, MAIN, first + rng.randrange(0, 500), rng.randrange(50, 100)) for _ in range(rng.randrange(2, 6))]
    for k in planned + [gemm(rng, COMM, first, rng.randrange(5, 50))]:
        trace.add(k)
    data = timeline.from_events(trace.events, "cuda")
    assert data["origin_ns"] == origin + first * 1000 and min(k["start"] for k in data["kernels"]) == 0
    assert sorted(k["start"] + first for k in data["kernels"]) == sorted([k.start for k in planned] + [first])


def test_a_timeline_without_device_kernels_has_no_exposure(tmp_path):
    data = timeline.from_events([Event("aten::mm", DeviceType.CPU, 0, 10, corr=1)], "cpu")
    assert data["kernels"] == [] and data["host_ops"] == 1
    path = tmp_path / f"x{timeline.SUFFIX}"
    timeline.write(data, path)
    assert exposed.analyze(exposed.read(path).kernels) is None


def test_a_file_that_is_not_a_timeline_is_one_line(tmp_path):
    path = tmp_path / f"x{timeline.SUFFIX}"
    path.write_text(json.dumps({"schema": "something-else"}))
    with pytest.raises(UserError, match=r"x\.timeline\.json is not a timeline of `sweep --profile` \(schema 'something-else'"):
        exposed.read(path)
    path.write_text("{")
    with pytest.raises(UserError, match="is not a timeline"):
        exposed.read(path)


# -- the report ------------------------------------------------------------------------------


def profiled_folder(tmp_path: Path, rng: random.Random, with_timeline: set[str]) -> tuple[Path, Path, dict]:
    """Rows, and a profile folder with a kernel table per row, timelines for `with_timeline`
    strategies (the planned kernels by strategy)."""
    rows = [synthetic.row("no_comm", 2048, {}, median=4.0), synthetic.row("baseline", 2048, median=4.4)]
    folder = tmp_path / "profile"
    folder.mkdir()
    planned = {}
    for r in rows:
        name = profile_name(r["strategy"], r["tokens"], r["knobs"])
        (folder / f"{name}.txt").write_text(profiler_table({GEMM: rng.uniform(1, 9), NCCL: rng.uniform(0.1, 2)}, 3))
        if r["strategy"] in with_timeline:
            kernels = [k for k in random_schedule(rng, 20) if r["strategy"] != "no_comm" or k.bytes is None]
            planned[name] = kernels
            timeline.write(timeline_of(kernels, rng), folder / f"{name}{timeline.SUFFIX}")
    return synthetic.write(tmp_path / "r.jsonl", rows), folder, planned


def test_report_profile_prints_each_point_s_exposed_intervals(tmp_path):
    rng = random.Random(11)
    rows, folder, planned = profiled_folder(tmp_path, rng, {"baseline", "no_comm"})
    out = io.StringIO()
    assert report.run([rows], "table", Console(file=out, width=400), profile_dir=folder) == 0
    text = out.getvalue()
    kernel_table = text.index("GPU ms per layer by kind of kernel")
    section = text.index("Exposed communication: one eager forward per point")
    assert kernel_table < section
    e = exposed.analyze(exposed.read(folder / f"baseline-2048{timeline.SUFFIX}").kernels)
    want = oracle(planned["baseline-2048"])
    line = next(t for t in text.splitlines() if t.startswith("baseline-2048: wall"))
    assert f"wall {want['wall'] / 1e3:.3f} ms" in line and f"comm busy {want['comm'] / 1e3:.3f}" in line
    assert f"exposed {want['exposed'] / 1e3:.3f} ({want['exposed'] / want['wall']:.1%} of wall)" in line
    assert line.endswith(f"{len(want['runs'])} exposed interval{'s' if len(want['runs']) != 1 else ''}")
    assert len(want["runs"]) > 8, "the schedule should leave more exposed intervals than the table shows"
    assert f"baseline-2048: exposed intervals (the 8 longest of {len(want['runs'])}, longest exposed first)" in text
    rows_shown = [t for t in text.splitlines() if short(NCCL) in t and "│" in t]
    assert len(rows_shown) == 8
    longest = e.intervals[0]
    assert f"{longest.exposed / 1e3:.3f}" in rows_shown[0] and f"{longest.start / 1e3:.3f}" in rows_shown[0]
    if longest.after is not None:
        after = longest.after
        assert f"{longest.relation} {after.kind}: {short(after.name)} (s{after.stream})" in rows_shown[0]
    assert "no_comm-2048: wall" in text and "0 exposed intervals" in text


def test_report_profile_json_carries_the_exposure_and_old_folders_still_read(tmp_path):
    rng = random.Random(12)
    rows, folder, planned = profiled_folder(tmp_path, rng, {"baseline"})
    out = io.StringIO()
    assert report.run([rows], "json", Console(file=out, width=200), profile_dir=folder) == 0
    records = {r["table"]: r for r in json.loads(out.getvalue())}
    assert records["no_comm-2048"]["timeline"] is None and records["no_comm-2048"]["exposure"] is None
    got, want = records["baseline-2048"]["exposure"], oracle(planned["baseline-2048"])
    assert got["exposed_ms"] == pytest.approx(want["exposed"] / 1e3) and got["intervals"] == len(want["runs"])
    assert len(got["longest"]) == min(8, len(want["runs"])) and got["longest"][0]["transfer"]["name"] == NCCL
    out = io.StringIO()
    assert report.run([rows], "table", Console(file=out, width=300), profile_dir=folder) == 0
    assert "no_comm-2048: no timeline beside its table (profiled before timelines were kept)" in out.getvalue()
    for path in folder.glob(f"*{timeline.SUFFIX}"):  # a folder from before timelines: tables alone
        path.unlink()
    out = io.StringIO()
    assert report.run([rows], "markdown", Console(file=out, width=300), profile_dir=folder) == 0
    assert "baseline-2048: no timeline beside its table" in out.getvalue() and "| point |" in out.getvalue()


# -- the CPU sweep ---------------------------------------------------------------------------

SPEC = """
name: tiny-profile
model: tiny
layers: [1, 2]
tokens: [16]
strategies:
  baseline: {}
  token_split: {align: 8}
measure: {warmup: 1, iters: 2, timeout_s: 60}
"""


def _profiled_sweep(rank: int, world: int, spec_path: str, out: str, folder: str) -> int:
    """The rank code of `sweep --profile` (the command itself refuses --profile without GPUs)."""
    from overlapbench.run.command import work
    from overlapbench.specs import spec

    return work(spec.load(Path(spec_path), cuda=False), Path(out), False, Path(folder))


@pytest.mark.slow
@pytest.mark.parametrize("interleave", [False, True])
def test_a_cpu_sweep_with_a_profile_folder_writes_timelines_the_report_reads(tmp_path, interleave):
    """Both timing modes profile every row asked for: interleaved, the batch's reference too."""
    spec_path, out, folder = tmp_path / "spec.yaml", tmp_path / "r.jsonl", tmp_path / "profile"
    spec_path.write_text(SPEC.replace("timeout_s: 60}", f"timeout_s: 60, interleave: {str(interleave).lower()}}}"))
    folder.mkdir()
    assert distributed.run(_profiled_sweep, str(spec_path), str(out), str(folder)) == [4, 0]
    rows = read_rows(out)
    assert {r["status"] for r in rows} == {"ok"} and {r["layers"] for r in rows} == {1, 2}
    assert {r["timing"] for r in rows} == ({"interleaved"} if interleave else {"sequential"}), {r["timing"] for r in rows}
    assert len(list(folder.glob("*.txt"))) == len(rows)  # each depth its own table: none written over
    assert not list(folder.glob(f"*{timeline.REPLAY_SUFFIX}"))  # no graph captured on CPU: no replay's timeline
    assert len(list(folder.glob(f"*{timeline.SUFFIX}"))) == 2 * len(rows)  # each rank's eager timeline
    for r in rows:
        name = profile_name(r["strategy"], r["tokens"], r["knobs"], layers=r["layers"])
        assert (folder / f"{name}.txt").read_text().startswith("3 eager forwards\n")
        for rank in (0, 1):  # rank 0's under the plain name, rank 1's beside it
            data = json.loads((folder / timeline.file_name(name, rank=rank)).read_text())
            assert set(data) == {"schema", "device", "forwards", "unit", "host_ops", "origin_ns", "rank", "world",
                                 "names", "ops", "kernels"}
            assert (data["schema"], data["device"], data["forwards"], data["unit"]) == (timeline.SCHEMA, "cpu", 1, "us")
            assert (data["rank"], data["world"], data["origin_ns"]) == (rank, 2, None)  # no device kernel: no origin
            assert data["kernels"] == [] and data["names"] == [] and data["host_ops"] > 10
    result = distributed.overlapbench("report", str(out), "--profile", str(folder), env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    for r in rows:
        name = profile_name(r["strategy"], r["tokens"], r["knobs"], layers=r["layers"])
        assert re.search(rf"{re.escape(name)}: no device kernels in its timeline \(profiled on cpu: \d+ host ops\)",
                         result.stdout), result.stdout


def test_the_wall_time_over_no_comm_splits_into_compute_exposed_and_idle():
    from overlapbench.report.exposed_view import against_line

    rng = random.Random()
    def totals():
        compute, exposed_, idle = (rng.uniform(1e3, 1e5) for _ in range(3))
        return exposed.Exposure(compute + exposed_ + idle, compute, exposed_ + rng.uniform(0, 1e4), 0.0, exposed_, idle,
                                2, 10, ())
    e, bound = totals(), totals()
    line = against_line(e, bound)
    numbers = [float(x) for x in re.findall(r"[+-]\d+\.\d+", line)]
    wall, parts = numbers[0], numbers[1:]
    assert len(parts) == 3 and abs(wall - sum(parts)) <= 0.002  # each shown to 3 decimals
    assert wall == pytest.approx((e.wall - bound.wall) / 1e3, abs=5e-4)
    assert parts[1] == pytest.approx((e.exposed - bound.exposed) / 1e3, abs=5e-4)
