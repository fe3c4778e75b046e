"""`overlapbench comm`: the communication under every overlap result, measured in nccl-tests' terms.

Before anyone believes an overlap number they check the collectives underneath it, and they
read them the way nccl-tests prints them: sizes from -b to -e by factor -f; per size the time,
the algorithm bandwidth (bytes / time) and the bus bandwidth (algbw x 2(n-1)/n for all-reduce,
x (n-1)/n for all-gather and reduce-scatter: what each rank's link carries), and #wrong, the
elements that differ from the exact expected result.

Every communication path the strategies use is measured: NCCL under each CTA budget
(`max_ctas`), torch's symmetric-memory one-shot and two-shot all-reduce, our fused all-reduce +
residual + RMSNorm kernel under each CTA budget, and an all-gather done by the copy engines
(peer copies between symmetric buffers, no SMs). On CPU NCCL is replaced by gloo and the
symmetric-memory paths are skipped, with the reason. NVLink multicast is never used.

Inputs are small non-zero integers that differ per rank, per chunk and per case, so every sum is
exact in bf16 and a right collective has exactly zero wrong elements. A case with wrong elements
is a failed row, never a timing. Rows go to the same JSONL store as `sweep` (workload `comm`).

No torch at module top: `--help` and spec validation stay fast.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import re
import warnings
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from overlapbench.errors import UserError, one_line, reject_unknown_keys

if TYPE_CHECKING:
    import torch
    from rich.console import Console
    from rich.table import Table

    from overlapbench.results import ResultStore
    from overlapbench.runtime import Runtime
    from overlapbench.spec import CommSpec, SweepSpec

OPS = ("all_reduce", "all_gather", "reduce_scatter")
PATHS = ("nccl", "symm_one_shot", "symm_two_shot", "fused_norm", "copy_engine")
PATHS_BY_OP = {
    "all_reduce": ("nccl", "symm_one_shot", "symm_two_shot", "fused_norm"),
    "all_gather": ("nccl", "copy_engine"),
    "reduce_scatter": ("nccl",),
}
SYMMETRIC_PATHS = ("symm_one_shot", "symm_two_shot", "fused_norm", "copy_engine")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # torch attribute names
FORMATS = ("table", "csv", "json")
VECTOR_BYTES = 16  # symmetric-memory kernels move whole 16-byte vectors
GPU_SIZES = ("1M", "1G")  # default -b/-e on GPUs
CPU_SIZES = ("1K", "64K")  # and on CPU (gloo): a demo, not a measurement
TIMEOUT_S = 600
FUSED_EPS = 1e-5
FUSED_WORLD = (2, 8)  # the fused kernel's supported world sizes
BYTES_PER_SAMPLE = 64 * 2**20  # a timed sample repeats a small op until it moves about this much
MAX_OPS_PER_SAMPLE = 32


# ---------------------------------------------------------------------------------------------
# Formulas and sizes


def bus_factor(op: str, world: int) -> float:
    """nccl-tests' busbw / algbw: all-reduce moves each byte over 2(n-1)/n links' worth,
    all-gather and reduce-scatter (n-1)/n."""
    share = (world - 1) / world
    return 2 * share if op == "all_reduce" else share


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes, as nccl-tests)."""
    return nbytes / seconds / 1e9


def busbw(op: str, nbytes: int, seconds: float, world: int) -> float:
    return algbw(nbytes, seconds) * bus_factor(op, world)


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|b)?", re.IGNORECASE)
_UNITS = {None: 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: Any, where: str) -> int:
    """Bytes from 4096, '4096', '1K', '1M', '1GiB', '1.5M' (binary units, as nccl-tests)."""
    if isinstance(text, int) and not isinstance(text, bool):
        number, unit = Decimal(text), None
    else:
        match = _SIZE.fullmatch(str(text).strip()) if isinstance(text, str) else None
        if match is None:
            raise UserError(f"{where}: {text!r} is not a size; give bytes, optionally with K, M or G (e.g. 64K, 1M, 1G)")
        try:
            number, unit = Decimal(match[1]), (match[2] or "").lower() or None
        except InvalidOperation:  # pragma: no cover -- the regex admits only decimals
            raise UserError(f"{where}: {text!r} is not a size") from None
    value = number * _UNITS[unit]
    if value != value.to_integral_value() or value < 1:
        raise UserError(f"{where}: {text!r} is not a whole number of bytes >= 1")
    return int(value)


def size_ladder(lo: int, hi: int, factor: int, names: tuple[str, str, str] = ("-b/--min-bytes", "-e/--max-bytes", "-f/--factor")) -> tuple[int, ...]:
    """lo, lo*f, lo*f^2, ... up to hi: nccl-tests' -b -e -f. `names` name the three fields in
    errors (options on the command line, keys in a spec)."""
    if not isinstance(factor, int) or isinstance(factor, bool) or factor < 2:
        raise UserError(f"{names[2]}: must be an integer >= 2, got {factor!r}")
    if hi < lo:
        raise UserError(f"{names[1]}: {format_bytes(hi)} is below {names[0]} {format_bytes(lo)}")
    sizes, size = [], lo
    while size <= hi:
        sizes.append(size)
        size *= factor
    return tuple(sizes)


