"""Across ranks (report/ranks.py, report/ranks_view.py): every rank's timeline laid on one clock
by its `origin_ns`, barriers matched by their order, and for rank 0's longest barrier waits the
rank that arrived last and the compute kernel it ran just before.

The forwards are drawn at random: 2-4 ranks, each running segments of compute (a GEMM whose FLOPs
are drawn per rank and segment, so a wrong rank or segment names a wrong kernel) then a barrier
that ends on every rank a little after the last rank reached it; each rank's first kernel starts
at its own random offset (so reading times without the origins, or a swapped rank, names a wrong
last arrival), and some ranks run a side-stream kernel beside part of a barrier (so a barrier's
exposed time is not its whole duration)."""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass

import pytest
from rich.console import Console

from overlapbench import report
from overlapbench.report import exposed, ranks
from overlapbench.timing import timeline
from tests.test_exposed import profiled_folder

BARRIER = "void c10d::symmetric_memory::barrier_kernel<4>(unsigned long, unsigned long, unsigned long)"
GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
SIDE = "flash_fwd_kernel"
MAIN, COMM, OTHER = 7, 245, 248


@dataclass
class Placed:
    """A kernel at absolute time (us), with its op."""

    name: str
    stream: int
    start: float
    end: float
    op: dict | None = None


@dataclass
class Drawn:
    """The ranks' kernels (absolute us) and what the oracle knows of them."""

    kernels: list[list[Placed]]  # per rank
    barrier_starts: list[list[float]]  # [rank][segment]
    barrier_ends: list[float]  # [segment], common to the ranks
    gemm_flops: list[list[int]]  # [rank][segment]: the GEMM just before that rank's barrier
    side: list[list[tuple[float, float] | None]]  # [rank][segment]: a side kernel beside the barrier


def draw(rng: random.Random, world: int | None = None, segments: int | None = None) -> Drawn:
    world = world or rng.randrange(2, 5)
    segments = segments or rng.randrange(6, 14)
    clock = [rng.uniform(0, 800) for _ in range(world)]  # each rank's first kernel: its own start
    kernels: list[list[Placed]] = [[] for _ in range(world)]
    starts = [[0.0] * segments for _ in range(world)]
    flops = [[0] * segments for _ in range(world)]
    side: list[list] = [[None] * segments for _ in range(world)]
    ends = []
    for i in range(segments):
        for r in range(world):
            at = clock[r] + rng.uniform(1, 20)
            dur = rng.uniform(50, 900)
            flops[r][i] = 2 * rng.randrange(1, 10**9)
            kernels[r].append(Placed(GEMM, MAIN, at, at + dur, {"name": "aten::mm", "flops": flops[r][i]}))
            starts[r][i] = at + dur + rng.uniform(0.5, 30)  # the barrier's launch after the GEMM ends
        end = max(starts[r][i] for r in range(world)) + rng.uniform(2, 12)
        ends.append(end)
        for r in range(world):
            kernels[r].append(Placed(BARRIER, COMM, starts[r][i], end, {"name": "symm_mem::barrier", "flops": 0}))
            if rng.random() < 0.4 and end - starts[r][i] > 4:  # beside the barrier, after its start
                a = rng.uniform(starts[r][i] + 1, end - 2)
                b = rng.uniform(a + 0.5, end - 0.5)
                side[r][i] = (a, b)
                kernels[r].append(Placed(SIDE, OTHER, a, b, {"name": "aten::_flash_attention_forward", "flops": 0}))
            clock[r] = end
    return Drawn(kernels, starts, ends, flops, side)


def to_timeline(placed: list[Placed], rank: int, world: int, rng: random.Random, replay: bool = True) -> dict:
    """The file as the sweep writes it: times from the rank's first kernel, its origin in ns."""
    origin = min(k.start for k in placed)
    names, ops, kernels = [], [], []
    for k in rng.sample(placed, len(placed)):
        if k.name not in names:
            names.append(k.name)
        if k.op not in ops:
            ops.append(k.op)
        kernels.append({"name": names.index(k.name), "stream": k.stream, "start": round(k.start - origin, 3),
                        "dur": round(k.end - k.start, 3), "op": ops.index(k.op)})
    data = {"schema": timeline.SCHEMA, "device": "cuda", "forwards": 1, "unit": "us", "host_ops": rng.randrange(1, 50),
            "origin_ns": EPOCH_NS + round(origin * 1e3), "rank": rank, "world": world, "names": names, "ops": ops,
            "kernels": sorted(kernels, key=lambda k: (k["start"], k["dur"]))}
    return data | ({"replay": True, "linked": len(kernels), "unmatched": []} if replay else {})


