"""The device's dense bf16 peak that a layer row's `peak_frac` is measured against.

`peak_tflops`, the denominator, is the rate a bf16 GEMM of 8192 x 8192 x 8192 on random data
reaches at burst clocks: from `TABLE` where the device is listed (what that GEMM measured on
the workplace's machines: the same denominator in every run, so rows of two runs compare), else
measured in this process. `peak_source` says which. Every row also carries what this process
measured at its start, on the same GEMM:

  burst_tflops      3 warm-up products, then the median of 10 timed one by one (761-802
                    TFLOP/s on an H200 here, lower when the card is still warm from earlier work)
  sustained_tflops  the same product after a second of back-to-back products, once the card
                    holds its power limit and lowers its clocks (666-689 on an H200): the rate any
                    long run of GEMMs, a layer's included, can at most keep up

so a reader can tell how much of a row's distance from the peak is the power limit rather than
the layer. On CPU there is none.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from overlapbench.timing.bench import CudaClock, bench
from overlapbench.timing.cuda_graph import capture

SIZE = 8192
MEASURED = f"measured: bf16 GEMM {SIZE}^3 on random data, median of 10 after 3 warm-ups, at this process's start"
# By device name: the 8192^3 bf16 GEMM's burst rate on this workplace's machines (H200: 788 in the
# device notes, 761-802 at the start of this branch's runs, results/h200/; datasheet 989).
TABLE = {"NVIDIA H200": 790.0}


@dataclass(frozen=True)
class Peak:
    tflops: float  # the denominator of peak_frac
    source: str
    burst_tflops: float  # measured at the process's start
    sustained_tflops: float


def dense_peak(device: torch.device) -> Peak | None:
    """The dense bf16 peak of `device`, with this process's measurements (None on CPU)."""
    if device.type != "cuda":
        return None
    return _measure(torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device()))


def _tflops(ms: float) -> float:
    return round(2 * SIZE**3 / ms / 1e9, 1)


@functools.cache
def _measure(device: torch.device) -> Peak:
    with torch.cuda.device(device):
        burst, sustained = _rates(device)
        torch.cuda.empty_cache()
    name = torch.cuda.get_device_name(device)
    if name in TABLE:
        source = f"table: {name}, the {SIZE}^3 bf16 GEMM's burst rate on this workplace's machines (overlapbench/timing/peak.py)"
        return Peak(TABLE[name], source, _tflops(burst), _tflops(sustained))
    return Peak(_tflops(burst), MEASURED, _tflops(burst), _tflops(sustained))


def _rates(device: torch.device) -> tuple[float, float]:
    """ms per product: burst (rested GPU), sustained (after a second of products)."""
    g = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(SIZE, SIZE, generator=g, device=device).bfloat16() for _ in range(2))
    out = torch.empty(SIZE, SIZE, dtype=torch.bfloat16, device=device)
    product = lambda: torch.mm(a, b, out=out)
    one_by_one = dict(clock=CudaClock(), before_each=torch.cuda.synchronize)  # each sample from an idle GPU
    burst = bench(product, 0.0, 0.0, warmup=3, iters=10, **one_by_one).median_ms
    graph = capture(lambda: [product() for _ in range(20)], warmup=0)  # warm already
    # after a second of replays, each waited for: the card holds its power limit
    sustained = bench(graph.replay, 1000.0, 0.0, iters=5, **one_by_one)
    return burst, sustained.median_ms / 20
