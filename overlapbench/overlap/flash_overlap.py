"""Flash-Overlap / CommFuse: the all-gather and reduce-scatter of an SP block as point-to-point
transfers interleaved with the partial GEMMs that consume or produce each piece.

All-gather -> GEMM: the rank publishes its shard, then pulls the peers' pieces on a side
stream, in the order of its schedule (sp_schedule: its own shard first), while the compute
stream runs the GEMM of each piece as soon as it is there. GEMM -> reduce-scatter: the
compute stream produces the partial sums bound for each peer in turn, each pushed into that
peer's landing slot on the side stream while the next is computed; its own rows come last,
straight into its own slot. Then each rank sums its slots.

Transports move the pieces:
- `SymmetricTransport` (GPUs): symmetric-memory buffers; the copies are copy-engine memcpys
  or a few-CTA Triton kernel (kernels/p2p.py). One barrier per all-gather (every shard is
  published) and one per reduce-scatter (every push has landed). Each block (attention, MLP)
  has its own buffers, so between two uses of a buffer there is always the other block's
  barrier: no peer still reads a shard that is being overwritten, and no push lands in
  slots that are still being summed. A micro workload, which reuses one block's buffers call
  after call, opens each call with a `fence` (one more barrier) instead.
- `GlooTransport` (CPU): the same schedule over gloo isend/irecv, so the CPU tests check the
  decomposition's numerics end to end (not its overlap).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from overlapbench.distributed.runtime import SymmetricBuffer, symmetric_buffer
from overlapbench.overlap.sequence_parallel import RowSource
from overlapbench.overlap.sp_schedule import Piece, Plan

Copy = Callable[[torch.Tensor, torch.Tensor], object]  # (dst, src): one transfer, on the current stream


def _local(shard: torch.Tensor, piece: Piece) -> torch.Tensor:
    """The rows of `piece` inside its owner's shard (or slot)."""
    return shard[piece.offset : piece.offset + piece.size]


class Transport(Protocol):
    """Moves the pieces of a block's decomposed all-gather and reduce-scatter."""

    def shard(self, block: int) -> torch.Tensor:
        """This rank's published all-gather shard [shard, width]: the block's input goes here."""

    def start_gather(self, block: int, pieces: list[Piece], into: torch.Tensor) -> None:
        """The shard is written: start fetching the peers' pieces of `pieces` into `into`."""

    def arrived(self, piece: Piece) -> None:
        """Order the compute after `piece`'s arrival (in `into`)."""

    def end_gather(self, block: int) -> None: ...

    def slots(self, block: int) -> torch.Tensor:
        """The reduce-scatter's landing slots [world, shard, width]: slot q holds rank q's
        partial sums of this rank's rows."""

    def start_scatter(self, block: int) -> None: ...

    def push(self, block: int, piece: Piece, rows: torch.Tensor) -> None:
        """`rows` (just computed) go to slot [this rank] of `piece.owner`'s slots."""

    def end_scatter(self, block: int) -> None:
        """After it every slot of this rank holds its peer's partial sums."""

    def fence(self) -> None:
        """See Exchange.fence."""


