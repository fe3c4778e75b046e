"""The torchrun process of a relaunched command: torch.distributed.run, tied to its launcher.

`python -m overlapbench.launch.launch_agent TORCHRUN-ARGS` is `python -m torch.distributed.run
TORCHRUN-ARGS`, except that it dies with the launcher that started it (the kernel kills it when
the launcher dies, however the launcher died: its workers then die with it, see
process_tree), its own messages and traceback go to the launch log rather than the
terminal, and how each worker ended is written there as an event the launcher turns into one
paragraph (launch.explain). Imports no torch before its stderr points at the log, so torch's
log handlers write there too.
"""

from __future__ import annotations

import os
import sys

from overlapbench.launch import launch_log, process_tree

LAUNCHER = "OVERLAPBENCH_LAUNCHER_PID"  # the launcher's pid, for this process to die with it
AGENT = "OVERLAPBENCH_AGENT_PID"  # this process's pid, for the workers to die with it


def main(argv: list[str]) -> int:
    process_tree.die_with_parent(int(os.environ[LAUNCHER]))
    os.environ[AGENT] = str(os.getpid())  # the workers inherit it
    log = launch_log.current()
    if log is not None:
        sys.stderr = open(log, "a", buffering=1)  # this process's stderr until it ends

    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        run.run(run.parse_args(argv))
    except ChildFailedError as e:
        for rank, failure in sorted(e.failures.items()):
            launch_log.event("ended", rank=rank, exitcode=failure.exitcode, pid=failure.pid)
        return 1
    except SignalException as e:  # a signal to this process: the workers were stopped with it
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
