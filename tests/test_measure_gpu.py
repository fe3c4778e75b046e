"""On a GPU: the paired (interleaved) ratio of two candidates is the ratio of long runs of each.

If the span per candidate per round were too short for the clock's sustained regime, the paired
ratio would measure a boosted regime that long runs never see, and this would fail. If the
candidates were not settled before their spans, one that idles the SMs for part of its step
would be timed at the clock of the round's mix, not at its own (docs/timing.md, "Each choice at
its own clock"), and the second test would fail.
"""

from __future__ import annotations

import statistics

import pytest

from overlapbench.specs.spec_sections import Measure
from overlapbench.timing import bench, interleave
from overlapbench.timing.cuda_graph import capture
from overlapbench.timing.interleave import Plan

pytestmark = pytest.mark.gpu


def gemm_chain(length: int, m: int = 2048, n: int = 8192, k: int = 8192):
    """A CUDA graph of `length` bf16 GEMMs: its replay, and the buffers it needs kept alive."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(length)
    a = torch.randn(m, k, generator=g, device="cuda").bfloat16()
    w = (torch.randn(k, n, generator=g, device="cuda") / k**0.5).bfloat16()
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    def chain():
        for _ in range(length):
            torch.matmul(a, w, out=out)

    graph = capture(chain, warmup=1)
    return graph.replay, (a, w, out, graph)


def long_run_ms(run, seconds: float, per_iter_ms: float) -> float:
    """Mean ms per iteration over a run of `seconds`, after the host sync a sequential mode has."""
    count = max(1, round(seconds * 1e3 / per_iter_ms))
    return bench.bench(run, 0.0, 0.0, iters=1, calls_per_sample=count, clock=bench.CudaClock()).samples_ms[0]


def long_ratios(a, b, per_a_ms: float, per_b_ms: float, seconds: float, settle_s: float = 0.0) -> list[float]:
    """A over B from long runs of each, in two ABBA orders (a linear drift cancels in each pair):
    each run `seconds` long, after `settle_s` of the same run untimed (its own clock's regime)."""
    ratios = []
    for _ in range(2):
        times = []
        for run, per in ((a, per_a_ms), (b, per_b_ms), (b, per_b_ms), (a, per_a_ms)):
            if settle_s > 0:
                long_run_ms(run, settle_s, per)
            times.append(long_run_ms(run, seconds, per))
        ratios += [times[0] / times[1], times[3] / times[2]]
    return ratios


def test_the_paired_ratio_is_the_ratio_of_long_runs():
    import torch

    torch.cuda.set_device(0)
    (a, _keep_a), (b, _keep_b) = gemm_chain(8), gemm_chain(7)  # the buffers live as long as the test
    per = {name: long_run_ms(run, 0.5, 1.0) for name, run in (("A", a), ("B", b))}  # warm, and the estimate
    long = long_ratios(a, b, per["A"], per["B"], seconds=1.0)
    # The sweep's default settling and span (spec_sections.Measure): the timing under test. A 200 ms span
    # with no settling measured [1.1348, 1.1476] against long runs at 1.1414-1.1484 on 2x H200 (too wide to decide).
    plan = Plan(span_ms=Measure.span_ms, max_rounds=100, ci_target=0.002, warmup_s=1.0, settle_ms=Measure.settle_ms)
    ref, other = interleave.time_rounds([a, b], [per["A"], per["B"]], 0, plan, bench.CudaClock())
    lo, hi = other.speedup_ci
    print(f"paired A/B {other.speedup:.4f} [{lo:.4f}, {hi:.4f}] over {len(other.samples_ms)} rounds; "
          f"long runs {statistics.median(long):.4f} ({', '.join(f'{x:.4f}' for x in long)})")
    assert hi - lo < 0.01
    assert lo <= max(long) and min(long) <= hi, "the paired interval misses every long-run ratio"


def gapped_chain(length: int, gap_share: float):
    """A GEMM chain (gemm_chain(length), m = 8192: at the power cap on an H100 or H200) followed by
    an idle `_sleep` of `gap_share` of the whole step, as a blocking all-reduce leaves the SMs
    idle: its replay, and what it keeps alive. The sleep is sized once, at the clock then."""
    import torch

    replay, keep = gemm_chain(length, m=8192)
    chain_ms = long_run_ms(replay, 0.5, 10.0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles_per_ms = 10_000_000 / start.elapsed_time(end)
    cycles = int(cycles_per_ms * chain_ms * gap_share / (1 - gap_share))

    def step() -> None:
        replay()
        torch.cuda._sleep(cycles)

    return step, keep


def test_a_candidate_that_idles_is_timed_at_its_own_clock():
    """A chain with idle gaps (a baseline's blocking all-reduce) against a busy chain: the paired
    ratio at the sweep's default settling and span is that of long runs of each (each at its own
    clock); with no settling in 20 ms spans it is printed beside, for the record."""
    import torch

    torch.cuda.set_device(0)
    (idle, _keep_a), (busy, _keep_b) = gapped_chain(6, 0.25), gemm_chain(7, m=8192)
    per = {name: long_run_ms(run, 1.0, 10.0) for name, run in (("idle", idle), ("busy", busy))}
    long = long_ratios(idle, busy, per["idle"], per["busy"], seconds=2.0, settle_s=1.0)
    settled = Plan(span_ms=Measure.span_ms, max_rounds=40, ci_target=0.002, warmup_s=1.0, settle_ms=Measure.settle_ms)
    shared = Plan(span_ms=20.0, max_rounds=200, ci_target=0.002, warmup_s=1.0)
    (_, got), (_, before) = (interleave.time_rounds([idle, busy], [per["idle"], per["busy"]], 0, plan, bench.CudaClock())
                             for plan in (settled, shared))
    lo, hi = got.speedup_ci
    print(f"idle/busy: long runs {statistics.median(long):.4f} ({', '.join(f'{x:.4f}' for x in long)}); "
          f"settled {got.speedup:.4f} [{lo:.4f}, {hi:.4f}] over {len(got.samples_ms)} rounds; "
          f"20 ms spans, no settling {before.speedup:.4f}")
    assert lo <= max(long) * 1.005 and min(long) * 0.995 <= hi, "the settled interval misses the long runs' ratio"
