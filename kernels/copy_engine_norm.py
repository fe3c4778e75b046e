"""All-reduce + residual add + RMSNorm with the copy engines moving the data: no SM moves a byte.

TokenWeave's contract, without multicast. Rank r owns the row block `row_block(r)` of a call's
rows; it keeps and updates the residual of those rows only (the residual stays token-sharded:
the other rows of `residual` are neither read nor written), and every rank ends with the whole
normalized output. The rank's own rows are cut into `chunks` pieces (chunk_count: pieces of
about CHUNK_BYTES, at most MAX_AUTO_CHUNKS, unless asked; every peer's block is cut by the same
rule, so every rank knows where a peer's chunk j lies). One call:

1. barrier (channel 0, caller's stream): every rank's partial sum of these rows is written.
2. reduce-scatter, on a copy stream: for chunk j = 0, 1, ... rank r pulls chunk j's rows of
   every peer's partial into its staging slots with Tensor.copy_ from the peer's mapped view
   (cudaMemcpyAsync: a copy engine, no SM), and records an event after each chunk.
3. on the caller's stream, per chunk j after its pull's event: a local Triton kernel on
   `num_ctas` CTAs (the CTA budget): partial + staged partials + residual in fp32, the new
   residual rounded once and stored, rmsnorm(new residual) * weight published in the symmetric
   buffer (only there: `out` gets it from the copy engine, step 4). The pull of chunk j+1 runs
   beside it.
4. all-gather, on a second copy stream, per chunk j after its kernel's event: a local copy of
   the published chunk into `out`, a barrier (channel 1: every rank has published its chunk
   j), then pulls of every peer's published chunk j into `out`; beside the kernel of chunk j+1.
5. the caller's stream waits for both copy streams before the call returns.

With chunks=1 every step runs on the caller's stream in this order: the serial schedule (no
side streams). `sm_out=True` (per call, or the instance's default) makes the kernel of step 3
write `out`'s own rows itself, and step 4 skips the local copy: chunk j's barrier then follows
its kernel at once on the gather stream (the `ce_out: kernel` knob of the layer's strategies).

Why it is safe. Within a rank, events order each kernel after its pull and each gather after
its kernel; the copy streams fork from the caller's stream after what precedes the call and are
joined into it before the return, so nothing of a call is left running behind it (CUDA-graph
capture sees one fork and one join; no host sync anywhere). Across ranks: (a) a peer's partial
rows are only read after the opening barrier, which no rank passes before every rank's partial is
written. (b) A peer's published chunk j is only read after the chunk-j barrier, which the peer
enters after its kernel for chunk j. (c) Back to back calls: my partial rows are free when my
call returns, because I return after my last chunk barrier, which every peer enters only after
its kernel for its last chunk, which waits for all its reduce-scatter pulls (one stream, in
order); so the next GEMM may overwrite them. My published rows are rewritten only by my next
call's kernels, which follow my next call's opening barrier; no peer enters that barrier before its
current call returned, i.e. before its gather pulls of my rows are done. My staging slots are
read and written by me only, in stream order. (d) Barriers pair up in order: every rank issues
the same sequence (per call one on channel 0, then one per chunk on channel 1; the chunk count
depends on the row count only), and on each rank they are totally ordered (the opening
barrier precedes the first kernel, chunk j's barrier follows kernel j and precedes chunk j+1's
on the one gather stream, the next call's opening barrier follows the join), so barrier k of one
rank meets barrier k of every other. A channel takes `world` int32 slots of the handle's signal pad (2 KiB or more: at
least 64 channels at 8 ranks); two are used. Per-peer put_signal/wait_signal instead of the
chunk barrier would let a gather start as each peer publishes (it matters beyond 2 ranks only).
The barriers are the symmetric-memory handle's (one CTA, counters that return to zero: safe
under graph replay). Every rank computes its own rows once, so `out` is bit-identical on all
ranks. No NVLink multicast anywhere.

Bytes per rank (N = the rows x hidden tensor, W ranks): copy engines (W-1)/W N pulled twice
over NVLink plus 1/W N copied locally (published -> out); the kernel reads (W+1)/W N and
writes 2/W N (residual, published), all local: 5 tensors of own-rows size through the SMs
instead of 6 with `sm_out`. Measured on 2x H200 (tests/benchmarks/copy_engine_norm.py,
results/h200x2/486cebf/bench_copy_engine_norm.log; busbw, median of 30 graph replays): the serial
schedule (chunks=1, sm_out) at 64 MiB 67/109/158/203 GB/s on 4/8/16/32 CTAs; 4 chunks with `out`
copied by the copy engine 93/160/242/237, and 2 chunks on 32 CTAs 267 (NCCL's all-reduce alone
267); at 256 MiB 4 chunks 98/174/284/309 (NCCL 301). The local kernel sets the pace: its 5
own-rows tensors go through few SMs (about 70 GB/s of HBM traffic per CTA at 4 CTAs), so the
CTA budget, not the copy engines, bounds the path below 16 CTAs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.allreduce_norm import MAX_WORLD, Allocate, check_call, row_block, slot_rows
from kernels.rmsnorm import rmsnorm_rows

TILE_ELEMS = 16384  # elements per tensor one CTA loads per step (32 KiB of bf16): all in flight at once
# Automatic chunks: about CHUNK_BYTES of own rows each, at most MAX_AUTO_CHUNKS. On 2x H200
# (results/h200x2/486cebf/bench_copy_engine_norm.log, out copied by the copy engine) 4 chunks were
# best or within 2% of it at 16 CTAs on 64 MiB (242 GB/s; 8 chunks 180) and 256 MiB (284; 8: 279),
# and 2 at 32 CTAs (267/319; 4: 237/309): beyond 4 the per-chunk barrier costs more than it hides.
CHUNK_BYTES = 8 << 20
MAX_AUTO_CHUNKS = 4
MAIN, SCATTER, GATHER = 0, 1, 2  # the streams of a call: the caller's and two copy streams


def buffer_elems(max_tokens: int, hidden: int, world: int) -> int:
    """Elements of the symmetric buffer: partials, world-1 staging slots, published rows."""
    return (2 * max_tokens + (world - 1) * slot_rows(max_tokens, world)) * hidden


def piece(lo: int, hi: int, chunks: int, j: int) -> tuple[int, int]:
    """Rows of chunk j when [lo, hi) is cut into `chunks` pieces (the same rule on every rank)."""
    return lo + j * (hi - lo) // chunks, lo + (j + 1) * (hi - lo) // chunks


@triton.jit
def _add_norm_kernel(
    part_ptr,  # own rows of this rank's partial, dense [n_rows, hidden]
    stage_ptr,  # staging slots [STAGED, >= n_rows, hidden], dense rows, slots slot_elems apart
    res_ptr, out_ptr,  # [n_rows, hidden] with row strides (out unused unless WRITE_OUT)
    pub_ptr,  # published rows in the symmetric buffer, dense [n_rows, hidden]
    w_ptr,
    n_rows, hidden, slot_elems, stride_res, stride_out, eps,
    STAGED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, WRITE_OUT: tl.constexpr,
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
        y = rmsnorm_rows(new.to(tl.float32), w[None, :], hidden, eps, 1).to(pub_ptr.dtype.element_ty)
        if WRITE_OUT:
            tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], y, mask=ok)
        tl.store(pub_ptr + dense, y, mask=ok)


def tile_rows(hidden: int) -> int:
    """Rows of one CTA's tile of the add + norm kernel: TILE_ELEMS over the row's padded width."""
    return max(1, TILE_ELEMS // triton.next_power_of_2(hidden))


def add_norm_reference(part, staged, residual, weight, eps, out, published) -> None:
    """Torch version of the local kernel (CPU, and the tests' oracle): same order of sums.
    `out` None: only the published rows are written."""
    acc = part.float() + staged.float().sum(0)
    new = (acc + residual.float()).to(residual.dtype)
    residual.copy_(new)
    r = new.float()
    y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    if out is not None:
        out.copy_(y)
    published.copy_(y)


def add_norm_rows(part, staged, residual, weight, eps, out, published, num_ctas: int, use_triton: bool) -> None:
    """The local step over a rank's own rows; `staged` [world-1, >= rows, hidden] holds the
    peers' partials of these rows in each slot's first rows (slots may lie apart: a chunk's rows
    of the staging area). `out` None: the kernel writes only the published rows."""
    n_rows, hidden = part.shape
    if n_rows == 0:
        return
    if not use_triton:
        add_norm_reference(part, staged[:, :n_rows], residual, weight, eps, out, published)
        return
    for name, t in (("partial", part), ("published", published), ("staged", staged[0])):  # dense: offsets below
        if not t.is_contiguous():
            raise ValueError(f"{name} must be dense")
    block_h, block_r = triton.next_power_of_2(hidden), tile_rows(hidden)
    target = published if out is None else out
    _add_norm_kernel[(num_ctas,)](
        part, staged, residual, target, published, weight.contiguous(),
        n_rows, hidden, staged.stride(0), residual.stride(0), target.stride(0), eps,
        STAGED=staged.shape[0], BLOCK_R=block_r, BLOCK_H=block_h, WRITE_OUT=out is not None,
        num_warps=max(4, min(16, block_r * block_h // 1024)),
    )


class InOrder:
    """Every op on the caller's stream in the order issued: the serial schedule (and the CPU's)."""

    def fork(self) -> None:
        pass

    def run(self, stream: int, fn) -> None:
        fn()

    def record(self, stream: int):
        return None

    def wait(self, stream: int, event) -> None:
        pass

    def join(self) -> None:
        pass


class CudaStreams:
    """The caller's stream and two copy streams: forked from the caller's at the start of a
    call, joined into it at the end (so CUDA-graph capture sees them as one fork and one join)."""

    def __init__(self, device: torch.device) -> None:
        # high priority: their only kernels are the one-CTA barriers, which must not queue behind GEMMs
        self._side = (torch.cuda.Stream(device, priority=-1), torch.cuda.Stream(device, priority=-1))
        self._device = device
        self._main = None

    def fork(self) -> None:
        self._main = torch.cuda.current_stream(self._device)
        for side in self._side:
            side.wait_stream(self._main)

    def _stream(self, stream: int):
        return self._main if stream == MAIN else self._side[stream - 1]

    def run(self, stream: int, fn) -> None:
        with torch.cuda.stream(self._stream(stream)):
            fn()

    def record(self, stream: int):
        return self._stream(stream).record_event()

    def wait(self, stream: int, event) -> None:
        self._stream(stream).wait_event(event)

    def join(self) -> None:
        for side in self._side:
            self._main.wait_stream(side)
        self._main = None


@dataclass
class _Chunk:
    """One chunk of a call: own rows [lo, hi) (relative to the call's row_start), this rank's
    reduce-scatter pulls (staging dst, peer's partial src), the kernel's partial, staged and
    published rows, and the all-gather pulls ((row range of `out`, peer's published src))."""

    lo: int
    hi: int
    scatter: list
    part: torch.Tensor
    staged: torch.Tensor
    published: torch.Tensor
    gather: list


def _copy_all(pairs) -> None:
    for dst, src in pairs:
        dst.copy_(src)


class CopyEngineNorm:
    """Owns a symmetric buffer sized for `max_tokens` rows (see the module docstring).

    Calls on one instance must be issued in order on one stream, with the same row range and
    chunk count on every rank (`num_ctas` may differ: it is local). The call signature is
    AllReduceNorm's (plus an optional `chunks`), so reducers.SymmetricReducer drives either;
    the residual contract is the sharded one.
    """

    def __init__(self, sym, max_tokens: int, hidden: int, chunks: int | None = None,
                 sm_out: bool = False, streams=None) -> None:
        """`sym`: a runtime.SymmetricBuffer of at least buffer_elems(...) elements (or a fake
        with the same view/handle in the CPU tests). `chunks`: pieces of own rows per call (None:
        chunk_count decides by size). `sm_out`: the calls' default (a call may ask otherwise):
        the kernel also writes `out`'s own rows (6 SM tensors instead of 5; no local copy).
        `streams`: the pipeline's stream stand-in (CPU tests); default CudaStreams on a GPU, InOrder on the CPU."""
        world = sym.world
        if not 2 <= world <= MAX_WORLD:
            raise ValueError(f"world size {world} outside 2..{MAX_WORLD}")
        if chunks is not None and chunks < 1:
            raise ValueError(f"chunks={chunks}: must be at least 1 (or None: by size)")
        self.sym, self.world, self.rank = sym, world, sym.rank
        self.max_tokens, self.hidden = max_tokens, hidden
        self.chunks, self.sm_out = chunks, sm_out
        self.slot = slot_rows(max_tokens, world)
        self._stage = sym.view(max_tokens * hidden, (world - 1, self.slot, hidden))
        self._pub_start = (max_tokens + (world - 1) * self.slot) * hidden
        self._plans: dict[tuple[int, int, int], list[_Chunk]] = {}
        if streams is None:
            streams = CudaStreams(sym.tensor.device) if sym.tensor.is_cuda else InOrder()
        self._streams, self._in_order = streams, InOrder()

    @classmethod
    def allocate(cls, group, max_tokens: int, hidden: int, dtype: torch.dtype, device,
                 chunks: int | None = None, sm_out: bool = False, *, allocate: Allocate) -> CopyEngineNorm:
        """`allocate`: the caller's symmetric allocator (allreduce_norm.Allocate)."""
        import torch.distributed as dist

        if hidden * torch.empty((), dtype=dtype).element_size() % 16:
            raise ValueError("a row must be a whole number of 16-byte vectors")
        world = dist.get_world_size(group or dist.group.WORLD)
        sym = allocate(buffer_elems(max_tokens, hidden, world), dtype, device, group)
        return cls(sym, max_tokens, hidden, chunks, sm_out)

    def partial(self, row_start: int, row_end: int) -> torch.Tensor:
        """[rows, hidden] view of this rank's partial rows: the GEMM writes its sum here."""
        self._check_rows(row_start, row_end)
        return self.sym.view(row_start * self.hidden, (row_end - row_start, self.hidden))

    def own_rows(self, row_start: int, row_end: int) -> tuple[int, int]:
        """The rows [lo, hi) of the call's range (relative to row_start) this rank reduces."""
        return row_block(row_end - row_start, self.world, self.rank)

    def chunk_count(self, n_rows: int, chunks: int | None = None) -> int:
        """Chunks of a call over n_rows (the same on every rank: it depends on n_rows only): as
        asked, or pieces of about CHUNK_BYTES of a rank's rows (at most MAX_AUTO_CHUNKS); never
        more than the smallest row block has rows, and at least 1."""
        chunks = self.chunks if chunks is None else chunks
        per_rank = n_rows // self.world
        if chunks is None:
            chunks = min(MAX_AUTO_CHUNKS, per_rank * self.hidden * self.sym.tensor.element_size() // CHUNK_BYTES)
        return max(1, min(chunks, per_rank))

    def _check_rows(self, row_start: int, row_end: int) -> None:
        if not 0 <= row_start <= row_end <= self.max_tokens:
            raise ValueError(f"rows [{row_start}, {row_end}) outside [0, {self.max_tokens})")

    def _plan(self, row_start: int, row_end: int, chunks: int) -> list[_Chunk]:
        key = (row_start, row_end, chunks)
        if key not in self._plans:
            n, h, view = row_end - row_start, self.hidden, self.sym.view
            lo, hi = self.own_rows(row_start, row_end)
            peers = [(self.rank + s) % self.world for s in range(1, self.world)]  # staggered
            plan = []
            for j in range(chunks):
                a, b = piece(lo, hi, chunks, j)
                scatter = [(self._stage[s, a - lo : b - lo], view((row_start + a) * h, (b - a, h), q))
                           for s, q in enumerate(peers) if b > a]
                gather = []
                for q in peers:
                    qa, qb = piece(*row_block(n, self.world, q), chunks, j)
                    if qb > qa:
                        gather.append(((qa, qb), view(self._pub_start + (row_start + qa) * h, (qb - qa, h), q)))
                part, staged = self.partial(row_start + a, row_start + b), self._stage[:, a - lo : b - lo]
                published = view(self._pub_start + (row_start + a) * h, (b - a, h))
                plan.append(_Chunk(a, b, scatter, part, staged, published, gather))
            self._plans[key] = plan
        return self._plans[key]

    def __call__(
        self,
        row_start: int,
        row_end: int,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        out: torch.Tensor,
        num_ctas: int,
        chunks: int | None = None,
        sm_out: bool | None = None,
    ) -> torch.Tensor:
        """Reduce rows [row_start, row_end) of the partials over ranks; on this rank's own rows
        (own_rows) residual += sum; out = rmsnorm(residual) * weight on every row, every rank.
        `chunks`, `sm_out`: this call's (None: the instance's). The result is the same bits either
        way; `sm_out` may differ between ranks (it is local: no barrier depends on it)."""
        n, h = row_end - row_start, self.hidden
        check_call(row_start, row_end, self.max_tokens, num_ctas, h, None, residual=residual, out=out)
        if chunks is not None and chunks < 1:
            raise ValueError(f"chunks={chunks}: must be at least 1 (or None: the instance's)")
        if n and out.stride(0) != h:
            raise ValueError("out must be dense rows: the copy engines write row ranges of it")
        if n == 0:
            return out
        chunks = self.chunk_count(n, chunks)
        sm_out = self.sm_out if sm_out is None else sm_out
        plan, barrier = self._plan(row_start, row_end, chunks), self.sym.handle.barrier
        ex = self._in_order if chunks == 1 else self._streams
        ex.fork()
        ex.run(MAIN, lambda: barrier(channel=0))  # every rank's partial of these rows is written
        ex.wait(SCATTER, ex.record(MAIN))
        pulled = []
        for c in plan:
            ex.run(SCATTER, lambda c=c: _copy_all(c.scatter))
            pulled.append(ex.record(SCATTER))
        for c, ready in zip(plan, pulled):
            ex.wait(MAIN, ready)
            own_out = out[c.lo : c.hi] if sm_out else None
            ex.run(MAIN, lambda c=c, own_out=own_out: add_norm_rows(
                c.part, c.staged, residual[c.lo : c.hi], weight, eps, own_out, c.published, num_ctas,
                use_triton=out.is_cuda))
            ex.wait(GATHER, ex.record(MAIN))
            if not sm_out:
                ex.run(GATHER, lambda c=c: out[c.lo : c.hi].copy_(c.published))
            ex.run(GATHER, lambda: barrier(channel=1))  # every rank published chunk j (so did its pulls up to j)
            ex.run(GATHER, lambda c=c: _copy_all((out[qa:qb], src) for (qa, qb), src in c.gather))
        ex.join()
        return out