def comm_sizes(value: Any, cuda: bool, where: str) -> tuple[int, ...]:
    """A spec's `sizes`: a list of sizes, one size, or a ladder {min, max, factor}; by default
    the device's ladder (1M..1G by 2 on GPUs)."""
    if value is None:
        lo, hi = (parse_size(s, where) for s in (GPU_SIZES if cuda else CPU_SIZES))
        return size_ladder(lo, hi, 2)
    if isinstance(value, dict):
        reject_unknown_keys(value, ("min", "max", "factor"), where)
        if "min" not in value:
            raise UserError(f"{where}.min: missing; a ladder is {{min: 1M, max: 1G, factor: 2}}")
        lo = parse_size(value["min"], f"{where}.min")
        hi = parse_size(value.get("max", value["min"]), f"{where}.max")
        return size_ladder(lo, hi, value.get("factor", 2), (f"{where}.min", f"{where}.max", f"{where}.factor"))
    items = value if isinstance(value, list) else [value]
    if not items:
        raise UserError(f"{where}: empty; give sizes like [1M, 16M] or a ladder {{min: 1M, max: 1G, factor: 2}}")
    sizes = tuple(parse_size(v, f"{where}[{i}]") for i, v in enumerate(items))
    repeated = [v for i, v in enumerate(sizes) if v in sizes[:i]]
    if repeated:
        raise UserError(f"{where}: {format_bytes(repeated[0])} is listed twice; remove the duplicate")
    return sizes


