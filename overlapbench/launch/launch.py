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

from overlapbench.errors import UserError
from overlapbench.launch import gpu_sharing, launch_agent, launch_log, process_tree

RELAUNCHED = "OVERLAPBENCH_RELAUNCHED"  # set for the workers of `relaunch`: the parent speaks for them
GRACE_S = 10.0  # how long a stopped run's processes get to end on their own before they are killed


class Interrupted(Exception):
    """The launched run was stopped (Ctrl-C, SIGTERM, SIGHUP); every process it started has
    ended. `killed`: how many had not ended GRACE_S after the interrupt and were killed; `log`:
    the launch log, kept where that happened (what they printed), else None."""

    def __init__(self, message: str = "", killed: int = 0, log: Path | None = None) -> None:
        super().__init__(message)
        self.killed, self.log = killed, log


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


def gpu_sharing_check(nproc: int, need_bytes: int | None, force: bool) -> str | None:
    """The paragraph on other processes holding the GPUs the run's `nproc` processes will use
    (gpu_sharing.check; a UserError where they leave too little free, unless `force`); None on
    a machine without GPUs or where nothing else holds them."""
    import torch

    gpus = local_gpus()
    if not gpus:
        return None
    uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(min(nproc, gpus))]
    return gpu_sharing.check(*gpu_sharing.survey(uuids), need_bytes, force)


def default_nproc(spec_tp: int | str | None = None) -> int:
    """A spec's numeric `tp` where this machine holds that many ranks (a GPU each; 2 gloo processes
    on a machine without GPUs), so a `tp: 2` spec runs on 2 of a 4-GPU machine's GPUs; else all
    local GPUs, or 2 gloo processes on a machine without any. A spec asking for more GPUs than the
    machine has is refused here, naming both (ranks sharing GPUs would time contention); on a
    machine without GPUs the spec's own tp check says how to launch more processes."""
    gpus = local_gpus()
    if gpus and isinstance(spec_tp, int) and spec_tp > gpus:
        raise UserError(f"tp: {spec_tp} needs {spec_tp} GPUs and this machine has {gpus}; run it where {spec_tp} "
                        f"are (or across nodes under torchrun: docs/sweeps.md), set tp to {gpus} or 'auto', or pass "
                        f"--nproc {spec_tp} to let ranks share GPUs")
    machine = gpus or 2
    return spec_tp if isinstance(spec_tp, int) and 1 <= spec_tp <= machine else machine


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

    Every process it starts ends with it, however it ends (process_tree): torchrun and the workers
    get SIGKILL from the kernel when their parent dies, and nothing below this process is left
    running when this returns or raises. Their diagnostics (torchrun's notices and traceback, a
    worker's traceback, the watchdog's stacks) go to `log`, not the terminal: after a failure
    `explain` reads it and says what happened in one paragraph.

    torchrun runs in a session of its own, so the terminal's Ctrl-C (and a hang-up or SIGTERM)
    reaches this process alone: it stops relaying their stderr and passes the interrupt on; the
    workers close the results file and exit; those still running GRACE_S later are killed, and
    this raises Interrupted."""
    from overlapbench.distributed.runtime import apply_safe_env

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
        sys.executable, "-m", "overlapbench.launch.launch_agent", "--standalone",
        f"--nproc-per-node={nproc}", "-m", "overlapbench", *args,
    ]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(f"== {time.strftime('%Y-%m-%d %H:%M:%S')} overlapbench {' '.join(args)} on {nproc} processes\n")
    return supervise(cmd, env, log)


def supervise(cmd: list[str], env: dict, log: Path) -> int:
    """Run `cmd` (torchrun) in a session of its own, its stderr relayed to ours and to `log`,
    until it ends (its exit code) or this process is interrupted (Interrupted, once every process
    below this one has ended: `_stop`). Nothing below this process runs on after it returns."""
    interrupted = threading.Event()
    previous = {signum: signal.signal(signum, _as_interrupt) for signum in FORWARDED}
    adopting = process_tree.adopt_orphans()
    child = relay = None
    try:
        child = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, start_new_session=True)
        relay = threading.Thread(target=_relay, args=(child.stderr, interrupted, log), daemon=True)
        relay.start()
        code = child.wait()
    except KeyboardInterrupt:  # Ctrl-C, a hang-up or SIGTERM, to this process alone
        interrupted.set()
        killed = _stop(child) if child is not None else 0
        raise Interrupted(killed=killed, log=log) from None
    finally:
        for signum in FORWARDED:  # a signal now must not cut the cleanup short
            signal.signal(signum, signal.SIG_IGN)
        process_tree.kill_descendants(spare_reaping={child.pid} if child is not None else set())  # none after a clean end
        if adopting:
            process_tree.adopt_orphans(False)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if relay is not None:
            relay.join(timeout=5)
    code = 128 - code if code < 0 else code  # ended by a signal N: the shell's 128 + N
    if code in (launch_log.INTERRUPTED, 128 + signal.SIGTERM):
        raise Interrupted(log=log)
    return code


def run_into(output: Path, args: list[str], nproc: int, memory: str | None = None) -> tuple[int, str | None]:
    """`relaunch` a command whose rows go to `output`, with a launch log of its own beside it
    (launch_log.create: never a file the user has). Returns the exit code and the paragraph that
    says what ended the run (explain, which names the log, kept then; None where a worker said it
    already). The log goes after a clean end, after a user error a worker printed and after an
    interrupt its processes obeyed; Interrupted carries it where some were killed. `memory`: the
    run's estimated memory in words, for the out-of-memory case."""
    log, oom_before = launch_log.create(output), launch_log.oom_kills()
    try:
        code = relaunch(args, nproc, log)
    except Interrupted as stop:
        if not stop.killed:
            log.unlink(missing_ok=True)
        raise Interrupted(killed=stop.killed, log=log if stop.killed else None) from None
    what = launch_log.explain(log, oom_before, memory, code) if code else None
    if what is None:
        log.unlink(missing_ok=True)
    return code, what


