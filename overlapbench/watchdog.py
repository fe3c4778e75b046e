"""A per-point time limit: a kernel spinning on a peer that died never returns to Python, so
process-group timeouts cannot see it; this thread can."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading


class Watchdog:
    def __init__(self, limit_s: float, rank: int) -> None:
        self.limit_s, self.rank = limit_s, rank

    @contextlib.contextmanager
    def guard(self, what: str, extra_s: float = 0.0):
        """Ends the process (torchrun then stops the other ranks) if the block outlives the limit
        (plus `extra_s`, for a block known to run long: a batch's interleaved rounds)."""
        timer = threading.Timer(self.limit_s + extra_s, self._expire, args=(what,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _expire(self, what: str) -> None:
        sys.stderr.write(
            f"rank {self.rank}: {what} ran longer than {self.limit_s:g} s (measure.timeout_s); "
            f"stopping the sweep; finished rows are on disk and --resume continues; where it was:\n"
        )
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)  # which phase hung
        os._exit(3)


def interrupt_on_sigterm() -> None:
    """torchrun stops workers with SIGTERM: turn it into KeyboardInterrupt so `finally` blocks
    (closing the results store) run."""
    import signal

    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _raise)