def format_bytes(n: int) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def ops_per_sample(nbytes: int, cuda: bool) -> int:
    """Back-to-back ops per timed sample: small ops are timed in batches, as nccl-tests does,
    so that launch gaps between them do not count as communication time."""
    if not cuda:
        return 1
    return max(1, min(MAX_OPS_PER_SAMPLE, BYTES_PER_SAMPLE // max(nbytes, 1)))


# ---------------------------------------------------------------------------------------------
# Cases: what one row measures


@dataclass(frozen=True)
class Case:
    """One collective on one path with one CTA budget at one size."""

    op: str
    path: str  # as selected (`nccl` also names gloo on CPU; `strategy` is what rows record)
    backend: str  # nccl | gloo
    ctas: int | str | None  # NCCL max_ctas ("default" or int), the fused kernel's grid, or None
    size: int  # bytes asked for on the ladder
    count: int  # elements of the larger buffer (nccl-tests' count), whole units of the path
    dtype: str
    hidden: int | None = None  # fused_norm: the count is rows x hidden
    seed: int = 0  # makes the inputs fresh per case
    skip: str | None = None  # why this case cannot run here

    @property
    def nbytes(self) -> int:
        return self.count * DTYPE_BYTES[self.dtype]

    @property
    def rows(self) -> int | None:
        return self.count // self.hidden if self.hidden else None

    @property
    def strategy(self) -> str:
        return "gloo" if self.path == "nccl" and self.backend == "gloo" else self.path

    def key(self) -> str:
        """Identity in a results file (what `--resume` matches on): sizes that round to the same
        bytes are one case; sizes below one unit stay apart by the size asked for."""
        return json.dumps(
            {"workload": "comm", "op": self.op, "strategy": self.strategy, "ctas": self.ctas,
             "bytes": self.nbytes, "below_unit": None if self.count else self.size,
             "dtype": self.dtype, "hidden": self.hidden},
            sort_keys=True,
        )


def _unit(op: str, path: str, world: int, elem: int, hidden: int) -> tuple[int, str]:
    """Elements that a count must be a multiple of, and what that unit is, in words."""
    if path == "fused_norm":
        return hidden, f"one row of hidden {hidden}"
    vector = VECTOR_BYTES // elem
    if op == "all_reduce":
        return vector, "one 16-byte vector"
    return vector * world, f"one 16-byte vector per rank x {world} ranks"


def _cta_settings(path: str, bench: "CommSpec", backend: str) -> tuple:
    if path == "nccl":
        return bench.nccl_max_ctas if backend == "nccl" else (None,)  # gloo has no CTA budget
    if path == "fused_norm":
        return bench.comm_ctas
    return (None,)  # torch's kernels pick their own grid; the copy engines use no SMs


def _path_skip(path: str, backend: str, world: int, hosts: int) -> str | None:
    if path not in SYMMETRIC_PATHS:
        return None
    if backend != "nccl":
        return "needs CUDA GPUs with symmetric memory; this run uses gloo on CPU"
    if os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST") != "1":
        return "refused: NVLink multicast is not disabled (TORCH_SYMM_MEM_DISABLE_MULTICAST != 1)"
    if hosts > 1:
        return "symmetric memory needs every rank on one host"
    if path == "fused_norm" and not FUSED_WORLD[0] <= world <= FUSED_WORLD[1]:
        return f"the fused kernel runs on {FUSED_WORLD[0]}..{FUSED_WORLD[1]} ranks, not {world}"
    return None


def make_cases(bench: "CommSpec", world: int, backend: str, dtype: str, hidden: int, hosts: int = 1) -> list[Case]:
    """Every (op, path, CTA budget, size) of the spec, in nccl-tests' order: one block of
    ascending sizes per op, path and budget. Sizes are rounded down to whole units of the
    path (16-byte vectors per rank, or rows for the fused kernel)."""
    elem = DTYPE_BYTES[dtype]
    cases, seen = [], set()
    for op in bench.ops:
        for path in (p for p in PATHS_BY_OP[op] if p in bench.paths):
            skip = _path_skip(path, backend, world, hosts)
            fused_hidden = hidden if path == "fused_norm" else None
            unit, unit_words = _unit(op, path, world, elem, hidden)
            for ctas in _cta_settings(path, bench, backend):
                for size in bench.sizes:
                    count = size // elem // unit * unit
                    too_small = None if count else f"{format_bytes(size)} is below {unit_words} ({unit * elem} B)"
                    case = Case(op, path, backend, ctas, size, count, dtype, fused_hidden, skip=skip or too_small)
                    if case.key() not in seen:
                        seen.add(case.key())
                        cases.append(case)
    return [replace(c, seed=i + 1) for i, c in enumerate(cases)]


# ---------------------------------------------------------------------------------------------
# Verifiable inputs: rank q's chunk c is 1 + (j + 3q + 5*seed + 11c) % 13 at offset j.
# Values 1..13 are never zero; a sum over up to 9 sources (8 ranks + a residual) stays <= 117,
# exact in bf16; a rank's or a chunk's data in the wrong place differs from what belongs there.

MODULUS = 13


def _ints(source: int, chunk: int, count: int, seed: int, device) -> "torch.Tensor":
    import torch

    shift = (3 * source + 5 * seed + 11 * chunk) % MODULUS
    index = torch.int32 if count + MODULUS < 2**31 else torch.int64
    return torch.arange(count, dtype=index, device=device).add_(shift).remainder_(MODULUS).add_(1)


def pattern(source: int, chunk: int, count: int, seed: int, dtype, device) -> "torch.Tensor":
    """Rank `source`'s input chunk `chunk` ([count]) for a case's `seed`."""
    return _ints(source, chunk, count, seed, device).to(dtype)


def pattern_sum(sources: range, chunk: int, count: int, seed: int, dtype, device) -> "torch.Tensor":
    """The exact sum over `sources` of their chunk `chunk`."""
    total = _ints(sources[0], chunk, count, seed, device)
    for source in sources[1:]:
        total += _ints(source, chunk, count, seed, device)
    return total.to(dtype)


def op_input(op: str, rank: int, world: int, count: int, seed: int, dtype, device) -> "torch.Tensor":
    """What `rank` contributes: the whole buffer (all-reduce), its shard (all-gather), or one
    chunk per destination rank (reduce-scatter)."""
    import torch

    if op == "all_reduce":
        return pattern(rank, 0, count, seed, dtype, device)
    shard = count // world
    if op == "all_gather":
        return pattern(rank, rank, shard, seed, dtype, device)
    return torch.cat([pattern(rank, c, shard, seed, dtype, device) for c in range(world)])


def op_expected(op: str, rank: int, world: int, count: int, seed: int, dtype, device) -> "torch.Tensor":
    """What `rank` must hold afterwards."""
    import torch

    if op == "all_reduce":
        return pattern_sum(range(world), 0, count, seed, dtype, device)
    shard = count // world
    if op == "all_gather":
        return torch.cat([pattern(q, q, shard, seed, dtype, device) for q in range(world)])
    return pattern_sum(range(world), rank, shard, seed, dtype, device)


def count_wrong(result: "torch.Tensor", expected: "torch.Tensor") -> int:
    """Elements that differ (NaN counts as wrong); a shape mismatch makes every element wrong."""
    if result.numel() != expected.numel():
        return max(result.numel(), expected.numel())
    return int((result.reshape(-1) != expected.reshape(-1)).sum())


# ---------------------------------------------------------------------------------------------
# Benches: a case made runnable


@dataclass
class Bench:
    """A case's buffers behind the calls a measurement makes."""

    fill: Callable[[int], None]  # write this rank's verifiable inputs for a seed
    run: Callable[[], None]  # the communication, exactly as timed
    wrong: Callable[[int], int]  # this rank's elements that differ from the expected result
    out: Callable[[], "torch.Tensor"]  # where this rank's result lands (after run)


def _collective_bench(rt: "Runtime", case: Case, inp: "torch.Tensor", out: Callable[[], "torch.Tensor"],
                      run: Callable[[], None], poison: "torch.Tensor | None") -> Bench:
    """A plain collective: inputs and expected results from op_input / op_expected. `poison`
    (the output buffer, where fixed) is set to -1 first, so a result never written is wrong."""
    import torch

    dtype = getattr(torch, _TORCH_DTYPES[case.dtype])
    args = (case.op, rt.rank, rt.world_size, case.count)

    def fill(seed: int) -> None:
        if poison is not None:
            poison.fill_(-1)
        inp.copy_(op_input(*args, seed, dtype, inp.device))

    def wrong(seed: int) -> int:
        return count_wrong(out(), op_expected(*args, seed, dtype, inp.device))

    return Bench(fill, run, wrong, out)


def _empty(rt: "Runtime", count: int, dtype: str) -> "torch.Tensor":
    import torch

    return torch.empty(count, dtype=getattr(torch, _TORCH_DTYPES[dtype]), device=rt.device)


def _nccl_bench(rt: "Runtime", case: Case, buffers: "Buffers") -> Bench:
    """NCCL (gloo on CPU) as the strategies call it; a CTA budget is a process group created
    with that `max_ctas`. All-reduce in place; all-gather and reduce-scatter out of place."""
    import torch.distributed as dist

    from overlapbench.strategies.base import DEFAULT

    group = rt.group(case.ctas if case.ctas is not None else DEFAULT)
    shard = case.count // rt.world_size
    if case.op == "all_reduce":
        buf = _empty(rt, case.count, case.dtype)
        return _collective_bench(rt, case, buf, lambda: buf, lambda: dist.all_reduce(buf, group=group), buf)
    if case.op == "all_gather":
        inp, out = _empty(rt, shard, case.dtype), _empty(rt, case.count, case.dtype)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
        return _collective_bench(rt, case, inp, lambda: out, lambda: gather(out, inp, group=group), out)
    inp, out = _empty(rt, case.count, case.dtype), _empty(rt, shard, case.dtype)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in torch 2.13
    return _collective_bench(rt, case, inp, lambda: out, lambda: scatter(out, inp, group=group), out)


def _symm_all_reduce_bench(rt: "Runtime", case: Case, buffers: "Buffers") -> Bench:
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


def _copy_engine_bench(rt: "Runtime", case: Case, buffers: "Buffers") -> Bench:
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


def _fused_norm_bench(rt: "Runtime", case: Case, buffers: "Buffers") -> Bench:
    """kernels.allreduce_norm.AllReduceNorm on rows x hidden: the partial sums are reduced over
    ranks, the residual becomes residual + sum (exact: small integers) and out becomes
    rmsnorm(residual) * weight (checked against the torch reference to one rounding step)."""
    import torch

    from kernels.rmsnorm import add_rmsnorm_reference

    kernel = buffers.fused(case)
    dtype = getattr(torch, _TORCH_DTYPES[case.dtype])
    rows, hidden, n, world = case.rows, case.hidden, case.count, rt.world_size
    partial = kernel.partial(0, rows)
    residual = torch.empty(rows, hidden, dtype=dtype, device=rt.device)
    out = torch.empty_like(residual)
    weight = (torch.arange(hidden, device=rt.device) % 3 + 1).to(dtype)
    rtol = max(torch.finfo(dtype).eps, 1e-5)  # one rounding step of the output dtype

    def fill(seed: int) -> None:
        partial.copy_(pattern(rt.rank, 0, n, seed, dtype, rt.device).view(rows, hidden))
        residual.copy_(pattern(world, 0, n, seed, dtype, rt.device).view(rows, hidden))  # one more source
        out.fill_(-1)

    def run() -> None:
        kernel(0, rows, residual, weight, FUSED_EPS, out, case.ctas)

    def wrong(seed: int) -> int:
        reduced = pattern_sum(range(world), 0, n, seed, torch.float32, rt.device).view(rows, hidden)
        ref_residual = pattern(world, 0, n, seed, dtype, rt.device).view(rows, hidden)
        ref_out = add_rmsnorm_reference(reduced, ref_residual, weight, FUSED_EPS)  # ref_residual += reduced
        off = ~torch.isclose(out.float(), ref_out.float(), rtol=rtol, atol=1e-6)
        return count_wrong(residual, ref_residual) + int(off.sum())

    return Bench(fill, run, wrong, lambda: out)


BUILDERS: dict[str, Callable[["Runtime", Case, "Buffers"], Bench]] = {
    "nccl": _nccl_bench,
    "symm_one_shot": _symm_all_reduce_bench,
    "symm_two_shot": _symm_all_reduce_bench,
    "copy_engine": _copy_engine_bench,
    "fused_norm": _fused_norm_bench,
}


@dataclass
class SymmetricBuffer:
    """A flat rendezvoused symmetric-memory tensor and the handle that maps the peers' ones."""

    tensor: "torch.Tensor"
    handle: Any
    group_name: str
    offset: int  # elements from the allocation base to `tensor` (pooled allocations add one)

    def peer(self, rank: int, start: int, count: int) -> "torch.Tensor":
        """[count] elements of `rank`'s buffer from `start`, mapped into this process."""
        return self.handle.get_buffer(rank, (count,), self.tensor.dtype, self.offset + start)


def enable_symmetric_memory(group) -> None:
    """Register the group with symmetric memory: required by the torch releases that have
    `enable_symm_mem_for_group`, deprecated (and harmless) in the later ones."""
    from torch.distributed import _symmetric_memory as symm_mem

    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable(group.group_name)


def symmetric_buffer(rt: "Runtime", count: int, dtype: str) -> SymmetricBuffer:
    """symm_mem.empty + rendezvous on the world group (collective). Refuses a mapping that came
    with NVLink multicast."""
    import torch
    import torch.distributed as dist
    from torch.distributed import _symmetric_memory as symm_mem

    group = dist.group.WORLD
    enable_symmetric_memory(group)
    tensor = symm_mem.empty(count, dtype=getattr(torch, _TORCH_DTYPES[dtype]), device=rt.device)
    handle = symm_mem.rendezvous(tensor, group)
    if getattr(handle, "multicast_ptr", 0):
        raise RuntimeError("symmetric memory came with an NVLink multicast mapping; set TORCH_SYMM_MEM_DISABLE_MULTICAST=1")
    offset = tensor.data_ptr() - handle.buffer_ptrs[rt.rank]
    if offset % tensor.element_size():
        raise RuntimeError("symmetric tensor is not element-aligned in its allocation")
    return SymmetricBuffer(tensor, handle, group.group_name, offset // tensor.element_size())


class Buffers:
    """The symmetric allocations of a run, one per kind, each made once at the size of the
    largest case that uses it. Allocation and rendezvous are collective: every rank asks for
    them in the same order, the case order."""

    def __init__(self, rt: "Runtime", cases: list[Case]) -> None:
        self.rt = rt
        self._largest: dict = {}
        for case in cases:
            if case.skip is None and case.path in SYMMETRIC_PATHS:
                key = self._key(case)
                self._largest[key] = max(self._largest.get(key, 0), case.count)
        self._made: dict = {}

    @staticmethod
    def _key(case: Case) -> tuple:
        if case.path == "fused_norm":
            return ("fused_norm", case.dtype, case.hidden)
        return ("symmetric", case.dtype)  # one-shot, two-shot and copy engine take turns on it

    def symmetric(self, case: Case) -> SymmetricBuffer:
        key = self._key(case)
        if key not in self._made:
            self._made[key] = symmetric_buffer(self.rt, self._largest[key], case.dtype)
        return self._made[key]

    def fused(self, case: Case):
        import torch
        import torch.distributed as dist

        from kernels.allreduce_norm import AllReduceNorm

        key = self._key(case)
        if key not in self._made:
            rows = self._largest[key] // case.hidden
            dtype = getattr(torch, _TORCH_DTYPES[case.dtype])
            enable_symmetric_memory(dist.group.WORLD)
            self._made[key] = AllReduceNorm(dist.group.WORLD, rows, case.hidden, dtype, self.rt.device)
        return self._made[key]


def build(rt: "Runtime", case: Case, buffers: Buffers) -> Bench:
    return BUILDERS[case.path](rt, case, buffers)


# ---------------------------------------------------------------------------------------------
# Measuring


def check(bench: Bench, seed: int, rt: "Runtime") -> int:
    """#wrong: fresh inputs, one run, the elements differing from the exact result, summed
    over ranks."""
    bench.fill(seed)
    bench.run()
    return _sum_over_ranks(bench.wrong(seed), rt)


def _sum_over_ranks(value: int, rt: "Runtime") -> int:
    import torch
    import torch.distributed as dist

    total = torch.tensor([value], dtype=torch.int64, device=rt.device)
    dist.all_reduce(total)
    return int(total.item())


@dataclass(frozen=True)
class RunInfo:
    """What every row of a run shares."""

    spec: str  # "comm" for the command, the study's name inside a sweep
    run_id: str
    env: dict  # environment.run_environment
    warmup: int
    iters: int
    graphs: bool


def measure_case(rt: "Runtime", case: Case, buffers: Buffers, info: RunInfo) -> dict:
    """Check, then time one case on every rank; the result fields of its row."""
    from overlapbench import measure
    from overlapbench.strategies.base import Step

    if case.skip:
        return {"status": "skipped", "error": case.skip}
    bench, failure = None, None
    try:
        bench = build(rt, case, buffers)
    except Exception as e:  # noqa: BLE001 -- OOM, an unsupported dtype: a failed row
        failure = {"status": "failed", "error": one_line(e)}
    failure = rt.first_failure(failure)  # every rank learns it: none walks alone into a collective
    if failure:
        return failure
    try:
        wrong = check(bench, case.seed, rt)
        if wrong:
            return {"status": "failed", "wrong": wrong, "error": f"#wrong {wrong}: result differs from the exact expected one"}
        reps = ops_per_sample(case.nbytes, rt.is_cuda)
        step = Step(lambda _x: _repeat(bench.run, reps))
        timing = measure.time_step(step, bench.out(), info.warmup, info.iters, info.graphs)
    except Exception as e:  # noqa: BLE001 -- a kernel error: a failed row, and go on
        return {"status": "failed", "error": one_line(e)}
    stats = measure.summarize(timing.samples_ms, per=reps)
    seconds = stats["ms"] / 1e3
    return stats | {
        "status": "ok",
        "error": None,
        "wrong": 0,
        "algbw": algbw(case.nbytes, seconds),
        "busbw": busbw(case.op, case.nbytes, seconds, rt.world_size),
        "ops_per_sample": reps,
        "samples_ms": [round(s / reps, 6) for s in timing.samples_ms],
        "graphs": timing.graphs,
        "graph_error": timing.graph_error,
    }


def _repeat(fn: Callable[[], None], times: int) -> None:
    for _ in range(times):
        fn()


def _agree(result: dict, rt: "Runtime") -> dict:
    """All ranks' results merged: one failing rank fails the case for everyone."""
    import torch.distributed as dist

    results: list = [None] * rt.world_size
    dist.all_gather_object(results, result)
    bad = [(rank, r) for rank, r in enumerate(results) if r["status"] != "ok"]
    if not bad:
        return result
    rank, first = bad[0]
    if all(r == first for r in results):  # a skip, or a failure every rank saw (#wrong is summed)
        return first
    return first | {"error": f"rank {rank}: {first['error']}"}


def _quiesce(rt: "Runtime") -> None:
    """Every rank's GPU work done before the next case: paths signal peers through
    symmetric-memory pads with different protocols, which must never interleave."""
    import torch
    import torch.distributed as dist

    if rt.is_cuda:
        torch.cuda.synchronize()
    dist.barrier()


def make_row(case: Case, result: dict, info: RunInfo) -> dict:
    """A store row: the stable columns of `sweep` rows (schema result-v1), workload `comm`."""
    from overlapbench.results import SCHEMA

    env = info.env
    row = {
        "schema": SCHEMA,
        "run_id": info.run_id,
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "spec": info.spec,
        "key": case.key(),
        "status": result["status"],
        "error": result.get("error"),
        "workload": "comm",
        "strategy": case.strategy,
        "knobs": {"op": case.op, "ctas": case.ctas},
        "model": None,
        "shape": {"hidden": case.hidden} if case.hidden else None,
        "layers": None,
        "dtype": case.dtype,
        "batch": [case.rows] if case.rows else None,
        "tokens": case.rows or None,
        "tp": env["world_size"],
        "seed": case.seed,
        **env,
        "warmup": info.warmup,
        "iters": info.iters,
        "op": case.op,
        "bytes": case.nbytes,
        "count": case.count,
        "requested_bytes": case.size,
        "rel_err": None,
    }
    for key in ("ms", "p10_ms", "p90_ms", "iqr_ms", "cv", "graphs", "graph_error", "algbw", "busbw",
                "wrong", "ops_per_sample", "samples_ms"):
        row[key] = result.get(key)
    return row


def run_cases(rt: "Runtime", cases: list[Case], info: RunInfo, store: "ResultStore | None",
              done: set[str], console: "Console") -> list[dict]:
    """Measure every case not already in `done`, append a row each (rank 0 holds the store);
    returns the rows."""
    buffers = Buffers(rt, cases)
    rows, told = [], set()
    for case in cases:
        if case.key() in done:
            continue
        result = _agree(measure_case(rt, case, buffers, info), rt)
        row = make_row(case, result, info)
        if store is not None:
            store.append(row)
        rows.append(row)
        if row["status"] != "skipped" or (case.op, case.path, row["error"]) not in told:  # a skip once per path
            told.add((case.op, case.path, row["error"]))
            console.print(summary_line(row), highlight=False)
        _quiesce(rt)
    return rows


def summary_line(row: dict) -> str:
    """One progress line per row (rich markup)."""
    from rich.markup import escape

    if row["status"] == "skipped":  # printed once per op and path
        return f"  [yellow]skipped[/yellow] {row['op']} {row['strategy']}: {escape(row['error'])}"
    ctas = row["knobs"]["ctas"]
    what = f"{row['op']} {row['strategy']}{'' if ctas is None else f' ctas={ctas}'} {row['bytes']} B"
    if row["status"] != "ok":
        return f"  [red]{row['status']:>7}[/red] {what}: {escape(row['error'])}"
    return (f"  [green]{'ok':>7}[/green] {what}: {row['ms'] * 1e3:.1f} us, "
            f"busbw {row['busbw']:.1f} GB/s, cv {row['cv']:.1%}")


def run_in_sweep(rt: "Runtime", spec: "SweepSpec", store: "ResultStore | None", done: set[str],
                 run_id: str, env: dict, console: "Console") -> int:
    """A study's `comm:` section, after its layer points, into the same store; rows written."""
    bench = spec.comm
    dtype = spec.resolved_dtype(rt.is_cuda)
    cases = make_cases(bench, rt.world_size, rt.backend, dtype, bench.hidden or spec.shape.hidden, len(env["hosts"]))
    m = spec.measure
    info = RunInfo(spec.name, run_id, env, m.warmup, m.iters, m.graphs)
    console.print(f"comm: {len(cases)} collective cases")
    rows = run_cases(rt, cases, info, store, done, console)
    return len(rows) if store is not None else 0


# ---------------------------------------------------------------------------------------------
# Output: nccl-tests' columns


COLUMNS = ("size", "count", "type", "op", "path", "ctas", "time_us", "algbw", "busbw", "wrong",
           "p10_us", "p90_us", "cv", "status", "error")


def record(row: dict) -> dict:
    """One flat record per row, in nccl-tests' terms (GB/s for the bandwidths)."""
    us = lambda ms: None if ms is None else round(ms * 1e3, 3)  # noqa: E731
    sig = lambda x: None if x is None else float(f"{x:.4g}")  # noqa: E731 -- 4 significant digits
    return {
        "size": row["bytes"], "count": row["count"], "type": row["dtype"], "op": row["op"],
        "path": row["strategy"], "ctas": row["knobs"]["ctas"],
        "time_us": us(row.get("ms")), "algbw": sig(row.get("algbw")), "busbw": sig(row.get("busbw")),
        "wrong": row.get("wrong"), "p10_us": us(row.get("p10_ms")), "p90_us": us(row.get("p90_ms")),
        "cv": sig(row.get("cv")), "status": row["status"], "error": row.get("error"),
    }


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in record(row).items()})
    return buf.getvalue()


def to_json(rows: list[dict]) -> str:
    return json.dumps([record(r) for r in rows], indent=1)


def to_table(rows: list[dict]) -> "Table":
    """The rich table: measured rows, and one line per distinct reason a case did not run."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="overlapbench comm", title_justify="left", caption_justify="left", show_edge=False)
    for name in ("size (B)", "count", "type", "op", "path", "ctas", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"):
        table.add_column(name, justify="left" if name in ("type", "op", "path") else "right")
    reasons: dict[str, list[str]] = {}
    for row in rows:
        what = f"{row['op']}/{row['strategy']}"
        if row["status"] == "skipped":
            reasons.setdefault(row["error"], []).append(what)
            continue
        ok = row["status"] == "ok"
        if not ok:
            reasons.setdefault(f"failed: {row['error']}", []).append(f"{what}@{row['bytes']}")
        timed = [f"{row['ms'] * 1e3:.2f}", f"{row['algbw']:.2f}", f"{row['busbw']:.2f}"] if ok else ["[red]failed[/red]"] * 3
        ctas, wrong = row["knobs"]["ctas"], row.get("wrong")
        table.add_row(str(row["bytes"]), str(row["count"]), row["dtype"], row["op"], row["strategy"],
                      "-" if ctas is None else str(ctas), *timed, "-" if wrong is None else str(wrong))
    notes = [f"{', '.join(dict.fromkeys(where))}: {escape(why)}" for why, where in reasons.items()]
    table.caption = "\n".join(notes) if notes else None
    return table


def render(rows: list[dict], fmt: str, console: "Console") -> None:
    if fmt == "table":
        if not console.is_terminal:  # a pipe or a file: no 80-column squeeze
            from rich.console import Console

            console = Console(file=console.file, width=160)
        console.print(to_table(rows))
    else:
        console.file.write(to_csv(rows) if fmt == "csv" else to_json(rows) + "\n")
        console.file.flush()


def totals(rows: list[dict]) -> str:
    """nccl-tests' closing line: the wrong elements over all rows, and the row counts."""
    wrong = sum(r.get("wrong") or 0 for r in rows)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "failed", "skipped")}
    verdict = "OK" if not counts["failed"] else "FAILED"
    return f"# #wrong total: {wrong} ({verdict}); {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped"


