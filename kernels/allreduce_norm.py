"""All-reduce + residual add + RMSNorm in one few-CTA Triton kernel over symmetric memory.

Every rank holds a row-parallel partial sum P_r of shape [tokens, hidden] in a symmetric
buffer. Rank r owns the contiguous row block `row_block(r)` of the range. The kernel runs
three phases separated by two cross-rank barriers, and moves data between GPUs only with
stores ("push"): a store leaves the SM at once, while a remote load holds registers for a
whole NVLink round trip, which is what starves a kernel that has only a few CTAs.

1. scatter: rank r pushes its partial rows of every peer's block into that peer's staging
   slot (a region after the partials in the same buffer).            -- barrier A --
2. reduce: rank r sums its block (staging slots + own partial + residual) in fp32, rounds
   the new residual once, and pushes it into the partial rows of that block on every rank
   (its own included): those rows are free, their owner read them in phase 1.  -- barrier B --
3. gather: every rank copies all the new residual rows from its own buffer into `residual`
   and computes `out = rmsnorm(residual) * weight`: the same code on the same bits, so
   `residual` and `out` are bit-identical on all ranks.

Row tile t of every block belongs to CTA t % num_ctas on every rank and in every phase, so a
barrier between CTA b of all ranks is enough (no grid-wide sync). Barrier flags are counters
(+1 by the sender, -1 by the receiver after it saw >= 1), so they return to 0 after every
call: safe under CUDA-graph replay. After barrier B no peer touches this rank's buffer again
in this call, so the next GEMM may overwrite the partial rows as soon as the kernel ends.
No NVLink multicast anywhere: only peer loads/stores/atomics through mapped pointers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from kernels.rmsnorm import rmsnorm_rows

MAX_CTAS = 64  # CTA budget limit: MAX_CTAS * MAX_WORLD int32 flags fill the smallest signal pad
MAX_WORLD = 8
SIGNAL_SLOTS = MAX_CTAS * MAX_WORLD
STEP_BYTES = 128 * 1024  # bytes one CTA loads per loop step (16-byte vectors, all in flight at once)
_MAX_TILE_ROWS = 16

# allocate(numel, dtype, device, group) -> a symmetric buffer (.tensor, .handle, .view, .peer_ptrs,
# .rank, .world): collective, every rank calls it in the same order. The caller passes its own
# (overlapbench's runtime.symmetric_buffer), so kernels/ depends on nothing above it.
Allocate = Callable[..., object]


def row_block(n_rows: int, world: int, rank: int) -> tuple[int, int]:
    """Rows [lo, hi) of an n_rows range that `rank` reduces (same formula as the kernel)."""
    return rank * n_rows // world, (rank + 1) * n_rows // world


def slot_rows(max_tokens: int, world: int) -> int:
    """Rows of one staging slot: the largest row block of any range."""
    return triton.cdiv(max_tokens, world)


def ranks_of(group, hidden: int, dtype: torch.dtype) -> tuple[int, int]:
    """(world size, rank) of `group`, once its size and the row width suit the kernels: rows move
    as whole 16-byte vectors, and the flags are laid out for at most MAX_WORLD ranks."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if not 2 <= world <= MAX_WORLD:
        raise ValueError(f"world size {world} outside 2..{MAX_WORLD}")
    if hidden * torch.empty((), dtype=dtype).element_size() % 16:
        raise ValueError("a row must be a whole number of 16-byte vectors")
    return world, rank


def check_call(row_start: int, row_end: int, max_tokens: int, num_ctas: int, hidden: int,
               dtype: torch.dtype | None, **rows: torch.Tensor | None) -> None:
    """One call's arguments, for every all-reduce + norm engine: a row range inside the buffers,
    a CTA budget in 1..MAX_CTAS, and each given tensor [rows, hidden] (of `dtype` unless None)
    with unit column stride."""
    n_rows = row_end - row_start
    if not 0 <= row_start <= row_end <= max_tokens:
        raise ValueError(f"rows [{row_start}, {row_end}) outside [0, {max_tokens})")
    if not 1 <= num_ctas <= MAX_CTAS:
        raise ValueError(f"num_ctas={num_ctas} outside 1..{MAX_CTAS}")
    for name, t in rows.items():
        if t is not None and (t.shape != (n_rows, hidden) or (dtype is not None and t.dtype != dtype)
                              or (n_rows and t.stride(1) != 1)):
            of = "" if dtype is None else f" {dtype}"
            raise ValueError(f"{name} must be [{n_rows}, {hidden}]{of} with unit column stride")


