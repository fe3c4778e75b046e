"""The communication paths, one record each: the collectives a path runs, how to build its bench,
the unit its counts come in, its CTA settings, and when it cannot run. A new path is one record
here and one builder in `benches`.

Torch-free at import: spec validation reads the names.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from overlapbench.comm import benches
from overlapbench.comm.cases import BesideLayer, Case
from overlapbench.comm.sizes import DTYPE_BYTES, VECTOR_BYTES, format_bytes

OPS = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class CommPath:
    """One way to move the data."""

    name: str
    ops: tuple[str, ...]  # the collectives it runs
    build: Callable  # (Runtime, Case, Buffers) -> benches.Bench
    ctas: Callable[[Any, str], tuple]  # (spec_sections.CommSpec, backend) -> its CTA settings; (None,): no budget
    buffer: str | None = None  # the run's symmetric allocation it takes turns on; None: none
    rows: bool = False  # counts are whole rows of `hidden` (a norm works per row)
    world: tuple[int, int] | None = None  # the world sizes it supports
    nccl: bool = False  # NCCL runs it: rows record the kernel and channels NCCL's tuning log shows
    window: bool = False  # its buffers are registered NCCL windows (runtime.Runtime.window), one per CTA budget
    # in the default --paths: a path that has not yet run on a GPU could hang or mislead a run
    # nobody asked it into (name it in --paths to try it)
    by_default: bool = True

    def unit(self, op: str, world: int, elem: int, hidden: int) -> tuple[int, str]:
        """Elements that a count must be a multiple of, and what that unit is, in words."""
        if self.rows:
            return hidden, f"one row of hidden {hidden}"
        vector = VECTOR_BYTES // elem
        if op == "all_reduce":
            return vector, "one 16-byte vector"
        return vector * world, f"one 16-byte vector per rank x {world} ranks"

    def skip(self, backend: str, world: int, hosts: int, windows: str | None = None) -> str | None:
        """Why it cannot run here, or None. `windows`: why NCCL windows cannot be registered
        here (runtime.Runtime.nccl_windows_unavailable), None where they can."""
        if self.window:
            if backend != "nccl":
                return "needs NCCL on CUDA GPUs (registered symmetric windows); this run uses gloo on CPU"
            return windows or self._outside_world(world)
        if self.buffer is None:
            return None
        if backend != "nccl":
            return "needs CUDA GPUs with symmetric memory; this run uses gloo on CPU"
        if os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST") != "1":
            return "refused: NVLink multicast is not disabled (TORCH_SYMM_MEM_DISABLE_MULTICAST != 1)"
        if hosts > 1:
            return "symmetric memory needs every rank on one host"
        return self._outside_world(world)

    def _outside_world(self, world: int) -> str | None:
        if self.world is not None and not self.world[0] <= world <= self.world[1]:
            return f"{self.name} runs on {self.world[0]}..{self.world[1]} ranks, not {world}"
        return None


def _nccl_ctas(spec: Any, backend: str) -> tuple:
    return spec.nccl_max_ctas if backend == "nccl" else (None,)  # gloo has no CTA budget


def _norm_ctas(spec: Any, backend: str) -> tuple:
    return spec.comm_ctas  # the kernel's grid (fused_norm) or the local add+norm's (copy_engine_norm)


def _own_grid(spec: Any, backend: str) -> tuple:
    return (None,)  # torch's kernels pick their own grid; the copy engines use no SMs


PATHS_BY_NAME = {
    path.name: path
    for path in (
        CommPath("nccl", OPS, benches.nccl_bench, _nccl_ctas, nccl=True),
        # NCCL's symmetric kernels (2.27+) at the same budgets, exact (min_ctas = max_ctas); at
        # world size 1 NCCL copies locally and runs no kernel, hence 2 ranks at least
        CommPath("nccl_symm", OPS, benches.nccl_symm_bench, _nccl_ctas, world=(2, 8), nccl=True, window=True),
        CommPath("symm_one_shot", ("all_reduce",), benches.symm_all_reduce_bench, _own_grid, buffer="symmetric"),
        CommPath("symm_two_shot", ("all_reduce",), benches.symm_all_reduce_bench, _own_grid, buffer="symmetric"),
        CommPath("fused_norm", ("all_reduce",), benches.fused_norm_bench, _norm_ctas,
                 buffer="fused_norm", rows=True, world=(2, 8)),
        CommPath("fused_norm_v1", ("all_reduce",), benches.fused_norm_bench, _norm_ctas,
                 buffer="fused_norm_v1", rows=True, world=(2, 8)),
        CommPath("fused_norm_push", ("all_reduce",), benches.fused_norm_bench, _norm_ctas,
                 buffer="fused_norm_push", rows=True, world=(2, 8)),
        CommPath("fused_norm_pull_push", ("all_reduce",), benches.fused_norm_bench, _norm_ctas,
                 buffer="fused_norm_pull_push", rows=True, world=(2, 8)),
        CommPath("copy_engine", ("all_gather",), benches.copy_engine_bench, _own_grid, buffer="symmetric"),
        CommPath("copy_engine_norm", ("all_reduce",), benches.copy_engine_norm_bench, _norm_ctas,
                 buffer="copy_engine_norm", rows=True, world=(2, 8)),
    )
}
PATHS = tuple(PATHS_BY_NAME)
DEFAULT_PATHS = tuple(name for name, path in PATHS_BY_NAME.items() if path.by_default)
PATHS_BY_OP = {op: tuple(p.name for p in PATHS_BY_NAME.values() if op in p.ops) for op in OPS}


def make_cases(bench: Any, world: int, backend: str, dtype: str, hidden: int, hosts: int = 1,
               beside_gemm: bool = False, ce_chunks: tuple = (None,), windows: str | None = None,
               beside_layer: BesideLayer | None = None) -> list[Case]:
    """Every (op, path, CTA budget, size) of `bench` (a spec_sections.CommSpec, which imports this
    module: hence untyped here), in nccl-tests' order: one block of
    ascending sizes per op, path and budget. Sizes are rounded down to whole units of the
    path (16-byte vectors per rank, or rows for the fused kernel). `beside_gemm`: every case is
    also timed beside a GEMM stream (comm.contention); `beside_layer`: beside the layer's own
    kernels (comm.beside_layer). `ce_chunks`: the chunk counts of
    copy_engine_norm (None: chosen by size), one block per count inside each CTA budget's.
    `windows`: why NCCL windows cannot be registered here (None: they can)."""
    elem = DTYPE_BYTES[dtype]
    cases, seen = [], set()
    for op in bench.ops:
        for path in (PATHS_BY_NAME[p] for p in PATHS_BY_OP[op] if p in bench.paths):
            skip = path.skip(backend, world, hosts, windows)
            if beside_gemm and backend != "nccl":
                skip = skip or "--beside-gemm needs CUDA GPUs (a bf16 GEMM stream beside the path)"
            if beside_layer is not None and backend != "nccl":
                skip = skip or "--beside-layer needs CUDA GPUs (the layer's bf16 kernels beside the path)"
            unit, unit_words = path.unit(op, world, elem, hidden)
            for ctas in path.ctas(bench, backend):
                for chunks in ce_chunks if path.name == "copy_engine_norm" else (None,):
                    for size in bench.sizes:
                        count = size // elem // unit * unit
                        too_small = None if count else f"{format_bytes(size)} is below {unit_words} ({unit * elem} B)"
                        case = Case(op, path.name, backend, ctas, size, count, dtype, hidden if path.rows else None,
                                    skip=skip or too_small, buffer=path.buffer, beside_gemm=beside_gemm, chunks=chunks,
                                    window=path.window, beside_layer=beside_layer)
                        if case.key() not in seen:
                            seen.add(case.key())
                            cases.append(case)
    return [replace(c, seed=i + 1) for i, c in enumerate(cases)]


def build(rt, case: Case, buffers) -> benches.Bench:
    """The bench of a case, by its path's builder."""
    return PATHS_BY_NAME[case.path].build(rt, case, buffers)
