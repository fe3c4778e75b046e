"""All-reduce + residual add + RMSNorm, v2: TokenWeave's contract in one few-CTA Triton kernel.

v1 (kernels/allreduce_norm.py) replicates the new residual and re-reads every row on every rank
(about 6.5N bytes per rank at 2 ranks, N = the rows x hidden tensor). v2 keeps the residual
token-sharded and gathers only the normalized output (about 4.5N; 3.5N when the caller takes
the output where it lands), and replaces v1's two barriers by flags per tile:

1. scatter: CTA b pushes its tiles of every peer's row block into that peer's staging slot and,
   after each tile, adds 1 to the peer's flag `arrive[b][me]` (release, system scope).
2. reduce: for each of its tiles of this rank's own block, CTA b waits until every peer's
   `arrive[b][peer]` is >= 1 and takes 1 from it (the tiles come in the order they are reduced,
   so the count is exactly the tiles not yet reduced), then sums partial + staged + residual in
   fp32, rounds and stores the residual (own rows only: the other rows are neither read nor
   written), normalizes, and pushes the normalized rows into the output region of every rank
   (its own included). After its last tile it adds 1 to every peer's `done[b][me]`.
3. gather: CTA b waits for `done[b][peer]` of every peer (their rows of CTA b's tiles have
   landed), takes it back to 0 and, if the caller gave `out`, copies those rows into it.

Tile t of every block belongs to CTA t % num_ctas on every rank, so only CTAs with the same
index ever wait for each other, and only one thread per CTA spins (a scalar atomic). Every flag
returns to 0 by the end of a call: safe under CUDA-graph replay. Why no barrier is needed
between calls: a peer pushes into this rank's staging slots or output region in call k+1 only
after it passed phase 3 of call k, which follows this rank's phase 2 of call k (its last read of
the slots); and a rank writes another rank's output region only after that rank's kernel of the
same call signalled it (so the previous reader of that region, the rank's own stream, is done).
The partial rows are only read by their own rank, so they are free when the kernel returns.
No NVLink multicast anywhere: only peer stores and atomics through mapped pointers.

Compiled for sm_90 (tests/checks/compiled_kernels.py, Triton 3.9, hidden 4096/5120/8192): every access
to row data is one 16-byte vector, 121-128 registers at 16 warps, no local memory (no spills).
The pull variants (kernels/allreduce_norm_pull.py: peers' partials read over NVLink instead of
pushed; the output rows pulled too, or pushed as here) have the same contract and are 5-12%
faster on 2x H200: pull is the layer's kernel, this one the comm path fused_norm_push
(both measurements in allreduce_norm_pull's docstring). At 64 MiB, push reaches 104 GB/s busbw
on 8 CTAs and 179 on 16, pull 113 and 188 (NCCL's all-reduce alone 156 and 238-265). Why short
of NCCL per CTA: the kernel also does the norm, so each rank's SMs load and store about 4N
bytes per call (N the rows x hidden tensor: its own partial, the peer's partial, the residual
in; the residual, the published rows, the gathered rows out) where NCCL's ring moves about 2N;
at 16 CTAs pull moves 4 x 64 MiB in 357 us, about 47 GB/s per SM, about what 16-byte loads with
the tile's registers in flight sustain. More per CTA needs more bytes in flight (bulk copies
into shared memory, TMA), not fewer instructions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from kernels.allreduce_norm import (
    MAX_CTAS,
    MAX_WORLD,
    STEP_BYTES,
    Allocate,
    _row_block,
    check_call,
    peer_offsets,
    ranks_of,
    row_block,
    slot_rows,
)
from kernels.rmsnorm import rmsnorm_rows

FLAG_SLOTS = 2 * MAX_CTAS * MAX_WORLD  # arrive[cta][src], then done[cta][src]
_DONE = MAX_CTAS * MAX_WORLD
_MAX_TILE_ROWS = 16


def buffer_rows(max_tokens: int, world: int) -> int:
    """Rows of the symmetric buffer: partials, world-1 staging slots, the output region."""
    return 2 * max_tokens + (world - 1) * slot_rows(max_tokens, world)


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


@dataclass(frozen=True)
class Tiling:
    """Rows per tile (the unit of CTA ownership and of a flag, ~step_bytes per CTA in flight
    when pushed) and per reduce step (the world+1 loads of a step ~step_bytes)."""

    block_h: int
    tile_rows: int
    reduce_rows: int
    num_warps: int


def tiling(world: int, hidden: int, elem_size: int, step_bytes: int = STEP_BYTES) -> Tiling:
    block_h = triton.next_power_of_2(hidden)
    rows = step_bytes // elem_size // block_h
    tile = min(_MAX_TILE_ROWS, _pow2_floor(rows))
    return Tiling(block_h, tile, min(tile, _pow2_floor(rows // (world + 1))), max(4, min(16, block_h // 256)))


@triton.jit
def _signal(flag_ptrs, slot, rank, WORLD: tl.constexpr, LANES: tl.constexpr):
    """+1 on flag `slot` of every peer; the CTA's stores before it are visible first."""
    k = tl.arange(0, LANES)
    live = (k < WORLD) & (k != rank)
    pads = tl.load(flag_ptrs + k, mask=live, other=0).to(tl.pointer_type(tl.int32))
    tl.debug_barrier()  # every thread's stores precede the release
    tl.atomic_add(pads + slot, 1, mask=live, sem="release", scope="sys")