def peer_offsets(sym, device: torch.device) -> torch.Tensor:
    """int64 [world]: where each rank's copy of `sym` (a runtime.SymmetricBuffer) lies relative to
    this rank's, in 16-byte units, the kernels' addressing; refuses copies not 16-byte aligned."""
    ptrs = sym.peer_ptrs()
    if any((p - ptrs[sym.rank]) % 16 for p in ptrs):
        raise RuntimeError("symmetric buffers are not 16-byte aligned relative to each other")
    return torch.tensor([(p - ptrs[sym.rank]) // 16 for p in ptrs], dtype=torch.int64, device=device)


def buffer_rows(max_tokens: int, world: int) -> int:
    """Rows of the symmetric buffer: the partials, then world-1 staging slots."""
    return max_tokens + (world - 1) * slot_rows(max_tokens, world)


@dataclass(frozen=True)
class Tiling:
    """Compile-time shape of the kernel's loop steps for one (world, hidden, dtype).

    Each step loads about `step_bytes` per CTA as [lanes, rows, block_h] tiles of 16-byte
    vectors, every load of a step issued before the first use (few CTAs are latency-bound:
    bytes in flight per CTA is what sets their bandwidth); wide worlds split the lanes into
    groups so that a step still fits in registers.
    """

    block_h: int  # hidden rounded up to a power of two: a whole row sits in registers
    peers: int  # lanes for the world-1 peers (a power of two)
    lanes: int  # lanes for all world ranks (a power of two)
    tile_rows: int  # rows per tile: the unit of CTA ownership, pushed at once in phase 1
    scatter_lanes: int  # peers per phase-1 step
    reduce_lanes: int  # staged partials per phase-2 step (with own partial and residual)
    reduce_rows: int
    gather_lanes: int  # ranks' blocks per phase-3 step (fp32 copies held for the norm)
    gather_rows: int
    num_warps: int


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def tiling(world: int, hidden: int, elem_size: int, step_bytes: int = STEP_BYTES) -> Tiling:
    """Steps of about `step_bytes` (128 KiB measured 5-16% faster than 64 KiB on H200, no spills)."""
    block_h = triton.next_power_of_2(hidden)
    peers, lanes = triton.next_power_of_2(world - 1), triton.next_power_of_2(world)
    step = step_bytes // elem_size // block_h  # rows per step
    scatter = min(peers, _pow2_floor(step))
    tile = min(_MAX_TILE_ROWS, _pow2_floor(step // scatter))
    reduce = min(peers, _pow2_floor(step - 2))
    gather = min(lanes, _pow2_floor(step // 2))
    return Tiling(
        block_h=block_h,
        peers=peers,
        lanes=lanes,
        tile_rows=tile,
        scatter_lanes=scatter,
        reduce_lanes=reduce,
        reduce_rows=min(tile, _pow2_floor(step // (reduce + 2))),
        gather_lanes=gather,
        gather_rows=min(tile, _pow2_floor(step // 2 // gather)),
        num_warps=max(4, min(16, block_h // 256)),
    )


@triton.jit
def _row_block(q, n_rows, WORLD: tl.constexpr):
    return q * n_rows // WORLD, (q + 1) * n_rows // WORLD


@triton.jit
def _barrier(pad_ptrs, rank, WORLD: tl.constexpr, LANES: tl.constexpr):
    """CTA `program_id` of every rank meets here; release/acquire at system scope.

    Flag [cta, src] in the pad of rank dst counts signals from src not yet consumed by dst.
    """
    slots = tl.program_id(0) * WORLD
    k = tl.arange(0, LANES)
    live = k < WORLD
    peer_pads = tl.load(pad_ptrs + k, mask=live, other=0).to(tl.pointer_type(tl.int32))
    own_pad = tl.load(pad_ptrs + rank).to(tl.pointer_type(tl.int32))
    tl.debug_barrier()  # every thread's stores of the phase precede the release
    tl.atomic_add(peer_pads + slots + rank, 1, mask=live, sem="release", scope="sys")
    for q in tl.static_range(WORLD):
        flag = own_pad + slots + q
        while tl.atomic_add(flag, 0, sem="acquire", scope="sys") == 0:
            pass
        tl.atomic_add(flag, -1, sem="relaxed", scope="sys")
    tl.debug_barrier()  # the acquire precedes every thread's loads of the next phase


@triton.jit
def _allreduce_norm_kernel(
    buf_ptr,  # this rank's symmetric buffer [buffer_rows, hidden]
    peer_off_ptr,  # int64 [world]: rank q's buffer minus this one, in 16-byte units
    pad_ptrs,  # int64 [world]: address of rank q's signal pad (int32 flags)
    res_ptr, out_ptr, w_ptr,
    row_start, n_rows, hidden, stride_res, stride_out, eps, rank,
    stage_row0, slot_rows,
    WORLD: tl.constexpr, PEERS: tl.constexpr, LANES: tl.constexpr, TILE_R: tl.constexpr,
    SCATTER_L: tl.constexpr, REDUCE_L: tl.constexpr, REDUCE_R: tl.constexpr,
    GATHER_L: tl.constexpr, GATHER_R: tl.constexpr, BLOCK_H: tl.constexpr, VEC: tl.constexpr,
):
    cta = tl.program_id(0)
    n_ctas = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < hidden
    n_tiles = tl.cdiv(tl.cdiv(n_rows, WORLD), TILE_R)

    # Phase 1, scatter: lane i pushes the rows of rank (rank+1+i)'s block into its slot WORLD-2-i.
    for g in tl.static_range(0, PEERS, SCATTER_L):
        i = g + tl.arange(0, SCATTER_L)
        dst = (rank + 1 + i) % WORLD
        dst_lo, dst_hi = _row_block(dst, n_rows, WORLD)
        dst_stage = tl.load(peer_off_ptr + dst) * VEC + (stage_row0 + (WORLD - 2 - i) * slot_rows).to(tl.int64) * hidden
        for t in range(cta, n_tiles, n_ctas):
            j = t * TILE_R + tl.arange(0, TILE_R)
            rows = dst_lo[:, None] + j[None, :]
            ok = ((i < WORLD - 1)[:, None] & (rows < dst_hi[:, None]))[:, :, None] & col_ok[None, None, :]
            src = ((row_start + rows).to(tl.int64) * hidden)[:, :, None] + cols[None, None, :]
            vals = tl.load(buf_ptr + src, mask=ok)
            dst_rows = dst_stage[:, None] + j.to(tl.int64)[None, :] * hidden
            tl.store(buf_ptr + dst_rows[:, :, None] + cols[None, None, :], vals, mask=ok)
    _barrier(pad_ptrs, rank, WORLD, LANES)

    # Phase 2, reduce this rank's block; slot s holds the partial of rank (rank+1+s) % WORLD.
    lo, hi = _row_block(rank, n_rows, WORLD)
    for t in range(cta, n_tiles, n_ctas):
        for s in range(0, TILE_R, REDUCE_R):
            j = t * TILE_R + s + tl.arange(0, REDUCE_R)
            rows = lo + j
            ok = (rows < hi)[:, None] & col_ok[None, :]
            offs = (row_start + rows).to(tl.int64)[:, None] * hidden + cols[None, :]
            res_ptrs = res_ptr + rows.to(tl.int64)[:, None] * stride_res + cols[None, :]
            acc = tl.load(buf_ptr + offs, mask=ok, other=0.0).to(tl.float32)
            acc += tl.load(res_ptrs, mask=ok, other=0.0).to(tl.float32)
            for g in tl.static_range(0, PEERS, REDUCE_L):
                sl = g + tl.arange(0, REDUCE_L)
                staged = (stage_row0 + sl[:, None] * slot_rows + j[None, :]).to(tl.int64) * hidden
                ok3 = (sl < WORLD - 1)[:, None, None] & ok[None, :, :]
                peers = tl.load(buf_ptr + staged[:, :, None] + cols[None, None, :], mask=ok3, other=0.0,
                                cache_modifier=".cg")
                acc += tl.sum(peers.to(tl.float32), axis=0)
            new = acc.to(buf_ptr.dtype.element_ty)
            for q in tl.static_range(WORLD):
                tl.store(buf_ptr + tl.load(peer_off_ptr + q) * VEC + offs, new, mask=ok)
    _barrier(pad_ptrs, rank, WORLD, LANES)

    # Phase 3, gather: lane k copies and normalizes the block of rank (rank+k) % WORLD.
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    for g in tl.static_range(0, LANES, GATHER_L):
        k = g + tl.arange(0, GATHER_L)
        src_lo, src_hi = _row_block((rank + k) % WORLD, n_rows, WORLD)
        for t in range(cta, n_tiles, n_ctas):
            for s in range(0, TILE_R, GATHER_R):
                j = t * TILE_R + s + tl.arange(0, GATHER_R)
                rows = src_lo[:, None] + j[None, :]
                ok = ((k < WORLD)[:, None] & (rows < src_hi[:, None]))[:, :, None] & col_ok[None, None, :]
                offs = ((row_start + rows).to(tl.int64) * hidden)[:, :, None] + cols[None, None, :]
                new = tl.load(buf_ptr + offs, mask=ok, other=0.0, cache_modifier=".cg")
                r64 = rows.to(tl.int64)[:, :, None]
                tl.store(res_ptr + r64 * stride_res + cols[None, None, :], new, mask=ok)
                y = rmsnorm_rows(new.to(tl.float32), w[None, None, :], hidden, eps, 2)
                tl.store(out_ptr + r64 * stride_out + cols[None, None, :], y.to(out_ptr.dtype.element_ty), mask=ok)


@dataclass(frozen=True)
class SymmetricRows:
    """One rank's view of the symmetric buffer: all the kernel needs, whoever allocated it."""

    buf: torch.Tensor  # [buffer_rows(max_tokens, world), hidden], this rank's
    peer_off: torch.Tensor  # int64 [world]: buffer of rank q minus this rank's, in 16-byte units
    pad_ptrs: torch.Tensor  # int64 [world]: signal pad address of rank q (>= SIGNAL_SLOTS int32, zeroed)
    rank: int
    world: int
    max_tokens: int


def reduce_norm(
    sym: SymmetricRows,
    row_start: int,
    row_end: int,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    num_ctas: int,
    step_bytes: int = STEP_BYTES,
) -> torch.Tensor:
    """Launch the kernel on rows [row_start, row_end) (see AllReduceNorm.__call__)."""
    n_rows, hidden = row_end - row_start, sym.buf.shape[1]
    check_call(row_start, row_end, sym.max_tokens, num_ctas, hidden, sym.buf.dtype, residual=residual, out=out)
    if n_rows == 0:
        return out
    til = tiling(sym.world, hidden, sym.buf.element_size(), step_bytes)
    _allreduce_norm_kernel[(num_ctas,)](
        sym.buf, sym.peer_off, sym.pad_ptrs, residual, out, weight.contiguous(),
        row_start, n_rows, hidden, residual.stride(0), out.stride(0), eps, sym.rank,
        sym.max_tokens, slot_rows(sym.max_tokens, sym.world),
        WORLD=sym.world, PEERS=til.peers, LANES=til.lanes, TILE_R=til.tile_rows,
        SCATTER_L=til.scatter_lanes, REDUCE_L=til.reduce_lanes, REDUCE_R=til.reduce_rows,
        GATHER_L=til.gather_lanes, GATHER_R=til.gather_rows,
        BLOCK_H=til.block_h, VEC=16 // sym.buf.element_size(), num_warps=til.num_warps,
    )
    return out


class AllReduceNorm:
    """Owns the symmetric buffers (allocated once, sized for the largest point).

    Calls on one instance must be issued in order on one stream, with the same row range and
    num_ctas on every rank. After a call the partial rows of its range hold the new residual.
    `step_bytes` (same on every rank) sets the bytes each CTA loads per loop step.
    """

    step_bytes: int = STEP_BYTES

    def __init__(self, group, max_tokens: int, hidden: int, dtype: torch.dtype, device: torch.device, *,
                 allocate: Allocate):
        """`allocate`: the caller's symmetric allocator (overlapbench's runtime.symmetric_buffer),
        passed in so the kernels import nothing from the package above them."""
        group = group or dist.group.WORLD
        world, rank = ranks_of(group, hidden, dtype)
        rows = buffer_rows(max_tokens, world)
        sym = allocate(rows * hidden, dtype, device, group)
        handle = sym.handle
        # The flags must start at 0 (a pooled allocation may reuse a pad); raises if the pad is smaller.
        handle.get_signal_pad(rank, [SIGNAL_SLOTS], torch.int32).zero_()
        self._sym = SymmetricRows(
            buf=sym.tensor.view(rows, hidden),
            peer_off=peer_offsets(sym, device),
            pad_ptrs=torch.tensor(list(handle.signal_pad_ptrs), dtype=torch.int64, device=device),
            rank=rank,
            world=world,
            max_tokens=max_tokens,
        )
        self._handle = sym  # keeps the peer mappings alive
        torch.cuda.current_stream(device).synchronize()
        dist.barrier(group)  # no rank signals before every pad is zeroed

    @property
    def max_tokens(self) -> int:
        return self._sym.max_tokens

    def partial(self, row_start: int, row_end: int) -> torch.Tensor:
        """[row_end-row_start, hidden] view into this rank's symmetric buffer: a row-parallel GEMM
        writes its partial sum here (torch.matmul(..., out=view)) so no copy is needed."""
        if not 0 <= row_start <= row_end <= self._sym.max_tokens:
            raise ValueError(f"rows [{row_start}, {row_end}) outside [0, {self._sym.max_tokens})")
        return self._sym.buf[row_start:row_end]

    def __call__(
        self,
        row_start: int,
        row_end: int,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        out: torch.Tensor,
        num_ctas: int,
    ) -> torch.Tensor:
        """Reduce rows [row_start, row_end) of the partial buffer over ranks, residual += sum,
        out = rmsnorm(residual) * weight; residual and out are [rows, hidden] tensors (regular
        memory) on every rank."""
        return reduce_norm(self._sym, row_start, row_end, residual, weight, eps, out, num_ctas, self.step_bytes)
