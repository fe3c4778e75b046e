"""The symmetric allocations of a comm run, one per kind, made once at the size of the largest
case that uses them (through runtime.symmetric_buffer, the one place symmetric memory is set up),
and the registered NCCL windows of path nccl_symm, one per process group (runtime.Runtime.window)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from overlapbench.comm.cases import Case
from overlapbench.comm.sizes import TORCH_DTYPES

if TYPE_CHECKING:
    from overlapbench.distributed.runtime import Runtime, SymmetricBuffer


class Buffers:
    """The symmetric allocations of a run, one per kind, each made once at the size of the
    largest case that uses it. Allocation and rendezvous are collective: every rank asks for
    them in the same order, the case order."""

    def __init__(self, rt: Runtime, cases: list[Case]) -> None:
        self.rt = rt
        self._largest: dict = {}
        for case in cases:
            if case.skip is None and case.buffer is not None:
                key = self._key(case)
                self._largest[key] = max(self._largest.get(key, 0), case.count)
            if case.skip is None and case.window:
                key = self._window_key(case)
                self._largest[key] = max(self._largest.get(key, 0), case.window_regions(rt.world_size)[1])
        self._made: dict = {}

    @staticmethod
    def _key(case: Case) -> tuple:
        """Paths that share an allocation take turns on it (one-shot, two-shot, copy engine)."""
        return case.buffer, case.dtype, case.hidden

    @staticmethod
    def _window_key(case: Case) -> tuple:
        """One window per process group (CTA budget, stream priority) and dtype."""
        return "nccl_window", case.ctas, case.beside_gemm, case.dtype

    def window(self, case: Case):
        """The registered NCCL window of the case's budget, sized for the largest case on it."""
        from overlapbench.distributed import DEFAULT

        ctas = DEFAULT if case.ctas is None else case.ctas
        return self.rt.window(self._largest[self._window_key(case)], self._dtype(case), ctas, case.beside_gemm)

    def _dtype(self, case: Case):
        import torch

        return getattr(torch, TORCH_DTYPES[case.dtype])

    def symmetric(self, case: Case) -> SymmetricBuffer:
        from overlapbench.distributed.runtime import symmetric_buffer

        key = self._key(case)
        if key not in self._made:
            self._made[key] = symmetric_buffer(self._largest[key], self._dtype(case), self.rt.device)
        return self._made[key]

    def fused(self, case: Case):
        """The fused kernel's buffers: path fused_norm takes the layer's kernel (the one `comm:
        fused` runs, comm_methods.fused_kernel); fused_norm_push (v2), fused_norm_pull_push and
        fused_norm_v1 always theirs."""
        import torch.distributed as dist

        from kernels.allreduce_norm_pull import FUSED_KERNELS
        from overlapbench.distributed.runtime import symmetric_buffer
        from overlapbench.overlap.comm_methods import fused_kernel

        key = self._key(case)
        if key not in self._made:
            rows = self._largest[key] // case.hidden
            variant = {"fused_norm_v1": "v1", "fused_norm_push": "v2", "fused_norm_pull_push": "v2pullpush"}.get(case.buffer)
            kernel = fused_kernel() if variant is None else FUSED_KERNELS[variant]
            self._made[key] = kernel(dist.group.WORLD, rows, case.hidden, self._dtype(case), self.rt.device,
                                     allocate=symmetric_buffer)
        return self._made[key]


    def copy_engine_norm(self, case: Case):
        from kernels.copy_engine_norm import CopyEngineNorm
        from overlapbench.distributed.runtime import symmetric_buffer

        key = self._key(case)
        if key not in self._made:
            rows = self._largest[key] // case.hidden
            # the layer's schedule: chunks by size (or --ce-chunks), `out` copied by the copy engine
            self._made[key] = CopyEngineNorm.allocate(None, rows, case.hidden, self._dtype(case), self.rt.device,
                                                     allocate=symmetric_buffer)
        return self._made[key]