def stopped(kept: str, stop: Interrupted) -> str:
    """What an interrupted run says: `interrupted; KEPT`, with the processes that had to be killed."""
    if not stop.killed:
        return f"interrupted; {kept}"
    were = "were" if stop.killed != 1 else "was"
    return (f"interrupted; {stop.killed} process{'es' if stop.killed != 1 else ''} of the run {were} still running "
            f"{GRACE_S:g} s later and {were} killed (what they printed is in {stop.log}); {kept}")


def as_worker() -> None:
    """In a worker of `relaunch`: die with torchrun (so with the launcher), and send an unexpected
    error's traceback to the launch log, where `explain` finds it (the launcher says what
    happened). A worker of the user's own torchrun is left as it is."""
    if not relaunched():
        return
    agent = os.environ.get(launch_agent.AGENT)
    if agent:
        process_tree.die_with_parent(int(agent))
    sys.excepthook = _log_exception


def ignore_stops_while_exiting() -> None:
    """A worker on its way out (its command returned or raised) ignores further stop signals. One
    arriving during the interpreter's exit, where torchrun's SIGTERM comes twice, raised
    KeyboardInterrupt inside an atexit callback, and Python printed `Exception ignored in atexit
    callback` with a traceback to the user's terminal. torchrun's SIGKILL still ends a worker
    whose exit hangs. Elsewhere (not under torchrun), nothing."""
    if under_torchrun():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


def end_worker(code: int, uncaught: bool = False) -> None:
    """End a worker at once with `code` where its runtime was abandoned on its GPU
    (runtime.abandoned: an interrupt or an error left kernels queued over symmetric memory), so
    no destructor unmaps that memory under them; every row is written before it gets here (the
    results store closes in the run's own `finally`). `uncaught`: called while handling an
    unexpected error, which is reported first as Python would at exit (sys.excepthook: the
    launch log's, in a relaunched worker). Elsewhere, nothing: the caller goes on to exit as usual."""
    if not under_torchrun():
        return
    from overlapbench.distributed import runtime

    if not runtime.abandoned():
        return
    if uncaught:
        sys.excepthook(*sys.exc_info())
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the terminal or pipe is gone
            pass
    os._exit(code)


def _log_exception(kind, value, tb) -> None:
    import traceback

    from overlapbench.errors import one_line

    rank = os.environ.get("RANK", "?")
    text = "".join(traceback.format_exception(kind, value, tb))
    launch_log.write("\n".join(f"rank {rank}: {line}" for line in text.splitlines()))
    launch_log.event("error", rank=int(rank) if rank.isdigit() else rank, error=one_line(value))


def _relay(stream, interrupted: threading.Event, log: Path) -> None:
    """Copy the launched processes' stderr to ours, line by line, until an interrupt or until the
    terminal is gone (a dead ssh connection); to the log, every line to the end, so no worker
    ever blocks on a full pipe."""
    to_terminal = True
    with open(log, "ab") as kept:
        for line in iter(stream.readline, b""):
            kept.write(line)
            kept.flush()
            if to_terminal and not interrupted.is_set():
                try:
                    sys.stderr.buffer.write(line)
                    sys.stderr.buffer.flush()
                except OSError:
                    to_terminal = False
    stream.close()


# Each stops the run as Ctrl-C does. SIGINT too: a process started in the background inherits it
# ignored, and torchrun (which handles it) no longer sees the signal, this process passes it on.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _as_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _stop(child: subprocess.Popen) -> int:
    """Pass the interrupt on to torchrun, which passes it to its workers (they close the results
    file and end); GRACE_S later, kill every process of the run that is still there. A second
    interrupt kills at once, unless it comes within a second of the first: that is the same one
    again (`timeout` signals its command, then the command's process group). Returns how many
    processes were killed."""
    first = time.monotonic()

    def again(signum, frame) -> None:
        if time.monotonic() - first >= 1.0:
            raise KeyboardInterrupt

    for signum in FORWARDED:
        signal.signal(signum, again)
    try:
        _signal_group(child, signal.SIGINT)
        child.wait(timeout=GRACE_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        pass
    for signum in FORWARDED:
        signal.signal(signum, signal.SIG_IGN)
    killed = process_tree.kill_descendants(spare_reaping={child.pid})
    if child.poll() is None:  # where /proc is missing: torchrun's group (its workers die with it)
        _signal_group(child, signal.SIGKILL)
    child.wait()
    return killed


def _signal_group(child: subprocess.Popen, signum: int) -> None:
    """`signum` to torchrun's process group (its session's; the workers have sessions of their own)."""
    try:
        os.killpg(child.pid, signum)
    except ProcessLookupError:  # all gone already
        pass
