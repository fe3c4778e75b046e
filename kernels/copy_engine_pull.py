"""All-reduce + residual add + RMSNorm in two halves: the copy engines pull every peer's partial
(`transfer`, on the caller's side stream), then one full-width kernel adds and normalizes
(`finish`, on the caller's main stream, just before the rows are next needed). No SM kernel runs
beside the compute but the one-CTA barriers.

Why two halves. In a split (overlapbench/overlap/split.py) a chunk's reduction runs on a side
stream beside the other chunk's compute. The copy-engine all-reduce (copy_engine_norm.py) moves
its bytes without SMs, but its add + norm runs there too, as few-CTA kernels that wait for SMs
beside cuBLAS's persistent GEMMs and slow them. Here the side stream only copies; the add + norm
runs on the main stream at full width, where it costs the main stream about one more read per
element than the add + norm it runs after an all-reduce anyway (the staged peer partials).

The buffer (one symmetric allocation, `world` regions of `max_tokens` rows): region q of rank r
holds rank q's partial of every row. Rank r's GEMM writes its partial into its own region r
(`partial`); `transfer` pulls each peer q's partial rows from region q of q's buffer into region
q of r's. So after a transfer every rank holds all ranks' partials of the rows in rank order,
and `finish` sums them in that order (region 0 + region 1 + ... in fp32, then the residual, the
order of copy_engine_norm.add_norm_reference): every rank computes every row from the same bits
in the same order, so `out` and `residual` are complete and bit-identical on every rank (no
token-sharded residual).

One reduction of rows [a, b), all of `transfer` on one stream, in this order:

1. barrier (channel 0): every rank's partial of these rows is written (each rank enters it after
   its GEMM, which precedes it in stream order or by an event).
2. for each peer q, staggered (r+1, r+2, ...: at any moment the ranks pull from different
   peers): Tensor.copy_ of q's region-q rows [a, b) (its mapped view) into my region q
   (cudaMemcpyAsync of a peer's memory: a copy engine, no SM).
3. barrier (channel 1): every rank has finished pulling from every other.

Then `finish(a, b, ...)` on the caller's main stream, after an event the side stream recorded
after step 3: residual += sum of the regions' rows; out = rmsnorm(residual) * weight.

Why it is safe across ranks. (a) A peer's partial rows are read only after barrier 0, which no
rank passes before every rank entered it, i.e. wrote its partial of these rows. (b) My partial
rows may be overwritten once my transfer's barrier 1 passed: every peer enters it after its pulls
(they precede it on its one stream), so no peer reads them any longer; the caller's next GEMM on
these rows must wait for the side stream's event after step 3 and follow `finish` (which reads
them) on the main stream. (c) My staged regions are written only by my own pulls and read only by
my `finish`: the caller orders the next transfer of the same rows after the finish (the rows'
next compute comes between). Rows of other chunks lie elsewhere in every region. (d) Barriers
pair up in order: every rank issues the same transfers in the same order on one stream, two
barriers each (none for an empty range, on every rank), so barrier k of one rank meets barrier k
of every other. The barriers are the symmetric-memory handle's (one CTA each, counters that return
to zero: safe under CUDA-graph capture and replay); `transfer` and `finish` have no host sync, and
each runs on the stream current when it is called, so a graph captures them as the caller's
streams and events order them. No NVLink multicast anywhere: symmetric-memory peer views and the
copy engines only.

Bytes per rank (N = the rows x hidden tensor, W ranks): (W-1) x N pulled over NVLink, against
copy_engine_norm's 2(W-1)/W x N (reduce-scatter then all-gather): equal at W=2, 1.5x more at W=4,
1.75x at W=8. The add + norm reads W + 1 tensors of N and writes 2 (residual, out) on every rank,
where copy_engine_norm's kernel works on 1/W of the rows.
"""

from __future__ import annotations

import torch
import triton

from kernels.allreduce_norm import MAX_WORLD, Allocate, check_call
from kernels.copy_engine_norm import add_norm_rows, tile_rows

CTAS_PER_SM = 4  # the finish's grid: at most this many CTAs per SM (one tile of rows each, grid-stride beyond)


def buffer_elems(max_tokens: int, hidden: int, world: int) -> int:
    """Elements of the symmetric buffer: one region of max_tokens rows per rank."""
    return world * max_tokens * hidden


