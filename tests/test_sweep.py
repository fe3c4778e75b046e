"""The sweep end to end on CPU: launch, rows, resume, refusal, two-node rendezvous."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from overlapbench.cli import app
from overlapbench.tuning.results import SCHEMA, ResultStore, read_rows
from tests import distributed
from tests.distributed import REPO, free_port

SPEC = """
name: tiny-test
model: tiny
layers: 2
tokens: [16, 29]
strategies:
  baseline: {}
  no_comm: {}
  token_split: {align: 8}
measure: {warmup: 1, iters: 3, timeout_s: 60}
"""
@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return path


def sweep(*args: str) -> subprocess.CompletedProcess:
    return distributed.overlapbench("sweep", *args)


@pytest.mark.slow
def test_sweep_writes_checked_rows_then_resumes(spec_file: Path, tmp_path: Path):
    out = tmp_path / "r.jsonl"
    done = sweep(str(spec_file), "--output", str(out))
    assert done.returncode == 0, done.stderr
    rows = read_rows(out)
    assert len(rows) == 6 and all(r["schema"] == SCHEMA for r in rows)
    assert {r["status"] for r in rows} == {"ok"}
    by_strategy = {r["strategy"]: r for r in rows if r["tokens"] == 29}
    assert by_strategy["token_split"]["rel_err"] < 1e-5
    assert by_strategy["baseline"]["rel_err"] is None and by_strategy["no_comm"]["rel_err"] is None
    # Rows name the attention kernels that ran: a split's second chunk merges two calls.
    assert by_strategy["baseline"]["attention"] == "math"
    assert by_strategy["token_split"]["attention"] == "math,math+lse_merge"
    for r in rows:
        assert len(r["samples_ms"]) == 3 and r["p10_ms"] <= r["ms"] <= r["p90_ms"]
        assert r["world_size"] == 2 and r["backend"] == "gloo" and r["device"] == "cpu"
        # each rank's own median; an iteration's time is the slowest rank's, so none above ms
        assert r["timing"] == "sequential" and len(r["rank_ms"]) == 2 and max(r["rank_ms"]) <= r["ms"] + 1e-6
        assert min(r["rank_ms"]) > 0
        assert r["versions"]["torch"] and r["batch"] == [r["tokens"]]

    # Without --resume an existing store is refused, untouched.
    before = out.read_text()
    refused = sweep(str(spec_file), "--output", str(out))
    assert refused.returncode == 2 and "--resume" in refused.stderr
    assert "Traceback" not in refused.stderr and out.read_text() == before

    # Drop the last two rows (as if the sweep died there): --resume redoes exactly those.
    lines = before.splitlines(keepends=True)
    out.write_text("".join(lines[:4]))
    resumed = sweep(str(spec_file), "--output", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    rows = read_rows(out)
    assert len(rows) == 6 and [json.loads(x) for x in lines[:4]] == rows[:4]
    expected = {(s, t) for s in ("baseline", "no_comm", "token_split") for t in (16, 29)}
    assert {(r["strategy"], r["tokens"]) for r in rows} == expected
    assert rows[4]["run_id"] != rows[0]["run_id"]


def test_busy_store_is_refused(tmp_path: Path):
    holder = ResultStore(tmp_path / "r.jsonl")
    holder.open(resume=False)
    try:
        from overlapbench.errors import UserError

        with pytest.raises(UserError, match="is being written by another run"):
            ResultStore(tmp_path / "r.jsonl").open(resume=True)
    finally:
        holder.close()


def test_bad_spec_is_one_line_exit_2(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: tiny\ntokens: [8]\nstrategies: {baseline: {nccl_max_ctas: 999}}\n")
    result = CliRunner().invoke(app, ["sweep", str(path)])
    assert result.exit_code == 2
    assert "strategies.baseline.nccl_max_ctas" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_two_node_launch(spec_file: Path, tmp_path: Path):
    """Two torchrun agents (one process each) rendezvous on localhost as two nodes."""
    out = tmp_path / "two-node.jsonl"
    port = free_port()
    env = os.environ | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "ob-test",
             "-m", "overlapbench", "sweep", str(spec_file), "--output", str(out)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for _ in range(2)
    ]
    logs = [a.communicate(timeout=300)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], logs
    rows = read_rows(out)
    assert len(rows) == 6
    ranks = rows[0]["ranks"]
    assert rows[0]["nodes"] == 2 and sorted(r["node"] for r in ranks) == [0, 1]
    assert [r["rank"] for r in ranks] == [0, 1]


IMPOSSIBLE = 10**12  # tokens no machine holds: the RoPE table and the input alone need terabytes
HUGE_SHAPE = "shape: {hidden: 4194304, ffn: 8388608, heads: 32768, kv_heads: 32768, head_dim: 128}"  # 35 TB of weights


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


def sweep_rows(tmp_path: Path, text: str) -> list[dict]:
    """A sweep meant to meet what cannot be built: run past the size check (--force) that would refuse it."""
    out = tmp_path / "r.jsonl"
    done = sweep(str(write(tmp_path, text)), "--output", str(out), "--force")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    return read_rows(out)


@pytest.mark.slow
@pytest.mark.parametrize("interleave", [False, True])
def test_a_batch_that_cannot_be_built_fails_its_own_points_and_the_sweep_goes_on(tmp_path: Path, interleave: bool):
    timing = f"interleave: {str(interleave).lower()}, span_ms: 2, settle_ms: 2, rounds: 4, warmup_s: 0"
    rows = sweep_rows(tmp_path, SPEC.replace("tokens: [16, 29]", f"tokens: [16, {IMPOSSIBLE}, 29]").replace(
        "timeout_s: 60}", f"timeout_s: 60, {timing}}}"))
    assert len(rows) == 9
    assert all(r["status"] == "ok" for r in rows if r["tokens"] == 16)  # written before: kept
    failed = [r for r in rows if r["tokens"] == IMPOSSIBLE]
    assert len(failed) == 3 and all(r["status"] == "failed" for r in failed)
    assert all(r["error"].startswith("the RoPE table: ") and "allocate" in r["error"] for r in failed), failed[0]["error"]
    assert all(r["status"] == "ok" for r in rows if r["tokens"] == 29)  # and it went on


@pytest.mark.slow
def test_a_kv_cache_that_cannot_be_built_fails_its_batch_only(tmp_path: Path):
    batches = f"batches: [[16], {{prefill: [16], decode: 4, context: {IMPOSSIBLE}}}, [29]]"
    rows = sweep_rows(tmp_path, SPEC.replace("tokens: [16, 29]", batches))
    assert len(rows) == 9
    failed = [r for r in rows if r["status"] != "ok"]
    assert {r["tokens"] for r in failed} == {20} and len(failed) == 3
    assert all(r["error"].startswith("the decode tokens' KV cache: ") and "allocate" in r["error"] for r in failed)


@pytest.mark.slow
def test_weights_that_cannot_be_built_are_failed_rows_not_a_traceback(tmp_path: Path):
    rows = sweep_rows(tmp_path, SPEC.replace("model: tiny", HUGE_SHAPE))
    assert len(rows) == 6 and {r["status"] for r in rows} == {"failed"}
    assert all(r["error"].startswith("the weights: ") and "allocate" in r["error"] for r in rows), rows[0]["error"]
    assert len({r["error"] for r in rows}) == 1  # one line, the same for every point


@pytest.mark.slow
def test_interleaved_rows_carry_paired_speedups_and_resume_retimes_the_reference(tmp_path: Path):
    interleaved = "timeout_s: 60, interleave: true, span_ms: 3, settle_ms: 4, rounds: 6, warmup_s: 0.02}"
    spec = write(tmp_path, SPEC.replace("timeout_s: 60}", interleaved))
    out = tmp_path / "r.jsonl"
    done = sweep(str(spec), "--output", str(out))
    assert done.returncode == 0, done.stderr
    rows = read_rows(out)
    assert len(rows) == 6 and {r["status"] for r in rows} == {"ok"} and {r["timing"] for r in rows} == {"interleaved"}
    for tokens in (16, 29):
        batch = {r["strategy"]: r for r in rows if r["tokens"] == tokens}
        ref, split = batch["baseline"], batch["token_split"]
        assert ref["speedup"] == 1.0 and ref["speedup_ci"] == [1.0, 1.0]
        assert len({r["pairing"] for r in batch.values()}) == 1 and ref["span_ms"] == 3 and ref["settle_ms"] == 4
        assert split["rel_err"] < 1e-5 and split["speedup_ci"][0] <= split["speedup"] <= split["speedup_ci"][1]
        assert set(split["round_ids"]) <= set(ref["round_ids"]) and len(split["samples_ms"]) == len(split["round_ids"]) >= 5
        ratios = {r: t for r, t in zip(ref["round_ids"], ref["samples_ms"])}
        logs = sorted(math.log(ratios[r] / t) for r, t in zip(split["round_ids"], split["samples_ms"]))
        cut = int(len(logs) * 0.1)  # the 10%-trimmed geometric mean of the per-round ratios
        assert split["speedup"] == pytest.approx(math.exp(statistics.fmean(logs[cut:len(logs) - cut])), rel=1e-4)
        for r in batch.values():  # each rank's own median; a round's time is the slowest rank's, so none above ms
            assert len(r["rank_ms"]) == r["world_size"] and max(r["rank_ms"]) <= r["ms"] + 1e-6
    assert rows[0]["pairing"] != rows[-1]["pairing"]

    # Resume after losing token_split at 29 tokens: it is timed again beside baseline, which is
    # timed but not written twice.
    kept = [r for r in rows if not (r["strategy"] == "token_split" and r["tokens"] == 29)]
    out.write_text("".join(json.dumps(r) + "\n" for r in kept))
    resumed = sweep(str(spec), "--output", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    again = read_rows(out)
    assert len(again) == 6 and again[-1]["strategy"] == "token_split" and again[-1]["tokens"] == 29
    assert again[-1]["speedup"] is not None and again[-1]["pairing"] != rows[-1]["pairing"]


@pytest.mark.slow
def test_a_mixed_batch_sweeps_checked_rows_that_say_their_decode_tokens(tmp_path: Path):
    """A prefill-only and a mixed batch of the same size through the CLI: every strategy checked
    against baseline on the mixed batch, rows carry `decode` and the decode kernel, and --resume
    tells the two batches apart."""
    spec = write(tmp_path, SPEC.replace("tokens: [16, 29]", "batches: [[29], {prefill: [21], decode: 8, context: 40}]").replace(
        "token_split: {align: 8}", "token_split: {align: 8}\n  iso: {align: 4}\n  sp_baseline: {}").replace(
        "timeout_s: 60}", "timeout_s: 60, check: fp32}"))  # the fp32 truth reads the cache too
    out = tmp_path / "r.jsonl"
    done = sweep(str(spec), "--output", str(out))
    assert done.returncode == 0, done.stderr
    rows = read_rows(out)
    assert len(rows) == 10 and {r["status"] for r in rows} == {"ok"}
    mixed = {r["strategy"]: r for r in rows if r["decode"] is not None}
    assert set(mixed) == {"baseline", "no_comm", "token_split", "iso", "sp_baseline"}
    for r in mixed.values():
        assert r["decode"] == {"tokens": 8, "context": 40} and r["tokens"] == 29 and r["batch"] == [21]
        assert "math_decode" in r["attention"] and r["check"] == "fp32"
    assert all(mixed[s]["rel_err"] < 1e-5 for s in ("token_split", "iso", "sp_baseline"))
    assert all(r["decode"] is None and "math_decode" not in r["attention"] for r in rows if r["batch"] == [29])
    again = sweep(str(spec), "--output", str(out), "--resume")
    assert again.returncode == 0 and "every point of tiny-test (10) is done already; nothing to run" in again.stdout, again.stdout


@pytest.mark.slow
def test_two_depths_time_each_point_beside_the_baseline_of_its_own_depth(tmp_path: Path):
    """`layers: [1, 2]`: rows of both depths, each depth's points paired with that depth's
    baseline in rounds of their own; --resume knows both; report adds the per-layer section."""
    interleaved = "timeout_s: 60, interleave: true, span_ms: 2, settle_ms: 2, rounds: 4, warmup_s: 0}"
    spec = write(tmp_path, SPEC.replace("layers: 2", "layers: [1, 2]").replace("tokens: [16, 29]", "tokens: [16]").replace(
        "timeout_s: 60}", interleaved))
    out = tmp_path / "r.jsonl"
    done = sweep(str(spec), "--output", str(out))
    assert done.returncode == 0, done.stderr
    rows = read_rows(out)
    assert sorted((r["layers"], r["strategy"]) for r in rows) == [
        (n, s) for n in (1, 2) for s in ("baseline", "no_comm", "token_split")]
    assert {r["status"] for r in rows} == {"ok"}
    for layers in (1, 2):
        mine = {r["strategy"]: r for r in rows if r["layers"] == layers}
        assert len({r["pairing"] for r in mine.values()}) == 1 and json.loads(mine["baseline"]["key"])["layers"] == layers
        ref, split = mine["baseline"], mine["token_split"]
        assert ref["speedup"] == 1.0 and split["rel_err"] < 1e-5
        ratios = {r: t for r, t in zip(ref["round_ids"], ref["samples_ms"])}
        logs = sorted(math.log(ratios[r] / t) for r, t in zip(split["round_ids"], split["samples_ms"]))
        cut = int(len(logs) * 0.1)  # its speedup is over this depth's baseline, round by round
        assert split["speedup"] == pytest.approx(math.exp(statistics.fmean(logs[cut:len(logs) - cut])), rel=1e-4)
    assert len({r["pairing"] for r in rows}) == 2
    again = sweep(str(spec), "--output", str(out), "--resume")
    assert again.returncode == 0 and "(6) is done already" in again.stdout, again.stdout
    shown = distributed.overlapbench("report", str(out))
    assert shown.returncode == 0 and "per added layer (steady state), 1 -> 2 layers" in shown.stdout, shown.stdout
