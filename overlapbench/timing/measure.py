"""Timing and statistics: CUDA events over graph replays on GPU, wall clocks on CPU.

A layer is as slow as its slowest rank, so each iteration's time is the max over ranks.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from overlapbench.errors import one_line
from overlapbench.timing.step import Step


@dataclass
class Timing:
    samples_ms: list[float]  # per iteration: the stack's time, max over ranks
    graphs: bool  # whether CUDA-graph replay was timed
    graph_error: str | None = None  # why capture failed, when it fell back to eager


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error ||out - ref|| / ||ref||, in fp32; inf for NaN/inf output."""
    out, ref = out.float(), ref.float()
    err = torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)
    return float(err) if torch.isfinite(err) else float("inf")


def capture(fn: Callable[[], object], warmup: int = 2) -> torch.cuda.CUDAGraph:
    """`fn` captured in a CUDA graph, after `warmup` calls on a side stream (as capture requires).
    The caller keeps the graph (and what `fn` reads and writes) alive while it replays it.

    A capture that fails (out of memory, an error inside `fn`, a capture CUDA invalidated) is
    ended and its memory released before the error goes on (`_abandon`), and the current stream
    is restored: the process runs its next points, and exits, as if it had never begun."""
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(warm)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # as torch.cuda.graph does: the most memory for the capture
    graph = torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle()  # its id known here: a failed capture's graph cannot say it
    began = False
    with torch.cuda.stream(torch.cuda.Stream()):  # restored however the capture ends
        try:
            graph.capture_begin(pool=pool)
            began = True
            fn()
        except BaseException:
            _abandon(graph, pool, began, end=began)
            raise
        try:
            graph.capture_end()
        except BaseException:
            _abandon(graph, pool, began=True, end=False)
            raise
    torch.cuda.synchronize()
    return graph


def _abandon(graph, pool, began: bool, end: bool) -> None:
    """End a capture that failed, and give back what it allocated.

    capture_begin tells the caching allocator that allocations go to `pool` while the capture
    runs (and counts a use of the pool); capture_end tells it that this has ended, but only after
    CUDA ended the capture without error (torch 2.11: CUDAGraph::capture_end checks
    cudaStreamEndCapture's result before endAllocateToPool), and the graph releases the pool only
    after a capture that ended. After a capture CUDA invalidated (running out of memory inside it
    frees cached blocks, which capture forbids) the allocator would go on believing a capture
    underway: it frees nothing more (empty_cache skips) and aborts the process at exit
    (`captures_underway.empty() INTERNAL ASSERT FAILED`, when a MemPool is destroyed). So: end
    the capture where it may still run (`end`); unless the graph got as far as owning the pool,
    end the pool's allocation here and release the pool once (`began`: its use was counted)."""
    if end:
        try:
            graph.capture_end()  # where it succeeds, the graph owns the pool, as after any capture
        except Exception:
            pass
    try:
        graph.pool()  # raises unless capture_end got past the allocator
        return
    except Exception:
        pass
    device = torch.cuda.current_device()
    stop = getattr(torch._C, "_cuda_endAllocateToPool", None) or torch._C._cuda_endAllocateCurrentStreamToPool
    try:
        stop(device, pool)
        underway = True
    except Exception:  # not allocating to it: never began, or capture_end had told it
        underway = False
    if underway or began:
        torch._C._cuda_releasePool(device, pool)


def _capture(step: Step, x: torch.Tensor):
    """A replay function for the step's CUDA graph."""
    return capture(lambda: step.forward(x)).replay


def runner(step: Step, x: torch.Tensor, graphs: bool) -> tuple[Callable[[], object], bool, str | None]:
    """What one timed iteration runs: the step's CUDA-graph replay where `graphs` and every rank
    captured it, else its eager forward; whether it is the graph, and why not where capture failed."""
    run, used_graphs, error = (lambda: step.forward(x)), False, None
    if x.device.type != "cuda" or not (graphs and step.graphable):
        return run, used_graphs, error
    try:
        replay = _capture(step, x)
    except Exception as e:
        error = one_line(e, limit=300)
    failed = _failures(error)
    if not failed:  # every rank captured
        run, used_graphs = replay, True
    else:  # the row is written by rank 0: it names the rank that failed and why
        rank, why = failed[0]
        error = f"capture failed on rank {rank}: {why}"
    return run, used_graphs, error


def _failures(error: str | None) -> list[tuple[int, str]]:
    """(rank, reason) of every rank whose capture failed, lowest rank first; the same on every rank."""
    errors: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return [(rank, why) for rank, why in enumerate(errors) if why is not None]