class FlashExchange:
    """The SP Exchange of flash_agrs: the plan's rank-ordered pieces through a transport."""

    def __init__(self, plan: Plan, rank: int, transport: Transport, gather_width: int, scatter_width: int, dtype, device) -> None:
        self.layout, self.rank, self.transport = plan.layout, rank, transport
        self.gather_pieces, self.scatter_pieces = plan.gather(rank), plan.scatter(rank)
        rows = plan.layout.padded
        # Written on one stream and read on the other: made once, not per call.
        self.gathered = torch.empty(rows, gather_width, dtype=dtype, device=device)  # peers' pieces
        self.staging = torch.empty(rows, scatter_width, dtype=dtype, device=device)  # partials for peers

    def shard_buffer(self, block: int) -> torch.Tensor:
        return self.transport.shard(block)

    def gather_matmul(self, block: int, shard: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out = shard.new_empty(self.layout.padded, weight.shape[0])
        self.transport.start_gather(block, self.gather_pieces, self.gathered)
        for p in self.gather_pieces:
            if p.owner == self.rank:
                a = _local(shard, p)
            else:
                self.transport.arrived(p)
                a = self.gathered[p.lo : p.hi]
            torch.matmul(a, weight.t(), out=out[p.lo : p.hi])
        self.transport.end_gather(block)
        return out

    def scatter_rows(self) -> list[tuple[int, int]]:
        return [(p.lo, p.hi) for p in self.scatter_pieces]

    def matmul_scatter(self, block: int, rows: RowSource, weight: torch.Tensor) -> torch.Tensor:
        return self._scatter(block, lambda lo, hi, out: torch.matmul(rows(lo, hi), weight.t(), out=out))

    def gather(self, block: int, shard: torch.Tensor) -> torch.Tensor:
        """The same pulls as gather_matmul's, into `gathered`; the own pieces copied in."""
        self.transport.start_gather(block, self.gather_pieces, self.gathered)
        for p in self.gather_pieces:
            if p.owner == self.rank:
                self.gathered[p.lo : p.hi].copy_(_local(shard, p))
            else:
                self.transport.arrived(p)
        self.transport.end_gather(block)
        return self.gathered

    def scatter(self, block: int, rows: RowSource) -> torch.Tensor:
        """Each piece's rows computed just before its push: the next piece's compute overlaps it."""
        return self._scatter(block, lambda lo, hi, out: out.copy_(rows(lo, hi)))

    def _scatter(self, block: int, produce: Callable[[int, int, torch.Tensor], object]) -> torch.Tensor:
        slots = self.transport.slots(block)
        self.transport.start_scatter(block)
        for p in self.scatter_pieces:
            own = p.owner == self.rank
            out = _local(slots[self.rank], p) if own else self.staging[p.lo : p.hi]
            produce(p.lo, p.hi, out)
            if not own:
                self.transport.push(block, p, out)
        self.transport.end_scatter(block)
        return slots.sum(dim=0)

    def fence(self) -> None:
        self.transport.fence()


# ---------------------------------------------------------------------------------------------
# GPUs: symmetric memory


@dataclass
class SymmetricBuffers:
    """The run's symmetric memory for flash_agrs, sized for its largest point: per block an
    all-gather shard [max_shard, gather_width] and reduce-scatter slots [world, max_shard,
    scatter_width]. A point uses the leading rows of each."""

    sym: SymmetricBuffer  # 1-D, this rank's; peers' through its handle
    world: int
    max_shard: int
    gather_width: int
    scatter_width: int

    @classmethod
    def allocate(cls, group, max_shard: int, gather_width: int, scatter_width: int, dtype, device) -> SymmetricBuffers:
        world = dist.get_world_size(group)
        elems = 2 * _round(max_shard * gather_width) + 2 * _round(world * max_shard * scatter_width)
        return cls(symmetric_buffer(elems, dtype, device, group), world, max_shard, gather_width, scatter_width)

    @property
    def handle(self):
        return self.sym.handle

    def _region(self, kind: str, block: int) -> int:
        shard = _round(self.max_shard * self.gather_width)
        slots = _round(self.world * self.max_shard * self.scatter_width)
        return 2 * shard + block * slots if kind == "slots" else block * shard

    def _view(self, offset: int, shape: tuple[int, ...], rank: int | None) -> torch.Tensor:
        return self.sym.view(offset, shape, rank)

    def shard(self, block: int, rows: int, rank: int | None = None) -> torch.Tensor:
        """Block `block`'s all-gather shard ([rows, gather_width]): this rank's, or `rank`'s."""
        return self._view(self._region("shard", block), (rows, self.gather_width), rank)

    def slots(self, block: int, rows: int, rank: int | None = None) -> torch.Tensor:
        """Block `block`'s reduce-scatter slots ([world, rows, scatter_width])."""
        return self._view(self._region("slots", block), (self.world, rows, self.scatter_width), rank)


def _round(elems: int, align: int = 64) -> int:
    """Regions start at 128-byte multiples."""
    return -(-elems // align) * align


class SymmetricTransport:
    """Pulls (all-gather) and pushes (reduce-scatter) through symmetric memory on the side
    stream, one event per piece; `copy` is the copy engine's memcpy or the P2P kernel."""

    def __init__(self, buffers: SymmetricBuffers, plan: Plan, rank: int, copy: Copy, side) -> None:
        self.buffers, self.rank, self.copy, self.side = buffers, rank, copy, side
        rows, world = plan.layout.shard, plan.layout.world
        peers = [q for q in range(world) if q != rank]
        self._shards = [buffers.shard(b, rows) for b in (0, 1)]
        self._slots = [buffers.slots(b, rows) for b in (0, 1)]
        # Peers' views (a micro workload uses only one side: no views of empty regions).
        self._peer_shards = [{q: buffers.shard(b, rows, q) for q in peers if buffers.gather_width} for b in (0, 1)]
        self._peer_slots = [{q: buffers.slots(b, rows, q) for q in peers if buffers.scatter_width} for b in (0, 1)]
        self._events: dict[Piece, torch.cuda.Event] = {}

    def shard(self, block: int) -> torch.Tensor:
        return self._shards[block]

    def start_gather(self, block, pieces, into):
        # The barrier waits on the side stream, so the compute stream starts on the local
        # piece at once instead of waiting for the slowest peer to publish.
        self.side.wait_stream(torch.cuda.current_stream())  # this rank's shard is written
        with torch.cuda.stream(self.side):
            self.buffers.handle.barrier(channel=0)  # ... and every peer's
            for p in pieces:
                if p.owner != self.rank:
                    self.copy(into[p.lo : p.hi], _local(self._peer_shards[block][p.owner], p))
                    self._events[p] = _recorded(self.side)

    def arrived(self, piece):
        torch.cuda.current_stream().wait_event(self._events.pop(piece))

    def end_gather(self, block):
        pass

    def slots(self, block):
        return self._slots[block]

    def start_scatter(self, block):
        pass

    def push(self, block, piece, rows):
        self.side.wait_event(_recorded(torch.cuda.current_stream()))
        with torch.cuda.stream(self.side):
            self.copy(_local(self._peer_slots[block][piece.owner][self.rank], piece), rows)

    def end_scatter(self, block):
        torch.cuda.current_stream().wait_stream(self.side)  # every push has left this rank
        self.fence()  # ... and landed on every peer

    def fence(self):
        # The barrier alone: by now the side stream's work is joined into the compute stream
        # (events after the pulls, the join above after the pushes). Joining it here as well
        # would make a CUDA graph capture that starts with the fence depend on uncaptured work.
        self.buffers.handle.barrier(channel=0)


def _recorded(stream) -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record(stream)
    return event


# ---------------------------------------------------------------------------------------------
# CPU: gloo point-to-point


class GlooTransport:
    """The same pieces in the same order over gloo isend/irecv (tag: the piece's first row)."""

    def __init__(self, plan: Plan, rank: int, gather_width: int, scatter_width: int, dtype, device) -> None:
        self.plan, self.rank = plan, rank
        rows, world = plan.layout.shard, plan.layout.world
        self.peers = [q for q in range(world) if q != rank]
        self._shards = [torch.zeros(rows, gather_width, dtype=dtype, device=device) for _ in (0, 1)]
        self._slots = [torch.zeros(world, rows, scatter_width, dtype=dtype, device=device) for _ in (0, 1)]
        self._recvs: dict[Piece, dist.Work] = {}
        self._pending: list[dist.Work] = []

    def shard(self, block):
        return self._shards[block]

    def start_gather(self, block, pieces, into):
        for peer in self.peers:
            for p in self.plan.served(self.rank, peer):
                self._pending.append(dist.isend(_local(self._shards[block], p), peer, tag=p.lo))
        for p in pieces:
            if p.owner != self.rank:
                self._recvs[p] = dist.irecv(into[p.lo : p.hi], p.owner, tag=p.lo)

    def arrived(self, piece):
        self._recvs.pop(piece).wait()

    def end_gather(self, block):
        self._drain()

    def slots(self, block):
        return self._slots[block]

    def start_scatter(self, block):
        for peer in self.peers:
            for p in self.plan.received(self.rank, peer):
                self._pending.append(dist.irecv(_local(self._slots[block][peer], p), peer, tag=p.lo))

    def push(self, block, piece, rows):
        self._pending.append(dist.isend(rows, piece.owner, tag=piece.lo))

    def end_scatter(self, block):
        self._drain()

    def fence(self):
        pass  # every transfer of a call is complete when it returns

    def _drain(self) -> None:
        for work in self._pending:
            work.wait()
        self._pending.clear()