EPOCH_NS = 1_764_201_234_000_000_000  # a Unix-epoch time in ns, as the profiler's timestamps are


def read_all(drawn: Drawn, tmp_path, rng) -> list[exposed.Timeline]:
    world = len(drawn.kernels)
    found = []
    for r in range(world):
        path = tmp_path / timeline.file_name("p", True, r)
        timeline.write(to_timeline(drawn.kernels[r], r, world, rng), path)
        found.append(exposed.read(path))
    return found


def oracle_waits(drawn: Drawn, top: int) -> list[tuple[int, int, int]]:
    """(segment, last rank, the FLOPs of its GEMM before) of rank 0's top barriers by exposed time."""
    world = len(drawn.kernels)
    exposed_of = []
    for i, end in enumerate(drawn.barrier_ends):
        length = end - drawn.barrier_starts[0][i]
        hidden = 0.0 if drawn.side[0][i] is None else drawn.side[0][i][1] - drawn.side[0][i][0]
        exposed_of.append(length - hidden)
    order = sorted(range(len(exposed_of)), key=lambda i: -exposed_of[i])[:top]
    out = []
    for i in order:
        last = max(range(world), key=lambda r: drawn.barrier_starts[r][i])
        out.append((i, last, drawn.gemm_flops[last][i]))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_each_wait_names_the_rank_that_arrived_last_and_its_kernel_before(tmp_path, seed):
    rng = random.Random(seed * 7919 + random.randrange(10**6))
    drawn = draw(rng)
    timelines = read_all(drawn, tmp_path, rng)
    result = ranks.across(timelines, waits=len(drawn.barrier_ends))
    assert result.unmatched is None and result.matched == len(drawn.barrier_ends)
    assert result.impossible == 0 and result.disagreement == 0.0
    want = oracle_waits(drawn, len(drawn.barrier_ends))
    assert [w.index for w in result.waits] == [i for i, _, _ in want]
    for w, (i, last, flops) in zip(result.waits, want):
        assert w.last.rank == last, (i, [a.late for a in w.arrivals])
        assert w.last.before.name == GEMM and w.last.before.flops == flops and w.last.before.op == "aten::mm"
        for a in w.arrivals:
            late = drawn.barrier_starts[a.rank][i] - drawn.barrier_starts[0][i]
            assert a.late == pytest.approx(late, abs=0.01), (i, a.rank)
            own = drawn.gemm_flops[a.rank][i]
            gemm_end = next(k.end for k in drawn.kernels[a.rank] if k.name == GEMM and k.op["flops"] == own)
            assert a.idle == pytest.approx(drawn.barrier_starts[a.rank][i] - gemm_end, abs=0.01)
        side = drawn.side[0][i]
        length = drawn.barrier_ends[i] - drawn.barrier_starts[0][i]
        assert w.exposed == pytest.approx(length - (0 if side is None else side[1] - side[0]), abs=0.01)


def test_each_rank_s_totals_are_its_own(tmp_path):
    rng = random.Random()
    drawn = draw(rng)
    result = ranks.across(read_all(drawn, tmp_path, rng))
    first = [min(k.start for k in kernels) for kernels in drawn.kernels]
    for t in result.totals:
        r = t.rank
        barrier = sum(e - s for s, e in zip(drawn.barrier_starts[r], drawn.barrier_ends))
        hidden = sum(b - a for a, b in (s for s in drawn.side[r] if s is not None))
        assert t.barriers == len(drawn.barrier_ends)
        assert t.barrier == pytest.approx(barrier, abs=0.05) and t.barrier_exposed == pytest.approx(barrier - hidden, abs=0.05)
        assert t.exposed == pytest.approx(barrier - hidden, abs=0.05)  # barriers are its only transfers
        assert t.wall == pytest.approx(drawn.barrier_ends[-1] - first[r], abs=0.05)
        assert t.shift == pytest.approx(first[r] - first[0], abs=0.01)


