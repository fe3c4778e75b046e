"""predict's communication inputs: the all-reduce table (comm rows, nccl-tests text, lookups,
scaling) and the beside-GEMM contention pairs, on synthetic tables with random shapes."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from overlapbench.comm.sizes import busbw
from overlapbench.errors import UserError
from overlapbench.predict.comm_table import CommTable
from overlapbench.predict.contention import Contention
from overlapbench.tuning.results import SCHEMA, ResultStore

SIZES = [2**20 * 2**i for i in range(8)]  # 1 MiB .. 128 MiB
BUDGETS = {"nccl": ["default", 8, 16], "nccl_symm": [8, 16, 32], "symm_one_shot": [None], "fused_norm": [16]}


def comm_row(path, ctas, nbytes, ms, world=2, hidden=None, beside=None) -> dict:
    key = {"bytes": nbytes, "ctas": ctas, "hidden": hidden, "op": "all_reduce", "strategy": path, "workload": "comm"}
    row = {"schema": SCHEMA, "status": "ok", "error": None, "workload": "comm", "strategy": path, "op": "all_reduce",
           "knobs": {"op": "all_reduce", "ctas": ctas}, "world_size": world, "tp": world, "device": "Test GPU",
           "bytes": nbytes, "ms": ms}
    if beside is not None:
        key["beside_gemm"] = True
        row |= {"beside_ms": ms * beside[1], "gemm_loss": beside[0]}
    return row | {"key": json.dumps(key, sort_keys=True)}


def write(path: Path, rows: list[dict]) -> Path:
    store = ResultStore(path)
    store.open(resume=False)
    for row in rows:
        store.append(row)
    store.close()
    return path


@pytest.fixture
def measured(tmp_path):
    """Random latency + size / bandwidth per (path, ctas, hidden); returns (file, {key: {bytes: ms}})."""
    rng = random.Random()
    truth, rows = {}, []
    for path, budgets in BUDGETS.items():
        for ctas in budgets:
            for hidden in ([4096, 8192] if path == "fused_norm" else [None]):
                latency, gbps = rng.uniform(0.008, 0.03), rng.uniform(40, 400)
                times = {b: latency + b / (gbps * 1e9) * 1e3 * rng.uniform(0.95, 1.0) for b in SIZES}
                truth[(path, ctas, hidden)] = times
                rows += [comm_row(path, ctas, b, ms, hidden=hidden) for b, ms in times.items()]
    beside = [comm_row("nccl", "default", b, 1.0, beside=(0.1, 3.0)) for b in SIZES]  # not a path's own time
    return write(tmp_path / "comm.jsonl", rows + beside), truth


def test_measured_points_come_back_exactly(measured):
    file, truth = measured
    table = CommTable.read([file])
    assert table.world_size == 2 and table.device == "Test GPU" and table.source == str(file)
    for (path, ctas, hidden), times in truth.items():
        for nbytes, ms in times.items():
            got = table.time_ms(path, ctas, nbytes, hidden)
            assert got.ms == ms and got.note is None


def test_between_sizes_log_linear_and_monotone(measured):
    table = CommTable.read([measured[0]])
    times = measured[1][("nccl_symm", 16, None)]
    rng = random.Random()
    for lo, hi in zip(SIZES, SIZES[1:]):
        inside = sorted(rng.randrange(lo, hi) for _ in range(20))
        got = [table.time_ms("nccl_symm", 16, b).ms for b in [lo, *inside, hi]]
        assert got == sorted(got) and times[lo] <= got[1] <= times[hi]
        b = rng.randrange(lo + 1, hi)
        w = math.log(b / lo) / math.log(hi / lo)  # log(time) is linear in log(bytes)
        expected = times[lo] ** (1 - w) * times[hi] ** w
        assert table.time_ms("nccl_symm", 16, b).ms == pytest.approx(expected, rel=1e-12)


def test_above_the_table_keeps_bus_bandwidth_and_below_it_the_floor(measured):
    table = CommTable.read([measured[0]])
    top, ms = SIZES[-1], measured[1][("nccl", 8, None)][SIZES[-1]]
    for nbytes in (top + 4096, 3 * top, 16 * top):
        got = table.time_ms("nccl", 8, nbytes)
        assert busbw("all_reduce", nbytes, got.ms / 1e3, 2) == pytest.approx(busbw("all_reduce", top, ms / 1e3, 2))
        assert "above 128M: extrapolated" in got.note
    floor = table.time_ms("nccl", 8, 4096)
    assert floor.ms == measured[1][("nccl", 8, None)][SIZES[0]] and "latency floor" in floor.note


def test_budgets_and_hiddens_not_measured_use_the_nearest_and_say_so(measured):
    table, truth = CommTable.read([measured[0]]), measured[1]
    nbytes = random.choice(SIZES)
    for wanted, used in ((24, 16), (20, 16), (28, 32), (4, 8), ("default", 32)):
        got = table.time_ms("nccl_symm", wanted, nbytes)
        assert got.ms == truth[("nccl_symm", used, None)][nbytes]
        shown = f"{wanted} CTAs" if isinstance(wanted, int) else "'default' CTAs"
        assert got.note == f"nccl_symm {shown} not measured: {used} used"
    assert table.time_ms("symm_one_shot", 16, nbytes).note is None  # a path without a budget ignores it
    got = table.time_ms("fused_norm", 16, nbytes, hidden=5000)
    assert got.ms == truth[("fused_norm", 16, 4096)][nbytes] and got.note == "fused_norm hidden 5000 not measured: 4096 used"
    assert table.time_ms("fused_norm", 16, nbytes, hidden=8192).ms == truth[("fused_norm", 16, 8192)][nbytes]


def test_a_path_not_in_the_table_is_one_line_naming_it_and_what_is_there(measured):
    table = CommTable.read([measured[0]])
    with pytest.raises(UserError) as e:
        table.time_ms("symm_two_shot", None, 2**20)
    text = str(e.value)
    assert "'symm_two_shot'" in text and "fused_norm, nccl, nccl_symm, symm_one_shot" in text and "\n" not in text


def test_tables_of_two_world_sizes_are_refused_naming_both_files(measured, tmp_path):
    other = write(tmp_path / "tp4.jsonl", [comm_row("nccl", "default", b, 0.1 + b / 1e8, world=4) for b in SIZES])
    with pytest.raises(UserError, match=rf"{measured[0]} \(2 ranks\), {other} \(4 ranks\)"):
        CommTable.read([measured[0], other])
    with pytest.raises(UserError, match="no ok all_reduce rows"):
        CommTable.from_rows([comm_row("nccl", "default", 2**20, 1.0, beside=(0.1, 2.0))])


NCCL_TESTS = """\
# nThread 1 nGpus 1 minBytes 1048576 maxBytes 8388608 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1
#
# Using devices
#  Rank  0 Group  0 Pid  41021 on     node-a device  0 [0000:18:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  41022 on     node-a device  1 [0000:2a:00] NVIDIA H100 80GB HBM3
node-a:41021:41021 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576        262144     float     sum      -1    {t0}   {a0}   {a0}      0    99.99   10.49   10.49      0
     2097152        524288     float     sum      -1    {t1}   {a1}   {a1}      0    99.99   20.97   20.97      0
     4194304       1048576     float     sum      -1    {t2}   {a2}   {a2}      0    99.99   41.94   41.94      0
     8388608       2097152     float     sum      -1  {t3}   {a3}   {a3}      N/A  1.2e+03   6.99   6.99    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 88.1234
