"""The communication paths `overlapbench comm` times, one record each beside the builder of its
bench: the collectives a path runs, how a case becomes runnable on it (buffers, verifiable inputs,
the call that is timed, the count of wrong elements), the unit its counts come in, its CTA
settings, and when it cannot run. A new path is one builder and one record here.

Torch-free at import: spec validation reads the names.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from overlapbench.comm.cases import BesideLayer, Case
from overlapbench.comm.patterns import (
    count_wrong,
    op_expected,
    op_input,
    pattern,
    pattern_sum,
)
from overlapbench.comm.sizes import DTYPE_BYTES, TORCH_DTYPES, VECTOR_BYTES, format_bytes

if TYPE_CHECKING:
    import torch

    from overlapbench.comm.buffers import Buffers
    from overlapbench.distributed.runtime import Runtime

FUSED_EPS = 1e-5


@dataclass
class Bench:
    """A case's buffers behind the calls a measurement makes."""

    fill: Callable[[int], None]  # write this rank's verifiable inputs for a seed
    run: Callable[[], None]  # the communication, exactly as timed
    wrong: Callable[[int], int]  # this rank's elements that differ from the expected result
    out: Callable[[], torch.Tensor]  # where this rank's result lands (after run)


def _collective_bench(rt: Runtime, case: Case, inp: torch.Tensor, out: Callable[[], torch.Tensor],
                      run: Callable[[], None], poison: torch.Tensor | None) -> Bench:
    """A plain collective: inputs and expected results from op_input / op_expected. `poison`
    (the output buffer, where fixed) is set to -1 first, so a result never written is wrong."""
    import torch

    dtype = getattr(torch, TORCH_DTYPES[case.dtype])
    args = (case.op, rt.rank, rt.world_size, case.count)

    def fill(seed: int) -> None:
        if poison is not None:
            poison.fill_(-1)
        inp.copy_(op_input(*args, seed, dtype, inp.device))

    def wrong(seed: int) -> int:
        return count_wrong(out(), op_expected(*args, seed, dtype, inp.device))

    return Bench(fill, run, wrong, out)


def _empty(rt: Runtime, count: int, dtype: str) -> torch.Tensor:
    import torch

    return torch.empty(count, dtype=getattr(torch, TORCH_DTYPES[dtype]), device=rt.device)


def nccl_bench(rt: Runtime, case: Case, buffers: Buffers) -> Bench:
    """NCCL (gloo on CPU) as the strategies call it; a CTA budget is a process group created
    with that `max_ctas`. All-reduce in place; all-gather and reduce-scatter out of place."""
    from overlapbench.distributed import DEFAULT

    # Beside a GEMM stream its kernels run on a high-priority stream, as in the overlapped strategies.
    group = rt.group(case.ctas if case.ctas is not None else DEFAULT, high_priority=case.beside_gemm)
    tensors = [_empty(rt, count, case.dtype) for count in case.tensor_counts(rt.world_size)]
    return _nccl_collective(rt, case, group, *tensors)


def nccl_symm_bench(rt: Runtime, case: Case, buffers: Buffers) -> Bench:
    """NCCL's symmetric kernels: the nccl path's collectives on views of a registered window
    (Buffers.window) of the case's budget, whose group has min_ctas = max_ctas, so that NCCL
    runs on exactly that many CTAs (`default`: its own choice). Which kernel ran, and on how
    many channels, the row takes from NCCL's tuning log (run.measure_case)."""
    window = buffers.window(case)
    counts = case.tensor_counts(rt.world_size)
    starts = case.window_regions(rt.world_size)[0]
    tensors = [window.view(start, (count,)) for start, count in zip(starts, counts)]
    return _nccl_collective(rt, case, window.group, *tensors)


def _nccl_collective(rt: Runtime, case: Case, group, out: torch.Tensor, inp: torch.Tensor | None = None) -> Bench:
    """The case's collective through torch.distributed on `group`: all-reduce in place on `out`,
    all-gather and reduce-scatter from `inp` into `out`."""
    import torch.distributed as dist

    if case.op == "all_reduce":
        return _collective_bench(rt, case, out, lambda: out, lambda: dist.all_reduce(out, group=group), out)
    if case.op == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
        return _collective_bench(rt, case, inp, lambda: out, lambda: gather(out, inp, group=group), out)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in torch 2.13
    return _collective_bench(rt, case, inp, lambda: out, lambda: scatter(out, inp, group=group), out)