def test_reading_without_the_origins_or_a_swapped_rank_names_other_ranks(tmp_path):
    """What the test above rests on: the origins and the ranks' order change the answer.

    Read without the origins, each rank's times count from its own first kernel, so the last
    arrival is the rank whose barrier starts latest after its own first kernel. Forwards are drawn
    until that names another rank at some barrier (most draws do), and the reading must name
    exactly those ranks."""
    rng = random.Random()
    while True:
        drawn = draw(rng, world=4, segments=12)
        first = [min(k.start for k in kernels) for kernels in drawn.kernels]
        order = [i for i, _, _ in oracle_waits(drawn, 12)]
        right = [max(range(4), key=lambda r: drawn.barrier_starts[r][i]) for i in order]
        unshifted = [max(range(4), key=lambda r: drawn.barrier_starts[r][i] - first[r]) for i in order]
        if unshifted != right:
            break
    timelines = read_all(drawn, tmp_path, rng)
    assert [w.last.rank for w in ranks.across(timelines, waits=12).waits] == right
    same_origin = [exposed.Timeline(t.device, t.host_ops, t.kernels, t.replay, t.unmatched, t.rank, t.world, EPOCH_NS)
                   for t in timelines]
    assert [w.last.rank for w in ranks.across(same_origin, waits=12).waits] == unshifted
    swapped = [timelines[0], timelines[2], timelines[1], timelines[3]]
    moved = [w.last.rank for w in ranks.across(swapped, waits=12).waits]
    assert [{1: 2, 2: 1}.get(r, r) for r in moved] == right  # the same ranks' data, under the other's number


SECOND = 246  # a second communication stream


def test_barriers_on_two_streams_match_by_stream_whatever_order_they_start_in(tmp_path):
    """Each segment ends in two barriers at once, one per stream, their order of start drawn per
    rank (so matching by order of start across streams pairs the wrong ones): each is matched with
    its own stream's on every rank, and a wait names the rank that reached that stream's barrier last."""
    rng = random.Random()
    world, segments = rng.randrange(2, 5), rng.randrange(4, 9)
    clock = [rng.uniform(0, 800) for _ in range(world)]
    kernels: list[list[Placed]] = [[] for _ in range(world)]
    starts = {}  # (segment, stream) -> each rank's barrier start
    for i in range(segments):
        for r in range(world):
            at = clock[r] + rng.uniform(1, 20)
            dur = rng.uniform(50, 900)
            kernels[r].append(Placed(GEMM, MAIN, at, at + dur, {"name": "aten::mm", "flops": 2 * rng.randrange(1, 10**9)}))
            first, second = at + dur + rng.uniform(0.5, 30), at + dur + rng.uniform(0.5, 30)
            starts.setdefault((i, COMM), []).append(first)
            starts.setdefault((i, SECOND), []).append(second)
        for stream in (COMM, SECOND):
            end = max(starts[(i, stream)]) + rng.uniform(2, 12)
            for r in range(world):
                kernels[r].append(Placed(BARRIER, stream, starts[(i, stream)][r], end, {"name": "symm_mem::barrier", "flops": 0}))
        for r in range(world):
            clock[r] = max(k.end for k in kernels[r])
    timelines = read_all(Drawn(kernels, [], [], [], []), tmp_path, rng)
    result = ranks.across(timelines, waits=2 * segments)
    assert result.matched == 2 * segments and result.impossible == 0
    zero_order = sorted(starts, key=lambda key: starts[key][0])  # rank 0's barriers in order of start
    for w in result.waits:
        key = zero_order[w.index]
        assert {a.barrier.stream for a in w.arrivals} == {key[1]}
        assert w.last.rank == max(range(world), key=lambda r: starts[key][r])
        for a in w.arrivals:
            assert a.late == pytest.approx(starts[key][a.rank] - starts[key][0], abs=0.01)


def test_clocks_that_disagree_show_as_barriers_ending_before_a_peer_began(tmp_path):
    rng = random.Random()
    drawn = draw(rng, world=rng.randrange(2, 5))
    timelines = read_all(drawn, tmp_path, rng)
    skew = rng.uniform(2000, 5000)  # us: later than any barrier lasts
    late = rng.randrange(1, len(timelines))
    timelines[late] = exposed.Timeline(**{**timelines[late].__dict__, "origin_ns": timelines[late].origin_ns + round(skew * 1e3)})
    result = ranks.across(timelines)
    shifted = [[s + (skew if r == late else 0) for s in starts] for r, starts in enumerate(drawn.barrier_starts)]
    gaps = [max(shifted[r][i] for r in range(len(shifted))) - min(end + (skew if r == late else 0) for r in range(len(shifted)))
            for i, end in enumerate(drawn.barrier_ends)]
    assert result.impossible == sum(1 for g in gaps if g > 0) == len(gaps)
    assert result.disagreement == pytest.approx(max(gaps), abs=0.01)


