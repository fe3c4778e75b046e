"""What else holds the GPUs a run is about to use, asked of nvidia-smi before the launch.

A run beside other processes measures them too, and where they hold the memory the run needs,
its points fail one by one with out-of-memory errors that name them (workers left over from an
earlier run that did not end are the usual case). So the launcher says, in one paragraph, which
processes hold what on its GPUs (pid, command, GiB), and refuses a run whose estimated
footprint fits a GPU but not what the others leave free (`--force` runs it anyway). Without
nvidia-smi (a CPU machine, a container without it) there is nothing to say. No torch: the GPUs
are named by UUID, which the caller reads from torch (CUDA's order is not nvidia-smi's).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from overlapbench.errors import UserError
from overlapbench.printing import gib

MIB = 2**20
GPU_QUERY = ["nvidia-smi", "--query-gpu=uuid,memory.total,memory.free", "--format=csv,noheader,nounits"]
APPS_QUERY = ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory,process_name", "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class Gpu:
    index: int  # as the run's processes number them (local rank)
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class Holder:
    """A process that holds memory on one of the run's GPUs."""

    gpu: int
    pid: int
    command: str
    used_bytes: int | None  # None where nvidia-smi cannot say (some containers)


def _uuid(text: str) -> str:
    """`GPU-5b0d...` (nvidia-smi) and `5b0d...` (torch) as one key."""
    text = text.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def _mib(text: str) -> int | None:
    text = text.strip()
    return int(float(text)) * MIB if text.replace(".", "", 1).isdigit() else None


def parse_gpus(text: str) -> dict[str, tuple[int, int]]:
    """nvidia-smi's `uuid, memory.total, memory.free` lines (MiB) -> uuid: (total, free) bytes."""
    found = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and _mib(parts[1]) is not None and _mib(parts[2]) is not None:
            found[_uuid(parts[0])] = (_mib(parts[1]), _mib(parts[2]))
    return found


def parse_apps(text: str) -> list[tuple[str, int, int | None, str]]:
    """nvidia-smi's `gpu_uuid, pid, used_memory, process_name` lines -> (uuid, pid, bytes, name)."""
    found = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", 3)]
        if len(parts) == 4 and parts[1].isdigit():
            found.append((_uuid(parts[0]), int(parts[1]), _mib(parts[2]), parts[3]))
    return found


def command_of(pid: int, fallback: str) -> str:
    """A process's command line where this machine can see it (else nvidia-smi's name), cut to 100 characters."""
    try:
        text = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        text = ""
    text = text or fallback
    return text if len(text) <= 100 else text[:99] + "…"


def _nvidia_smi(args: list[str]) -> str | None:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def survey(uuids: list[str], ask: Callable[[list[str]], str | None] = _nvidia_smi) -> tuple[list[Gpu], list[Holder]]:
    """The run's GPUs (`uuids`, in the order its processes number them) and the other processes
    that hold memory on them (not this one); nothing where nvidia-smi does not answer or knows
    none of them."""
    gpus_text, apps_text = ask(GPU_QUERY), ask(APPS_QUERY)
    if gpus_text is None:
        return [], []
    rooms = parse_gpus(gpus_text)
    index = {_uuid(u): i for i, u in enumerate(uuids)}
    gpus = [Gpu(i, *rooms[key]) for key, i in index.items() if key in rooms]
    holders = [Holder(index[u], pid, command_of(pid, name), used) for u, pid, used, name in parse_apps(apps_text or "")
               if u in index and pid != os.getpid()]
    return gpus, sorted(holders, key=lambda h: (h.gpu, -(h.used_bytes or 0), h.pid))


def check(gpus: list[Gpu], holders: list[Holder], need_bytes: int | None, force: bool) -> str | None:
    """The paragraph that names the other processes on the run's GPUs (None where there are
    none); a UserError instead where the run's estimated memory per GPU (`need_bytes`) would fit
    a GPU but not what the others leave free on it, unless `force`."""
    if not holders:
        return None
    on = {g.index: g for g in gpus}
    parts = []
    for index in sorted({h.gpu for h in holders}):
        mine = [h for h in holders if h.gpu == index]
        room = f" ({gib(on[index].free_bytes)} free of {gib(on[index].total_bytes)})" if index in on else ""
        listed = ", ".join(f"pid {h.pid} `{h.command}` {'?' if h.used_bytes is None else gib(h.used_bytes)}" for h in mine)
        parts.append(f"GPU {index}{room}: {listed}")
    said = f"other processes hold memory on the GPUs this run uses: {'; '.join(parts)}"
    short = [g for g in gpus if need_bytes is not None and g.free_bytes < need_bytes <= g.total_bytes
             and any(h.gpu == g.index for h in holders)]
    if short and not force:
        pids = " ".join(str(p) for p in sorted({h.pid for h in holders if h.gpu in {g.index for g in short}}))
        raise UserError(f"{said}. This run needs about {gib(need_bytes)} per GPU, more than they leave free on GPU "
                        f"{', '.join(str(g.index) for g in short)}: end them (`kill {pids}`, if they are left over "
                        f"from an earlier run) or pass --force to run beside them")
    return f"{said}; timings beside them are slower, and points that do not fit fail"
