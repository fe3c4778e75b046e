"""A CUDA-graph replay's timeline (timing/timeline.py `link_replay`): its kernels, which the
profiler links to no op, paired per kernel name in start order with an eager forward's and given
their ops (FLOPs, shapes) and sizes; names that cannot be paired surely are linked to nothing and
listed. Then `report --profile` reading a replay's timeline where one lies beside the table, and
the eager forward's where not (or with `--timeline eager`), and the CPU profile writing none.

Programs are drawn at random: kernel names bound to streams, several ops per name (so a wrong
pairing links a wrong op), copies with sizes; the replay runs the same kernels with other stream
ids, other durations, and the streams' work interleaved otherwise than in the eager forward."""

from __future__ import annotations

import copy
import io
import json
import random
from dataclasses import dataclass

import pytest
from rich.console import Console

from overlapbench import report
from overlapbench.errors import UserError
from overlapbench.report import exposed
from overlapbench.timing import timeline
from tests.test_exposed import oracle, profiled_folder, timeline_of

COPY = "Memcpy DtoD (Device -> Device)"


@dataclass
class Launch:
    """One kernel the program issues: its name, its eager stream, its op, its size (copies)."""

    name: str
    stream: int
    op: dict
    bytes: int | None = None


def random_program(rng: random.Random) -> list[Launch]:
    """Kernels over 2-4 streams, each name bound to one stream and drawn from 1-3 ops (GEMMs of
    different shapes under one kernel name); copies with random sizes on one of the streams."""
    streams = rng.sample(range(1, 60), rng.randrange(2, 5))
    pools = {}
    for i in range(rng.randrange(4, 9)):
        name = f"kernel_{i}_{rng.randrange(10**6)}"
        pools[name] = (rng.choice(streams), [{"name": "aten::mm", "flops": 2 * rng.randrange(1, 10**6),
                                              "shapes": [[rng.randrange(1, 9000), rng.randrange(1, 9000)]],
                                              "dtypes": ["c10::BFloat16"]} for _ in range(rng.randrange(1, 4))])
    copies = rng.choice(streams)
    program = []
    for _ in range(rng.randrange(30, 90)):
        if rng.random() < 0.2:
            program.append(Launch(COPY, copies, {"name": "aten::copy_", "flops": 0}, rng.randrange(1, 1 << 26)))
        else:
            name = rng.choice(list(pools))
            stream, ops = pools[name]
            program.append(Launch(name, stream, rng.choice(ops)))
    return program


def eager_timeline(program: list[Launch], rng: random.Random) -> dict:
    """The eager forward: each stream runs its kernels in issue order, from time 0, with gaps."""
    clock: dict[int, float] = {}
    names, ops, placed = [], [], []
    for launch in program:
        start = clock.get(launch.stream, 0.0) + rng.randrange(1, 40)
        dur = rng.randrange(1, 300)
        clock[launch.stream] = start + dur
        if launch.name not in names:
            names.append(launch.name)
        if launch.op not in ops:
            ops.append(launch.op)
        k = {"name": names.index(launch.name), "stream": launch.stream, "start": float(start), "dur": float(dur),
             "op": ops.index(launch.op)}
        placed.append(k | ({"bytes": launch.bytes} if launch.bytes is not None else {}))
    return _timeline(names, ops, placed, host_ops=rng.randrange(100, 1000))


def replay_timeline(program: list[Launch], rng: random.Random, own_bytes: dict[int, int]) -> tuple[dict, list[int]]:
    """One replay of the program's graph: other stream ids, the last stream's work first and the
    first's last (so the streams interleave otherwise), no ops; copies at `own_bytes` (program
    index -> the size the replay's event recorded) keep a size of their own. Also, per kernel of
    the timeline (in its order), the program index it runs."""
    streams = sorted({launch.stream for launch in program})
    offset = {s: 1e6 * (len(streams) - i) for i, s in enumerate(streams)}
    clock: dict[int, float] = {}
    names, placed = [], []
    for i, launch in enumerate(program):
        start = clock.get(launch.stream, offset[launch.stream]) + rng.randrange(0, 5)
        dur = rng.randrange(1, 200)
        clock[launch.stream] = start + dur
        if launch.name not in names:
            names.append(launch.name)
        k = {"name": names.index(launch.name), "stream": 1000 + launch.stream, "start": float(start), "dur": float(dur),
             "op": None}
        placed.append((k | ({"bytes": own_bytes[i]} if i in own_bytes else {}), i))
    placed.sort(key=lambda p: (p[0]["start"], p[0]["dur"]))
    return _timeline(names, [], [k for k, _ in placed], host_ops=rng.randrange(1, 20)), [i for _, i in placed]


