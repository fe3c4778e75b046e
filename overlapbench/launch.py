"""Run under torchrun as is; started plainly, re-launch through torch.distributed.run."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading

from overlapbench.runtime import apply_safe_env

RELAUNCHED = "OVERLAPBENCH_RELAUNCHED"  # set for the workers of `relaunch`: the parent speaks for them
INTERRUPTED = 130  # the shell's code for a command ended by Ctrl-C


class Interrupted(Exception):
    """The launched sweep was stopped by Ctrl-C (or SIGTERM); its workers have exited."""


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def relaunched() -> bool:
    """Whether this worker was started by `relaunch` (rather than by the user's own torchrun)."""
    return os.environ.get(RELAUNCHED) == "1"


def local_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_nproc() -> int:
    """All local GPUs, or 2 gloo processes on a machine without any."""
    return local_gpus() or 2


def oversubscription(nproc: int) -> str | None:
    """A warning when the processes outnumber what runs them (GPUs, else CPU cores): timings
    would then measure contention."""
    gpus = local_gpus()
    if gpus:
        return None if nproc <= gpus else f"--nproc {nproc}: more processes than the {gpus} GPUs here; ranks will share GPUs"
    cores = os.cpu_count() or 1
    if nproc <= cores:
        return None
    return (f"--nproc {nproc}: more processes than the {cores} CPU cores here; they will take turns, "
            f"so the timings measure contention, not the strategies")


def relaunch(args: list[str], nproc: int) -> int:
    """`python -m torch.distributed.run --standalone --nproc-per-node N -m overlapbench ARGS`;
    returns its exit code. torchrun stops every rank when one fails.

    Ctrl-C reaches torchrun and the workers too; the workers close the results file and exit,
    and this raises Interrupted. What torchrun prints while it shuts down (signal notices, its
    own traceback) is dropped: the caller says what happened, once."""
    env = os.environ.copy()
    apply_safe_env(env)
    env[RELAUNCHED] = "1"
    if sys.stderr.isatty():  # the workers' stderr comes through a pipe: keep its colours and width
        env.setdefault("FORCE_COLOR", "1")
        env.setdefault("COLUMNS", str(shutil.get_terminal_size().columns))
    if not local_gpus():
        env.setdefault("OMP_NUM_THREADS", "1")  # 2 processes on a small CPU box
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc}", "-m", "overlapbench", *args,
    ]
    child = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)
    interrupted = threading.Event()
    relay = threading.Thread(target=_relay, args=(child.stderr, interrupted), daemon=True)
    relay.start()
    try:
        code = child.wait()
    except KeyboardInterrupt:  # the terminal sent SIGINT to torchrun and its workers too
        interrupted.set()
        _stop(child)
        raise Interrupted from None
    finally:
        relay.join(timeout=5)
    if code in (INTERRUPTED, -signal.SIGINT, -signal.SIGTERM):
        raise Interrupted
    return code


# torchrun's notices that a signal arrived (logged before this process has seen the same Ctrl-C)
_SIGNAL_NOTICE = re.compile(rb"torch/distributed/elastic/.*(death signal|closing signal)")


def _relay(stream, interrupted: threading.Event) -> None:
    """Copy the launched processes' stderr to ours, line by line, until an interrupt."""
    for line in iter(stream.readline, b""):
        if not interrupted.is_set() and not _SIGNAL_NOTICE.search(line):
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()
    stream.close()


def _stop(child: subprocess.Popen) -> None:
    """Let torchrun stop its workers (they finish writing their row); ask it once more if it
    has not (a SIGINT sent to this process alone), kill it if it hangs; a second Ctrl-C kills."""
    try:
        for wait_s, then in ((5.0, signal.SIGINT), (30.0, signal.SIGKILL)):
            try:
                child.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                child.send_signal(then)
    except KeyboardInterrupt:
        child.kill()
    child.wait()
