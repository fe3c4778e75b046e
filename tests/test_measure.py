"""Measurement: every rank runs the same number of iterations, whatever its own speed."""

from __future__ import annotations

import time

from tests import distributed


def _warm_up_counts(rank: int, world: int) -> int:
    from overlapbench.timing import measure

    calls = 0

    def run() -> None:  # rank 1 is three times slower, as a rank on a throttled GPU
        nonlocal calls
        calls += 1
        time.sleep(0.002 * (1 + 2 * rank))

    measure._warm_up(run, warmup=2, warmup_s=0.15, synchronize=lambda: None)
    return calls


def test_ranks_warm_up_for_the_same_count():
    """An iteration holds collectives: a rank that ran one more would wait forever."""
    fast, slow = distributed.run(_warm_up_counts, world=2)
    assert fast == slow and fast >= 2 + 0.15 / 0.006 - 1, (fast, slow)


def _iteration_counts(rank: int, world: int, per_iter_s: float) -> int:
    from overlapbench.timing import measure

    return measure._iterations(5, min_time_s=0.1, per_iter_s=per_iter_s * (1 + rank))


def test_timed_counts_agree_and_fill_the_minimum_time():
    counts = distributed.run(_iteration_counts, 0.001, world=2)
    assert counts[0] == counts[1] == 101  # the slower rank needs 51, the faster 101: the max