def symm_all_reduce_bench(rt: Runtime, case: Case, buffers: Buffers) -> Bench:
    """torch.ops.symm_mem.one_shot_all_reduce (every rank reads all peers' buffers, writes a
    new tensor) or two_shot_all_reduce_ (reduce-scatter + all-gather in place). Both need the
    input in a rendezvoused symmetric buffer; sum only; no multicast (unicast peer loads)."""
    import torch

    sym = buffers.symmetric(case)
    buf = sym.tensor[: case.count]
    if case.path == "symm_two_shot":
        op = torch.ops.symm_mem.two_shot_all_reduce_
        return _collective_bench(rt, case, buf, lambda: buf, lambda: op(buf, "sum", sym.group_name), buf)
    op = torch.ops.symm_mem.one_shot_all_reduce
    latest: dict = {}

    def run() -> None:
        latest["out"] = op(buf, "sum", sym.group_name)

    return _collective_bench(rt, case, buf, lambda: latest["out"], run, None)


def copy_engine_bench(rt: Runtime, case: Case, buffers: Buffers) -> Bench:
    """All-gather in place in a symmetric buffer, moved by the copy engines: after a barrier
    (every rank's shard is in place) each rank pulls every peer's shard with Tensor.copy_ from
    the peer's mapped buffer, on a side stream; a second barrier keeps any rank from
    overwriting its shard while a peer still reads it. Only the barriers run on SMs (1 CTA)."""
    import torch

    sym = buffers.symmetric(case)
    rank, world = rt.rank, rt.world_size
    shard = case.count // world
    out = sym.tensor[: case.count]
    peers = [(rank + step) % world for step in range(1, world)]  # staggered: no peer is hit by all at once
    pulls = [(out[p * shard:(p + 1) * shard], sym.peer(p, p * shard, shard)) for p in peers]
    side = rt.side_stream()

    def run() -> None:
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            sym.handle.barrier(channel=0)
            for dst, src in pulls:
                dst.copy_(src)
            sym.handle.barrier(channel=0)
        main.wait_stream(side)

    return _collective_bench(rt, case, out[rank * shard:(rank + 1) * shard], lambda: out, run, out)


def fused_norm_bench(rt: Runtime, case: Case, buffers: Buffers) -> Bench:
    """A fused all-reduce + norm kernel on rows x hidden, the one of the case's path
    (Buffers.fused: fused_norm the layer's, comm_methods.fused_kernel; fused_norm_push, _pull_push, _v1)."""
    return _norm_bench(rt, case, buffers.fused(case))


def copy_engine_norm_bench(rt: Runtime, case: Case, buffers: Buffers) -> Bench:
    """kernels.copy_engine_norm.CopyEngineNorm on rows x hidden: copy-engine reduce-scatter and
    all-gather, the add + norm on `ctas` CTAs; the residual checked on this rank's rows only
    (it stays token-sharded); its own rows cut into `case.chunks` chunks (None: by size)."""
    return _norm_bench(rt, case, buffers.copy_engine_norm(case), chunks=case.chunks)


def copy_engine_norm_kernel_bench(rt: Runtime, case: Case, buffers: Buffers) -> Bench:
    """copy_engine_norm with the add + norm kernel writing this rank's own output rows where the
    copy engine copies them: the transfer of a copy-engine split with `ce_out: kernel`."""
    return _norm_bench(rt, case, buffers.copy_engine_norm(case), chunks=case.chunks, sm_out=True)


