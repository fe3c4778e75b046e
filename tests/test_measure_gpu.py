"""On a GPU: the paired (interleaved) ratio of two candidates is the ratio of long runs of each.

If the span per candidate per round were too short for the clock's sustained regime, the paired
ratio would measure a boosted regime that long runs never see, and this would fail.
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


def test_the_paired_ratio_is_the_ratio_of_long_runs():
    import torch

    torch.cuda.set_device(0)
    (a, _keep_a), (b, _keep_b) = gemm_chain(8), gemm_chain(7)  # the buffers live as long as the test
    per = {name: long_run_ms(run, 0.5, 1.0) for name, run in (("A", a), ("B", b))}  # warm, and the estimate
    long = []
    for _ in range(2):  # ABBA: a linear drift cancels in the pair
        ta1, tb1, tb2, ta2 = (long_run_ms(r, 1.0, per[n]) for n, r in (("A", a), ("B", b), ("B", b), ("A", a)))
        long += [ta1 / tb1, ta2 / tb2]
    # The sweep's default settling and span (spec_sections.Measure): the timing under test. A 200 ms span
    # with no settling measured [1.1348, 1.1476] against long runs at 1.1414-1.1484 on 2x H200 (too wide to decide).
    plan = Plan(span_ms=Measure.span_ms, max_rounds=100, ci_target=0.002, warmup_s=1.0, settle_ms=Measure.settle_ms)
    ref, other = interleave.time_rounds([a, b], [per["A"], per["B"]], 0, plan, bench.CudaClock())
    lo, hi = other.speedup_ci
    print(f"paired A/B {other.speedup:.4f} [{lo:.4f}, {hi:.4f}] over {len(other.samples_ms)} rounds; "
          f"long runs {statistics.median(long):.4f} ({', '.join(f'{x:.4f}' for x in long)})")
    assert hi - lo < 0.01
    assert lo <= max(long) and min(long) <= hi, "the paired interval misses every long-run ratio"