def test_barrier_counts_that_differ_match_nothing(tmp_path):
    rng = random.Random()
    drawn = draw(rng, world=3)
    dropped = rng.randrange(1, 3)
    last = drawn.barrier_starts[dropped][-1]
    drawn.kernels[dropped] = [k for k in drawn.kernels[dropped] if not (k.name == BARRIER and k.start == last)]
    result = ranks.across(read_all(drawn, tmp_path, rng))
    n = len(drawn.barrier_ends)
    counts = {r: n - (r == dropped) for r in range(3)}
    assert result.unmatched == "barrier counts differ: " + ", ".join(f"rank {r} {c}" for r, c in counts.items())
    assert result.waits == () and len(result.totals) == 3


def test_file_names_of_other_ranks_keep_the_suffixes_and_rank_0_s_names():
    point = f"flash_agrs-{random.randrange(1, 99999)}-4layers"
    assert timeline.file_name(point) == f"{point}.timeline.json"
    assert timeline.file_name(point, replay=True) == f"{point}.replay.timeline.json"
    k = random.randrange(1, 8)
    assert timeline.file_name(point, rank=k) == f"{point}.rank{k}.timeline.json"
    assert timeline.file_name(point, True, k) == f"{point}.rank{k}.replay.timeline.json"
    assert timeline.file_name(point, True, k).endswith(timeline.REPLAY_SUFFIX)


# -- the report --------------------------------------------------------------------------------


def report_text(rows, folder, fmt="table") -> str:
    out = io.StringIO()
    assert report.run([rows], fmt, Console(file=out, width=400), profile_dir=folder) == 0
    return out.getvalue()


def with_ranks(tmp_path, rng):
    """A profile folder (test_exposed.profiled_folder) whose baseline point has every rank's graph replay."""
    rows, folder, _ = profiled_folder(tmp_path, rng, {"baseline", "no_comm"})
    drawn = draw(rng, world=rng.randrange(2, 5))
    world = len(drawn.kernels)
    for r in range(world):
        timeline.write(to_timeline(drawn.kernels[r], r, world, rng), folder / timeline.file_name("baseline-2048", True, r))
    return rows, folder, drawn


def test_report_adds_each_rank_s_totals_and_the_longest_waits(tmp_path):
    rng = random.Random()
    rows, folder, drawn = with_ranks(tmp_path, rng)
    text = report_text(rows, folder)
    world = len(drawn.kernels)
    assert f"  across ranks ({world} ranks' graph replays on one clock, the profiler's):" in text
    for r in range(world):
        assert any(line.startswith(f"    rank {r}: ") for line in text.splitlines()), text
    assert "baseline-2048 (graph replay): rank 0's longest barrier waits" in text
    want = oracle_waits(drawn, ranks.WAITS)
    table = [line for line in text.splitlines() if line.startswith("│") and " of " in line and "#" in line]
    assert len(table) == len(want)
    for line, (i, last, flops) in zip(table, want):
        assert f"#{i + 1} of {len(drawn.barrier_ends)}" in line and f"rank {last}" in line, line
        assert f"{flops / 1e9:.4g}" in line and "aten::mm" in line
    records = {r["table"]: r for r in json.loads(report_text(rows, folder, "json"))}
    across = records["baseline-2048"]["across_ranks"]
    assert across["world"] == world and len(across["ranks"]) == world
    assert [w["last"] for w in across["waits"]] == [last for _, last, _ in want]
    assert "across_ranks" not in records["no_comm-2048"]


def test_report_says_why_ranks_are_not_compared_and_prints_as_before_without_rank_files(tmp_path):
    rng = random.Random()
    rows, folder, drawn = with_ranks(tmp_path, rng)
    world = len(drawn.kernels)
    missing = folder / timeline.file_name("baseline-2048", True, world - 1)
    missing.unlink()
    assert f"  across ranks: not compared ({missing.name} is missing)" in report_text(rows, folder)
    wrong = to_timeline(drawn.kernels[world - 1], 0, world, rng)  # a file that says another rank
    timeline.write(wrong, missing)
    assert f"says rank 0 of {world}, not {world - 1} of {world}" in report_text(rows, folder)
    zero = folder / timeline.file_name("baseline-2048", True)
    data = json.loads(zero.read_text())
    for key in ("rank", "world", "origin_ns"):  # rank 0's file as written before every rank wrote its own
        data.pop(key)
    timeline.write(data, zero)
    timeline.write(to_timeline(drawn.kernels[world - 1], world - 1, world, rng), missing)
    beside = {fmt: report_text(rows, folder, fmt) for fmt in ("table", "json", "markdown")}
    assert "across" not in beside["table"] and "across_ranks" not in beside["json"]
    for r in range(1, world):
        (folder / timeline.file_name("baseline-2048", True, r)).unlink()
    assert {fmt: report_text(rows, folder, fmt) for fmt in beside} == beside
