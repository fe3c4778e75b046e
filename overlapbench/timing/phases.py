"""A phase of a point (build, check, capture, time) on every rank, then agreement on its outcome.

A build that fails on one rank must fail the point on all of them before any collective, or the
others would wait in that collective forever.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist

from overlapbench.errors import UserError, one_line

T = TypeVar("T")


class PointFailed(Exception):
    """A phase of a point failed on some rank: every rank stops the point with this result."""

    def __init__(self, result: dict) -> None:
        self.result = result


def phase(rt, fn: Callable[[], T]) -> T:
    """Run one phase of a point on this rank, then agree with the others over the control
    group (`rt.first_failure`); raises PointFailed with the first rank's failure."""
    value, result = None, None
    try:
        value = fn()
    except UserError as e:  # the strategy cannot run this point here
        result = {"status": "skipped", "error": str(e)}
    except (dist.DistError, KeyboardInterrupt):  # a dead peer or an interrupt ends the sweep
        raise
    except Exception as e:
        result = {"status": "failed", "error": one_line(e)}
    verdict = rt.first_failure(result)
    if verdict is not None:
        raise PointFailed(verdict)
    return value


def out_of_memory(result: dict) -> bool:
    """Whether a failed result is the device (or host) running out of memory."""
    error = (result.get("error") or "").lower()
    return result.get("status") == "failed" and ("out of memory" in error or "outofmemory" in error or "can't allocate" in error)