def _timeline(names: list[str], ops: list[dict], kernels: list[dict], host_ops: int) -> dict:
    return {"schema": timeline.SCHEMA, "device": "cuda", "forwards": 1, "unit": "us", "host_ops": host_ops,
            "names": names, "ops": ops, "kernels": sorted(kernels, key=lambda k: (k["start"], k["dur"]))}


def name_order(t: dict) -> list[str]:
    return [t["names"][k["name"]] for k in t["kernels"]]


@pytest.mark.parametrize("seed", range(8))
def test_each_replayed_kernel_takes_the_op_and_size_of_its_eager_twin(seed):
    rng = random.Random(seed)
    program = random_program(rng)
    copies = [i for i, launch in enumerate(program) if launch.bytes is not None]
    own = {i: rng.randrange(1, 1 << 26) for i in copies if rng.random() < 0.5}  # the event's own size, kept
    eager = eager_timeline(program, rng)
    replay, runs = replay_timeline(program, rng, own)
    before = copy.deepcopy((replay, eager))
    assert name_order(replay) != name_order(eager), "the replay should interleave the streams otherwise"
    linked = timeline.link_replay(replay, eager)
    assert (replay, eager) == before  # pure
    assert linked["replay"] is True and linked["unmatched"] == [] and linked["linked"] == len(program)
    assert linked["names"] == replay["names"] and linked["host_ops"] == replay["host_ops"]
    assert [(k["stream"], k["start"], k["dur"]) for k in linked["kernels"]] == [
        (k["stream"], k["start"], k["dur"]) for k in replay["kernels"]]
    for k, i in zip(linked["kernels"], runs):
        launch = program[i]
        assert linked["ops"][k["op"]] == launch.op, (launch.name, i)
        want = own.get(i, launch.bytes)
        assert k.get("bytes") == want, (launch.name, i)


def back_to_back(program: list[Launch], rng: random.Random, replays: int) -> tuple[dict, list[int]]:
    """`replays` replays of the program's graph, each after the one before has ended (a stream
    runs one graph launch after the other), as one timeline; per kernel, the program index it runs."""
    kernels, runs, names, end = [], [], None, 0.0
    for _ in range(replays):
        one, ran = replay_timeline(program, rng, {})
        shift = end + rng.randrange(1, 50) - min(k["start"] for k in one["kernels"])
        kernels += [dict(k, start=k["start"] + shift) for k in one["kernels"]]
        runs += ran
        names, end = one["names"], max(k["start"] + shift + k["dur"] for k in one["kernels"])
    return _timeline(names, [], kernels, host_ops=rng.randrange(1, 20)), runs


@pytest.mark.parametrize("seed", range(4))
def test_replays_back_to_back_link_each_replay_s_kernels_to_the_same_twins(seed):
    rng = random.Random(seed)
    program = random_program(rng)
    eager = eager_timeline(program, rng)
    replays = rng.randrange(2, 6)
    timed, runs = back_to_back(program, rng, replays)
    linked = timeline.link_replay(timed, eager, replays)
    assert linked["unmatched"] == [] and linked["linked"] == replays * len(program) and linked["replays"] == replays
    order = sorted(range(len(runs)), key=lambda j: (timed["kernels"][j]["start"], timed["kernels"][j]["dur"]))
    for j in order:
        assert linked["ops"][linked["kernels"][j]["op"]] == program[runs[j]].op
    short = timeline.link_replay(timed, eager, replays + 1)  # a count that does not hold them: nothing linked
    counts = {eager["names"][k["name"]] for k in eager["kernels"]}
    assert short["linked"] == 0 and {u["name"] for u in short["unmatched"]} == counts
    assert all(u["why"] == timeline.COUNTS_DIFFER and u["replay"] == replays * u["eager"] for u in short["unmatched"])


