"""Process groups, devices, streams and symmetric memory: what the strategies, the kernels and the
communication benchmarks run on. Symmetric memory is allocated here and nowhere else, so the
multicast refusal and the alignment checks hold for every user; so are NCCL's registered
windows (`Runtime.window`, through nccl_windows.py), one per process group. The ground floor:
it imports nothing of the package but its own folder."""

from __future__ import annotations

import gc
import math
import os
import socket
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from overlapbench.distributed import DEFAULT, nccl_log, nccl_windows

# NVLink multicast stays off unless the user explicitly turned it on: our kernels never need
# it, and on shared hosts it can take the GPUs down.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def apply_safe_env(env: dict = os.environ) -> None:
    for key, value in SAFE_ENV.items():
        env.setdefault(key, value)


_abandoned = False  # Runtime.close left this process's device memory to the exit (see `abandoned`)


def abandoned() -> bool:
    """Whether an interrupted or failed run left this process's GPU memory mapped for the exit to
    reclaim (Runtime.close, clean=False, on GPUs): the process must then end with os._exit, not
    through Python's teardown, whose destructors would unmap symmetric memory under kernels still
    queued on the device."""
    return _abandoned


@dataclass
class Runtime:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    control: dist.ProcessGroup | None = None  # gloo group for agreement, never blocked by GPU work
    _groups: dict = field(default_factory=dict)
    _resources: dict = field(default_factory=dict)
    _windows: dict = field(default_factory=dict)  # (max_ctas, high_priority, dtype) -> the NCCL windows made, oldest first
    _side_stream: Any = None
    tuning_log: nccl_log.TuningLog | None = None  # this process's NCCL tuning log, where init turned it on

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def group(self, max_ctas: int | str = DEFAULT, high_priority: bool = False,
              exact: bool = False) -> dist.ProcessGroup | None:
        """The world group (None), or a copy of it whose NCCL kernels are capped at `max_ctas`
        CTAs (the SM budget of NCCL) and/or run on a high-priority stream (for overlap).
        `exact`: min_ctas = max_ctas too, so NCCL runs on exactly that many CTAs; its symmetric
        kernels otherwise pick fewer (max_ctas only caps them). Created on first use; every rank
        asks for the same ones in the same order."""
        if not self.is_cuda or (max_ctas == DEFAULT and not high_priority):
            return None
        exact = exact and max_ctas != DEFAULT
        key = (max_ctas, high_priority) + (("exact",) if exact else ())
        if key not in self._groups:
            options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=high_priority)
            if max_ctas != DEFAULT:
                options.config.max_ctas = int(max_ctas)
                options.config.min_ctas = int(max_ctas) if exact else 1
            self._groups[key] = dist.new_group(backend="nccl", pg_options=options)
        return self._groups[key]

    def window(self, numel: int, dtype: torch.dtype, max_ctas: int | str = DEFAULT, high_priority: bool = False,
               fallback: int | None = None) -> nccl_windows.NcclWindow:
        """A registered NCCL window of at least `numel` elements on the group of that budget
        (exact: NCCL's symmetric kernels run on exactly `max_ctas` CTAs; `default`: NCCL's own
        choice), made once per group and dtype, outside CUDA-graph capture, and kept for the
        run; where `numel` does not fit in memory, `fallback` elements (what this point needs).
        A larger request makes a larger window and keeps the old one too, until `close`: a
        captured graph may still use it. Collective: every rank asks for the same windows in the
        same order."""
        group = self.group(max_ctas, high_priority, exact=True) or dist.group.WORLD
        made = self._windows.setdefault((max_ctas, high_priority, dtype), [])
        if made and made[-1].numel >= (fallback or numel):
            return made[-1]
        try:
            made.append(nccl_windows.register(group, self.device, numel, dtype, self._first_error))
        except torch.OutOfMemoryError:
            if fallback is None or fallback >= numel:
                raise
            torch.cuda.empty_cache()
            made.append(nccl_windows.register(group, self.device, fallback, dtype, self._first_error))
        return made[-1]

    def nccl_windows_unavailable(self) -> str | None:
        """Why NCCL's symmetric kernels cannot run here (None: they can): gloo, a torch or NCCL
        without them, a backend that refuses its window allocator, NVLink multicast not turned
        off, or ranks on several hosts. Collective on the first call on GPUs (every rank asks in
        the same order; the first rank's reason is every rank's), then remembered."""
        if self.backend != "nccl":
            return f"needs NCCL on CUDA GPUs (registered symmetric windows); this run uses {self.backend} on CPU"
        key = "nccl_windows_unavailable"
        if key not in self._resources:
            mine = nccl_windows.missing_support() or nccl_windows.allocator_refusal(dist.group.WORLD, self.device)
            seen: list = [None] * self.world_size
            dist.all_gather_object(seen, (socket.gethostname(), mine), group=self.control)
            reason = next((r for _, r in seen if r is not None), None)
            if reason is None and len({host for host, _ in seen}) > 1:
                reason = "NCCL's symmetric kernels need every rank on one host"
            self._resources[key] = reason
        return self._resources[key]

    def side_stream(self) -> torch.cuda.Stream:
        """The stream communication overlaps on, at the highest priority the device has."""
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(device=self.device, priority=-100)
        return self._side_stream

    def resource(self, key: Any, make: Callable[[], Any]) -> Any:
        """A per-run object (symmetric buffers, say) made once and reused by later points."""
        if key not in self._resources:
            self._resources[key] = make()
        return self._resources[key]

    def cached(self, key: Any) -> Any:
        return self._resources.get(key)

    def replace_resource(self, key: Any, make: Callable[[], Any]) -> Any:
        """Drop the object under `key` (its memory with it), then make a new one."""
        self._resources.pop(key, None)
        if self.is_cuda:
            torch.cuda.empty_cache()
        self._resources[key] = make()
        return self._resources[key]

    def first_failure(self, result: dict | None) -> dict | None:
        """All ranks' outcomes of a phase (None: it went well); the first failure, named by
        rank, or None when every rank succeeded. Runs on the control group."""
        outcomes: list = [None] * self.world_size
        dist.all_gather_object(outcomes, result, group=self.control)
        for rank, outcome in enumerate(outcomes):
            if outcome is not None:
                if outcome["status"] == "failed" and self.world_size > 1:
                    outcome = outcome | {"error": f"rank {rank}: {outcome['error']}"}
                return outcome
        return None

    def _first_error(self, error: str | None) -> str | None:
        """Every rank's error of a phase (None: it went well): the first, named by rank."""
        failure = self.first_failure(None if error is None else {"status": "failed", "error": error})
        return None if failure is None else failure["error"]

    def close(self, clean: bool = True) -> None:
        """Give back what the run holds, then leave the process group. The order matters: NCCL
        windows are deregistered and freed while their communicators live (nccl_windows.release),
        then the groups go. `clean`: every rank got here (a finished run): wait for the device
        and for the other ranks first. Otherwise (an interrupt, an error) nothing collective or
        blocking runs: a peer may be gone or stuck. On CPU the windows are still released and
        the process group is left to the exit, as torch does. On GPUs nothing is freed: kernels
        still queued may read the symmetric buffers and windows through peer mappings, and
        unmapping them under those kernels is an illegal memory access (both ranks of a stopped
        llama3-70b TP=2 run aborted so at exit, in the symmetric allocator's destructor). The
        process is marked `abandoned` and must end without Python's teardown (os._exit), which
        the launch layer's `end_worker` does; the driver reclaims the memory then."""
        global _abandoned
        if not clean and self.is_cuda:
            _abandoned = True
            return
        if clean:
            self.in_step()
        self._resources.clear()  # the steps' buffers and kernels, which may view the windows
        gc.collect()
        for made in self._windows.values():
            for window in made:
                nccl_windows.release(window, self.device)
        self._windows.clear()
        if clean:
            self._groups.clear()
            dist.destroy_process_group()

    def in_step(self) -> None:
        """Wait for this rank's device, then for every rank on the control group (the host only:
        no kernel runs), so the ranks issue what comes next together. A profiled forward starts
        so (timeline.record): the ranks' timelines then start as the timed loop's iterations do,
        not as far apart as each rank's profiler took to start (2.6 ms at 1K on 4x H200,
        results/h200x4/60ae8af/report-profile-70b-tp4-1k-2k.txt), which a transfer joining the
        ranks read as exposed time on the rank that started first."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
        dist.barrier(group=self.control)

    def max_over_ranks(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())


@dataclass
class SymmetricBuffer:
    """A flat symmetric-memory tensor, rendezvoused on a group, and the handle that maps every
    peer's copy of it into this process (NVLink loads and stores; never multicast)."""

    tensor: torch.Tensor  # 1-D, this rank's
    handle: Any  # the rendezvous handle: peers' buffers, signal pads, barrier
    group_name: str
    rank: int
    world: int
    offset: int  # elements from the handle's allocation base to `tensor` (pooled allocations add one)

    def view(self, start: int, shape: tuple[int, ...], rank: int | None = None) -> torch.Tensor:
        """`shape` elements from element `start`: this rank's, or peer `rank`'s mapped into this
        process."""
        if rank is None:
            return self.tensor[start : start + math.prod(shape)].view(shape)
        return self.handle.get_buffer(rank, shape, self.tensor.dtype, self.offset + start)

    def peer(self, rank: int, start: int, count: int) -> torch.Tensor:
        """[count] elements of `rank`'s buffer from `start`."""
        return self.view(start, (count,), rank)

    def peer_ptrs(self) -> list[int]:
        """Every rank's address of `tensor`'s first element, as mapped here."""
        shift = self.offset * self.tensor.element_size()
        return [p + shift for p in self.handle.buffer_ptrs]