# ---------------------------------------------------------------------------------------------
# The command


@dataclass(frozen=True)
class Options:
    """One `overlapbench comm` invocation, validated before any process starts."""

    min_bytes: int | None  # None: by device (GPU_SIZES / CPU_SIZES)
    max_bytes: int | None
    factor: int
    ops: tuple[str, ...]
    paths: tuple[str, ...]
    dtype: str
    nccl_max_ctas: tuple
    comm_ctas: tuple[int, ...]
    hidden: int
    iters: int
    warmup: int
    graphs: bool
    fmt: str
    output: Path | None
    resume: bool
    nproc: int | None

    @classmethod
    def parse(cls, *, min_bytes: str | None, max_bytes: str | None, factor: int, ops: str | None,
              paths: str | None, dtype: str, nccl_max_ctas: str, comm_ctas: str, hidden: int,
              iters: int, warmup: int, graphs: bool, fmt: str, output: Path | None, resume: bool,
              nproc: int | None) -> "Options":
        from overlapbench.spec import DTYPES, CommSpec

        if fmt not in FORMATS:
            raise UserError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
        if dtype not in DTYPES:
            raise UserError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
        if iters < 1:
            raise UserError(f"--iters: must be at least 1, got {iters}")
        if warmup < 0:
            raise UserError(f"--warmup: must be at least 0, got {warmup}")
        if nproc is not None and nproc < 1:
            raise UserError(f"--nproc: must be at least 1, got {nproc}")
        if output is not None and output.suffix != ".jsonl":
            raise UserError(f"--output: must be a path ending in .jsonl, got {str(output)!r}")
        lists = CommSpec.build(
            ops=ops or OPS, paths=paths or PATHS, sizes=(), hidden=hidden,
            nccl_max_ctas=nccl_max_ctas or CommSpec.DEFAULT_NCCL_MAX_CTAS,
            comm_ctas=comm_ctas or CommSpec.DEFAULT_COMM_CTAS,
            name=lambda field: "--" + field.replace("_", "-"),
        )
        opts = cls(
            min_bytes=None if min_bytes is None else parse_size(min_bytes, "-b/--min-bytes"),
            max_bytes=None if max_bytes is None else parse_size(max_bytes, "-e/--max-bytes"),
            factor=factor, ops=lists.ops, paths=lists.paths, dtype=dtype, nccl_max_ctas=lists.nccl_max_ctas,
            comm_ctas=lists.comm_ctas, hidden=hidden, iters=iters, warmup=warmup, graphs=graphs, fmt=fmt,
            output=output, resume=resume, nproc=nproc,
        )
        opts.sizes(cuda=False)  # validates -b -e -f now, in one line
        return opts

    def sizes(self, cuda: bool) -> tuple[int, ...]:
        """The ladder; a bound not given is the device's default, moved to meet the other."""
        lo_default, hi_default = (parse_size(s, "size") for s in (GPU_SIZES if cuda else CPU_SIZES))
        lo, hi = self.min_bytes, self.max_bytes
        if lo is None:
            lo = lo_default if hi is None else min(lo_default, hi)
        if hi is None:
            hi = max(lo, hi_default)
        return size_ladder(lo, hi, self.factor)

    def bench(self, cuda: bool) -> "CommSpec":
        from overlapbench.spec import CommSpec

        return CommSpec(self.ops, self.paths, self.sizes(cuda), self.nccl_max_ctas, self.comm_ctas, self.hidden)

    def argv(self, cuda: bool, output: Path) -> list[str]:
        """The same command, explicit, for the ranks torchrun starts."""
        sizes = self.sizes(cuda)
        args = [
            "comm", "-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", str(self.factor),
            "--ops", ",".join(self.ops), "--paths", ",".join(self.paths), "--dtype", self.dtype,
            "--nccl-max-ctas", ",".join(map(str, self.nccl_max_ctas)), "--comm-ctas", ",".join(map(str, self.comm_ctas)),
            "--hidden", str(self.hidden), "--iters", str(self.iters), "--warmup", str(self.warmup),
            "--graphs" if self.graphs else "--no-graphs", "--format", self.fmt, "--output", str(output),
        ]
        return args + (["--resume"] if self.resume else [])


