"""All-reduce + residual add + RMSNorm with the copy engines moving the data: no SM moves a byte.

TokenWeave's contract, without multicast. Rank r owns the row block `row_block(r)` of a call's
rows; it keeps and updates the residual of those rows only (the residual stays token-sharded:
the other rows of `residual` are neither read nor written), and every rank ends with the whole
normalized output. One call, on the caller's stream:

1. barrier: every rank's partial sum of these rows is in its symmetric buffer.
2. reduce-scatter: rank r pulls its block's rows of every peer's partial into its staging slots
   with Tensor.copy_ from the peer's mapped view (cudaMemcpyAsync: a copy engine, no SM).
3. a local Triton kernel on `num_ctas` CTAs (the CTA budget) over the rank's own rows: partial
   + staged partials + residual in fp32, the new residual rounded once and stored, then
   rmsnorm(new residual) * weight written to `out` and published in the symmetric buffer.
4. barrier: every rank's normalized rows are published (and no peer reads a partial any more).
5. all-gather: rank r pulls every peer's published rows into `out` (copy engine again).

No closing barrier: a rank writes its published rows again only in a later call on the same
stream, after that call's first barrier, which no peer passes before its pulls of this call are
done (they precede it on the peer's stream). The partial rows are free when the call returns
(barrier 4 follows every peer's reduce-scatter pulls), so the next GEMM may overwrite them.
The barriers are the symmetric-memory handle's (one CTA, counters that return to zero: safe
under CUDA-graph replay). Every rank computes its own rows once, so `out` is bit-identical on
all ranks. No NVLink multicast anywhere.

Bytes per rank (N = the rows x hidden tensor, W ranks): copy engines (W-1)/W N pulled twice
(over NVLink); the kernel reads (W+1)/W N and writes 3/W N, all local. The pulls from several
peers go one after another on the caller's stream (at TP=2, one pull each way); the reduce-scatter
is not pipelined with the kernel (a chunked version would be the next step). Not measured yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.allreduce_norm import MAX_WORLD, check_call, row_block, slot_rows
from kernels.rmsnorm import rmsnorm_rows

TILE_ELEMS = 16384  # elements per tensor one CTA loads per step (32 KiB of bf16): all in flight at once


def buffer_elems(max_tokens: int, hidden: int, world: int) -> int:
    """Elements of the symmetric buffer: partials, world-1 staging slots, published rows."""
    return (2 * max_tokens + (world - 1) * slot_rows(max_tokens, world)) * hidden


@triton.jit
def _add_norm_kernel(
    part_ptr,  # own rows of this rank's partial, dense [n_rows, hidden]
    stage_ptr,  # staging slots, dense [STAGED, slot_rows, hidden]
    res_ptr, out_ptr,  # [n_rows, hidden] with row strides
    pub_ptr,  # published rows in the symmetric buffer, dense [n_rows, hidden]
    w_ptr,
    n_rows, hidden, slot_elems, stride_res, stride_out, eps,
    STAGED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < hidden
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    for t in range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_R), tl.num_programs(0)):
        rows = (t * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        ok = (rows < n_rows)[:, None] & col_ok[None, :]
        dense = rows[:, None] * hidden + cols[None, :]
        res_ptrs = res_ptr + rows[:, None] * stride_res + cols[None, :]
        acc = tl.load(part_ptr + dense, mask=ok, other=0.0).to(tl.float32)
        for s in tl.static_range(STAGED):
            staged = stage_ptr + s * slot_elems.to(tl.int64) + dense
            acc += tl.load(staged, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
        acc += tl.load(res_ptrs, mask=ok, other=0.0).to(tl.float32)
        new = acc.to(res_ptr.dtype.element_ty)
        tl.store(res_ptrs, new, mask=ok)
        y = rmsnorm_rows(new.to(tl.float32), w[None, :], hidden, eps, 1).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], y, mask=ok)
        tl.store(pub_ptr + dense, y, mask=ok)


def add_norm_reference(part, staged, residual, weight, eps, out, published) -> None:
    """Torch version of the local kernel (CPU, and the tests' oracle): same order of sums."""
    acc = part.float() + staged.float().sum(0)
    new = (acc + residual.float()).to(residual.dtype)
    residual.copy_(new)
    r = new.float()
    y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    out.copy_(y)
    published.copy_(y)


def add_norm_rows(part, staged, residual, weight, eps, out, published, num_ctas: int, use_triton: bool) -> None:
    """The local step over a rank's own rows; `staged` is the whole staging area [world-1,
    slot_rows, hidden] (dense), of which each slot's first rows hold the peers' partials."""
    n_rows, hidden = part.shape
    if n_rows == 0:
        return
    if not use_triton:
        add_norm_reference(part, staged[:, :n_rows], residual, weight, eps, out, published)
        return
    for name, t in (("partial", part), ("published", published), ("staged", staged)):  # dense: offsets below
        if not t.is_contiguous():
            raise ValueError(f"{name} must be dense")
    block_h = triton.next_power_of_2(hidden)
    block_r = max(1, TILE_ELEMS // block_h)
    _add_norm_kernel[(num_ctas,)](
        part, staged, residual, out, published, weight.contiguous(),
        n_rows, hidden, staged.shape[1] * hidden, residual.stride(0), out.stride(0), eps,
        STAGED=staged.shape[0], BLOCK_R=block_r, BLOCK_H=block_h,
        num_warps=max(4, min(16, block_r * block_h // 1024)),
    )


@dataclass
class _Transfers:
    """A call's copy-engine transfers for one row range: (this rank's dst, peer's src) pairs
    for the reduce-scatter, (row range of `out`, peer's src) pairs for the all-gather."""

    scatter: list
    gather: list


class CopyEngineNorm:
    """Owns a symmetric buffer sized for `max_tokens` rows (see the module docstring).

    Calls on one instance must be issued in order on one stream, with the same row range on
    every rank (`num_ctas` may differ: it is local). The call signature is AllReduceNorm's, so
    reducers.SymmetricReducer drives either; the residual contract is the sharded one.
    """

    def __init__(self, sym, max_tokens: int, hidden: int) -> None:
        """`sym`: a runtime.SymmetricBuffer of at least buffer_elems(...) elements (or a fake
        with the same view/handle in the CPU tests)."""
        world = sym.world
        if not 2 <= world <= MAX_WORLD:
            raise ValueError(f"world size {world} outside 2..{MAX_WORLD}")
        self.sym, self.world, self.rank = sym, world, sym.rank
        self.max_tokens, self.hidden = max_tokens, hidden
        self.slot = slot_rows(max_tokens, world)
        self._stage = sym.view(max_tokens * hidden, (world - 1, self.slot, hidden))
        self._pub_start = (max_tokens + (world - 1) * self.slot) * hidden
        self._transfers: dict[tuple[int, int], _Transfers] = {}

    @classmethod
    def allocate(cls, group, max_tokens: int, hidden: int, dtype: torch.dtype, device) -> CopyEngineNorm:
        import torch.distributed as dist

        from overlapbench.runtime import symmetric_buffer

        if hidden * torch.empty((), dtype=dtype).element_size() % 16:
            raise ValueError("a row must be a whole number of 16-byte vectors")
        world = dist.get_world_size(group or dist.group.WORLD)
        return cls(symmetric_buffer(buffer_elems(max_tokens, hidden, world), dtype, device, group), max_tokens, hidden)

    def partial(self, row_start: int, row_end: int) -> torch.Tensor:
        """[rows, hidden] view of this rank's partial rows: the GEMM writes its sum here."""
        self._check_rows(row_start, row_end)
        return self.sym.view(row_start * self.hidden, (row_end - row_start, self.hidden))

    def own_rows(self, row_start: int, row_end: int) -> tuple[int, int]:
        """The rows [lo, hi) of the call's range (relative to row_start) this rank reduces."""
        return row_block(row_end - row_start, self.world, self.rank)

    def _check_rows(self, row_start: int, row_end: int) -> None:
        if not 0 <= row_start <= row_end <= self.max_tokens:
            raise ValueError(f"rows [{row_start}, {row_end}) outside [0, {self.max_tokens})")

    def _plan(self, row_start: int, row_end: int) -> _Transfers:
        key = (row_start, row_end)
        if key not in self._transfers:
            n, h, view = row_end - row_start, self.hidden, self.sym.view
            lo, hi = self.own_rows(row_start, row_end)
            peers = [(self.rank + s) % self.world for s in range(1, self.world)]  # staggered
            scatter = [(self._stage[s, : hi - lo], view((row_start + lo) * h, (hi - lo, h), q))
                       for s, q in enumerate(peers) if hi > lo]
            gather = []
            for q in peers:
                qlo, qhi = row_block(n, self.world, q)
                if qhi > qlo:
                    gather.append(((qlo, qhi), view(self._pub_start + (row_start + qlo) * h, (qhi - qlo, h), q)))
            self._transfers[key] = _Transfers(scatter, gather)
        return self._transfers[key]

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
        """Reduce rows [row_start, row_end) of the partials over ranks; on this rank's own rows
        (own_rows) residual += sum; out = rmsnorm(residual) * weight on every row, every rank."""
        n, h = row_end - row_start, self.hidden
        check_call(row_start, row_end, self.max_tokens, num_ctas, h, None, residual=residual, out=out)
        if n and out.stride(0) != h:
            raise ValueError("out must be dense rows: the copy engines write row ranges of it")
        if n == 0:
            return out
        plan, barrier = self._plan(row_start, row_end), self.sym.handle.barrier
        lo, hi = self.own_rows(row_start, row_end)
        barrier(channel=0)  # every rank's partial of these rows is written
        for dst, src in plan.scatter:
            dst.copy_(src)
        published = self.sym.view(self._pub_start + (row_start + lo) * h, (hi - lo, h))
        add_norm_rows(self.partial(row_start + lo, row_start + hi), self._stage, residual[lo:hi],
                      weight, eps, out[lo:hi], published, num_ctas, use_triton=out.is_cuda)
        barrier(channel=0)  # every rank's rows are published; no peer reads a partial any more
        for (qlo, qhi), src in plan.gather:
            out[qlo:qhi].copy_(src)
        return out