@triton.jit
def _take(flag):
    """Wait until `flag` >= 1 (acquire, one thread spins), then take 1 from it."""
    while tl.atomic_add(flag, 0, sem="acquire", scope="sys") == 0:
        pass
    tl.atomic_add(flag, -1, sem="relaxed", scope="sys")


@triton.jit
def _add_residual_norm(acc, res_ptr, rows, cols, ok, stride_res, w, hidden, eps, like_ptr):
    """The reduced rows `acc` (fp32) + residual: stored as the new residual (rounded once, own
    rows only); returns rmsnorm(new residual) * w in the element type of `like_ptr`."""
    res_ptrs = res_ptr + rows.to(tl.int64)[:, None] * stride_res + cols[None, :]
    acc += tl.load(res_ptrs, mask=ok, other=0.0).to(tl.float32)
    new = acc.to(res_ptr.dtype.element_ty)
    tl.store(res_ptrs, new, mask=ok)
    return rmsnorm_rows(new.to(tl.float32), w[None, :], hidden, eps, 1).to(like_ptr.dtype.element_ty)


@triton.jit
def _gather_tiles(src_buf, buf_ptr, out_ptr, src_lo, src_hi, cta, n_tiles, n_ctas, out_row0, row_start, hidden,
                  stride_out, cols, col_ok, TILE_R: tl.constexpr, COPY_OUT: tl.constexpr):
    """This CTA's tiles of one peer's rows, from the output region of `src_buf` (this rank's, or
    a peer's mapped one) into `out` (COPY_OUT), else into this rank's output region."""
    for t in range(cta, n_tiles, n_ctas):
        rows = src_lo + t * TILE_R + tl.arange(0, TILE_R)
        ok = (rows < src_hi)[:, None] & col_ok[None, :]
        landed = (out_row0 + row_start + rows).to(tl.int64)[:, None] * hidden + cols[None, :]
        y = tl.load(src_buf + landed, mask=ok, cache_modifier=".cg")
        if COPY_OUT:
            tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :], y, mask=ok)
        else:
            tl.store(buf_ptr + landed, y, mask=ok)