class CopyEnginePull:
    """Owns a symmetric buffer for `max_tokens` rows (see the module docstring).

    Transfers on one instance must be issued in the same order, with the same row ranges, on
    every rank, on one stream; each range's `finish` after its `transfer` (on any stream the
    caller orders after it) and before the next `transfer` of those rows.
    """

    def __init__(self, sym, max_tokens: int, hidden: int, sm_count: int | None = None) -> None:
        """`sym`: a runtime.SymmetricBuffer of at least buffer_elems(...) elements (or a fake with
        the same view/handle in the CPU tests). `sm_count`: the device's SMs, which bound the
        finish's grid (default: the buffer's device's; unused on the CPU)."""
        world = sym.world
        if not 2 <= world <= MAX_WORLD:
            raise ValueError(f"world size {world} outside 2..{MAX_WORLD}")
        self.sym, self.world, self.rank = sym, world, sym.rank
        self.max_tokens, self.hidden = max_tokens, hidden
        self._regions = sym.view(0, (world, max_tokens, hidden))
        self._peers = [(self.rank + s) % world for s in range(1, world)]  # staggered
        self._views: dict[tuple[int, int], list] = {}
        if sm_count is None and sym.tensor.is_cuda:
            sm_count = torch.cuda.get_device_properties(sym.tensor.device).multi_processor_count
        self.sm_count = sm_count

    @classmethod
    def allocate(cls, group, max_tokens: int, hidden: int, dtype: torch.dtype, device, *,
                 allocate: Allocate) -> CopyEnginePull:
        """`allocate`: the caller's symmetric allocator (allreduce_norm.Allocate)."""
        import torch.distributed as dist

        if hidden * torch.empty((), dtype=dtype).element_size() % 16:
            raise ValueError("a row must be a whole number of 16-byte vectors")
        world = dist.get_world_size(group or dist.group.WORLD)
        return cls(allocate(buffer_elems(max_tokens, hidden, world), dtype, device, group), max_tokens, hidden)

    def partial(self, row_start: int, row_end: int) -> torch.Tensor:
        """[rows, hidden] view of this rank's partial rows (its own region): the GEMM writes here."""
        self._check_rows(row_start, row_end)
        return self._regions[self.rank, row_start:row_end]

    def _check_rows(self, row_start: int, row_end: int) -> None:
        if not 0 <= row_start <= row_end <= self.max_tokens:
            raise ValueError(f"rows [{row_start}, {row_end}) outside [0, {self.max_tokens})")

    def transfer(self, row_start: int, row_end: int) -> None:
        """Every peer's partial of rows [row_start, row_end) pulled into this rank's buffer, between
        two barriers, on the current stream (the side stream in a split)."""
        self._check_rows(row_start, row_end)
        if row_end == row_start:
            return
        barrier = self.sym.handle.barrier
        barrier(channel=0)  # every rank's partial of these rows is written
        for dst, src in self._pulls(row_start, row_end):
            dst.copy_(src)
        barrier(channel=1)  # every rank pulled from every other: my partial rows may be overwritten

    def _pulls(self, row_start: int, row_end: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(my region q's rows, peer q's mapped region-q rows) for every peer, staggered: made
        once per row range (a peer's view is a new mapping object)."""
        key = (row_start, row_end)
        if key not in self._views:
            n, h = row_end - row_start, self.hidden
            self._views[key] = [(self._regions[q, row_start:row_end],
                                 self.sym.view((q * self.max_tokens + row_start) * h, (n, h), q)) for q in self._peers]
        return self._views[key]

    def finish(self, row_start: int, row_end: int, residual: torch.Tensor, weight: torch.Tensor, eps: float,
               out: torch.Tensor) -> torch.Tensor:
        """After this range's transfer, on the current stream (the main one in a split): residual
        += the sum over ranks of the partials of these rows; out = rmsnorm(residual) * weight,
        every row, at full width (a grid of one tile of rows per CTA, at most CTAS_PER_SM per SM).
        `out` must be dense rows (the kernel writes it at dense offsets)."""
        n = row_end - row_start
        check_call(row_start, row_end, self.max_tokens, 1, self.hidden, None, residual=residual, out=out)  # no CTA budget
        if n and not out.is_contiguous():
            raise ValueError("out must be dense rows: the add + norm kernel writes it at dense offsets")
        if n == 0:
            return out
        rows = self._regions[:, row_start:row_end]
        ctas = min(triton.cdiv(n, tile_rows(self.hidden)), CTAS_PER_SM * (self.sm_count or 1))
        add_norm_rows(rows[0], rows[1:], residual, weight, eps, None, out, ctas, use_triton=out.is_cuda)
        return out