def test_a_name_whose_counts_differ_is_linked_to_nothing_and_listed():
    rng = random.Random()  # fresh
    program = random_program(rng)
    by_name: dict[str, list[int]] = {}
    for i, launch in enumerate(program):
        by_name.setdefault(launch.name, []).append(i)
    dropped = rng.choice([n for n in by_name if n != COPY])  # the graph lacks one of its kernels
    gone = rng.choice(by_name[dropped])
    eager_only = Launch("eager_only_kernel", program[0].stream, {"name": "aten::add", "flops": 0})
    graph_only = Launch("graph_only_kernel", program[-1].stream, {"name": "aten::mul", "flops": 0})
    eager = eager_timeline(program + [eager_only], rng)
    replayed = [launch for i, launch in enumerate(program) if i != gone] + [graph_only]
    replay, runs = replay_timeline(replayed, rng, {})
    linked = timeline.link_replay(replay, eager)
    count = len(by_name[dropped])
    assert sorted(linked["unmatched"], key=lambda u: u["name"]) == sorted([
        {"name": dropped, "replay": count - 1, "eager": count, "why": timeline.COUNTS_DIFFER},
        {"name": "eager_only_kernel", "replay": 0, "eager": 1, "why": timeline.COUNTS_DIFFER},
        {"name": "graph_only_kernel", "replay": 1, "eager": 0, "why": timeline.COUNTS_DIFFER},
    ], key=lambda u: u["name"])
    assert linked["linked"] == len(program) - count
    for k, i in zip(linked["kernels"], runs):
        launch = replayed[i]
        if launch.name in (dropped, "graph_only_kernel"):
            assert k["op"] is None and "bytes" not in k, launch.name
        else:
            assert linked["ops"][k["op"]] == launch.op and k.get("bytes") == launch.bytes


def test_twins_that_differ_on_several_streams_are_not_paired_by_start_order():
    """One kernel name on two eager streams with different ops: the replay may start them in
    another order (here it does), so start order does not say which is which. The same name with
    one op on both streams pairs either way, and is linked."""
    rng = random.Random()
    a, b = rng.sample(range(1, 60), 2)
    ops = [{"name": "aten::mm", "flops": 2 * rng.randrange(1, 10**6)} for _ in range(2)]
    same = {"name": "aten::add", "flops": 0}
    def kernel(name: int, stream: int, start: float, dur: float, op: int | None) -> dict:
        return {"name": name, "stream": stream, "start": start, "dur": dur, "op": op}

    eager = _timeline(["gemm_kernel", "add_kernel"], ops + [same], [
        kernel(0, a, 0.0, 10.0, 0), kernel(0, b, 1.0, 10.0, 1), kernel(1, a, 20.0, 5.0, 2), kernel(1, b, 21.0, 5.0, 2)],
        host_ops=9)
    replay = _timeline(["gemm_kernel", "add_kernel"], [], [  # stream b's first: the eager order swapped
        kernel(0, 200, 0.0, 8.0, None), kernel(0, 100, 0.5, 8.0, None), kernel(1, 200, 9.0, 4.0, None),
        kernel(1, 100, 9.5, 4.0, None)], host_ops=1)
    linked = timeline.link_replay(replay, eager)
    assert linked["unmatched"] == [{"name": "gemm_kernel", "replay": 2, "eager": 2, "why": timeline.ORDER_UNSURE}]
    assert [k["op"] for k in linked["kernels"][:2]] == [None, None]
    assert [linked["ops"][k["op"]] for k in linked["kernels"][2:]] == [same, same]