@triton.jit
def _allreduce_norm_v2_kernel(
    buf_ptr,  # this rank's symmetric buffer [buffer_rows, hidden]
    peer_off_ptr,  # int64 [world]: rank q's buffer minus this one, in 16-byte units
    flag_ptrs,  # int64 [world]: address of rank q's flags (int32 [FLAG_SLOTS])
    res_ptr, out_ptr, w_ptr,
    row_start, n_rows, hidden, stride_res, stride_out, eps, rank,
    stage_row0, slot_rows, out_row0,
    WORLD: tl.constexpr, LANES: tl.constexpr, MAXW: tl.constexpr, DONE: tl.constexpr,
    TILE_R: tl.constexpr, REDUCE_R: tl.constexpr, BLOCK_H: tl.constexpr, VEC: tl.constexpr,
    COPY_OUT: tl.constexpr,
):
    cta = tl.program_id(0)
    n_ctas = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < hidden
    n_tiles = tl.cdiv(tl.cdiv(n_rows, WORLD), TILE_R)
    own_flags = tl.load(flag_ptrs + rank).to(tl.pointer_type(tl.int32))

    # Phase 1, scatter: peer i+1 (dst) keeps this rank's partial in its slot (me - dst - 1) mod W.
    for t in range(cta, n_tiles, n_ctas):
        j = t * TILE_R + tl.arange(0, TILE_R)
        for i in tl.static_range(WORLD - 1):
            dst = (rank + 1 + i) % WORLD
            dst_lo, dst_hi = _row_block(dst, n_rows, WORLD)
            ok = ((dst_lo + j) < dst_hi)[:, None] & col_ok[None, :]
            vals = tl.load(buf_ptr + (row_start + dst_lo + j).to(tl.int64)[:, None] * hidden + cols[None, :], mask=ok)
            slot = (WORLD - 2 - i) * slot_rows
            staged = tl.load(peer_off_ptr + dst) * VEC + (stage_row0 + slot + j).to(tl.int64) * hidden
            tl.store(buf_ptr + staged[:, None] + cols[None, :], vals, mask=ok)
        _signal(flag_ptrs, cta * MAXW + rank, rank, WORLD, LANES)

    # Phase 2, reduce this rank's block; slot s holds the partial of rank (rank+1+s) % WORLD.
    lo, hi = _row_block(rank, n_rows, WORLD)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    for t in range(cta, n_tiles, n_ctas):
        for i in tl.static_range(WORLD - 1):
            _take(own_flags + cta * MAXW + (rank + 1 + i) % WORLD)
        tl.debug_barrier()  # the acquire precedes every thread's loads of the staged tile
        for s in range(0, TILE_R, REDUCE_R):
            j = t * TILE_R + s + tl.arange(0, REDUCE_R)
            rows = lo + j
            ok = (rows < hi)[:, None] & col_ok[None, :]
            offs = (row_start + rows).to(tl.int64)[:, None] * hidden + cols[None, :]
            acc = tl.load(buf_ptr + offs, mask=ok, other=0.0).to(tl.float32)
            for k in tl.static_range(WORLD - 1):
                staged = (stage_row0 + k * slot_rows + j).to(tl.int64)[:, None] * hidden + cols[None, :]
                acc += tl.load(buf_ptr + staged, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
            y = _add_residual_norm(acc, res_ptr, rows, cols, ok, stride_res, w, hidden, eps, buf_ptr)
            landed = (out_row0 + row_start + rows).to(tl.int64)[:, None] * hidden + cols[None, :]
            for q in tl.static_range(1 if COPY_OUT else 0, WORLD):  # its own copy only when it is the output
                tl.store(buf_ptr + tl.load(peer_off_ptr + (rank + q) % WORLD) * VEC + landed, y, mask=ok)
            if COPY_OUT:
                tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :], y, mask=ok)
    _signal(flag_ptrs, DONE + cta * MAXW + rank, rank, WORLD, LANES)

    # Phase 3, gather: the peers' rows of this CTA's tiles have landed in the output region.
    for i in tl.static_range(WORLD - 1):
        _take(own_flags + DONE + cta * MAXW + (rank + 1 + i) % WORLD)
    tl.debug_barrier()
    if COPY_OUT:
        for i in tl.static_range(WORLD - 1):
            src_lo, src_hi = _row_block((rank + 1 + i) % WORLD, n_rows, WORLD)
            _gather_tiles(buf_ptr, buf_ptr, out_ptr, src_lo, src_hi, cta, n_tiles, n_ctas, out_row0, row_start, hidden,
                          stride_out, cols, col_ok, TILE_R, COPY_OUT)


@dataclass(frozen=True)
class SymmetricRowsV2:
    """One rank's view of the symmetric buffers: all the kernel needs, whoever allocated them."""

    buf: torch.Tensor  # [buffer_rows(max_tokens, world), hidden], this rank's
    peer_off: torch.Tensor  # int64 [world]: buffer of rank q minus this rank's, in 16-byte units
    flag_ptrs: torch.Tensor  # int64 [world]: address of rank q's flags (int32 [FLAG_SLOTS], zeroed)
    rank: int
    world: int
    max_tokens: int

    def landed(self, row_start: int, row_end: int) -> torch.Tensor:
        """Rows [row_start, row_end) of the output region (every rank's normalized rows)."""
        return self.buf[self.out_row0 + row_start : self.out_row0 + row_end]

    @property
    def out_row0(self) -> int:
        return self.max_tokens + (self.world - 1) * slot_rows(self.max_tokens, self.world)


