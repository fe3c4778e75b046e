"""bench, the one timing primitive, on CPU: the counts it runs (given, or filling a budget of
time), the samples and their statistics, the hooks around them, and its errors."""

from __future__ import annotations

import math
import random
import re
import statistics

import pytest
import torch

from overlapbench.timing import bench as timing
from overlapbench.timing.bench import Timing, WallClock, bench
from tests.fake_time import FakeTime


class Counted:
    """A random matmul (fresh inputs, never zeros) that counts its calls."""

    def __init__(self, n: int = 48) -> None:
        g = torch.Generator().manual_seed(random.randrange(1 << 30))
        self.a, self.b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
        self.out = torch.empty(n, n)
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        torch.mm(self.a, self.b, out=self.out)


def test_counts_given_are_run_exactly_and_each_sample_is_a_call():
    work = Counted()
    warmup, iters, calls = random.randrange(0, 4), random.randrange(1, 9), random.randrange(1, 4)
    samples_before = []
    timed = bench(work, 0.0, 0.0, warmup=warmup, iters=iters, calls_per_sample=calls,
                  before_each=lambda: samples_before.append(work.calls))
    assert work.calls == warmup + iters * calls
    assert len(timed.samples_ms) == iters and all(s > 0 for s in timed.samples_ms)
    assert not timed.graphs and timed.graph_error is None
    assert samples_before == list(range(warmup)) + [warmup + i * calls for i in range(iters)]  # outside the spans
    assert torch.allclose(work.out, work.a @ work.b)  # the work ran


def test_the_statistics_agree_with_the_samples():
    timed = bench(Counted(), 0.0, 0.0, iters=random.randrange(2, 12))
    xs = timed.samples_ms
    assert timed.min_ms == min(xs) <= timed.median_ms <= max(xs) == timed.max_ms
    assert timed.mean_ms == pytest.approx(sum(xs) / len(xs))
    assert timed.median_ms == statistics.median(xs)
    per = random.randrange(1, 5)
    summary = timed.summary(per)
    assert summary["ms"] == pytest.approx(timed.median_ms / per)
    assert summary["p10_ms"] <= summary["ms"] <= summary["p90_ms"] and summary["iqr_ms"] >= 0
    one = Timing([random.uniform(0.1, 2.0)])
    assert one.summary() == {"ms": one.min_ms, "p10_ms": one.min_ms, "p90_ms": one.min_ms, "iqr_ms": 0.0, "cv": 0.0}


def test_budgets_fill_their_time(monkeypatch):
    """The warm-up runs its count, then as many calls as fill warmup_ms; the samples fill rep_ms
    at the warm-up's estimate of a call (budgets set halfway between two counts)."""
    fake = FakeTime(monkeypatch, per_call_ms=random.uniform(0.05, 3.0))
    per = fake.per_call_ms
    warmup, extra_warm = random.randrange(0, 4), random.randrange(1, 20)
    iters, extra_samples, calls = random.randrange(1, 5), random.randrange(1, 30), random.randrange(1, 4)
    first = max(warmup, 1)
    warmup_ms = (first + extra_warm - 0.5) * per  # ceil: extra_warm more
    rep_ms = (iters + extra_samples - 0.5) * per * calls  # int + 1: iters + extra_samples
    timed = bench(fake.fn, warmup_ms, rep_ms, warmup=warmup, iters=iters, calls_per_sample=calls, clock=WallClock())
    assert len(timed.samples_ms) == iters + extra_samples
    assert fake.calls == first + extra_warm + len(timed.samples_ms) * calls
    assert timed.samples_ms == pytest.approx([per] * len(timed.samples_ms))