def default_output(device: str, world: int) -> Path:
    """results/comm-<device>-<world>.jsonl, e.g. results/comm-nvidia-h200-2.jsonl."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "cpu"
    return Path("results") / f"comm-{slug}-{world}.jsonl"


def _local_device_name() -> str:
    import torch

    return torch.cuda.get_device_properties(0).name if torch.cuda.is_available() else "cpu"


def main(opts: Options, console: "Console", err_console: "Console") -> int:
    """Started plainly: check the store, re-launch under torchrun; under torchrun: measure."""
    from overlapbench import launch
    from overlapbench.results import check_writable

    if launch.under_torchrun():
        return run_ranks(opts, console)
    cuda = launch.local_gpus() > 0
    world = opts.nproc or launch.default_nproc()
    out = opts.output or default_output(_local_device_name(), world)
    check_writable(out, opts.resume)
    code = launch.relaunch(opts.argv(cuda, out), world)
    if code:
        err_console.print(f"[bold red]comm failed[/bold red] (exit {code}); finished rows are in {out}; `--resume` continues")
    return code


def run_ranks(opts: Options, console: "Console") -> int:
    """The measurement on this rank: cases, the store, the rows; rank 0 prints them."""
    import torch.distributed as dist
    from rich.console import Console

    from overlapbench import environment, results, runtime

    rt = runtime.init(TIMEOUT_S)
    progress = Console(stderr=True, quiet=rt.rank != 0)
    env = environment.run_environment(rt)
    dtype = ("bf16" if rt.is_cuda else "fp32") if opts.dtype == "auto" else opts.dtype
    cases = make_cases(opts.bench(rt.is_cuda), rt.world_size, rt.backend, dtype, opts.hidden, len(env["hosts"]))
    output = opts.output or default_output(env["device"], rt.world_size)
    store, done, run_id = results.open_on_ranks(output, opts.resume, rt.rank)
    info = RunInfo("comm", run_id, env, opts.warmup, opts.iters, opts.graphs)
    try:
        progress.print(f"comm: {len(cases)} cases on {rt.world_size} x {env['device']} ({rt.backend}, {dtype}) -> {output}", highlight=False)
        rows = run_cases(rt, cases, info, store, done, progress)
    finally:
        if store is not None:
            store.close()
    if rt.rank == 0:
        render(rows, opts.fmt, console)
        progress.print(totals(rows), highlight=False)
    dist.barrier()
    dist.destroy_process_group()
    return 0