def enable_symmetric_memory(group: dist.ProcessGroup | None = None) -> str:
    """Register the group with symmetric memory (required by the torch releases that have
    `enable_symm_mem_for_group`, deprecated and harmless in later ones); its name."""
    from torch.distributed import _symmetric_memory as symm_mem

    name = (group or dist.group.WORLD).group_name
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable(name)
    return name


def symmetric_buffer(numel: int, dtype: torch.dtype, device: torch.device,
                     group: dist.ProcessGroup | None = None) -> SymmetricBuffer:
    """symm_mem.empty + rendezvous (collective: every rank of `group` calls it, in the same order).
    Refuses a mapping that came with NVLink multicast."""
    from torch.distributed import _symmetric_memory as symm_mem

    group = group or dist.group.WORLD
    name = enable_symmetric_memory(group)
    tensor = symm_mem.empty(numel, dtype=dtype, device=device)
    handle = symm_mem.rendezvous(tensor, group)
    if getattr(handle, "multicast_ptr", 0):
        raise RuntimeError("symmetric memory came with an NVLink multicast mapping; set TORCH_SYMM_MEM_DISABLE_MULTICAST=1")
    rank = dist.get_rank(group)
    offset = tensor.data_ptr() - handle.buffer_ptrs[rank]
    if offset % tensor.element_size():
        raise RuntimeError("symmetric tensor is not element-aligned in its allocation")
    return SymmetricBuffer(tensor, handle, name, rank, dist.get_world_size(group), offset // tensor.element_size())


def init(timeout_s: int, nccl_tuning_log: bool = False) -> Runtime:
    """Join the process group torchrun set up: NCCL on GPUs, gloo on CPU. `nccl_tuning_log`:
    NCCL logs the kernel and channels of each collective into a file of this process
    (`Runtime.tuning_log`; see nccl_log), unless the user set NCCL's debug variables."""
    apply_safe_env()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    # NCCL reads its debug settings once, before its first communicator
    log = nccl_log.enable() if nccl_tuning_log and backend == "nccl" and not dist.is_initialized() else None
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=timeout, **kwargs)
    control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    return Runtime(rank, world, local_rank, device, backend, control, tuning_log=log)
