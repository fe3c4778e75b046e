"""Stopped runs and failed captures on 2 GPUs, as a user's command line runs them
(tests/checks/signal_gpu.sh runs this file and keeps its log).

1. SIGTERM to the launcher and its process group (what `timeout` and a SLURM time limit send
   first) while rank 1 is stuck in a point's warm-up and rank 0 waits for it in an NCCL
   collective, spinning in a CUDA synchronize: 20 s after the launcher ended, nvidia-smi lists no
   process of the run, and none is left on the machine.
2. Ctrl-C while a batch's candidates are timed in rounds, the splits' kernels reading the peer's
   symmetric memory, under the user's own torchrun: no worker aborts (unmapping that memory under
   kernels still queued aborted both ranks at exit: `terminate called ... an illegal memory
   access`), and nvidia-smi lists none of them 20 s later.
3. Points whose CUDA-graph capture fails, by running out of memory inside it or by an operation
   CUDA forbids there (which invalidates the capture and, under torch 2.11, left the caching
   allocator believing a capture underway: `captures_underway.empty() INTERNAL ASSERT FAILED` at
   exit): they end alone (timed eagerly, the capture's reason in their row), the next batch is
   captured and timed as ever, and the run exits 0 with no abort.

Each test prints what it saw (pytest -rA shows it in the log)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from overlapbench.tuning.results import read_rows
from tests import distributed
from tests.test_launch import gone_within, processes_naming

pytestmark = distributed.two_gpus()
PLUGINS = {"OVERLAPBENCH_PLUGINS": "tests.fault_plugin"}
ABORTS = ("terminate called", "INTERNAL ASSERT", "captures_underway", "Traceback")
SHAPE = {"hidden": 4096, "ffn": 14336, "heads": 32, "kv_heads": 8, "head_dim": 128}


def compute_pids() -> set[int]:
    """The pids nvidia-smi lists as holding a GPU (in its own pid namespace, which may not be ours)."""
    done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=30)
    return {int(p) for p in done.stdout.split() if p.strip().isdigit()}


def write_spec(tmp_path: Path, name: str, batches: list, strategies: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "tp": 2, "layers": 2, "dtype": "bf16", "shape": SHAPE, "batches": batches,
        "strategies": strategies, "measure": {"warmup": 1, "iters": 3, "timeout_s": 600},
    }))
    return path


def wait_for_event(out: Path, words: tuple[str, ...], seconds: float, log: Path | None = None) -> Path:
    """The run's launch log (`log`, else the one beside `out`) once a line of it holds all `words`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for found in [log] if log is not None else out.parent.glob(f"{out.name}.launch-*.log"):
            if any(all(w in line for w in words) for line in found.read_text(errors="replace").splitlines()):
                return found
        time.sleep(0.5)
    raise AssertionError(f"no {words} in the launch log within {seconds} s")