#
"""


def nccl_tests_text(times_us: list[float]) -> str:
    fields = {f"t{i}": f"{t:7.2f}" for i, t in enumerate(times_us)}
    fields |= {f"a{i}": f"{SIZES[i] / t / 1e3:6.2f}" for i, t in enumerate(times_us)}
    return NCCL_TESTS.format(**fields)


def test_nccl_tests_output_gives_out_of_place_times_world_and_device(tmp_path):
    rng = random.Random()
    times_us = sorted(round(rng.uniform(20, 400), 2) for _ in range(4))
    file = tmp_path / "all_reduce_perf.txt"
    file.write_text(nccl_tests_text(times_us))
    table = CommTable.read([file])
    assert table.world_size == 2 and table.device == "NVIDIA H100 80GB HBM3"
    assert list(table.entries) == [("nccl", "default", None)]
    for nbytes, us in zip(SIZES, times_us):
        assert table.time_ms("nccl", "default", nbytes).ms == pytest.approx(us / 1e3, rel=1e-12)
    no_ranks = "\n".join(line for line in nccl_tests_text(times_us).splitlines() if "Rank" not in line)
    assert CommTable.from_nccl_tests(no_ranks, path="nccl_symm", world_size=8).world_size == 8
    with pytest.raises(UserError, match="lists no ranks"):
        CommTable.from_nccl_tests(no_ranks)


def test_nccl_tests_text_without_results_or_of_another_collective_is_refused(tmp_path):
    file = tmp_path / "empty.txt"
    file.write_text("# nThread 1 nGpus 8\n# Out of bounds values : 0 OK\n")
    with pytest.raises(UserError, match=rf"^{file}: no result lines of nccl-tests"):
        CommTable.read([file])
    with pytest.raises(UserError, match="output of all_gather_perf, not all_reduce_perf"):
        CommTable.from_nccl_tests("# Collective test starting: all_gather_perf\n" + nccl_tests_text([30, 40, 50, 60]))


def test_scaled_table_meets_the_bus_bandwidth_and_keeps_the_shape(measured):
    table, rng = CommTable.read([measured[0]]), random.Random()
    world, gbps, reference = rng.choice([4, 8]), rng.uniform(200, 450), rng.choice(SIZES[2:])
    scaled = table.scaled(world, gbps, reference_bytes=reference, source="device notes")
    at = scaled.time_ms("nccl", "default", reference).ms
    assert busbw("all_reduce", reference, at / 1e3, world) == pytest.approx(gbps)
    assert scaled.world_size == world and scaled.source.startswith(f"device notes: {measured[0]} (2 ranks)")
    small, big = SIZES[0], SIZES[-1]
    for key in [("nccl", 8), ("symm_one_shot", None)]:
        ratio = table.time_ms(*key, big).ms / table.time_ms(*key, small).ms
        assert scaled.time_ms(*key, big).ms / scaled.time_ms(*key, small).ms == pytest.approx(ratio)
    with pytest.raises(UserError, match="not a positive number"):
        table.scaled(8, 0)
    with pytest.raises(UserError, match="not a whole number >= 2"):
        table.scaled(1, 300.0)


def test_contention_interpolates_clamps_and_says_what_it_assumed(tmp_path):
    rng = random.Random()
    losses = {b: rng.uniform(0.02, 0.3) for b in SIZES[::2]}
    stretches = {b: rng.uniform(1.5, 12) for b in SIZES[::2]}
    rows = [comm_row(p, c, b, rng.uniform(0.05, 2), beside=(losses[b], stretches[b]))
            for p, c in (("nccl", 16), ("fused_norm", 32)) for b in SIZES[::2]]
    rows.append(comm_row("nccl", 16, SIZES[0], 0.2))  # alone: not a contention row
    contention = Contention.read([write(tmp_path / "beside.jsonl", rows)])
    for b in SIZES[::2]:
        got = contention.at("nccl", 16, b)
        assert got.gemm_loss == pytest.approx(losses[b]) and got.transfer_stretch == pytest.approx(stretches[b])
        assert got.note is None
    lo, hi = SIZES[0], SIZES[2]
    middle = contention.at("nccl", 16, SIZES[1])  # halfway in log(bytes)
    assert middle.gemm_loss == pytest.approx((losses[lo] + losses[hi]) / 2)
    assert contention.at("nccl", 16, 2 * SIZES[-1]).gemm_loss == pytest.approx(losses[SIZES[-2]])
    assert contention.at("nccl", 16, 1024).transfer_stretch == pytest.approx(stretches[lo])
    assert contention.at("nccl", 64, lo).note == "nccl 64 CTAs not measured: 16 used"
    mean = sum(losses.values()) / len(losses)
    guess = contention.at("symm_two_shot", None, lo)
    assert (guess.gemm_loss, guess.transfer_stretch) == (pytest.approx(mean), 1.0)
    assert "symm_two_shot not measured beside GEMMs" in guess.note and "mean of all measured rows" in guess.note
    given = contention.at("symm_two_shot", None, lo, assumed_loss=0.25, assumed_stretch=2.0)
    assert (given.gemm_loss, given.transfer_stretch) == (0.25, 2.0) and "as given" in given.note


def test_the_modules_import_without_torch():
    code = ("import sys, overlapbench.predict.comm_table, overlapbench.predict.contention; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


REAL = Path(__file__).parents[1] / "results/h100x2/cc10b27/comm.jsonl"


def test_the_committed_h100_table_returns_its_measured_times():
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", str(REAL)], capture_output=True,
                             cwd=Path(__file__).parents[1]).returncode == 0
    if not tracked:
        pytest.skip(f"{REAL} is not committed on this branch")
    row = next(r for r in map(json.loads, REAL.read_text().splitlines())
               if r["strategy"] == "nccl_symm" and r["knobs"]["ctas"] == 16 and r["bytes"] == 64 * 2**20)
    table = CommTable.read([REAL])
    assert table.world_size == 2 and table.time_ms("nccl_symm", 16, 64 * 2**20).ms == row["ms"]


def _pieces(row: dict, chunks: int) -> dict:
    """A copy-engine row as `comm --ce-chunks N` writes it: the count in its knobs and its key."""
    key = json.loads(row["key"]) | {"chunks": chunks}
    return row | {"knobs": row["knobs"] | {"chunks": chunks}, "key": json.dumps(key, sort_keys=True)}


def test_rows_of_a_set_piece_count_are_left_out_and_said(tmp_path):
    rng = random.Random()
    own = {b: rng.uniform(0.02, 2) for b in SIZES}  # the kernel's own count, what a split runs
    rows = [comm_row("copy_engine_norm", 32, b, ms, hidden=8192) for b, ms in own.items()]
    rows += [_pieces(comm_row("copy_engine_norm", 32, b, ms * rng.uniform(1.5, 3), hidden=8192), c)
             for b, ms in own.items() for c in (1, 4)]
    table = CommTable.read([write(tmp_path / "ce.jsonl", rows)])
    for b, ms in own.items():
        assert table.time_ms("copy_engine_norm", 32, b, 8192).ms == ms  # not a median with the set counts
    (note,) = [n.text for n in table.notes]
    assert "16 copy_engine_norm rows timed at a set piece count (--ce-chunks 1, 4) left out" in note


def test_a_table_of_set_piece_counts_only_lacks_the_path(tmp_path):
    rng = random.Random()
    rows = [comm_row("nccl", "default", b, rng.uniform(0.02, 2)) for b in SIZES]
    rows += [_pieces(comm_row("copy_engine_norm", 32, b, rng.uniform(0.02, 2), hidden=8192), 4) for b in SIZES]
    table = CommTable.read([write(tmp_path / "ce.jsonl", rows)])
    assert table.paths() == ["nccl"]
    with pytest.raises(UserError, match="no 'copy_engine_norm' rows"):
        table.time_ms("copy_engine_norm", 32, SIZES[0], 8192)
    with pytest.raises(UserError, match=r"every one timed at a set piece count \(--ce-chunks\)"):
        CommTable.read([write(tmp_path / "only.jsonl", rows[len(SIZES):])])


def test_contention_leaves_out_rows_of_a_set_piece_count(tmp_path):
    rng = random.Random()
    own = {b: (rng.uniform(0.02, 0.3), rng.uniform(1.5, 6)) for b in SIZES}
    rows = [comm_row("copy_engine_norm", 32, b, rng.uniform(0.05, 2), beside=own[b]) for b in SIZES]
    rows += [_pieces(comm_row("copy_engine_norm", 32, b, rng.uniform(0.05, 2), beside=(0.6, 20.0)), 1) for b in SIZES]
    contention = Contention.read([write(tmp_path / "beside.jsonl", rows)])
    for b, (loss, stretch) in own.items():
        got = contention.at("copy_engine_norm", 32, b)
        assert (got.gemm_loss, got.transfer_stretch) == (pytest.approx(loss), pytest.approx(stretch))
    assert any("(--ce-chunks 1) left out" in n.text for n in contention.notes)