def _norm_bench(rt: Runtime, case: Case, kernel, **call) -> Bench:
    """An all-reduce + norm engine on rows x hidden: the partial sums are reduced over ranks, the
    residual becomes residual + sum (exact: small integers) on the rows this rank keeps (all of
    them, or its own with a sharded residual) and out becomes rmsnorm(residual) * weight
    (checked against the torch reference to one rounding step). `call`: the engine's own
    keyword arguments (copy_engine_norm: chunks, sm_out)."""
    import torch

    from kernels.rmsnorm import add_rmsnorm_reference

    dtype = getattr(torch, TORCH_DTYPES[case.dtype])
    rows, hidden, n, world = case.rows, case.hidden, case.count, rt.world_size
    partial = kernel.partial(0, rows)
    residual = torch.empty(rows, hidden, dtype=dtype, device=rt.device)
    out = torch.empty_like(residual)
    weight = (torch.arange(hidden, device=rt.device) % 3 + 1).to(dtype)
    rtol = max(torch.finfo(dtype).eps, 1e-5)  # one rounding step of the output dtype
    kept = slice(*kernel.own_rows(0, rows)) if hasattr(kernel, "own_rows") else slice(None)

    def fill(seed: int) -> None:
        partial.copy_(pattern(rt.rank, 0, n, seed, dtype, rt.device).view(rows, hidden))
        residual.copy_(pattern(world, 0, n, seed, dtype, rt.device).view(rows, hidden))  # one more source
        out.fill_(-1)

    def run() -> None:
        kernel(0, rows, residual, weight, FUSED_EPS, out, case.ctas, **call)

    def wrong(seed: int) -> int:
        reduced = pattern_sum(range(world), 0, n, seed, torch.float32, rt.device).view(rows, hidden)
        ref_residual = pattern(world, 0, n, seed, dtype, rt.device).view(rows, hidden)
        ref_out = add_rmsnorm_reference(reduced, ref_residual, weight, FUSED_EPS)  # ref_residual += reduced
        off = ~torch.isclose(out.float(), ref_out.float(), rtol=rtol, atol=1e-6)
        return count_wrong(residual[kept], ref_residual[kept]) + int(off.sum())

    return Bench(fill, run, wrong, lambda: out)


OPS = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class CommPath:
    """One way to move the data."""

    name: str
    ops: tuple[str, ...]  # the collectives it runs
    build: Callable  # (Runtime, Case, Buffers) -> Bench
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
        CommPath("nccl", OPS, nccl_bench, _nccl_ctas, nccl=True),
        # NCCL's symmetric kernels (2.27+) at the same budgets, exact (min_ctas = max_ctas); at
        # world size 1 NCCL copies locally and runs no kernel, hence 2 ranks at least
        CommPath("nccl_symm", OPS, nccl_symm_bench, _nccl_ctas, world=(2, 8), nccl=True, window=True),
        CommPath("symm_one_shot", ("all_reduce",), symm_all_reduce_bench, _own_grid, buffer="symmetric"),
        CommPath("symm_two_shot", ("all_reduce",), symm_all_reduce_bench, _own_grid, buffer="symmetric"),
        CommPath("fused_norm", ("all_reduce",), fused_norm_bench, _norm_ctas,
                 buffer="fused_norm", rows=True, world=(2, 8)),
        CommPath("fused_norm_v1", ("all_reduce",), fused_norm_bench, _norm_ctas,
                 buffer="fused_norm_v1", rows=True, world=(2, 8)),
        CommPath("fused_norm_push", ("all_reduce",), fused_norm_bench, _norm_ctas,
                 buffer="fused_norm_push", rows=True, world=(2, 8)),
        CommPath("fused_norm_pull_push", ("all_reduce",), fused_norm_bench, _norm_ctas,
                 buffer="fused_norm_pull_push", rows=True, world=(2, 8)),
        CommPath("copy_engine", ("all_gather",), copy_engine_bench, _own_grid, buffer="symmetric"),
        CommPath("copy_engine_norm", ("all_reduce",), copy_engine_norm_bench, _norm_ctas,
                 buffer="copy_engine_norm", rows=True, world=(2, 8)),
        CommPath("copy_engine_norm_kernel", ("all_reduce",), copy_engine_norm_kernel_bench, _norm_ctas,
                 buffer="copy_engine_norm", rows=True, world=(2, 8)),
    )
}
COPY_ENGINE_NORM_PATHS = ("copy_engine_norm", "copy_engine_norm_kernel")  # the paths --ce-chunks cuts
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
                for chunks in ce_chunks if path.name in COPY_ENGINE_NORM_PATHS else (None,):
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


def build(rt, case: Case, buffers) -> Bench:
    """The bench of a case, by its path's builder."""
    return PATHS_BY_NAME[case.path].build(rt, case, buffers)
