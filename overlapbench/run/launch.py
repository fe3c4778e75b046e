"""Run under torchrun as is; started plainly, re-launch through torch.distributed.run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from overlapbench.run import launch_agent, launch_log, watchdog
from overlapbench.run.runtime import apply_safe_env

RELAUNCHED = "OVERLAPBENCH_RELAUNCHED"  # set for the workers of `relaunch`: the parent speaks for them


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


def gpu_memory_bytes() -> int | None:
    """One local GPU's memory (the first's), None without GPUs. Read from the device's
    properties, which opens no context on it: the launcher holds no GPU memory while its
    workers run."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory if local_gpus() else None


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


def relaunch(args: list[str], nproc: int, log: Path) -> int:
    """`python -m torch.distributed.run --standalone --nproc-per-node N -m overlapbench ARGS`
    (through launch_agent); returns its exit code. torchrun stops every rank when one fails.

    torchrun and its workers die with this process, however it dies (launch_agent,
    watchdog.die_with_parent): nothing runs on holding the results file. Their diagnostics
    (torchrun's notices and traceback, a worker's traceback, the watchdog's stacks) go to `log`,
    not the terminal: after a failure `explain` reads it and says what happened in one paragraph.

    torchrun runs in a session of its own, so the terminal's Ctrl-C (and a hang-up or SIGTERM)
    reaches this process alone: it stops relaying their stderr, then passes the interrupt on; the
    workers close the results file and exit, and this raises Interrupted."""
    env = os.environ.copy()
    apply_safe_env(env)
    env[RELAUNCHED] = "1"
    env[launch_log.LOG] = str(log)
    env[launch_agent.LAUNCHER] = str(os.getpid())
    if sys.stderr.isatty():  # the workers' stderr comes through a pipe: keep its colours and width
        env.setdefault("FORCE_COLOR", "1")
        env.setdefault("COLUMNS", str(shutil.get_terminal_size().columns))
    if not local_gpus():
        env.setdefault("OMP_NUM_THREADS", "1")  # 2 processes on a small CPU box
    cmd = [
        sys.executable, "-m", "overlapbench.run.launch_agent", "--standalone",
        f"--nproc-per-node={nproc}", "-m", "overlapbench", *args,
    ]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(f"== {time.strftime('%Y-%m-%d %H:%M:%S')} overlapbench {' '.join(args)} on {nproc} processes\n")
    interrupted = threading.Event()
    previous = {signum: signal.signal(signum, _as_interrupt) for signum in FORWARDED}
    child = relay = None
    try:
        child = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, start_new_session=True)
        relay = threading.Thread(target=_relay, args=(child.stderr, interrupted, log), daemon=True)
        relay.start()
        code = child.wait()
    except KeyboardInterrupt:  # Ctrl-C, a hang-up or SIGTERM, to this process alone
        interrupted.set()
        if child is not None:
            _stop(child)
        raise Interrupted from None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if relay is not None:
            relay.join(timeout=5)
    if code in (launch_log.INTERRUPTED, 128 + signal.SIGTERM, -signal.SIGINT, -signal.SIGTERM):
        raise Interrupted
    return code


def as_worker() -> None:
    """In a worker of `relaunch`: die with torchrun (so with the launcher), and send an unexpected
    error's traceback to the launch log, where `explain` finds it (the launcher says what
    happened). A worker of the user's own torchrun is left as it is."""
    if not relaunched():
        return
    agent = os.environ.get(launch_agent.AGENT)
    if agent:
        watchdog.die_with_parent(int(agent), signal.SIGTERM)
    sys.excepthook = _log_exception


def _log_exception(kind, value, tb) -> None:
    import traceback

    from overlapbench.errors import one_line

    rank = os.environ.get("RANK", "?")
    text = "".join(traceback.format_exception(kind, value, tb))
    launch_log.write("\n".join(f"rank {rank}: {line}" for line in text.splitlines()))
    launch_log.event("error", rank=int(rank) if rank.isdigit() else rank, error=one_line(value))


def _relay(stream, interrupted: threading.Event, log: Path) -> None:
    """Copy the launched processes' stderr to ours, line by line, until an interrupt; and to the log."""
    with open(log, "ab") as kept:
        for line in iter(stream.readline, b""):
            kept.write(line)
            kept.flush()
            if not interrupted.is_set():
                sys.stderr.buffer.write(line)
                sys.stderr.buffer.flush()
    stream.close()


# Each stops the run as Ctrl-C does. SIGINT too: a process started in the background inherits it
# ignored, and torchrun (which handles it) no longer sees the signal, this process passes it on.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _as_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _stop(child: subprocess.Popen) -> None:
    """Pass the interrupt on to torchrun and its workers (they finish writing their row); once
    more if they have not stopped in 5 s, then kill them all after 30 s; a second Ctrl-C kills."""
    try:
        for wait_s in (5.0, 30.0):
            _signal_group(child, signal.SIGINT)
            try:
                child.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                pass
    except KeyboardInterrupt:
        pass
    _signal_group(child, signal.SIGKILL)
    child.wait()


def _signal_group(child: subprocess.Popen, signum: int) -> None:
    """`signum` to torchrun and every worker it started (the session's process group)."""
    try:
        os.killpg(child.pid, signum)
    except ProcessLookupError:  # all gone already
        pass
