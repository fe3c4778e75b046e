"""`comm --beside-gemm` and `--beside-layer`: a path timed while compute runs beside it.

Busbw alone does not decide an overlapped strategy's SM budget: what matters is the pair (how
fast the communication runs next to the compute, how much compute throughput it takes from it).
The compute is a *stream*: anything with `run(passes)`, its one pass's time alone (`alone_ms`)
and `fields(beside_ms)`, the row fields of one pass's time beside the path. Here, the GEMM
stream of `--beside-gemm`: a layer's MLP of llama3-70b at TP=2 (gate/up 8192 -> 2 x 14336, down
14336 -> 8192) on `GEMM_TOKENS` tokens; `comm.beside_layer` gives the layer's own kernels. The
compute runs on the current stream; the path on its own high-priority stream. Four windows per
round; the first two take each number while the other side is busy all along:

- comm window: the compute starts first and lasts longer than the path's ops (sized from the
  times alone); the path's time is its own stream's elapsed time over its ops.
- compute window: the path's ops start first and last longer than one compute pass; the
  pass's time is its stream's elapsed time.
- alone window: the compute window without the path's ops: the same streams, one pass timed on
  its stream after the ranks meet.
- one-call window: the compute window with one call of the path, issued first and not repeated,
  as a split issues a reduction just as the next compute block starts; the call's own time there
  is timed too, on its stream.

The comm window comes first in every round; the other three follow in an order reversed from one
round to the next (alone, beside, one call in even rounds), so each of them stands first and last
among them as often.

The compute's loss is taken two ways, both in the rows: paired, from each round's pass alone and
beside (comm/paired_loss.py: `compute_loss_paired`, `gemm_loss_paired`; and the pass's extra beside
one call, `compute_one_call_extra_ms`, `gemm_one_call_extra_ms`), and, as rows made before
it hold it, 1 - the pass timed alone by `time_alone` (its own harness, each pass from an idle
device) / the median pass beside (for the GEMMs, `gemm_loss` = 1 - TFLOP/s beside / TFLOP/s
alone, the same number). The time alone also sizes the windows. Eager launches of the path (no
graphs): the GEMM stream is queued far ahead anyway; the layer stream replays a CUDA graph per pass.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from overlapbench.comm.paired_loss import GEMM, PairedLoss, compute_loss

if TYPE_CHECKING:
    from overlapbench.distributed.runtime import Runtime

GEMM_TOKENS = 4096  # half of an 8192-token batch: one chunk of a token split
HIDDEN, FFN_PER_RANK = 8192, 14336  # llama3-70b, TP=2
COVER = 1.5  # the busy side lasts this many times the measured side (from times alone)
MIN_TIMED_MS = 1.0  # the path's ops timed in the comm window last at least this long (alone)


def mlp_shapes(tokens: int = GEMM_TOKENS) -> list[tuple[int, int, int]]:
    """(m, k, n) of the MLP's GEMMs: gate/up fused, then down."""
    return [(tokens, HIDDEN, 2 * FFN_PER_RANK), (tokens, FFN_PER_RANK, HIDDEN)]


@dataclass
class GemmStream:
    """The MLP GEMMs with their operands, made once per run."""

    operands: list  # (a, b, out) per GEMM
    prefix = GEMM  # of its paired loss's fields (comm/paired_loss.py)
    flops: float  # of one pass over the GEMMs
    alone_ms: float = 0.0  # one pass, alone (median)

    @classmethod
    def make(cls, device, shapes: list[tuple[int, int, int]] | None = None) -> GemmStream:
        import torch

        shapes = shapes or mlp_shapes()
        g = torch.Generator(device=device).manual_seed(1234)
        operands = [(torch.randn(m, k, device=device, generator=g, dtype=torch.bfloat16),
                     torch.randn(k, n, device=device, generator=g, dtype=torch.bfloat16),
                     torch.empty(m, n, device=device, dtype=torch.bfloat16)) for m, k, n in shapes]
        return cls(operands, float(sum(2 * m * k * n for m, k, n in shapes)))

    def run(self, passes: int = 1) -> None:
        import torch

        for _ in range(passes):
            for a, b, out in self.operands:
                torch.matmul(a, b, out=out)

    def tflops(self, ms: float) -> float:
        return self.flops / (ms * 1e-3) / 1e12

    def fields(self, beside_ms: float) -> dict:
        """The row fields of one pass that took `beside_ms` beside the path."""
        alone, beside = self.tflops(self.alone_ms), self.tflops(beside_ms)
        return {"gemm_tflops_alone": alone, "gemm_tflops_beside": beside, "gemm_loss": compute_loss(self.alone_ms, beside_ms),
                "gemm_tokens": GEMM_TOKENS}


