"""A worker's runtime for the length of its run: joined on start, given back however the run ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from overlapbench.distributed.runtime import Runtime, init
from overlapbench.launch import launch_log


@contextmanager
def session(timeout_s: int, nccl_tuning_log: bool = False) -> Iterator[Runtime]:
    """`init`, and `Runtime.close` however the body ends: a clean close after it returns, a
    local one (no collectives) when it raises or is interrupted."""
    rt = init(timeout_s, nccl_tuning_log)
    try:
        yield rt
    except BaseException:
        rt.close(clean=False)
        raise
    launch_log.event("finished", rank=rt.rank)  # every row is written: what ends the process now ends it at exit
    rt.close()
