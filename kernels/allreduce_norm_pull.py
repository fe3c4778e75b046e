"""All-reduce + residual add + RMSNorm, kernel v2's pull variant: peers' rows read, not pushed.

Same contract, call signature, tiling and flag words as the push variant
(kernels/allreduce_norm_v2.py: token-sharded residual, only the normalized output gathered,
tile t of every block owned by CTA t % num_ctas on every rank), but every byte that crosses
NVLink is a load issued by the rank that needs it, and the only remote stores are flag atomics
(AllReduceNormPullPush, below, pushes its output instead).
The hypothesis it tests: an SM keeps more load bytes in flight than store bytes, so pulled rows
may reach more NVLink bandwidth per CTA than pushed ones (or not: measure both).

The buffer holds the partial rows (the row-parallel GEMM writes them) and an output region, no
staging slots (2 x max_tokens rows instead of (2 + (W-1)/W) x max_tokens).

1. ready: CTA b adds 1 to every peer's `ready[b][me]` (release, system scope): this rank's
   partial rows are written (the kernels before this one on the stream wrote them). It then
   waits for every peer's `ready[b][peer]` and takes 1 from it.
2. reduce: for each of its tiles of this rank's own block, CTA b loads its own partial rows and
   every peer's (remote 16-byte loads through the peer's mapped buffer), adds the residual in
   fp32, rounds and stores the residual (own rows only), normalizes, and stores the normalized
   rows into its own output region (local; and into `out` when given). After its last tile it
   adds 1 to every peer's `done[b][me]`: its rows are published, and it has finished reading
   the peers' partials of CTA b's tiles.
3. gather: CTA b waits for `done[b][peer]` of every peer, takes it back to 0, and loads the
   peer's published rows of CTA b's tiles (remote) into `out`, or, without `out`, into the same
   rows of its own output region (so the view returned holds every row, as in the push variant).

AllReduceNormPullPush (PUSH_OUT) pulls in phase 2 but pushes the normalized rows into every
rank's output region there (as the push variant's phase 2 does; `done` then also says "they have
landed"), and its phase 3 only copies the landed peer rows into `out`, locally: the shape of
PyTorch's in-place two-shot all-reduce, the third point of the comparison.

Every flag returns to 0 by the end of a call (each CTA adds 1 and its peer CTA takes 1, once per
call per flag): safe under CUDA-graph replay. Why no barrier is needed between calls:
- a rank's partial rows are read by peers, but its kernel returns only after every CTA b took
  every peer's `done[b]`, which each peer's CTA b signals after its last read of those partials:
  the partial rows are free when the call returns, as in the push variant.
- a rank's output region rows of its own block are read by peers in phase 3 (their only
  remote access to it), and rewritten only in phase 2 of a later call. Every CTA of call k+1
  takes `ready` from every peer before it writes anything, and a peer signals `ready` of call
  k+1 only when it starts call k+1, after its call k (phase 3 included) has returned on its
  stream. The same holds for the gather's local writes of peer
  rows into the output region (without `out`), whatever the row ranges of the two calls, and,
  with PUSH_OUT, for a peer's stores into this rank's region: they follow this rank's `ready`
  of the same call, so this rank's previous call, and its stream's use of the view before
  it, are done.
- `ready` of call k+1 never meets an unconsumed `ready` of call k: this rank's call k returned
  only after every peer CTA published (phase 2 of call k done, its `ready` taken).
No NVLink multicast anywhere: only peer loads (and, PUSH_OUT, stores) and atomics through
mapped pointers.

Compiled for sm_90 (tests/checks/compiled_kernels.py; Triton 3.6 on the H200 machine, 3.9 on a CPU one;
tests/test_kernels_ptx.py also 5120/2 and 4096/4): every access to row data is one 16-byte
vector, 128 registers at 16 warps, no local memory, as push (both variants, both output modes).

Measured on 2x H200 (`overlapbench comm`, bf16 hidden 8192, busbw in GB/s at 64 / 256 MiB;
results/h200x2/486cebf/comm-paths.txt, the same within 1-2% in 05b703a/comm-paths.txt):

    CTAs    push (v2)      pull          pull_push      NCCL all-reduce alone
    4       52.8 / 53.2    59.2 / 59.9   58.3 / 58.7
    8       103.8 / 105.3  113.0 / 115.6 113.6 / 115.6  156.1 / 160.3
    16      178.7 / 182.8  187.7 / 194.8 171.2 / 175.5  237.6 / 265.0
    32      254.9 / 259.2  271.0 / 288.8 (05b703a)      264.2 / 300.2

Pull is 5-12% faster than push at every budget and size, and pull_push no better than pull (at
16 CTAs 9-10% worse), so pull is the layer's kernel (the one `comm: fused` and comm path fused_norm
run: overlapbench/overlap/comm_methods.fused_kernel); push stays as fused_norm_push. All are
exact on the integer patterns (#wrong 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import triton
import triton.language as tl

from kernels.allreduce_norm import MAX_CTAS, MAX_WORLD, STEP_BYTES, AllReduceNorm, _row_block, check_call
from kernels.allreduce_norm_v2 import (
    AllReduceNormV2,
    SymmetricRowsV2,
    _add_residual_norm,
    _gather_tiles,
    _signal,
    _take,
    tiling,
)

FLAG_SLOTS = 2 * MAX_CTAS * MAX_WORLD  # ready[cta][src], then done[cta][src]: push's layout
_DONE = MAX_CTAS * MAX_WORLD


def buffer_rows(max_tokens: int, world: int) -> int:
    """Rows of the symmetric buffer: the partials, then the output region."""
    return 2 * max_tokens


@dataclass(frozen=True)
class SymmetricRowsPull(SymmetricRowsV2):
    """SymmetricRowsV2 over the pull layout: the output region follows the partials."""

    @property
    def out_row0(self) -> int:
        return self.max_tokens


@triton.jit
def _allreduce_norm_pull_kernel(
    buf_ptr,  # this rank's symmetric buffer [buffer_rows, hidden]
    peer_off_ptr,  # int64 [world]: rank q's buffer minus this one, in 16-byte units
    flag_ptrs,  # int64 [world]: address of rank q's flags (int32 [FLAG_SLOTS])
    res_ptr, out_ptr, w_ptr,
    row_start, n_rows, hidden, stride_res, stride_out, eps, rank, out_row0,
    WORLD: tl.constexpr, LANES: tl.constexpr, MAXW: tl.constexpr, DONE: tl.constexpr,
    TILE_R: tl.constexpr, REDUCE_R: tl.constexpr, BLOCK_H: tl.constexpr, VEC: tl.constexpr,
    COPY_OUT: tl.constexpr, PUSH_OUT: tl.constexpr,
):
    cta = tl.program_id(0)
    n_ctas = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < hidden
    n_tiles = tl.cdiv(tl.cdiv(n_rows, WORLD), TILE_R)
    own_flags = tl.load(flag_ptrs + rank).to(tl.pointer_type(tl.int32))

    # Phase 1, ready: this rank's partials may be read; wait until every peer's may.
    _signal(flag_ptrs, cta * MAXW + rank, rank, WORLD, LANES)
    for i in tl.static_range(WORLD - 1):
        _take(own_flags + cta * MAXW + (rank + 1 + i) % WORLD)
    tl.debug_barrier()  # the acquire precedes every thread's loads of the peers' partials

    # Phase 2, reduce this rank's block, pulling the peers' partial rows.
    lo, hi = _row_block(rank, n_rows, WORLD)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    for t in range(cta, n_tiles, n_ctas):
        for s in range(0, TILE_R, REDUCE_R):
            rows = lo + t * TILE_R + s + tl.arange(0, REDUCE_R)
            ok = (rows < hi)[:, None] & col_ok[None, :]
            offs = (row_start + rows).to(tl.int64)[:, None] * hidden + cols[None, :]
            acc = tl.load(buf_ptr + offs, mask=ok, other=0.0).to(tl.float32)
            for i in tl.static_range(WORLD - 1):
                peer = tl.load(peer_off_ptr + (rank + 1 + i) % WORLD) * VEC
                acc += tl.load(buf_ptr + peer + offs, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
            y = _add_residual_norm(acc, res_ptr, rows, cols, ok, stride_res, w, hidden, eps, buf_ptr)
            landed = (out_row0 + row_start + rows).to(tl.int64)[:, None] * hidden + cols[None, :]
            if PUSH_OUT:  # into every rank's output region; its own copy only when it is the output
                for q in tl.static_range(1 if COPY_OUT else 0, WORLD):
                    tl.store(buf_ptr + tl.load(peer_off_ptr + (rank + q) % WORLD) * VEC + landed, y, mask=ok)
            else:  # published where the peers pull it from
                tl.store(buf_ptr + landed, y, mask=ok)
            if COPY_OUT:
                tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :], y, mask=ok)
    _signal(flag_ptrs, DONE + cta * MAXW + rank, rank, WORLD, LANES)

    # Phase 3, gather: the peers' rows of this CTA's tiles are published in their output regions
    # (PUSH_OUT: have landed in this rank's).
    for i in tl.static_range(WORLD - 1):
        _take(own_flags + DONE + cta * MAXW + (rank + 1 + i) % WORLD)
    tl.debug_barrier()
    if COPY_OUT or not PUSH_OUT:
        for i in tl.static_range(WORLD - 1):
            src = (rank + 1 + i) % WORLD
            src_lo, src_hi = _row_block(src, n_rows, WORLD)
            if PUSH_OUT:
                src_buf = buf_ptr
            else:
                src_buf = buf_ptr + tl.load(peer_off_ptr + src) * VEC
            _gather_tiles(src_buf, buf_ptr, out_ptr, src_lo, src_hi, cta, n_tiles, n_ctas, out_row0, row_start, hidden,
                          stride_out, cols, col_ok, TILE_R, COPY_OUT)


def reduce_norm(sym: SymmetricRowsV2, row_start: int, row_end: int, residual: torch.Tensor, weight: torch.Tensor,
                eps: float, out: torch.Tensor | None, num_ctas: int, step_bytes: int = STEP_BYTES,
                push_out: bool = False) -> torch.Tensor:
    """Launch the pull kernel on rows [row_start, row_end) (see AllReduceNormV2.__call__);
    push_out: the normalized rows pushed to every rank (AllReduceNormPullPush)."""
    n_rows, hidden = row_end - row_start, sym.buf.shape[1]
    check_call(row_start, row_end, sym.max_tokens, num_ctas, hidden, sym.buf.dtype, residual=residual, out=out)
    if n_rows == 0:
        return sym.landed(row_start, row_end) if out is None else out
    til = tiling(sym.world, hidden, sym.buf.element_size(), step_bytes)
    _allreduce_norm_pull_kernel[(num_ctas,)](
        sym.buf, sym.peer_off, sym.flag_ptrs, residual, sym.buf if out is None else out, weight.contiguous(),
        row_start, n_rows, hidden, residual.stride(0), hidden if out is None else out.stride(0), eps, sym.rank,
        sym.out_row0,
        WORLD=sym.world, LANES=triton.next_power_of_2(sym.world), MAXW=MAX_WORLD, DONE=_DONE,
        TILE_R=til.tile_rows, REDUCE_R=til.reduce_rows, BLOCK_H=til.block_h, VEC=16 // sym.buf.element_size(),
        COPY_OUT=out is not None, PUSH_OUT=push_out, num_warps=til.num_warps,
    )
    return sym.landed(row_start, row_end) if out is None else out


class AllReduceNormPull(AllReduceNormV2):
    """AllReduceNormV2's contract (same calls, same caller rules) on the pull kernel."""

    _buffer_rows = staticmethod(buffer_rows)
    _view = SymmetricRowsPull
    _reduce = staticmethod(reduce_norm)


class AllReduceNormPullPush(AllReduceNormPull):
    """The pull kernel with the normalized rows pushed to every rank (PUSH_OUT), same contract."""

    _reduce = staticmethod(partial(reduce_norm, push_out=True))


# The fused all-reduce + norm kernels by variant (here, where every one of them is importable):
# comm's fused_norm_push, fused_norm_pull_push and fused_norm_v1 paths, the benchmark and the tests
# take their classes from this one table.
FUSED_KERNELS = {"v2": AllReduceNormV2, "v2pull": AllReduceNormPull, "v2pullpush": AllReduceNormPullPush,
                 "v1": AllReduceNorm}