def test_a_budget_never_gives_fewer_than_iters_nor_more_than_max_iters(monkeypatch):
    fake = FakeTime(monkeypatch, per_call_ms=random.uniform(0.05, 3.0))
    iters = random.randrange(5, 10)
    few = bench(fake.fn, 0.0, 0.5 * fake.per_call_ms, iters=iters, clock=WallClock())
    assert len(few.samples_ms) == iters
    cap = random.randrange(iters, 40)
    many = bench(fake.fn, 0.0, 1e4 * fake.per_call_ms, iters=iters, max_iters=cap, clock=WallClock())
    assert len(many.samples_ms) == cap
    assert len(bench(fake.fn, 0.0, 1e4 * fake.per_call_ms, iters=cap + 3, max_iters=cap, clock=WallClock()).samples_ms) == cap + 3


def test_counts_from_budgets_go_through_agree_and_given_counts_do_not(monkeypatch):
    """Where ranks time together, each count a budget gives is agreed (their max); counts the
    caller gives are the same on every rank already."""
    fake = FakeTime(monkeypatch, per_call_ms=random.uniform(0.05, 3.0))
    per, bump = fake.per_call_ms, random.randrange(1, 6)
    asked = []

    def agree(count: int) -> int:
        asked.append(count)
        return count + bump

    timed = bench(fake.fn, 3.5 * per, 4.5 * per, iters=1, clock=WallClock(), agree=agree)
    assert asked == [3, 5]  # 3 warm-up calls after the first; 5 samples
    assert fake.calls == 1 + 3 + bump + 5 + bump and len(timed.samples_ms) == 5 + bump
    asked.clear()
    bench(fake.fn, 0.0, 0.0, warmup=2, iters=3, clock=WallClock(), agree=agree)
    assert asked == []


def test_before_loop_runs_once_between_the_warm_up_and_the_samples():
    work, order = Counted(), []
    warmup, iters = random.randrange(1, 4), random.randrange(1, 5)
    bench(work, 0.0, 0.0, warmup=warmup, iters=iters, before_loop=lambda: order.append(work.calls))
    assert order == [warmup] and work.calls == warmup + iters


def test_warm_up_estimates_a_call(monkeypatch):
    fake = FakeTime(monkeypatch, per_call_ms=random.uniform(0.05, 3.0))
    warmup = random.randrange(0, 5)
    assert timing.warm_up(fake.fn, warmup, 0.0, WallClock()) == pytest.approx(fake.per_call_ms)
    assert fake.calls == max(warmup, 1)


def test_a_span_marks_its_calls():
    work, clock = Counted(), WallClock()
    calls = random.randrange(1, 5)
    start, end = timing.timed_span(clock, work, calls)
    assert work.calls == calls and clock.elapsed_ms(start, end) > 0


@pytest.mark.parametrize("kwargs, message", [
    ({"warmup_ms": -1.0}, "warmup_ms must be a finite number of ms >= 0, got -1.0"),
    ({"rep_ms": math.nan}, "rep_ms must be a finite number of ms >= 0, got nan"),
    ({"rep_ms": "10"}, "rep_ms must be a finite number of ms >= 0, got '10'"),
    ({"warmup": -1}, "warmup must be an integer >= 0, got -1"),
    ({"iters": 0}, "iters must be an integer >= 1, got 0"),
    ({"iters": True}, "iters must be an integer >= 1, got True"),
    ({"iters": 2.0}, "iters must be an integer >= 1, got 2.0"),
    ({"calls_per_sample": 0}, "calls_per_sample must be an integer >= 1, got 0"),
    ({"max_iters": 0}, "max_iters must be an integer >= 1, got 0"),
    ({"graphs": True, "clock": WallClock()}, "graphs=True replays a CUDA graph"),
])
def test_bad_arguments_are_refused_before_anything_runs(kwargs, message):
    work = Counted()
    with pytest.raises(ValueError, match="^" + re.escape(f"bench: {message}")):
        bench(work, **kwargs)
    assert work.calls == 0


def test_fn_must_be_callable():
    with pytest.raises(TypeError, match="^bench: fn must be a callable of no arguments, got Tensor$"):
        bench(torch.randn(3))