def test_a_linked_replay_reads_as_a_timeline_with_flops_and_bytes(tmp_path):
    rng = random.Random()
    size = 2 * rng.randrange(1, 1 << 25)  # a bf16 buffer's bytes
    flops = 2 * rng.randrange(1, 10**9)
    gemm, nccl = "nvjet_sm90_tst_128x256", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
    reduce = {"name": "nccl:all_reduce", "flops": 0, "shapes": [[size // 2]], "dtypes": ["c10::BFloat16"]}
    eager = _timeline([gemm, nccl], [{"name": "aten::mm", "flops": flops}, reduce],
                      [{"name": 0, "stream": 7, "start": 0.0, "dur": 50.0, "op": 0},
                       {"name": 1, "stream": 13, "start": 80.0, "dur": 30.0, "op": 1}], host_ops=40)
    replay = _timeline([nccl, gemm], [], [{"name": 1, "stream": 3, "start": 0.0, "dur": 45.0, "op": None},
                                         {"name": 0, "stream": 4, "start": 46.0, "dur": 25.0, "op": None}], host_ops=2)
    path = tmp_path / timeline.file_name("p", replay=True)
    timeline.write(timeline.link_replay(replay, eager), path)
    read = exposed.read(path)
    assert read.replay is True and read.unmatched == ()
    by_name = {k.name: k for k in read.kernels}
    assert by_name[gemm].flops == flops and by_name[nccl].bytes == size
    assert exposed.analyze(read.kernels).wall == pytest.approx(71.0)


def test_the_replay_s_file_lies_beside_the_table_and_ends_as_a_timeline_does(tmp_path):
    table = tmp_path / f"token_split-{random.randrange(1, 99999)}-align=256.txt"
    point = table.name.removesuffix(".txt")
    assert timeline.beside(table) == tmp_path / f"{point}.timeline.json"
    assert timeline.beside(table, replay=True) == tmp_path / f"{point}.replay.timeline.json"
    assert timeline.beside(table, replay=True).name.endswith(timeline.SUFFIX)  # what lists of timelines match


# -- the report ------------------------------------------------------------------------------


def replayed(planned: list, rng: random.Random) -> tuple[list, dict]:
    """A graph replay of the planned kernels: their launch gaps gone (each start pulled in by a
    random share), linked to the eager timeline of the same kernels."""
    squeezed = [type(k)(k.name, k.stream, int(k.start * rng.uniform(0.3, 0.9)), k.dur, k.flops, k.bytes) for k in planned]
    return squeezed, timeline_of(squeezed, rng)


def report_text(rows, folder, fmt="table", **options) -> str:
    out = io.StringIO()
    assert report.run([rows], fmt, Console(file=out, width=400), profile_dir=folder, **options) == 0
    return out.getvalue()


def test_report_reads_a_graph_replay_where_one_lies_beside_the_table_and_says_so(tmp_path):
    rng = random.Random()
    rows, folder, planned = profiled_folder(tmp_path, rng, {"baseline", "no_comm"})
    before = {fmt: report_text(rows, folder, fmt) for fmt in ("table", "json")}
    eager = json.loads((folder / timeline.file_name("baseline-2048")).read_text())
    squeezed, replay = replayed(planned["baseline-2048"], rng)
    replay = dict(replay, ops=[], kernels=[dict(k, op=None) for k in replay["kernels"]])  # as the profiler gives it
    timeline.write(timeline.link_replay(replay, eager), folder / timeline.file_name("baseline-2048", replay=True))
    text = report_text(rows, folder)
    want = oracle(squeezed)
    assert "one CUDA-graph replay of the timed step" in text
    line = next(t for t in text.splitlines() if t.startswith("baseline-2048 (graph replay): wall"))
    assert f"wall {want['wall'] / 1e3:.3f} ms" in line and f"exposed {want['exposed'] / 1e3:.3f}" in line
    assert any(t.startswith("no_comm-2048 (eager forward): wall") for t in text.splitlines())
    assert "against no_comm: not shown (no_comm read from its eager forward, this point from its graph replay)" in text
    records = {r["table"]: r for r in json.loads(report_text(rows, folder, "json"))}
    base = records["baseline-2048"]
    assert base["timeline"] == "baseline-2048.replay.timeline.json" and base["timeline_of"] == "graph replay"
    assert base["exposure"]["exposed_ms"] == pytest.approx(want["exposed"] / 1e3) and base["unlinked"] == []
    assert base["exposure"]["longest"][0]["transfer"]["bytes"] is not None  # linked through the eager twin
    assert (records["no_comm-2048"]["timeline_of"], records["no_comm-2048"]["replays"]) == ("eager forward", None)
    assert {fmt: report_text(rows, folder, fmt, timeline="eager") for fmt in before} == before  # as without the file
    (folder / timeline.file_name("baseline-2048", replay=True)).unlink()
    assert {fmt: report_text(rows, folder, fmt) for fmt in before} == before


def test_report_names_how_many_replays_a_timeline_holds_and_compares_only_like_with_like(tmp_path):
    rng = random.Random()
    rows, folder, planned = profiled_folder(tmp_path, rng, {"baseline", "no_comm"})
    replays = rng.randrange(2, 9)
    for name, count in (("baseline-2048", replays), ("no_comm-2048", 1)):
        eager = json.loads((folder / timeline.file_name(name)).read_text())
        _, replay = replayed(planned[name], rng)
        replay = dict(replay, ops=[], kernels=[dict(k, op=None) for k in replay["kernels"]])
        linked = timeline.link_replay(replay, eager) | {"replays": count}  # the count as profile_parts records it
        timeline.write(linked, folder / timeline.file_name(name, replay=True))
    text = report_text(rows, folder)
    assert any(t.startswith(f"baseline-2048 ({replays} graph replays): wall") for t in text.splitlines())
    assert any(t.startswith("no_comm-2048 (graph replay): wall") for t in text.splitlines())
    assert (f"against no_comm: not shown (no_comm read from its graph replay, this point from its {replays} graph "
            "replays)") in text
    records = {r["table"]: r for r in json.loads(report_text(rows, folder, "json"))}
    assert (records["baseline-2048"]["timeline_of"], records["baseline-2048"]["replays"]) == ("graph replay", replays)
    assert (records["no_comm-2048"]["timeline_of"], records["no_comm-2048"]["replays"]) == ("graph replay", 1)


def test_report_names_a_replay_s_unlinked_kernels_and_falls_back_where_it_has_none(tmp_path):
    rng = random.Random()
    rows, folder, planned = profiled_folder(tmp_path, rng, {"baseline"})
    eager = json.loads((folder / timeline.file_name("baseline-2048")).read_text())
    _, replay = replayed(planned["baseline-2048"] + planned["baseline-2048"][:1], rng)  # one kernel twice
    path = folder / timeline.file_name("baseline-2048", replay=True)
    linked = timeline.link_replay(replay, eager)
    assert linked["unmatched"]
    timeline.write(linked, path)
    text = report_text(rows, folder)
    first = linked["unmatched"][0]
    assert "not linked to their ops" in text and f"({first['replay']} replayed, {first['eager']} eager)" in text
    timeline.write(dict(replay, kernels=[], names=[]), path)  # the profiler recorded no kernel of the graph
    text = report_text(rows, folder)
    assert any(t.startswith("baseline-2048 (eager forward): wall") for t in text.splitlines())
    assert "holds no device kernel" in text and "the eager forward's is read instead" in text


def test_timeline_choices_are_checked(tmp_path):
    rows, folder, _ = profiled_folder(tmp_path, random.Random(), set())
    with pytest.raises(UserError, match=r"--timeline: 'graph' is not one of replay, eager"):
        report.run([rows], "table", Console(file=io.StringIO()), profile_dir=folder, timeline="graph")
    with pytest.raises(UserError, match=r"--timeline: only with --profile DIR"):
        report.run([rows], "table", Console(file=io.StringIO()), timeline="eager")


# -- the profile itself, on CPU ----------------------------------------------------------------


class CountingStep:
    """A step whose forward is a matmul of fresh random inputs; counts its forwards."""

    def __init__(self):
        import torch

        self.w = torch.randn(32, 48)
        self.forwards = 0

    def forward(self, x):
        self.forwards += 1
        return x @ self.w


def test_a_cpu_profile_writes_no_replay_timeline_and_leaves_no_earlier_one(tmp_path):
    import torch

    step, replays = CountingStep(), []
    table = tmp_path / "baseline-16.txt"
    from overlapbench.timing import measure

    timeline.beside(table, replay=True).write_text("an earlier run's replay of this point")

    parts = measure.profile_parts(step, torch.randn(16, 32), table, replay=lambda: replays.append(1))
    assert [part.what for part in parts] == ["the kernel table", "the eager timeline"]  # no replay on CPU
    for part in parts:
        part.run()
    assert table.is_file() and timeline.beside(table).is_file()
    assert not timeline.beside(table, replay=True).exists() and replays == []
    assert step.forwards == 4  # three for the table, one for the timeline


def test_a_rank_other_than_0_writes_its_own_timeline_and_no_table(tmp_path):
    """Every rank's timeline beside rank 0's, under its own name and marked with its rank; the
    kernel table is rank 0's alone. Each part names the file it writes on that rank (the one a
    failed part removes)."""
    import torch

    from overlapbench.timing import measure

    world = random.randrange(2, 9)
    rank = random.randrange(1, world)
    table = tmp_path / f"baseline-{random.randrange(1, 99999)}.txt"
    step = CountingStep()
    parts = measure.profile_parts(step, torch.randn(16, 32), table, rank=rank, world=world)
    mine = timeline.beside(table, rank=rank)
    assert [(part.what, part.file) for part in parts] == [("the kernel table", None), ("the eager timeline", mine)]
    for part in parts:
        part.run()
    assert not table.exists() and not timeline.beside(table).exists() and step.forwards == 4
    assert mine.name == table.name.removesuffix(".txt") + f".rank{rank}.timeline.json"
    data = json.loads(mine.read_text())
    assert (data["rank"], data["world"], data["device"], data["kernels"]) == (rank, world, "cpu", [])
    read = exposed.read(mine)
    assert (read.rank, read.world, read.origin_ns) == (rank, world, None)
    zero = measure.profile_parts(CountingStep(), torch.randn(16, 32), table, world=world)
    assert [part.file for part in zero] == [table, timeline.beside(table)]
