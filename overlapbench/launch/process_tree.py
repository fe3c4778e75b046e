"""The processes of a launched run, and how they all end with it.

A relaunched command is three layers: the launcher (the command the user started), torchrun
(launch_agent) and the workers. torchrun starts each worker in a session of its own, so a signal
to the launcher's process group, or to torchrun's, never reaches a worker; and a worker stuck in
native code (a CUDA synchronize, an NCCL collective, a graph replay) runs no Python signal
handler and no Python thread. So the guards are the kernel's, which need no cooperation:

- each process gets SIGKILL when the process that started it dies (PR_SET_PDEATHSIG), however
  that one died: the launcher's death ends torchrun, torchrun's ends the workers;
- the launcher adopts whatever its descendants leave behind (PR_SET_CHILD_SUBREAPER), so a worker
  whose torchrun died is still found under it, and `kill_descendants` ends every process below
  it, however deep, before it returns.

Linux only; elsewhere a thread watches the parent (`die_with_parent`) and nothing is adopted.
No torch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1  # linux/prctl.h
PR_SET_CHILD_SUBREAPER = 36
PARENT_GONE = 4  # the exit code where no kernel guard exists and the watching thread ends the process


def _prctl(option: int, value: int) -> bool:
    """prctl(option, value) on Linux; False where it is not available or refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent: int, signum: int = signal.SIGKILL) -> None:
    """End this process with `signum` when `parent` (the pid that started it) dies.

    On Linux the kernel sends it at the parent's death, however the parent died; if the parent is
    already gone by the time that is set, it comes now. SIGKILL, because a process that must not
    outlive its parent may be in native code that no other signal interrupts. Where the kernel
    cannot be told, a thread sees this process adopted by another parent and sends `signum`, then
    ends the process 10 s later if it still runs."""
    by_kernel = _prctl(PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent:  # died before the kernel could be told
        os.kill(os.getpid(), signum)
    if by_kernel:
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signum)
        time.sleep(10.0)
        os._exit(PARENT_GONE)

    threading.Thread(target=watch, name="overlapbench-parent-watch", daemon=True).start()


def adopt_orphans(on: bool = True) -> bool:
    """Make this process the one that adopts its descendants' orphans (while `on`), so that
    `descendants` still finds a worker whose torchrun died. False where it cannot be set."""
    return _prctl(PR_SET_CHILD_SUBREAPER, int(on))


def _parents() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process /proc shows."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        fields = text[text.rfind(")") + 2:].split()  # after `pid (command)`, which may hold spaces
        if len(fields) >= 2 and fields[1].isdigit():
            found[int(stat.parent.name)] = (int(fields[1]), fields[0])
    return found


def descendants(root: int | None = None) -> list[int]:
    """The live processes below `root` (this process by default), however deep; zombies (ended,
    not yet reaped) are not counted. Empty where /proc does not exist."""
    root = os.getpid() if root is None else root
    table = _parents()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if table[pid][1] != "Z":
            found.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(found)


def kill_descendants(spare_reaping: set[int] = frozenset(), settle_s: float = 5.0) -> int:
    """SIGKILL every process below this one, again for any that appear meanwhile (a worker's own
    children, adopted when it dies), until none is left or `settle_s` has passed; reap those this
    process adopted (not the pids in `spare_reaping`: a subprocess.Popen reaps its own child).
    Returns how many were killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + settle_s
    while True:
        alive = descendants()
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        _reap(killed - set(spare_reaping))
        if not alive or time.monotonic() > deadline:
            return len(killed)
        time.sleep(0.05)


def _reap(pids: set[int]) -> None:
    """Collect the exit status of those of `pids` that are this process's children and ended."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not ours, or reaped already
            pass
