"""The device's dense bf16 peak that a layer row's `peak_frac` is measured against.

Measured, once per process and device: a bf16 GEMM of 8192 x 8192 x 8192 on random inputs,
replayed from a CUDA graph, the median of several timed batches after a warm-up long enough
for the clocks to settle. That is what a large, well-shaped GEMM reaches on this card as it is
(about 790 TFLOP/s on an H200 of this workplace, against 989 on the datasheet), so `peak_frac`
says how close the layer's compute runs to what the hardware allows, not to a datasheet figure
no kernel reaches. Rows record the value and how it was obtained (`peak_tflops`,
`peak_source`); on CPU there is none.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass

import torch

SIZE = 8192
SOURCE = f"measured: bf16 GEMM {SIZE}^3, CUDA-graph replay, median of 5 batches of 20"


@dataclass(frozen=True)
class Peak:
    tflops: float
    source: str


def dense_peak(device: torch.device) -> Peak | None:
    """The measured dense bf16 peak of `device` (None on CPU)."""
    if device.type != "cuda":
        return None
    return _measure(torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device()))


@functools.cache
def _measure(device: torch.device, warmup_s: float = 1.0, batches: int = 5, per_batch: int = 20) -> Peak:
    g = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(SIZE, SIZE, generator=g, device=device).bfloat16() for _ in range(2))
    out = torch.empty(SIZE, SIZE, dtype=torch.bfloat16, device=device)
    with torch.cuda.device(device):
        torch.mm(a, b, out=out)  # the library's plan, chosen before capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(per_batch):
                torch.mm(a, b, out=out)
        end = time.perf_counter() + warmup_s
        while time.perf_counter() < end:
            graph.replay()
            torch.cuda.synchronize()
        times = []
        for _ in range(batches):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / per_batch)
    del graph, a, b, out
    torch.cuda.empty_cache()
    return Peak(round(2 * SIZE**3 / statistics.median(times) / 1e9, 1), SOURCE)
