"""Guards of a worker process: a per-point time limit, and an end together with the process
that started it.

A kernel spinning on a peer that died never returns to Python, so process-group timeouts cannot
see it; the time limit's thread can. And a worker whose launcher was killed (an OOM killer, a
scheduler) must not run on for hours holding the results file's lock: it dies with its parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import faulthandler
import os
import signal
import sys
import threading
import time

from overlapbench.run import launch_log

TIMED_OUT = 3  # a worker's exit code when the time limit stopped it
PARENT_GONE = 4  # a worker's exit code when its parent died and the signal did not end it
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Watchdog:
    def __init__(self, limit_s: float, rank: int) -> None:
        self.limit_s, self.rank = limit_s, rank

    @contextlib.contextmanager
    def guard(self, what: str, extra_s: float = 0.0):
        """Ends the process (torchrun then stops the other ranks) if the block outlives the limit
        (plus `extra_s`, for a block known to run long: a batch's interleaved rounds). Each rank
        tells the launch log what it runs, so a run that dies can name the point of the rank that
        died (ranks are not in lockstep between collectives)."""
        launch_log.event("running", what=what, rank=self.rank)
        timer = threading.Timer(self.limit_s + extra_s, self._expire, args=(what, self.limit_s + extra_s))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _expire(self, what: str, limit_s: float) -> None:
        line = f"rank {self.rank}: {what} ran longer than {limit_s:g} s (measure.timeout_s); where it was:\n"
        launch_log.event("timeout", rank=self.rank, what=what, limit_s=limit_s)
        log = launch_log.current()
        if log is None:  # started by the user's own torchrun: the stacks go to stderr, as torchrun shows them
            sys.stderr.write(line)
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        else:  # the launcher says what happened in a paragraph and points at the stacks
            with open(log, "a") as f:
                f.write(line)
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
        os._exit(TIMED_OUT)


def interrupt_on_sigterm() -> None:
    """torchrun stops workers with SIGTERM: turn it into KeyboardInterrupt so `finally` blocks
    (closing the results store) run."""

    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _raise)


def die_with_parent(parent: int, signum: int, grace_s: float = 10.0) -> None:
    """End this process when `parent` (the pid that started it) dies.

    On Linux the kernel sends `signum` at the parent's death (prctl PR_SET_PDEATHSIG), however it
    died; if the parent is already gone by the time that is set, the signal comes now. Elsewhere,
    and as a backstop for a `signum` a busy process does not act on, a thread sees this process
    adopted by another parent (the parent died) and sends `signum`, then ends the process
    `grace_s` later if it still runs."""
    by_kernel = _set_parent_death_signal(signum)
    if os.getppid() != parent:  # died before the kernel could be told
        os.kill(os.getpid(), signum)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        if not by_kernel:  # else the kernel sent it already: a second one would cut the first's cleanup short
            os.kill(os.getpid(), signum)
        time.sleep(grace_s)
        os._exit(PARENT_GONE)

    threading.Thread(target=watch, name="overlapbench-parent-watch", daemon=True).start()


def _set_parent_death_signal(signum: int) -> bool:
    """prctl(PR_SET_PDEATHSIG, signum) on Linux; False where it is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
