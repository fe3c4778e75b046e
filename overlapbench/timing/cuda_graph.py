"""CUDA-graph capture that leaves nothing behind when it fails: what `bench(graphs=True)`,
`measure.runner` and the scripts that replay a graph capture with."""

from __future__ import annotations

from collections.abc import Callable

import torch


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
