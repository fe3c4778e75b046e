"""NCCL's symmetric windows: buffers registered with a communicator so that NCCL (2.27+) runs
its symmetric kernels on them. Those kernels load from and store to the peers' copies of the
window directly (no multicast with NVLS off) and need far fewer CTAs than the ring kernels for
the same bandwidth (2x H200: 243 GB/s on 8 CTAs against 156 for the ring, all-reduce 64 MiB).

A window's memory comes from a torch MemPool on the group backend's NCCL allocator
(ncclMemAlloc), and the pool is registered with that group as symmetric: collective, every
rank in the same order, outside CUDA-graph capture. Each rank's tensor starts its registered
segment, so views at the same offset on every rank are symmetric buffers, which is what NCCL
asks of both the input and the output of a collective before it picks a symmetric kernel
(otherwise it quietly runs its ring). `runtime.Runtime.window` is the one caller: one window
per process group (its CTA budget) and dtype, kept for the run, and `release`d by
`runtime.Runtime.close` before the process group is destroyed: a pool that outlives its
communicator aborts the process at exit (torch 2.11 + NCCL 2.28: `NCCL communicator was aborted`,
thrown from `MemPool`'s destructor after every row was written).

Torch is imported inside the functions: `layout` serves the torch-free comm planning.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

MIN_NCCL = (2, 27)  # the first NCCL with symmetric kernels
ALIGN_BYTES = 4096  # every region of a window starts on a page: 16-byte vectors of any dtype stay aligned


def layout(counts: Sequence[int], element_size: int) -> tuple[list[int], int]:
    """Where regions of `counts` elements start when laid back to back on ALIGN_BYTES
    boundaries, and the elements they take in all (what a window must hold)."""
    step = max(1, ALIGN_BYTES // element_size)
    starts, end = [], 0
    for count in counts:
        starts.append(end)
        end += -(-count // step) * step
    return starts, end


def _nccl_version() -> tuple[int, ...]:
    import torch

    version = torch.cuda.nccl.version()
    if isinstance(version, int):  # older torch: NCCL's version code, major * 10000 + minor * 100 + patch
        return version // 10000, version // 100 % 100, version % 100
    return tuple(version)


def missing_support(env: Mapping[str, str] = os.environ) -> str | None:
    """Why this process cannot register symmetric windows (None: it can): no GPU, a torch
    without the APIs (named), an NCCL older than 2.27, or NVLink multicast not turned off in
    `env` (NCCL's symmetric kernels would use it). Needs no process group."""
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        return "needs CUDA GPUs"
    nccl_group = getattr(dist, "ProcessGroupNCCL", None) if dist.is_available() else None
    if nccl_group is None:
        return f"torch {torch.__version__} has no ProcessGroupNCCL"
    wanted = {
        "torch.cuda.MemPool": hasattr(torch.cuda, "MemPool"),
        "torch.cuda.use_mem_pool": hasattr(torch.cuda, "use_mem_pool"),
        "ProcessGroupNCCL.mem_allocator": hasattr(nccl_group, "mem_allocator"),
        "ProcessGroupNCCL.register_mem_pool": hasattr(nccl_group, "register_mem_pool"),
    }
    missing = [name for name, there in wanted.items() if not there]
    if missing:
        return f"torch {torch.__version__} lacks {', '.join(missing)}"
    if "symm" not in (nccl_group.register_mem_pool.__doc__ or "symm"):
        return f"torch {torch.__version__}: ProcessGroupNCCL.register_mem_pool takes no symm argument"
    version = _nccl_version()
    if version < MIN_NCCL:
        return f"NCCL {'.'.join(map(str, version))} has no symmetric kernels (2.27 or later)"
    if env.get("NCCL_NVLS_ENABLE") != "0":
        return "refused: NVLink multicast is not disabled (NCCL_NVLS_ENABLE != 0); NCCL's symmetric kernels would use it"
    return None


def allocator_refusal(group: dist.ProcessGroup, device: torch.device) -> str | None:
    """Why `group`'s NCCL backend gives no allocator for windows here (None: it gives one).
    torch can have the API and still refuse at run time: torch 2.11 with NCCL 2.28.9 raised "NCCL
    mem allocator is not supported in this NCCL version" on a one-GPU H200 (world size 1)."""
    try:
        group._get_backend(device).mem_allocator  # noqa: B018 (the property raises where it cannot)
    except RuntimeError as e:
        return f"torch's NCCL backend gives no window allocator here: {str(e).splitlines()[0]}"
    return None


@dataclass
class NcclWindow:
    """A flat tensor registered with `group` as a symmetric NCCL window."""

    tensor: torch.Tensor  # 1-D, this rank's, at the start of its registered segment
    pool: Any  # the MemPool: the registered memory lives as long as the window
    group: dist.ProcessGroup

    @property
    def numel(self) -> int:
        return self.tensor.numel()

    def view(self, start: int, shape: tuple[int, ...]) -> torch.Tensor:
        """`shape` elements from element `start` (the same offset on every rank: symmetric)."""
        count = 1
        for n in shape:
            count *= n
        if start + count > self.numel:
            raise ValueError(f"window of {self.numel} elements has no room for {count} from {start}")
        return self.tensor[start : start + count].view(shape)


def register(group: dist.ProcessGroup, device: torch.device, numel: int, dtype: torch.dtype,
             agree: Callable[[str | None], str | None]) -> NcclWindow:
    """Allocate `numel` elements from a pool on `group`'s NCCL allocator and register the pool
    with the group as a symmetric window. Collective. `agree(error)` gathers every rank's
    allocation error (None: allocated) and returns the first one: a rank that could not
    allocate must not leave the others waiting in the collective registration."""
    import torch
    import torch.distributed as dist

    backend = group._get_backend(device)
    # torch registers only with a communicator that exists; the first collective makes it
    dist.all_reduce(torch.zeros(1, device=device), group=group)
    pool = torch.cuda.MemPool(backend.mem_allocator)
    tensor, error = None, None
    try:
        with torch.cuda.use_mem_pool(pool):
            tensor = torch.empty(numel, dtype=dtype, device=device)
    except (torch.OutOfMemoryError, RuntimeError) as e:
        error = f"{type(e).__name__}: {e}".splitlines()[0]
    failure = agree(error)
    if failure is not None:
        del tensor, pool
        raise (torch.OutOfMemoryError if "out of memory" in failure.lower() else RuntimeError)(
            f"NCCL window of {numel} elements: {failure}")
    backend.register_mem_pool(pool, symm=True)
    return NcclWindow(tensor, pool, group)


def release(window: NcclWindow, device: torch.device) -> None:
    """Deregister `window`'s pool from its group and drop the window's memory, while the group's
    communicator still lives. Local to this rank (NCCL's window deregistration takes no
    collective), so it is safe on an interrupted run too. The caller drops every view of the
    window first; what still holds one keeps its block until it dies, outside the pool's
    registration."""
    import torch

    if window.pool is None:
        return
    deregister = getattr(window.group._get_backend(device), "deregister_mem_pool", None)
    if deregister is not None:  # torch releases without it register nothing they would have to undo
        deregister(window.pool)
    window.tensor, window.pool = None, None  # the pool's destructor gives its segments back now
    torch.cuda.empty_cache()