def reduce_norm(sym: SymmetricRowsV2, row_start: int, row_end: int, residual: torch.Tensor, weight: torch.Tensor,
                eps: float, out: torch.Tensor | None, num_ctas: int, step_bytes: int = STEP_BYTES) -> torch.Tensor:
    """Launch the kernel on rows [row_start, row_end) (see AllReduceNormV2.__call__)."""
    n_rows, hidden = row_end - row_start, sym.buf.shape[1]
    check_call(row_start, row_end, sym.max_tokens, num_ctas, hidden, sym.buf.dtype, residual=residual, out=out)
    if n_rows == 0:
        return sym.landed(row_start, row_end) if out is None else out
    til = tiling(sym.world, hidden, sym.buf.element_size(), step_bytes)
    _allreduce_norm_v2_kernel[(num_ctas,)](
        sym.buf, sym.peer_off, sym.flag_ptrs, residual, sym.buf if out is None else out, weight.contiguous(),
        row_start, n_rows, hidden, residual.stride(0), hidden if out is None else out.stride(0), eps, sym.rank,
        sym.max_tokens, slot_rows(sym.max_tokens, sym.world), sym.out_row0,
        WORLD=sym.world, LANES=triton.next_power_of_2(sym.world), MAXW=MAX_WORLD, DONE=MAX_CTAS * MAX_WORLD,
        TILE_R=til.tile_rows, REDUCE_R=til.reduce_rows, BLOCK_H=til.block_h, VEC=16 // sym.buf.element_size(),
        COPY_OUT=out is not None, num_warps=til.num_warps,
    )
    return sym.landed(row_start, row_end) if out is None else out


class AllReduceNormV2:
    """Owns the symmetric buffers (allocated once, sized for the largest point).

    Calls on one instance must be issued in order on one stream, with the same row range and
    num_ctas on every rank. The residual is token-sharded: a call reads and updates only the rows
    `own_rows` of it. Without `out` the call returns the output region's rows (valid until the
    next call on those rows: no copy); the partial rows are free when the call returns.
    """

    step_bytes: int = STEP_BYTES
    returns_view = True  # reducers.SymmetricReducer may pass out=None
    # the variant: its buffer's rows, its view of them and its launch (allreduce_norm_pull overrides)
    _buffer_rows = staticmethod(buffer_rows)
    _view = SymmetricRowsV2
    _reduce = staticmethod(reduce_norm)

    def __init__(self, group, max_tokens: int, hidden: int, dtype: torch.dtype, device: torch.device, *,
                 allocate: Allocate):
        """`allocate`: the caller's symmetric allocator (allreduce_norm.Allocate)."""
        group = group or dist.group.WORLD
        world, rank = ranks_of(group, hidden, dtype)
        rows = self._buffer_rows(max_tokens, world)
        data = allocate(rows * hidden, dtype, device, group)
        flags = allocate(FLAG_SLOTS, torch.int32, device, group)
        flags.tensor.zero_()
        self._sym = self._view(
            buf=data.tensor.view(rows, hidden),
            peer_off=peer_offsets(data, device),
            flag_ptrs=torch.tensor(flags.peer_ptrs(), dtype=torch.int64, device=device),
            rank=rank, world=world, max_tokens=max_tokens,
        )
        self._handles = (data, flags)  # keep the peer mappings alive
        torch.cuda.current_stream(device).synchronize()
        dist.barrier(group)  # no rank signals before every flag is zeroed

    @property
    def max_tokens(self) -> int:
        return self._sym.max_tokens

    def own_rows(self, row_start: int, row_end: int) -> tuple[int, int]:
        """The rows [lo, hi) of the call's range (relative to row_start) whose residual this rank keeps."""
        return row_block(row_end - row_start, self._sym.world, self._sym.rank)

    def partial(self, row_start: int, row_end: int) -> torch.Tensor:
        """[rows, hidden] view into this rank's partial rows: the row-parallel GEMM writes here."""
        if not 0 <= row_start <= row_end <= self._sym.max_tokens:
            raise ValueError(f"rows [{row_start}, {row_end}) outside [0, {self._sym.max_tokens})")
        return self._sym.buf[row_start:row_end]

    def __call__(self, row_start: int, row_end: int, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 out: torch.Tensor | None, num_ctas: int) -> torch.Tensor:
        """Reduce rows [row_start, row_end) of the partials over ranks; on own_rows residual += sum;
        out = rmsnorm(residual) * weight on every row and every rank (into `out`, or the view
        returned)."""
        return self._reduce(self._sym, row_start, row_end, residual, weight, eps, out, num_ctas, self.step_bytes)
