"""Stopped runs leave nothing behind: however a run is stopped (a signal to the launcher, to its
process group, to torchrun; `timeout`; SIGKILL), no process of it is left 20 s after the launcher
ended, also when its workers are stuck where no signal handler runs (a rank in a CUDA
synchronize); the graceful part is bounded (launch.GRACE_S). The process tree of tests/fake_run.py
stands for torchrun and its workers (no torch: each case takes a few seconds); two real sweeps on
CPU check the same with torchrun itself."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from overlapbench.tuning.results import read_rows
from tests.distributed import REPO
from tests.test_launch import gone_within, processes_naming, wait_for

GRACE_S = 2.0  # the fake launcher's grace: the real one's (10 s) would only make the cases slower


def start_fake(tmp_path: Path, tag: str, *extra: str, wrap: tuple[str, ...] = ()) -> subprocess.Popen:
    """The fake launcher (`wrap`ped, e.g. in `timeout`), in a session of its own as a job is."""
    env = os.environ | {"PYTHONPATH": str(REPO), "FAKE_RUN_LOG": str(tmp_path / "launch.log")}
    cmd = [*wrap, sys.executable, "-m", "tests.fake_run", "launcher", tag, str(GRACE_S), *extra]
    return subprocess.Popen(cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def up(tag: str, count: int, seconds: float = 60) -> dict[int, dict]:
    """The processes naming `tag` once there are `count` of them (the workers have started)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = processes_naming(tag)
        if len(found) >= count:
            return found
        time.sleep(0.1)
    raise AssertionError(f"only {len(processes_naming(tag))} of {count} processes came up")


def role_pid(tag: str, role: str) -> int:
    for pid in processes_naming(tag):
        if (Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") + [b"", b""])[3] == role.encode():
            return pid
    raise AssertionError(f"no {role} process")


def signal_it(child: subprocess.Popen, tag: str, target: str, signum: int) -> None:
    if target == "launcher":
        os.kill(child.pid, signum)
    elif target == "group":  # the launcher's process group, as a terminal's Ctrl-C or `kill -- -PGID` reaches it
        os.killpg(child.pid, signum)
    else:
        os.kill(role_pid(tag, target), signum)


CASES = [
    ("launcher", signal.SIGINT), ("launcher", signal.SIGTERM), ("launcher", signal.SIGHUP),
    ("launcher", signal.SIGKILL), ("group", signal.SIGINT), ("group", signal.SIGTERM), ("group", signal.SIGKILL),
    ("torchrun", signal.SIGKILL),
]


@pytest.mark.slow
@pytest.mark.parametrize("target, signum", CASES, ids=[f"{t}-{signal.Signals(s).name}" for t, s in CASES])
def test_every_process_ends_with_a_stopped_run(tmp_path, target, signum):
    tag = f"fake-run-{random.randrange(1 << 30)}"
    child = start_fake(tmp_path, tag)
    up(tag, 4)  # the launcher, torchrun, two workers
    sent = time.monotonic()
    signal_it(child, tag, target, signum)
    out, _ = child.communicate(timeout=GRACE_S + 20)
    ended = time.monotonic() - sent
    assert gone_within(tag, 20), processes_naming(tag)
    if signum != signal.SIGKILL:  # the launcher stopped the run: its grace, then the kill of all 3 deaf processes
        assert out.strip() == "interrupted killed=3" and child.returncode == 130, out
        assert GRACE_S - 0.5 < ended < GRACE_S + 10, ended
    elif target == "torchrun":  # its workers died with it, and the launcher saw it end
        assert out.strip() == f"ended code={128 + signal.SIGKILL}", out


@pytest.mark.slow
def test_timeout_stops_it_once_and_what_a_worker_started_ends_too(tmp_path):
    """`timeout` signals its command and then the command's process group (the same signal twice,
    and SIGCONT): one interrupt, with its grace, not a second one that kills at once. Each worker
    also started a process not tied to it, which ends all the same."""
    if shutil.which("timeout") is None:
        pytest.skip("needs coreutils' timeout")
    tag = f"fake-run-{random.randrange(1 << 30)}"
    child = start_fake(tmp_path, tag, "--grandchild", wrap=("timeout", "-s", "TERM", "5"))
    up(tag, 7)  # timeout, the launcher, torchrun, two workers and their two helpers
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 124 and out.strip() == "interrupted killed=5", out
    assert gone_within(tag, 20), processes_naming(tag)


# -- the same with torchrun and a real sweep on CPU --------------------------------------------------


def stuck_spec(tmp_path: Path) -> Path:
    """A sweep whose rank 1 gets stuck in its second point's timing, as a rank in native code does."""
    path = tmp_path / "stuck.yaml"
    path.write_text(yaml.safe_dump({
        "name": "stuck", "model": "tiny", "layers": 1, "tokens": [16, 24],
        "strategies": {"baseline": {}, "fault": {"mode": "stuck_later", "at_tokens": 16}},
        "measure": {"warmup": 0, "iters": 2, "timeout_s": 600},
    }))
    return path


def start_stuck(tmp_path: Path, *wrap: str) -> tuple[subprocess.Popen, Path]:
    """The stuck sweep (`wrap`ped, e.g. in `timeout`) in a session of its own, once rank 1 is stuck."""
    out = tmp_path / f"r-{random.randrange(1 << 30)}.jsonl"  # a name only this test's processes carry
    env = os.environ | {"PYTHONPATH": str(REPO), "COLUMNS": "200", "OVERLAPBENCH_PLUGINS": "tests.fault_plugin"}
    cmd = [*wrap, sys.executable, "-m", "overlapbench", "sweep", str(stuck_spec(tmp_path)), "-o", str(out)]
    child = subprocess.Popen(cmd, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    wait_for(child.stdout, r"\[\s*1/\d+\].* baseline")  # the next point is the stuck one
    time.sleep(1)
    return child, out


@pytest.mark.slow
def test_a_sweep_stopped_by_timeout_with_a_stuck_rank_leaves_nothing(tmp_path):
    """The reported case: `timeout` (SIGTERM to the command and its group, as a SLURM time limit's
    first signal) while a rank is stuck; the launcher ends within its grace and the kill, and no
    process of the run is left."""
    from overlapbench.launch.launch import GRACE_S as grace

    child, out = start_stuck(tmp_path, "timeout", "-s", "TERM", "600")
    sent = time.monotonic()
    os.kill(child.pid, signal.SIGTERM)  # `timeout` passes it on as when its time is up
    _, err = child.communicate(timeout=grace + 30)
    assert time.monotonic() - sent < grace + 15
    assert gone_within(str(out), 20), processes_naming(str(out))
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"interrupted; 3 processes of the run were still running {grace:g} s later and were killed"), err
    log = lines[0].split("what they printed is in ")[1].split(")")[0]
    assert Path(log).exists() and Path(log).name.startswith(out.name + ".launch-")
    assert "1 finished row is in" in lines[0] and [r["strategy"] for r in read_rows(out)] == ["baseline"]


@pytest.mark.slow
def test_torchrun_killed_takes_its_stuck_workers_with_it(tmp_path):
    child, out = start_stuck(tmp_path)
    agent = next(pid for pid, env in processes_naming(str(out)).items() if "RANK" not in env
                 and env.get("OVERLAPBENCH_LAUNCHER_PID"))
    os.kill(agent, signal.SIGKILL)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 128 + signal.SIGKILL
    assert gone_within(str(out), 20), processes_naming(str(out))
    assert err.strip().startswith("sweep failed: torchrun (between this command and its workers) was ended by SIGKILL "
                                  "while running point 'fault tokens=16"), err
