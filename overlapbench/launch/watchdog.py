"""The guard of a worker process: a per-point time limit.

A kernel spinning on a peer that died never returns to Python, so process-group timeouts cannot
see it; the time limit's thread can. (A worker's end with its launcher is process_tree's.)
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time

from overlapbench.launch import launch_log

TIMED_OUT = 3  # a worker's exit code when the time limit stopped it
# How long a rank whose limit fired lives on after writing where it was, so that the other ranks'
# limits, each started as its rank reached the same point, fire within it and write theirs too
# before this exit has torchrun stop them: which rank fires first is a race, and the rank that hung,
# whose stack says why, need not win it (under load the ranks reach a point up to seconds apart).
STACKS_GRACE_S = 3.0


class Watchdog:
    def __init__(self, limit_s: float, rank: int) -> None:
        self.limit_s, self.rank = limit_s, rank
        self.fired = threading.Event()  # a limit fired: the process ends STACKS_GRACE_S later

    @contextlib.contextmanager
    def guard(self, what: str, extra_s: float = 0.0):
        """Ends the process (torchrun then stops the other ranks) if the block outlives the limit
        (plus `extra_s`, for a block known to run long: a batch's interleaved rounds). Each rank
        tells the launch log what it runs, so a run that dies can name the point of the rank that
        died (ranks are not in lockstep between collectives). A block that ends after its limit
        fired goes no further (no row of a point said to be over its limit, nothing of the next)
        while the process waits out the grace in which the other ranks write their stacks."""
        launch_log.event("running", what=what, rank=self.rank)
        timer = threading.Timer(self.limit_s + extra_s, self._expire, args=(what, self.limit_s + extra_s))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            if self.fired.is_set():
                threading.Event().wait()  # until the limit's thread ends the process

    def _expire(self, what: str, limit_s: float) -> None:
        self.fired.set()
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
        time.sleep(STACKS_GRACE_S)
        os._exit(TIMED_OUT)


def interrupt_on_sigterm() -> None:
    """torchrun stops workers with SIGTERM: turn it into KeyboardInterrupt so `finally` blocks
    (closing the results store) run."""

    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _raise)