def test_sigterm_while_a_rank_is_stuck_leaves_no_process_on_the_gpus(tmp_path: Path):
    from overlapbench.launch.launch import GRACE_S

    before = compute_pids()
    spec = write_spec(tmp_path, "stopped", [[8192], [4096]],
                      {"baseline": {}, "fault": {"mode": "stuck_later", "at_tokens": 8192}})
    out = tmp_path / f"r-{random.randrange(1 << 30)}.jsonl"  # a name only this test's processes carry
    child = subprocess.Popen([sys.executable, "-m", "overlapbench", "sweep", str(spec), "-o", str(out), "--nproc", "2"],
                             cwd=tmp_path,
                             env=os.environ | {"PYTHONPATH": str(distributed.REPO)} | PLUGINS, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    # rank 1's second forward of `fault` (its capture's warm-up) never returns; rank 0's NCCL
    # all-reduce of the same forward waits for it on the GPU
    wait_for_event(out, ('"running"', "building fault", '"rank": 1'), 240)
    time.sleep(10)  # its build, its check, and the capture's first forward
    run = set(processes_naming(str(out)))
    on_gpus = compute_pids() - before
    print(f"before the signal: run processes {sorted(run)}; new on the GPUs {sorted(on_gpus)}")
    assert len(on_gpus) >= 2, on_gpus  # both ranks hold their GPU: what must go
    sent = time.monotonic()
    os.kill(child.pid, signal.SIGTERM)  # as `timeout` does: the command, then its process group
    os.killpg(child.pid, signal.SIGTERM)
    _, err = child.communicate(timeout=GRACE_S + 60)
    ended = time.monotonic() - sent
    print(f"the launcher ended {ended:.1f} s after the signal, exit {child.returncode}: {err.strip()}")
    assert ended < GRACE_S + 20, ended
    time.sleep(20)
    left = compute_pids() & on_gpus
    print(f"20 s later on the GPUs: {sorted(compute_pids())}; of the run: {sorted(left)}")
    assert not left, left
    assert gone_within(str(out), 1), processes_naming(str(out))
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted; ") and not any(a in err for a in ABORTS), err
    assert "were killed" in lines[0]  # the stuck ranks did not end by themselves: the launcher ended them


def test_ctrl_c_while_splits_over_symmetric_memory_are_timed_ends_every_worker_by_itself(tmp_path: Path):
    """Under the user's own torchrun, so every worker's stderr is the test's to read: Ctrl-C while
    the splits are timed in rounds (torchrun passes the SIGINT on to its workers)."""
    from overlapbench.distributed.runtime import SAFE_ENV
    from overlapbench.launch import launch_log

    before = compute_pids()
    split = {"comm": ["fused", "copy_engine"], "comm_ctas_attn": 16, "comm_ctas_mlp": 16, "align": 256}
    spec = write_spec(tmp_path, "ctrl-c", [[16384], [8192]], {"baseline": {}, "token_split": split})
    out = tmp_path / f"r-{random.randrange(1 << 30)}.jsonl"
    log = tmp_path / f"{out.name}.launch-events.log"  # the workers' events, read by wait_for_event
    env = os.environ | SAFE_ENV | {"PYTHONPATH": str(distributed.REPO), launch_log.LOG: str(log)}
    child = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                              "-m", "overlapbench", "sweep", str(spec), "-o", str(out)], cwd=tmp_path, env=env,
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    log.touch()
    wait_for_event(out, ('"running"', "timing", "interleaved", '"rank": 1'), 300, log)
    time.sleep(random.uniform(1, 4))  # somewhere in the rounds, kernels queued
    on_gpus = compute_pids() - before
    sent = time.monotonic()
    os.killpg(child.pid, signal.SIGINT)  # Ctrl-C to torchrun's group; it passes SIGINT on to its workers
    _, err = child.communicate(timeout=120)
    ended = time.monotonic() - sent
    print(f"torchrun ended {ended:.1f} s after Ctrl-C, exit {child.returncode}; its stderr:\n{err[-3000:]}")
    aborts = ("terminate called", "illegal memory access", "core dumped", "Exception ignored", "SIGABRT")
    assert not any(a in err for a in aborts), err[-3000:]
    time.sleep(20)
    left = compute_pids() & on_gpus
    print(f"20 s later on the GPUs: {sorted(compute_pids())}; of the run: {sorted(left)}")
    assert not left, left
    assert gone_within(str(out), 1), processes_naming(str(out))


def test_a_failed_capture_fails_alone_and_the_run_exits_cleanly(tmp_path: Path):
    spec = write_spec(tmp_path, "captures", [[4096], [2048]],
                      {"baseline": {}, "fault": {"mode": ["oom_in_capture", "invalid_capture"], "at_tokens": 4096},
                       "token_split": {"align": 256}})
    out = tmp_path / "rows.jsonl"
    done = distributed.overlapbench("sweep", str(spec), "--output", str(out), "--nproc", "2", env=PLUGINS, timeout=480,
                                    cwd=tmp_path)
    print(f"exit {done.returncode}; stderr:\n{done.stderr[-3000:]}")
    rows = read_rows(out)
    for r in rows:
        print(r["strategy"], r["knobs"].get("mode"), r["tokens"], r["status"], r["graphs"], r["graph_error"], r["error"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert not any(a in done.stderr for a in ABORTS), done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["captures.yaml", "rows.jsonl"]  # no lock, no launch log
    faults = {r["knobs"]["mode"]: r for r in rows if r["strategy"] == "fault" and r["tokens"] == 4096}
    assert set(faults) == {"oom_in_capture", "invalid_capture"}
    for mode, row in faults.items():  # their capture failed on rank 1: timed eagerly, its rank and reason kept
        assert row["status"] == "ok" and row["graphs"] is False, (mode, row)
        assert row["graph_error"].startswith("capture failed on rank 1: "), (mode, row["graph_error"])
    assert "out of memory" in faults["oom_in_capture"]["graph_error"].lower(), faults["oom_in_capture"]["graph_error"]
    others = [r for r in rows if not (r["strategy"] == "fault" and r["tokens"] == 4096)]
    assert {r["tokens"] for r in others} == {4096, 2048}
    assert all(r["status"] == "ok" and r["graphs"] is True for r in others), [
        (r["strategy"], r["tokens"], r["status"], r["graphs"], r["error"]) for r in others]
