"""A launched run's process tree without torch, for the tests of how a stopped run ends
(tests/test_stopped_runs.py): the launcher (`launch.supervise`, as `relaunch` runs it), a
torchrun stand-in and its workers, each tied to its parent as the real ones are
(process_tree.die_with_parent), every worker stuck as a rank in a CUDA synchronize is: signals
ignored, the GIL held in native code. Each process carries TAG in its command line, so the test
finds them in /proc.

    python -m tests.fake_run launcher TAG GRACE_S [--grandchild]
    python -m tests.fake_run torchrun TAG [--grandchild]
    python -m tests.fake_run worker TAG [--grandchild]
    python -m tests.fake_run grandchild TAG

The torchrun stand-in passes SIGINT and SIGTERM on to its workers and waits for them, as
torchrun does; `--grandchild`: each worker also starts a process of its own, in a session of its
own and not tied to it (a compiler, a helper), which only the launcher's sweep of its
descendants can end.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _spawn(role: str, tag: str, *extra: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.fake_run", role, tag, *extra], start_new_session=True, **kwargs)


def _stuck() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    libc = ctypes.PyDLL(None)  # the call keeps the GIL: no Python thread of this process runs again
    while True:
        libc.sleep(3600)


def launcher(tag: str, grace_s: str, extra: list[str]) -> int:
    from overlapbench.launch import launch

    launch.GRACE_S = float(grace_s)
    log = Path(os.environ["FAKE_RUN_LOG"])
    env = os.environ | {"FAKE_RUN_LAUNCHER": str(os.getpid())}
    try:
        code = launch.supervise([sys.executable, "-m", "tests.fake_run", "torchrun", tag, *extra], env, log)
    except launch.Interrupted as stop:
        print(f"interrupted killed={stop.killed}", flush=True)
        return 130
    print(f"ended code={code}", flush=True)
    return code


def torchrun(tag: str, extra: list[str]) -> int:
    from overlapbench.launch import process_tree

    process_tree.die_with_parent(int(os.environ["FAKE_RUN_LAUNCHER"]))
    env = os.environ | {"FAKE_RUN_AGENT": str(os.getpid())}
    workers = [_spawn("worker", tag, *extra, env=env) for _ in range(2)]

    def stop(signum, frame) -> None:
        for w in workers:
            w.send_signal(signum)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    for w in workers:
        while w.poll() is None:
            time.sleep(0.1)
    return 0


def worker(tag: str, extra: list[str]) -> int:
    from overlapbench.launch import process_tree

    process_tree.die_with_parent(int(os.environ["FAKE_RUN_AGENT"]))
    if "--grandchild" in extra:
        _spawn("grandchild", tag)
    print(f"worker {os.getpid()} ready", file=sys.stderr, flush=True)
    _stuck()
    return 0


def main(argv: list[str]) -> int:
    role, tag, *rest = argv
    if role == "launcher":
        return launcher(tag, rest[0], rest[1:])
    if role == "torchrun":
        return torchrun(tag, rest)
    if role == "worker":
        return worker(tag, rest)
    _stuck()  # grandchild
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
