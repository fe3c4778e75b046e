"""NCCL's tuning log: which kernel and how many channels (CTAs) each collective ran on.

NCCL (2.27+) prints one INFO line per collective it plans, on rank 0 of the communicator, when
`NCCL_DEBUG=INFO` and `NCCL_DEBUG_SUBSYS` includes TUNING, e.g.

    h:1:2 [0] NCCL INFO AllReduce [Symmetric]: 67108864 Bytes -> Kernel AllReduce_RSxLD_AGxST nchannels 8 nthreads 512 nWorks 1
    h:1:2 [0] NCCL INFO AllReduce: 67108864 Bytes -> Algo Ring proto Simple channel{Lo..Hi}={0..15}

The first form is a symmetric kernel (buffers in registered windows), the second the classic
algorithms. `enable` turns the log on for this process, into a file of its own, before the first
communicator exists (NCCL reads these variables once); `TuningLog.since` reads what was planned
after a mark, and `summarize` says what one collective of one size ran on.

Torch-free: the CPU tests feed it lines written by hand.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# NCCL's names of our collectives (ncclFuncToString)
NCCL_OPS = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter"}
# Settings that are the user's when set: the log is then theirs, and rows record no kernel.
DEBUG_VARS = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")

_SYMMETRIC = re.compile(r"NCCL INFO (\w+) \[Symmetric\]: (\d+) Bytes -> Kernel (\S+) nchannels (\d+)")
_CLASSIC = re.compile(r"NCCL INFO (\w+): (\d+) Bytes -> Algo (\S+) proto (\S+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")


@dataclass(frozen=True)
class Launch:
    """One collective as NCCL planned it."""

    op: str  # NCCL's name: AllReduce, AllGather, ReduceScatter, ...
    nbytes: int  # as NCCL counts them: all-gather and reduce-scatter per rank
    kernel: str  # a symmetric kernel's name, or "<algo>/<proto>" (Ring/Simple)
    channels: int
    symmetric: bool


def parse_line(line: str) -> Launch | None:
    """The launch a log line describes, or None for any other line."""
    if m := _SYMMETRIC.search(line):
        op, nbytes, kernel, channels = m.groups()
        return Launch(op, int(nbytes), kernel, int(channels), True)
    if m := _CLASSIC.search(line):
        op, nbytes, algo, proto, lo, hi = m.groups()
        return Launch(op, int(nbytes), f"{algo}/{proto}", int(hi) - int(lo) + 1, False)
    return None


def parse(text: str) -> list[Launch]:
    return [launch for line in text.splitlines() if (launch := parse_line(line)) is not None]


def matching(launches: list[Launch], op: str, nbytes: int, world: int) -> list[Launch]:
    """The launches of collective `op` (ours: all_reduce, ...) on `nbytes` (the larger buffer,
    as nccl-tests counts): NCCL logs all-gather and reduce-scatter by their per-rank bytes.
    The small collectives around a measurement (agreement, barriers) differ in size."""
    sizes = {nbytes} if op == "all_reduce" else {nbytes // world, nbytes}
    return [x for x in launches if x.op == NCCL_OPS[op] and x.nbytes in sizes]


def summarize(launches: list[Launch]) -> dict:
    """The row fields of what one case's collectives ran on: the most frequent (kernel,
    channels), whether it was a symmetric kernel, and every other pair seen (none, normally)."""
    if not launches:
        return {"nccl_kernel": None, "nccl_channels": None, "nccl_symmetric": None}
    counts = Counter((x.kernel, x.channels, x.symmetric) for x in launches)
    (kernel, channels, symmetric), _ = counts.most_common(1)[0]
    fields = {"nccl_kernel": kernel, "nccl_channels": channels, "nccl_symmetric": symmetric}
    others = [f"{k} x{c}" for (k, c, _), _ in counts.most_common()[1:]]
    return fields | ({"nccl_also": others} if others else {})


@dataclass(frozen=True)
class TuningLog:
    """This process's NCCL tuning log, read from a mark on."""

    path: Path

    def mark(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def since(self, mark: int) -> list[Launch]:
        """The launches logged after `mark` (NCCL writes whole lines, line-buffered)."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(mark)
            return parse(f.read().decode(errors="replace"))


def enable(env: dict = os.environ, directory: str | None = None) -> TuningLog | None:
    """Turn NCCL's tuning log on for this process (call before its first communicator), into
    a file of its own; None where the user set NCCL's debug variables (their log, left alone)."""
    if any(env.get(var) for var in DEBUG_VARS):
        return None
    if directory is None:
        directory = tempfile.mkdtemp(prefix="overlapbench-nccl-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)  # rows keep what it said
    folder = Path(directory)
    path = folder / f"nccl-tuning-{os.getpid()}.log"
    env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="TUNING", NCCL_DEBUG_FILE=str(path))
    return TuningLog(path)
