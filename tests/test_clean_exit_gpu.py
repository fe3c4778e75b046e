"""Runs that use NCCL's windows and PyTorch's symmetric memory end cleanly on 2 GPUs: every row
`ok`, exit code 0, and nothing on stderr from a process aborting at exit (torch 2.11 + NCCL
2.28 killed both ranks with `terminate called ... NCCL communicator was aborted`, thrown from
`MemPool`'s destructor, after every row was written). A run with a failing point ends the same
way. Each run is the command line a user types.

The sweep's grid also holds baseline's all-reduce choices (NCCL's ring, its symmetric kernels on
a budget, PyTorch's one-shot and two-shot symmetric-memory all-reduce) at odd token counts, on a
custom shape and a mixed batch: the sweep checks each point against the reference, eager and
replayed, so an `ok` row is a correct one."""

from __future__ import annotations

from pathlib import Path

import yaml

from overlapbench.tuning.results import read_rows
from tests import distributed

pytestmark = distributed.two_gpus()
PLUGINS = {"OVERLAPBENCH_PLUGINS": "tests.fault_plugin"}
ABORTS = ("terminate called", "DistBackendError", "communicator was aborted", "Traceback")

GRID = {
    "baseline": [
        {"nccl_symm": [False, True], "nccl_max_ctas": ["default", 8]},
        {"allreduce": ["one_shot", "two_shot"]},
    ],
    "token_split": {"comm": "nccl_symm", "comm_ctas_attn": 8, "comm_ctas_mlp": 8},
    "sp_baseline": {"nccl_symm": True, "nccl_max_ctas": 8},
}


def _write_spec(tmp_path: Path, strategies: dict, name: str = "clean-exit") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "tp": 2, "layers": 2, "dtype": "bf16",
        "shape": {"hidden": 1024, "ffn": 2816, "heads": 16, "kv_heads": 4, "head_dim": 64},
        "batches": [[1000], [1023], [300, 257, 5], {"prefill": [700], "decode": 24, "context": 512}],
        "strategies": strategies,
        "measure": {"warmup": 1, "iters": 3, "timeout_s": 120},
    }))
    return path


def _assert_clean(done, what: str) -> None:
    assert done.returncode == 0, f"{what}: exit {done.returncode}\n{done.stderr[-3000:]}"
    found = [word for word in ABORTS if word in done.stderr]
    assert not found, f"{what}: {found} on stderr\n{done.stderr[-3000:]}"


def test_sweep_on_windows_and_symmetric_memory_is_correct_and_exits_cleanly(tmp_path: Path):
    out = tmp_path / "rows.jsonl"
    done = distributed.overlapbench("sweep", str(_write_spec(tmp_path, GRID)), "--nproc", "2", "--output", str(out),
                                    timeout=480)
    _assert_clean(done, "sweep")
    rows = read_rows(out)
    not_ok = [(r["strategy"], r["knobs"], r["tokens"], r["error"]) for r in rows if r["status"] != "ok"]
    assert not not_ok, not_ok
    choices = {r["knobs"].get("allreduce", "nccl") for r in rows if r["strategy"] == "baseline"}
    assert choices == {"nccl", "one_shot", "two_shot"}, choices
    assert {r["tokens"] for r in rows} >= {1000, 1023, 562, 724}  # every batch ran (the mixed one: 700 + 24)


def test_sweep_with_a_failing_point_exits_cleanly(tmp_path: Path):
    grid = {"baseline": {"nccl_symm": True}, "fault": {"mode": "raise", "at_tokens": 1023}}
    out = tmp_path / "rows.jsonl"
    done = distributed.overlapbench("sweep", str(_write_spec(tmp_path, grid, "clean-exit-fault")), "--nproc", "2",
                                    "--output", str(out),
                                    env=PLUGINS, timeout=480)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "terminate called" not in done.stderr and "communicator was aborted" not in done.stderr, done.stderr[-3000:]
    failed = [(r["strategy"], r["tokens"]) for r in read_rows(out) if r["status"] != "ok"]
    assert failed == [("fault", 1023)], failed


def test_comm_on_windows_exits_cleanly(tmp_path: Path):
    out = tmp_path / "comm.jsonl"
    done = distributed.overlapbench(
        "comm", "--paths", "nccl,nccl_symm,symm_one_shot,symm_two_shot", "--nccl-max-ctas", "default,8",
        "-b", "1M", "-e", "4M", "-f", "4", "--iters", "3", "--warmup", "1", "--nproc", "2", "--output", str(out),
        timeout=300)
    _assert_clean(done, "comm")
    rows = read_rows(out)
    assert rows and all(r["status"] == "ok" and r["wrong"] == 0 for r in rows), [r for r in rows if r["status"] != "ok"]
    paths_run = {r["strategy"] for r in rows}  # a comm row names its path as its strategy
    assert paths_run >= {"nccl_symm", "symm_one_shot", "symm_two_shot"}, paths_run
