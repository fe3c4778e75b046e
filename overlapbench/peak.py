"""The device's dense bf16 peak that a layer row's `peak_frac` is measured against.

Measured, once per process and device, on a bf16 GEMM of 8192 x 8192 x 8192 on random inputs:

  peak_tflops       the burst rate: 3 warm-up products, then the median of 10 timed one by
                    one, from a rested GPU (the process's start). This is the figure the
                    workplace's notes quote for an H200 (about 790 TFLOP/s against a datasheet
                    989): what the tensor cores give while the clocks are at their highest.
  sustained_tflops  the same product after a second of back-to-back products, once the card
                    holds its power limit and its clocks drop: the rate any long run of GEMMs,
                    a layer's included, can at most keep up.

`peak_frac` is against the burst rate, the conservative reading; the sustained rate is in the
row to say how much of the gap is the power limit rather than the layer. Rows record both and
`peak_source`; on CPU there is none.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass

import torch

SIZE = 8192
SOURCE = (f"measured: bf16 GEMM {SIZE}^3 on random data, median of 10 after 3 warm-ups (burst); "
          "sustained: median of 5 batches of 20 after 1 s of products")


@dataclass(frozen=True)
class Peak:
    tflops: float  # burst
    sustained_tflops: float
    source: str = SOURCE


def dense_peak(device: torch.device) -> Peak | None:
    """The measured dense bf16 peak of `device` (None on CPU)."""
    if device.type != "cuda":
        return None
    return _measure(torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device()))


def _tflops(ms: float) -> float:
    return round(2 * SIZE**3 / ms / 1e9, 1)


def _timed(fn, times: int = 1) -> float:
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(times):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / times


@functools.cache
def _measure(device: torch.device) -> Peak:
    with torch.cuda.device(device):
        burst, sustained = _rates(device)
        torch.cuda.empty_cache()
    return Peak(_tflops(burst), _tflops(sustained))


def _rates(device: torch.device) -> tuple[float, float]:
    """ms per product: burst (rested GPU), sustained (after a second of products)."""
    g = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(SIZE, SIZE, generator=g, device=device).bfloat16() for _ in range(2))
    out = torch.empty(SIZE, SIZE, dtype=torch.bfloat16, device=device)
    product = lambda: torch.mm(a, b, out=out)
    for _ in range(3):
        product()
    torch.cuda.synchronize()
    burst = statistics.median(_timed(product) for _ in range(10))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            product()
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end:
        graph.replay()
        torch.cuda.synchronize()
    return burst, statistics.median(_timed(graph.replay) / 20 for _ in range(5))