def _elapsed_ms(stream, fn: Callable[[], None]) -> Callable[[], float]:
    """Run `fn` on `stream` between two marks (bench.timed_span); returns a reader of their
    elapsed time, for once the work is done."""
    import torch

    from overlapbench.timing.bench import CudaClock, timed_span

    clock = CudaClock()
    with torch.cuda.stream(stream):
        span = timed_span(clock, fn)
    return lambda: clock.elapsed_ms(*span)


def _sync(rt: Runtime) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.synchronize()
    dist.barrier(group=rt.control)


def time_alone(rt: Runtime, stream, iters: int) -> float:
    """Median ms of one pass of a compute stream alone (two passes to warm; each pass from an
    idle device, after the ranks meet); max over ranks."""
    from overlapbench.timing.bench import CudaClock, bench

    timed = bench(stream.run, 0.0, 0.0, warmup=2, iters=iters, clock=CudaClock(), before_each=lambda: _sync(rt))
    return rt.max_over_ranks(timed.median_ms)


def measure_beside(rt: Runtime, run: Callable[[], None], op_ms: float, compute,
                   iters: int) -> tuple[float, float, PairedLoss]:
    """The path's `run` (one op, `op_ms` alone) beside a compute stream `compute` (run(passes),
    alone_ms), in max(`iters`, MIN_ROUNDS) rounds: (the path's ms per op beside it, one compute
    pass's ms beside the path, medians, each the max over ranks; and each round's pass alone,
    beside and beside one call, each the max over ranks).

    Its own loop, not `bench` or interleave's rounds: a round is four windows, each marking a
    span on one stream, the other stream running beside it in all but the alone window; the spans
    are bench.timed_span's."""
    import torch

    from overlapbench.comm.in_layer import MIN_ROUNDS
    from overlapbench.timing.interleave import ranks_max

    main = torch.cuda.current_stream()
    comm = torch.cuda.Stream(priority=-100)  # as the overlapped strategies' communication lane
    timed_ops = max(1, math.ceil(MIN_TIMED_MS / op_ms))
    passes = max(2, math.ceil(COVER * timed_ops * op_ms / compute.alone_ms))  # comm window: compute covers the ops
    ops = max(2, math.ceil(COVER * compute.alone_ms / op_ms))  # compute window: ops cover one pass

    def repeat(times: int) -> Callable[[], None]:
        return lambda: [run() for _ in range(times)]

    def compute_window(calls: int) -> tuple[Callable[[], float], Callable[[], float]]:
        """One pass timed on its stream after the ranks meet, beside `calls` of the path's ops
        issued first on the comm stream (0: alone): readers of the pass's time and the ops'."""
        _sync(rt)
        comm.wait_stream(main)
        ops_span = _elapsed_ms(comm, repeat(calls))  # started first
        measured = _elapsed_ms(main, compute.run)
        main.wait_stream(comm)
        torch.cuda.synchronize()
        return measured, ops_span

    comm_ms, one_call_op_ms = [], []
    # the path's calls -> the passes timed: alone, beside (the ops outlast the pass), beside one call
    windows = {0: [], 1 + ops: [], 1: []}
    for round_number in range(max(iters, MIN_ROUNDS)):
        _sync(rt)
        comm.wait_stream(main)
        compute.run(1)  # started first
        _elapsed_ms(main, lambda: compute.run(passes))
        timed = _elapsed_ms(comm, repeat(timed_ops))
        main.wait_stream(comm)
        torch.cuda.synchronize()
        comm_ms.append(timed() / timed_ops)
        order = list(windows) if round_number % 2 == 0 else list(windows)[::-1]  # alone first in even rounds
        for calls in order:
            pass_ms, ops_ms = compute_window(calls)
            windows[calls].append(pass_ms())
            if calls == 1:
                one_call_op_ms.append(ops_ms())  # the one call's own time beside the pass
    agree = ranks_max(rt)
    paired = PairedLoss(*(tuple(agree(times)) for times in windows.values()),  # alone, beside, beside one call
                        one_call_op_ms=tuple(agree(one_call_op_ms)))
    compute_ms = windows[1 + ops]
    return rt.max_over_ranks(statistics.median(comm_ms)), rt.max_over_ranks(statistics.median(compute_ms)), paired
