"""Measurement: every rank runs the same number of iterations, whatever its own speed."""

from __future__ import annotations

import random
import time

import pytest

from tests import distributed


def _warm_up_counts(rank: int, world: int) -> int:
    from overlapbench.timing import bench, measure

    calls = 0

    def run() -> None:  # rank 1 is three times slower, as a rank on a throttled GPU
        nonlocal calls
        calls += 1
        time.sleep(0.002 * (1 + 2 * rank))

    bench.warm_up(run, warmup=2, warmup_ms=150.0, clock=bench.WallClock(), agree=measure.agreed_count)
    return calls


def test_ranks_warm_up_for_the_same_count():
    """An iteration holds collectives: a rank that ran one more would wait forever."""
    fast, slow = distributed.run(_warm_up_counts, world=2)
    assert fast == slow and fast >= 2 + 0.15 / 0.006 - 1, (fast, slow)


def _iteration_counts(rank: int, world: int, per_iter_ms: float) -> int:
    from overlapbench.timing import bench, measure

    return measure.agreed_count(bench.samples_for(5, rep_ms=100.0, per_sample_ms=per_iter_ms * (1 + rank)))


def test_timed_counts_agree_and_fill_the_minimum_time():
    counts = distributed.run(_iteration_counts, 1.0, world=2)
    assert counts[0] == counts[1] == 101  # the slower rank needs 51, the faster 101: the max


def _time_step_samples(rank: int, world: int, warmup: int, iters: int, seed: int) -> tuple[int, int]:
    import torch

    from overlapbench.timing import measure
    from overlapbench.timing.step import Step

    calls = 0
    g = torch.Generator().manual_seed(seed + rank)
    a, b = torch.randn(48, 64, generator=g), torch.randn(64, 32, generator=g)

    def forward(x):
        nonlocal calls
        calls += 1
        return x @ b

    timing = measure.time_step(Step(forward), a, warmup, iters, graphs=True, warmup_s=5.0, min_time_s=5.0)
    assert not timing.graphs and all(s > 0 for s in timing.samples_ms)
    return calls, len(timing.samples_ms)


def test_time_step_on_cpu_runs_exactly_the_counts_it_is_given():
    """On CPU the sequential mode runs `warmup` + `iters` forwards on every rank, the budgets of
    time aside (they are for GPU clocks), and a sample per iteration."""
    warmup, iters = random.randrange(0, 4), random.randrange(1, 6)
    got = distributed.run(_time_step_samples, warmup, iters, random.randrange(1 << 20), world=2)
    assert got == [(warmup + iters, iters)] * 2


def _over_ranks(rank: int, world: int, every: list[list[float]]):
    import torch

    from overlapbench.timing import measure

    return measure._over_ranks(torch.tensor(every[rank], dtype=torch.float64))


def test_an_iteration_is_the_slowest_rank_s_and_each_rank_keeps_its_own_median():
    """What a sequential row's samples_ms and rank_ms are made of: each rank's samples gathered,
    the max per iteration, and each rank's median, in rank order."""
    import statistics

    world, iters = random.randrange(2, 4), random.randrange(1, 8)
    every = [[random.uniform(0.5, 3.0) for _ in range(iters)] for _ in range(world)]
    got = distributed.run(_over_ranks, every, world=world)
    want = ([max(each) for each in zip(*every)], [statistics.median(samples) for samples in every])
    for slowest, medians in got:  # every rank learns the same
        assert slowest == pytest.approx(want[0], rel=1e-12) and medians == pytest.approx(want[1], rel=1e-12)


class _Graph:
    """A CUDAGraph as a failed capture leaves it: capture_end may fail, pool() works only once
    capture_end got past the allocator."""

    def __init__(self, end_works: bool) -> None:
        self.end_works, self.ended, self.end_calls = end_works, False, 0

    def capture_end(self) -> None:
        self.end_calls += 1
        if not self.end_works:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
        self.ended = True

    def pool(self):
        if not self.ended:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return (0, 7)


def _allocator(monkeypatch, underway: bool) -> list:
    """The caching allocator's pool calls, recorded; `underway`: it still allocates to the pool."""
    import torch

    calls: list = []

    def end(device, pool):
        calls.append(("end", device, pool))
        if not underway:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", end, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_releasePool", lambda device, pool: calls.append(("release", device, pool)),
                        raising=False)
    return calls


def test_a_failed_capture_is_ended_and_its_pool_given_back_exactly_once(monkeypatch):
    """After an error inside the capture or in capture_end, the allocator must learn that the
    capture ended and get its pool back (else it frees nothing more and aborts at exit), but a
    graph that owns its pool releases it itself: a second release would be a double free."""
    import random

    from overlapbench.timing.cuda_graph import _abandon

    pool = (0, random.randrange(1, 1 << 20))
    calls = _allocator(monkeypatch, underway=True)
    invalidated = _Graph(end_works=False)  # CUDA invalidated the capture: capture_end fails before the allocator
    _abandon(invalidated, pool, began=True, end=True)
    assert invalidated.end_calls == 1 and calls == [("end", 3, pool), ("release", 3, pool)]

    calls = _allocator(monkeypatch, underway=True)
    failed_end = _Graph(end_works=False)  # capture_end itself raised: not called a second time
    _abandon(failed_end, pool, began=True, end=False)
    assert failed_end.end_calls == 0 and calls == [("end", 3, pool), ("release", 3, pool)]

    calls = _allocator(monkeypatch, underway=True)
    still_valid = _Graph(end_works=True)  # an error in the captured code; capture_end ends it as usual
    _abandon(still_valid, pool, began=True, end=True)
    assert still_valid.ended and calls == []  # the graph owns its pool: it goes with the graph

    calls = _allocator(monkeypatch, underway=False)
    _abandon(_Graph(end_works=False), pool, began=False, end=False)  # capture_begin failed before the allocator
    assert calls == [("end", 3, pool)]  # nothing counted, nothing released


def _capture_failures(rank: int, world: int, failing: list[int], seed: int) -> list:
    from overlapbench.timing.measure import _failures

    why = f"out of memory {random.Random(seed + rank).randrange(1 << 30)}" if rank in failing else None
    return _failures(why)


@pytest.mark.slow
@pytest.mark.parametrize("failing", [[], [1], [0, 1]])
def test_every_rank_learns_which_rank_failed_its_capture_and_why(failing):
    """The row is rank 0's: where another rank's capture failed, it names that rank and its reason."""
    seed = random.randrange(1 << 20)
    results = distributed.run(_capture_failures, failing, seed, world=2)
    expected = [(r, f"out of memory {random.Random(seed + r).randrange(1 << 30)}") for r in failing]
    assert results == [expected, expected]
