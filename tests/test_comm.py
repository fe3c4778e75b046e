"""`overlapbench comm` on CPU: nccl-tests' formulas, sizes, the #wrong check on 2 gloo processes,
the outputs, the spec section, and the command end to end."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from overlapbench.cli import app
from overlapbench.comm import buffers, command, output, paths, patterns, sizes
from overlapbench.comm import run as comm_run
from overlapbench.comm.cases import Case
from overlapbench.comm.spec import CommSpec
from overlapbench.errors import UserError
from overlapbench.specs import spec
from overlapbench.tuning.results import SCHEMA, read_rows
from tests import distributed

SYMMETRIC_PATHS = tuple(p.name for p in paths.PATHS_BY_NAME.values() if p.buffer is not None)

K, M, G = 2**10, 2**20, 2**30


# --- bandwidth: nccl-tests' busbw = algbw x 2(n-1)/n (all-reduce), x (n-1)/n (AG, RS) ---------


@pytest.mark.parametrize("world, ar, ag", [(2, 1.0, 0.5), (4, 1.5, 0.75), (8, 1.75, 0.875)])
def test_bus_factors(world, ar, ag):
    assert sizes.bus_factor("all_reduce", world) == ar
    assert sizes.bus_factor("all_gather", world) == ag
    assert sizes.bus_factor("reduce_scatter", world) == ag


def test_bandwidths_by_hand():
    # 1 GiB in 1 ms: 1073741824 B / 1e-3 s = 1073.741824 GB/s (1e9, as nccl-tests)
    assert sizes.algbw(G, 1e-3) == pytest.approx(1073.741824)
    assert sizes.busbw("all_reduce", G, 1e-3, 2) == pytest.approx(1073.741824)
    assert sizes.busbw("all_reduce", G, 1e-3, 8) == pytest.approx(1879.048192)
    assert sizes.busbw("all_gather", G, 1e-3, 4) == pytest.approx(805.306368)
    assert sizes.busbw("reduce_scatter", 64 * M, 0.25e-3, 8) == pytest.approx(234.881024)


# --- sizes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("4096", 4096), (4096, 4096), ("1K", K), ("1k", K), ("64K", 64 * K), ("1M", M), ("1G", G),
    ("1GiB", G), ("2mb", 2 * M), ("1.5K", 1536), (" 3 M ", 3 * M), ("100B", 100), ("1T", 2**40),
])
def test_parse_size(text, expected):
    assert sizes.parse_size(text, "-b") == expected


@pytest.mark.parametrize("text", ["", "abc", "1X", "0", "0K", "-1K", "0.1K", "1.5", "K", "1KK", True, None, 1.5])
def test_bad_size_is_one_line_naming_the_field(text):
    with pytest.raises(UserError) as e:
        sizes.parse_size(text, "-b/--min-bytes")
    assert str(e.value).startswith("-b/--min-bytes: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("lo, hi, factor, expected", [
    (K, 8 * K, 2, (K, 2 * K, 4 * K, 8 * K)),
    (K, K, 2, (K,)),  # -b == -e: one size
    (K, 5 * K, 2, (K, 2 * K, 4 * K)),  # stops below -e when -e is not on the ladder
    (M, G, 4, (M, 4 * M, 16 * M, 64 * M, 256 * M, G)),
    (3, 30, 3, (3, 9, 27)),
])
def test_size_ladder(lo, hi, factor, expected):
    assert sizes.size_ladder(lo, hi, factor) == expected


@pytest.mark.parametrize("lo, hi, factor, field", [
    (4 * K, K, 2, "-e/--max-bytes"), (K, M, 1, "-f/--factor"), (K, M, 0, "-f/--factor"),
    (K, K, 1, "-f/--factor"), (K, M, 2.5, "-f/--factor"),
])
def test_bad_ladder_is_one_line_naming_the_field(lo, hi, factor, field):
    with pytest.raises(UserError, match=f"^{field}: "):
        sizes.size_ladder(lo, hi, factor)


def test_spec_sizes_forms():
    assert sizes.comm_sizes(["1M", 4 * M], True, "comm.sizes") == (M, 4 * M)
    assert sizes.comm_sizes("2M", True, "comm.sizes") == (2 * M,)
    assert sizes.comm_sizes({"min": "1M", "max": "4M"}, True, "comm.sizes") == (M, 2 * M, 4 * M)
    assert sizes.comm_sizes({"min": "1M", "max": "1G", "factor": 32}, True, "comm.sizes") == (M, 32 * M, G)
    assert sizes.comm_sizes(None, True, "s") == sizes.size_ladder(M, G, 2)  # 1 MiB .. 1 GiB on GPUs
    assert sizes.comm_sizes(None, False, "s") == sizes.size_ladder(K, 64 * K, 2)  # a demo on CPU
    for bad, field in [({"max": "1M"}, "comm.sizes.min"), ({"min": "1M", "maxx": 2}, "comm.sizes.maxx"),
                       ({"min": "1M", "factor": 1}, "comm.sizes.factor"), ([], "comm.sizes"),
                       (["1M", "1M"], "comm.sizes"), (["1M", "x"], r"comm.sizes\[1\]")]:
        with pytest.raises(UserError, match=f"^{field}: "):
            sizes.comm_sizes(bad, True, "comm.sizes")


# --- cases --------------------------------------------------------------------------------------


def bench(**overrides) -> CommSpec:
    values = dict(ops=paths.OPS, paths=paths.PATHS, sizes=(100, 101, 4 * K, M), nccl_max_ctas=("default", 8),
                  comm_ctas=(4, 16), hidden=1024)
    return CommSpec(**(values | overrides))


def test_cases_on_gloo_skip_symmetric_memory_and_ctas():
    cases = paths.make_cases(bench(), world=2, backend="gloo", dtype="fp32", hidden=1024)
    ran = [c for c in cases if c.skip is None]
    assert {c.strategy for c in ran} == {"gloo"} and {c.ctas for c in ran} == {None}
    assert {(c.op, c.path) for c in cases if c.skip} == {
        ("all_reduce", "symm_one_shot"), ("all_reduce", "symm_two_shot"), ("all_reduce", "fused_norm"),
        ("all_gather", "copy_engine"), ("all_reduce", "copy_engine_norm"), ("all_reduce", "copy_engine_norm_kernel"),
        ("all_reduce", "fused_norm_v1"),
        ("all_reduce", "fused_norm_push"), ("all_reduce", "fused_norm_pull_push"),
        ("all_reduce", "nccl_symm"), ("all_gather", "nccl_symm"), ("reduce_scatter", "nccl_symm")}
    assert all("gloo on CPU" in c.skip for c in cases if c.path != "nccl")
    assert len({c.seed for c in cases}) == len(cases) and min(c.seed for c in cases) > 0  # fresh per case


def test_counts_round_down_to_whole_units(monkeypatch):
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    cases = paths.make_cases(bench(), world=4, backend="nccl", dtype="bf16", hidden=1024)
    ar = {c.size: c for c in cases if (c.op, c.path, c.ctas) == ("all_reduce", "nccl", "default")}
    assert ar[100].count == 48 and ar[100].nbytes == 96  # whole 16-byte vectors
    assert 101 not in ar  # 101 B rounds to the same 96 B case: measured once
    ag = {c.size: c for c in cases if (c.op, c.path, c.ctas) == ("all_gather", "nccl", 8)}
    assert ag[100].count == 32 and ag[4 * K].count == 2048  # whole 16-byte vectors per rank: 4 x 8 bf16
    wide = paths.make_cases(bench(), world=8, backend="nccl", dtype="fp32", hidden=1024)
    rs = {c.size: c for c in wide if (c.op, c.ctas) == ("reduce_scatter", "default")}
    assert rs[100].skip == "100B is below one 16-byte vector per rank x 8 ranks (128 B)"
    fused = {c.size: c for c in cases if (c.op, c.path, c.ctas) == ("all_reduce", "fused_norm", 16)}
    assert fused[M].rows == 512 and fused[M].hidden == 1024  # 1 MiB bf16 = 512 rows of 1024
    assert fused[4 * K].rows == 2 and "below one row of hidden 1024" in fused[100].skip
    assert fused[101].skip.startswith("101B is below")  # each size below a row keeps its own row
    budgets = {c.ctas for c in cases if c.path == "nccl"}
    assert budgets == {"default", 8}


def test_symmetric_paths_refuse_multicast_and_other_hosts(monkeypatch):
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0")
    cases = paths.make_cases(bench(), world=2, backend="nccl", dtype="bf16", hidden=1024)
    assert all("multicast" in c.skip for c in cases if c.path in SYMMETRIC_PATHS)
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    cases = paths.make_cases(bench(), world=2, backend="nccl", dtype="bf16", hidden=1024, hosts=2)
    assert all("one host" in c.skip for c in cases if c.path in SYMMETRIC_PATHS)
    assert not any(c.skip for c in cases if c.path == "nccl" and c.size >= 4 * K)
    cases = paths.make_cases(bench(), world=16, backend="nccl", dtype="bf16", hidden=1024)
    assert all("2..8 ranks" in c.skip for c in cases if c.path in ("fused_norm", "fused_norm_v1", "fused_norm_push",
                                                                    "fused_norm_pull_push", "copy_engine_norm"))


# --- the inputs and the expected results --------------------------------------------------------


def simulate(op: str, world: int, count: int, seed: int) -> list[torch.Tensor]:
    """Each rank's result of the collective, computed here from every rank's input."""
    inputs = [patterns.op_input(op, r, world, count, seed, torch.float64, "cpu") for r in range(world)]
    if op == "all_reduce":
        return [sum(inputs)] * world
    if op == "all_gather":
        return [torch.cat(inputs)] * world
    return list(sum(inputs).chunk(world))


@pytest.mark.parametrize("op", paths.OPS)
@pytest.mark.parametrize("world", [2, 3, 8])
def test_expected_results_match_a_simulated_collective(op, world):
    count = world * 13 * 8  # shards a multiple of 13: misplaced chunks must still differ
    for rank, result in enumerate(simulate(op, world, count, seed=5)):
        expected = patterns.op_expected(op, rank, world, count, 5, torch.float64, "cpu")
        assert patterns.count_wrong(result, expected) == 0
        assert patterns.count_wrong(result.to(torch.bfloat16), expected.to(torch.bfloat16)) == 0  # exact in bf16


def test_inputs_are_small_nonzero_and_tell_ranks_chunks_and_seeds_apart():
    a = patterns.pattern(0, 0, 1000, 1, torch.float32, "cpu")
    assert a.min() == 1 and a.max() == patterns.MODULUS
    assert patterns.pattern_sum(range(9), 0, 1000, 1, torch.float32, "cpu").max() <= 256  # exact in bf16
    for other in [(1, 0, 1), (0, 1, 1), (0, 0, 2)]:  # another rank, chunk, seed: every element differs
        b = patterns.pattern(other[0], other[1], 1000, other[2], torch.float32, "cpu")
        assert patterns.count_wrong(a, b) == 1000
    gathered = patterns.op_expected("all_gather", 0, 2, 26, 3, torch.float32, "cpu")
    swapped = torch.cat([gathered[13:], gathered[:13]])  # shards exchanged
    assert patterns.count_wrong(swapped, gathered) == 26


def test_count_wrong_counts_nan_and_size_mismatch():
    x = torch.ones(8)
    y = x.clone()
    y[3] = float("nan")
    assert patterns.count_wrong(y, x) == 1
    assert patterns.count_wrong(x[:4], x) == 8


# --- the check on 2 gloo processes ---------------------------------------------------------------


def _rank_check(rank: int, world: int, op: str, corrupt: str | None) -> int:
    from dataclasses import replace

    from overlapbench.distributed import runtime

    rt = runtime.init(timeout_s=60)
    case = Case(op, "nccl", "gloo", None, 4 * K, 1024, "fp32", seed=7)
    right = paths.build(rt, case, buffers.Buffers(rt, [case]))
    bench_ = right
    if corrupt == "three":  # the collective runs, then three elements on rank 1 are off by one
        def run():
            right.run()
            if rank == 1:
                right.out()[[0, 100, -1]] += 1
        bench_ = replace(right, run=run)
    elif corrupt == "skip":  # no communication at all
        bench_ = replace(right, run=lambda: None)
    first = comm_run.check(bench_, case.seed, rt)
    again = comm_run.check(bench_, case.seed + 1, rt)  # fresh inputs: same verdict
    return first, again


@pytest.mark.slow
@pytest.mark.parametrize("op", paths.OPS)
def test_check_counts_zero_wrong_for_a_right_collective(op):
    assert distributed.run(_rank_check, op, None) == [(0, 0), (0, 0)]


@pytest.mark.slow
def test_check_counts_corrupted_elements_over_ranks():
    assert distributed.run(_rank_check, "all_reduce", "three") == [(3, 3), (3, 3)]
    # nothing communicated: every element of every rank is wrong (its own input is not the sum)
    assert distributed.run(_rank_check, "all_reduce", "skip") == [(2048, 2048), (2048, 2048)]
    # all-gather (out of place) without communication: the output stays poisoned (-1), all wrong
    assert distributed.run(_rank_check, "all_gather", "skip") == [(2048, 2048), (2048, 2048)]


# --- outputs ------------------------------------------------------------------------------------


def rows() -> list[dict]:
    env = {"world_size": 2, "device": "NVIDIA H200", "backend": "nccl", "hosts": ["h"], "versions": {}, "git": None}
    info = comm_run.RunInfo("comm", "run1", env, 1, 3, True)
    ok = Case("all_reduce", "nccl", "nccl", 8, M, M // 2, "bf16", seed=1)
    ok_result = {"status": "ok", "error": None, "wrong": 0, "ms": 0.01, "p10_ms": 0.009, "p90_ms": 0.012,
                 "iqr_ms": 0.001, "cv": 0.01, "algbw": sizes.algbw(M, 1e-5), "busbw": sizes.busbw("all_reduce", M, 1e-5, 2),
                 "graphs": True, "samples_ms": [0.01] * 3, "ops_per_sample": 32}
    fused = Case("all_reduce", "fused_norm", "nccl", 4, M, M // 2, "bf16", hidden=8192, seed=2)
    bad = {"status": "failed", "error": "#wrong 5: result differs from the exact expected one", "wrong": 5}
    small = Case("all_reduce", "fused_norm", "nccl", 4, K, 0, "bf16", hidden=8192, seed=3,
                      skip="1K is below one row of hidden 8192 (16384 B)")
    return [comm_run.make_row(ok, ok_result, info), comm_run.make_row(fused, bad, info),
            comm_run.make_row(small, {"status": "skipped", "error": small.skip}, info)]


def test_rows_have_the_store_schema():
    from overlapbench.tuning.results import COLUMNS

    ok, fused, skipped = rows()
    for row in (ok, fused, skipped):
        assert set(COLUMNS) <= set(row) and row["schema"] == SCHEMA and row["workload"] == "comm"
    assert ok["strategy"] == "nccl" and ok["knobs"] == {"op": "all_reduce", "ctas": 8}
    assert ok["tokens"] is None and ok["batch"] is None and ok["bytes"] == M and ok["busbw"] == pytest.approx(104.8576)
    assert fused["tokens"] == 64 and fused["batch"] == [64] and fused["shape"] == {"hidden": 8192}
    assert fused["status"] == "failed" and fused["wrong"] == 5 and fused["ms"] is None
    assert json.loads(ok["key"]) != json.loads(fused["key"])


def test_csv_and_json_parse():
    records = list(csv.DictReader(io.StringIO(output.to_csv(rows()))))
    assert [r["path"] for r in records] == ["nccl", "fused_norm", "fused_norm"]
    assert list(records[0])[:10] == ["size", "count", "type", "op", "path", "ctas", "time_us", "algbw", "busbw", "wrong"]
    assert records[0]["size"] == str(M) and records[0]["count"] == str(M // 2) and float(records[0]["time_us"]) == 10.0
    assert float(records[0]["busbw"]) == 104.9 and records[1]["wrong"] == "5"
    assert records[2]["status"] == "skipped" and records[2]["time_us"] == ""
    parsed = json.loads(output.to_json(rows()))
    assert parsed[0]["ctas"] == 8 and parsed[0]["wrong"] == 0 and parsed[1]["time_us"] is None


def test_table_shows_rows_and_reasons():
    console = Console(file=io.StringIO())
    output.render(rows(), "table", console)  # not a terminal, 80 columns: a table per case, each figure whole
    text = console.file.getvalue()
    assert "1048576" in text and "104.86" in text and "failed" in text
    assert "all_reduce/fused_norm: 1K is below one row of hidden 8192" in text
    assert "#wrong 5" in text
    assert output.totals(rows()).startswith("# #wrong total: 5 (FAILED)")


# --- the spec's comm section ---------------------------------------------------------------------


SPEC = {"name": "s", "model": "tiny", "tokens": [16], "strategies": ["baseline"]}


def test_spec_comm_section():
    assert spec.from_dict(SPEC, "s", cuda=False).comm is None
    s = spec.from_dict(SPEC | {"comm": {}}, "s", cuda=True)
    assert s.comm.ops == paths.OPS and s.comm.sizes == sizes.size_ladder(M, G, 2)
    assert s.comm.nccl_max_ctas == ("default", 4, 8, 16, 32) and s.comm.hidden is None
    gpu = {"ops": ["all_gather"], "paths": "nccl, copy_engine", "nccl_max_ctas": ["default", 16], "hidden": 4096}
    s = spec.from_dict(SPEC | {"comm": gpu, "cpu": {"comm": {"sizes": ["1K"]}}}, "s", cuda=True)
    assert s.comm.ops == ("all_gather",) and s.comm.paths == ("nccl", "copy_engine")
    assert s.comm.nccl_max_ctas == ("default", 16) and s.comm.hidden == 4096 and s.comm.sizes[0] == M
    s = spec.from_dict(SPEC | {"comm": gpu, "cpu": {"comm": {"sizes": ["1K"]}}}, "s", cuda=False)
    assert s.comm.sizes == (K,) and s.comm.ops == paths.OPS  # a device section replaces the whole key


@pytest.mark.parametrize("section, message", [
    ({"sizez": ["1M"]}, r"^comm\.sizez: unknown key \(did you mean 'sizes'\?\)"),
    ({"ops": ["all_reduse"]}, r"^comm\.ops: unknown 'all_reduse' \(did you mean 'all_reduce'\?\)"),
    ({"ops": []}, r"^comm\.ops: empty"),
    ({"paths": ["nccl", "nccl"]}, r"^comm\.paths: 'nccl' is listed twice"),
    ({"ops": "reduce_scatter", "paths": "fused_norm"}, r"^comm\.paths: none of fused_norm runs the chosen ops"),
    ({"nccl_max_ctas": [0]}, r"^comm\.nccl_max_ctas: 0 is outside"),
    ({"comm_ctas": [65]}, r"^comm\.comm_ctas: 65 is outside"),
    ({"hidden": 0}, r"^comm\.hidden: must be a positive integer"),
    ({"sizes": {"min": "1G", "max": "1M"}}, r"^comm\.sizes\.max: 1M is below comm\.sizes\.min 1G"),
    ([1, 2], r"^comm: must be a mapping"),
])
def test_bad_comm_section_is_one_line_naming_the_field(section, message):
    with pytest.raises(UserError, match=message) as e:
        spec.from_dict(SPEC | {"comm": section}, "s", cuda=True)
    assert "\n" not in str(e.value)


# --- the command ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["-b", "1X"], "-b/--min-bytes: '1X' is not a size"),
    (["-b", "4K", "-e", "1K"], "-e/--max-bytes: 1K is below -b/--min-bytes 4K"),
    (["-f", "1"], "-f/--factor: must be an integer >= 2"),
    (["--paths", "nccll"], "--paths: unknown 'nccll' (did you mean 'nccl'?)"),
    (["--comm-ctas", "4,x"], "--comm-ctas: 'x' is not an int"),
    (["--ce-chunks", "4,0"], "--ce-chunks: '0' is not auto or an int >= 1"),
    (["--format", "xml"], "--format: 'xml' is not one of table, csv, json"),
    (["--iters", "0"], "--iters: must be at least 1"),
    (["--output", "r.csv"], "--output: must be a path ending in .jsonl"),
])
def test_bad_options_are_one_line_exit_2(args, message):
    result = CliRunner().invoke(app, ["comm", *args])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output


def test_options_forward_explicitly_to_the_ranks():
    opts = command.Plan.parse(min_bytes=None, max_bytes="512K", factor=4, ops="all_reduce", paths=None,
                              dtype="auto", nccl_max_ctas="default,8", comm_ctas=None, hidden=8192, iters=3,
                              warmup=1, graphs=False, fmt="csv", output=None, resume=True, nproc=None)
    assert opts.sizes(cuda=True) == (512 * K,)  # -b defaults to 1M on GPUs, moved down to meet -e
    assert opts.sizes(cuda=False) == (K, 4 * K, 16 * K, 64 * K, 256 * K)
    argv = opts.argv(cuda=False, output=Path("x.jsonl"))
    assert argv[:7] == ["comm", "-b", "1024", "-e", str(256 * K), "-f", "4"]
    assert "--no-graphs" in argv and argv[-1] == "--resume" and "default,8" in argv
    assert command.default_output("NVIDIA H200", 2) == Path("results/comm-nvidia-h200-2.jsonl")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return distributed.overlapbench("comm", *args)


@pytest.mark.slow
def test_command_end_to_end_on_gloo(tmp_path: Path):
    out = tmp_path / "c.jsonl"
    done = run_cli("-b", "1K", "-e", "4K", "--nproc", "2", "--iters", "3", "--warmup", "1",
                   "--format", "json", "--output", str(out))
    assert done.returncode == 0, done.stderr
    records = json.loads(done.stdout)  # stdout holds nothing but the records
    measured = [r for r in records if r["status"] == "ok"]
    assert {(r["op"], r["size"]) for r in measured} == {(op, s) for op in paths.OPS for s in (K, 2 * K, 4 * K)}
    assert all(r["wrong"] == 0 and r["path"] == "gloo" and r["time_us"] > 0 and r["busbw"] > 0 for r in measured)
    windows = {p.name for p in paths.PATHS_BY_NAME.values() if p.window}  # NCCL's windows: CUDA only, as symmetric memory
    assert {r["path"] for r in records if r["status"] == "skipped"} == set(SYMMETRIC_PATHS) & set(paths.DEFAULT_PATHS) | windows
    stored = read_rows(out)
    assert len(stored) == len(records) and all(r["workload"] == "comm" and r["spec"] == "comm" for r in stored)
    assert {r["world_size"] for r in stored} == {2} and {r["backend"] for r in stored} == {"gloo"}
    assert "# #wrong total: 0 (OK)" in done.stderr

    again = run_cli("-b", "1K", "-e", "8K", "--nproc", "2", "--iters", "3", "--warmup", "1",
                    "--ops", "all_reduce", "--paths", "nccl", "--format", "csv", "--output", str(out), "--resume")
    assert again.returncode == 0, again.stderr
    new = list(csv.DictReader(io.StringIO(again.stdout)))
    assert [(r["op"], r["size"]) for r in new] == [("all_reduce", str(8 * K))]  # only the case not yet done
    refused = run_cli("-b", "1K", "-e", "1K", "--nproc", "2", "--output", str(out))
    assert refused.returncode == 2 and "already holds results" in refused.stderr


def test_fuzzed_comm_sections_fail_only_with_a_clean_error():
    from hypothesis import HealthCheck, example, given, settings
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 2**40), st.floats(allow_nan=True),
                        st.text(max_size=8), st.sampled_from(["1M", "1G", "default", "nccl", "all_reduce", "min", "max"]))
    values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                          max_leaves=6)
    keys = st.sampled_from([*CommSpec.KEYS, "sizez"])

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(section=st.one_of(values, st.dictionaries(keys, values, max_size=4)))
    @example(section={"sizes": {"\n": None}})  # a size ladder's key holding a newline (found by this test)
    def fuzz(section):
        try:
            s = spec.from_dict(SPEC | {"comm": section}, "s", cuda=True)
            paths.make_cases(s.comm, 2, "nccl", "bf16", s.comm.hidden or 64)
        except UserError as e:
            assert str(e) and "\n" not in str(e)

    fuzz()


# --- --beside-gemm -------------------------------------------------------------------------------


def test_beside_gemm_keys_and_cpu_skip():
    plain = paths.make_cases(bench(), world=2, backend="gloo", dtype="fp32", hidden=1024)
    beside = paths.make_cases(bench(), world=2, backend="gloo", dtype="fp32", hidden=1024, beside_gemm=True)
    assert all("beside_gemm" not in json.loads(c.key()) for c in plain), "the keys of plain runs do not name beside_gemm"
    assert all(json.loads(c.key())["beside_gemm"] is True for c in beside)
    assert all(c.skip and "CUDA" in c.skip for c in beside)


def test_beside_gemm_columns_and_table():
    from rich.console import Console

    from overlapbench.comm import output
    from overlapbench.comm.contention import GEMM_TOKENS, mlp_shapes

    assert mlp_shapes() == [(GEMM_TOKENS, 8192, 28672), (GEMM_TOKENS, 14336, 8192)]
    row = {"bytes": M, "count": M // 2, "dtype": "bf16", "op": "all_reduce", "strategy": "copy_engine_norm",
           "knobs": {"op": "all_reduce", "ctas": 4}, "status": "ok", "error": None, "ms": 0.25, "algbw": 4.0,
           "busbw": 4.0, "wrong": 0, "beside_ms": 0.5, "beside_busbw": 2.0, "gemm_loss": 0.031}
    rec = output.record(row)
    assert rec["beside_us"] == 500.0 and rec["beside_busbw"] == 2.0 and rec["gemm_loss"] == 0.031
    console = Console(width=200, record=True)
    console.print(output.to_table([row]))
    text = console.export_text()
    assert "GEMM loss" in text and "3.1%" in text


# --- --ce-chunks ---------------------------------------------------------------------------------


def test_ce_chunks_make_a_case_block_each_with_keys_only_where_asked():
    plain = paths.make_cases(bench(), world=2, backend="nccl", dtype="bf16", hidden=1024)
    chunked = paths.make_cases(bench(), world=2, backend="nccl", dtype="bf16", hidden=1024, ce_chunks=(1, None, 4))
    for path in paths.COPY_ENGINE_NORM_PATHS:  # the rows copied or written by the kernel: cut alike
        ce = [c for c in chunked if c.path == path]
        assert [c.chunks for c in ce[:3 * len(bench().sizes)]] == [1] * 4 + [None] * 4 + [4] * 4  # per budget: a block each
        assert len(ce) == 3 * len([c for c in plain if c.path == path])
    assert {c.chunks for c in chunked if c.path not in paths.COPY_ENGINE_NORM_PATHS} == {None}
    ce = [c for c in chunked if c.path == "copy_engine_norm"]
    assert all("chunks" not in json.loads(c.key()) for c in plain), "the keys of plain runs do not name chunks"
    assert len({c.key() for c in ce}) == len(ce) and json.loads(ce[0].key())["chunks"] == 1


def test_ce_chunks_parse_forward_and_show():
    from rich.console import Console

    from overlapbench.comm import output

    opts = command.Plan.parse(min_bytes=None, max_bytes="512K", factor=4, ops="all_reduce", paths=None,
                                 dtype="auto", nccl_max_ctas="default", comm_ctas="4", hidden=8192, iters=3,
                                 warmup=1, graphs=True, fmt="table", output=None, resume=False, nproc=None,
                                 ce_chunks="1, auto,4,1")
    assert opts.ce_chunks == (1, None, 4)
    argv = opts.argv(cuda=True, output=Path("x.jsonl"))
    assert argv[argv.index("--ce-chunks") + 1] == "1,auto,4"
    row = {"bytes": M, "count": M // 2, "dtype": "bf16", "op": "all_reduce", "strategy": "copy_engine_norm",
           "knobs": {"op": "all_reduce", "ctas": 4, "chunks": 4}, "status": "ok", "error": None, "ms": 0.25,
           "algbw": 4.0, "busbw": 4.0, "wrong": 0, "cv": 0.01}
    assert output.record(row)["chunks"] == 4 and "chunks=4" in str(output.summary_line(row))
    console = Console(width=200, record=True)
    console.print(output.to_table([row]))
    assert "copy_engine_norm chunks=4" in console.export_text()


def test_gemm_stream_counts_its_flops():
    from overlapbench.comm.contention import GemmStream

    gemms = GemmStream.make("cpu", [(4, 8, 16), (4, 16, 8)])
    gemms.run(2)
    a, b, out = gemms.operands[0]
    torch.testing.assert_close(out.float(), (a @ b).float())
    assert gemms.flops == 2 * (4 * 8 * 16 + 4 * 16 * 8) and gemms.tflops(1.0) == gemms.flops / 1e-3 / 1e12


def test_fused_paths_take_their_kernels(monkeypatch):
    """fused_norm builds the layer's kernel (the one `comm: fused` runs, comm_methods.fused_kernel);
    the other fused paths always theirs."""
    from types import SimpleNamespace

    from kernels.allreduce_norm_pull import FUSED_KERNELS, AllReduceNormPull
    from overlapbench.overlap import comm_methods

    assert comm_methods.fused_kernel() is AllReduceNormPull
    for kernel, kind in list(FUSED_KERNELS.items()):
        monkeypatch.setitem(FUSED_KERNELS, kernel,
                            lambda group, rows, hidden, dtype, device, allocate, name=kind.__name__: (name, rows))
    monkeypatch.setattr(comm_methods, "fused_kernel",
                        lambda: lambda group, rows, hidden, dtype, device, allocate: ("the layer's", rows))
    cases = [Case("all_reduce", p, "nccl", 8, 0, 3 * 1024, "bf16", 1024, buffer=p)
             for p in ("fused_norm", "fused_norm_v1", "fused_norm_push", "fused_norm_pull_push")]
    bufs = buffers.Buffers(SimpleNamespace(device=torch.device("cpu")), cases)
    made = [bufs.fused(c) for c in cases]
    assert made == [("the layer's", 3), ("AllReduceNorm", 3), ("AllReduceNormV2", 3), ("AllReduceNormPullPush", 3)]


def test_by_default_comm_runs_every_path_that_has_run_on_a_gpu_and_the_layers_copy_engine_schedule():
    """Every path that has run correct on GPUs (results/h200x2/486cebf/; nccl_symm on 2x H100,
    results/h100x2/331cb63/; copy_engine_norm_kernel on 4x H100, results/h100x4/b71640f/) runs by
    default, and only those: a path no GPU has run stays out until --paths (or a spec's
    comm.paths) names it. copy_engine_norm's chunks default to the layer's (by size)."""
    def parsed(paths_arg):
        return command.Plan.parse(min_bytes=None, max_bytes="64K", factor=4, ops=None, paths=paths_arg,
                                     dtype="auto", nccl_max_ctas="default", comm_ctas=None, hidden=64, iters=1,
                                     warmup=0, graphs=False, fmt="csv", output=None, resume=False, nproc=None)

    untried = {name for name, path in paths.PATHS_BY_NAME.items() if not path.by_default}
    assert untried == set()  # every path has run on a GPU
    opts = parsed(None)
    assert set(opts.paths) == set(paths.PATHS) - untried == set(CommSpec.from_yaml({}, cuda=False).paths)
    assert set(paths.DEFAULT_PATHS) == set(paths.PATHS) - untried
    assert parsed("nccl,nccl_symm").paths == ("nccl", "nccl_symm")
    assert CommSpec.from_yaml({"paths": ["nccl_symm"]}, cuda=False).paths == ("nccl_symm",)
    assert opts.ce_chunks == (None,)
    assert "fused_norm_push" in paths.PATHS and "fused_norm_pull" not in paths.PATHS