MAX_ITERS = 2000


def time_step(
    step: Step, x: torch.Tensor, warmup: int, iters: int, graphs: bool,
    warmup_s: float = 0.0, min_time_s: float = 0.0,
) -> Timing:
    """Per-iteration times of `step`, max over ranks.

    Warm-up runs at least `warmup` iterations and `warmup_s` seconds, so clocks settle into
    the steady state the timed loop sees; the timed loop runs at least `iters` iterations and
    `min_time_s` seconds (at most MAX_ITERS), the same count on every rank.
    """
    if x.device.type != "cuda":
        return _time_wall(step, x, warmup, iters)
    run, used_graphs, error = runner(step, x, graphs)
    per_iter_s = _warm_up(run, warmup, warmup_s)
    iters = _iterations(iters, min_time_s, per_iter_s)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    dist.barrier()
    for start, end in zip(starts, ends):
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    local = torch.tensor([s.elapsed_time(e) for s, e in zip(starts, ends)], device=x.device)
    return Timing(_max_over_ranks(local), used_graphs, error)


def _warm_up(run, warmup: int, warmup_s: float, synchronize=torch.cuda.synchronize) -> float:
    """Run `warmup` iterations, then as many more as fill `warmup_s`; returns the seconds one
    iteration took. Every count is agreed over the ranks first: an iteration holds collectives
    and barriers, so a rank that ran one more than its peers would wait for them forever."""
    synchronize()
    t0 = time.perf_counter()
    first = max(warmup, 1)
    for _ in range(first):
        run()
    synchronize()
    per_iter_s = (time.perf_counter() - t0) / first
    more = _agreed_count(math.ceil(max(0.0, warmup_s - first * per_iter_s) / max(per_iter_s, 1e-6)))
    for done in range(1, more + 1):
        run()
        if done % 4 == 0:
            synchronize()  # the CPU stays close to the GPU: clocks see a steady load
    synchronize()
    return (time.perf_counter() - t0) / (first + more)


def _iterations(iters: int, min_time_s: float, per_iter_s: float) -> int:
    return _agreed_count(max(iters, min(MAX_ITERS, int(min_time_s / max(per_iter_s, 1e-6)) + 1)))


def _agreed_count(wanted: int) -> int:
    """The largest of the ranks' counts: each rank runs it, so all issue the same collectives."""
    count = torch.tensor([wanted], device=_collective_device())
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _time_wall(step: Step, x: torch.Tensor, warmup: int, iters: int) -> Timing:
    for _ in range(warmup):
        step.forward(x)
    samples = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        step.forward(x)
        samples.append((time.perf_counter() - t0) * 1e3)
    return Timing(_max_over_ranks(torch.tensor(samples)), graphs=False)


def _max_over_ranks(local: torch.Tensor) -> list[float]:
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return torch.stack(gathered).max(dim=0).values.tolist()


def summarize(samples_ms: list[float], per: int = 1) -> dict:
    """Median, p10, p90, IQR (ms, divided by `per`, e.g. the layer count) and CV of samples."""
    xs = sorted(s / per for s in samples_ms)
    if len(xs) == 1:
        return {"ms": xs[0], "p10_ms": xs[0], "p90_ms": xs[0], "iqr_ms": 0.0, "cv": 0.0}
    q = statistics.quantiles(xs, n=20, method="inclusive")  # 5% steps
    quartiles = statistics.quantiles(xs, n=4, method="inclusive")
    mean = statistics.fmean(xs)
    return {
        "ms": statistics.median(xs),
        "p10_ms": q[1],
        "p90_ms": q[17],
        "iqr_ms": quartiles[2] - quartiles[0],
        "cv": statistics.stdev(xs) / mean if mean > 0 else 0.0,
    }


def profile_step(step: Step, x: torch.Tensor, path, iterations: int = 3) -> None:
    """A few eager forwards under torch.profiler, their kernel table (by device time) to `path`;
    then one more forward's timeline (its device kernels, timeline.py) beside it. `path` None:
    profile, but write nothing (the other ranks join the forwards' collectives)."""
    from torch.profiler import ProfilerActivity, profile

    from overlapbench.timing import timeline

    cuda = x.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(iterations):
            step.forward(x)
        if cuda:
            torch.cuda.synchronize()
    if path is not None:
        table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=90)
        path.write_text(f"{iterations} eager forwards\n{table}\n")
    kernels = timeline.record(lambda: step.forward(x), cuda)
    if path is not None:
        timeline.write(kernels, timeline.beside(path))
