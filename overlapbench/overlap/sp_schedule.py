"""Bookkeeping of the sequence-parallel layout and of the decomposed all-gather/reduce-scatter.

Pure functions, no torch: which rows each rank holds, in which order a rank visits the
slices of a decomposed collective, and who sends to whom at each step.

Layout: `tokens` rows are cut into `world` contiguous shards of `ceil(tokens / world)` rows;
rank r holds rows [r * shard, (r + 1) * shard). The rows past `tokens` (fewer than `world`,
all at the end, so only the last shard or shards hold them) are padding: they start as
zeros and stay zeros through every GEMM, norm and SiLU, and attention never reads them.

Orders (Flash-Overlap / CommFuse):

- `local_first_last`: an all-gather consumer starts on the slice the rank already holds and
  then takes the peers' in ring order r+1, r+2, ...; a reduce-scatter producer makes the
  slices bound for its peers first, in ring order r+1, r+2, ..., and its own last. At every
  step the ranks' transfers form a permutation (each rank sends once, receives once), and
  the last GEMM's output stays local, so no transfer is left exposed at the end.
- `ring`: every rank walks the slices in the same index order 0, 1, ..., world-1, as a
  rank-unaware decomposition does: all ranks but 0 wait for slice 0 before their first
  all-gather GEMM, every slice's owner serves all peers at once, and the reduce-scatter's
  last slice goes out after the last GEMM. It is there to measure what the ordering buys.

Over-decomposition (`chunks` > 1) cuts every shard into that many pieces, visited in order,
so the first GEMM on a peer's slice starts after a fraction of it has arrived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ORDERS = ("local_first_last", "ring")
ATTENTION_MODES = ("whole", "per_piece")  # how the SP layer feeds the O-proj pieces (sequence_parallel.py)
Phase = Literal["gather", "scatter"]


@dataclass(frozen=True)
class ShardLayout:
    """How `tokens` rows are sharded over `world` ranks (the last shards padded)."""

    tokens: int
    world: int

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.world < 1:
            raise ValueError(f"need tokens >= 1 and world >= 1, got {self.tokens}, {self.world}")

    @property
    def shard(self) -> int:
        """Rows per rank."""
        return -(-self.tokens // self.world)

    @property
    def padded(self) -> int:
        """Rows of the gathered layout: tokens plus the padding."""
        return self.shard * self.world

    def rows(self, rank: int) -> tuple[int, int]:
        """Rows [lo, hi) of the padded layout that `rank` holds."""
        return rank * self.shard, (rank + 1) * self.shard

    def real_rows(self, rank: int) -> tuple[int, int]:
        """The rows of `rank`'s shard that are tokens, not padding (possibly none)."""
        lo, hi = self.rows(rank)
        return min(lo, self.tokens), min(hi, self.tokens)


@dataclass(frozen=True)
class Piece:
    """Rows [lo, hi) of the padded layout, inside the shard of rank `owner`.

    In an all-gather the owner is where the rows come from; in a reduce-scatter, where the
    partial sums of these rows go. `offset` is the first row's index inside the owner's shard.
    """

    owner: int
    lo: int
    hi: int
    offset: int

    @property
    def size(self) -> int:
        return self.hi - self.lo


def pieces(layout: ShardLayout, owner: int, chunks: int) -> list[Piece]:
    """`owner`'s shard cut into `chunks` near-equal pieces, in row order; empty ones dropped."""
    base, shard = layout.rows(owner)[0], layout.shard
    cuts = [c * shard // chunks for c in range(chunks + 1)]
    return [Piece(owner, base + a, base + b, a) for a, b in zip(cuts, cuts[1:]) if b > a]


def owner_order(rank: int, world: int, order: str, phase: Phase) -> list[int]:
    """The ranks whose slices `rank` visits, step by step (see the module docstring)."""
    if order == "ring":
        return list(range(world))
    if order != "local_first_last":
        raise ValueError(f"unknown order {order!r}; expected one of {ORDERS}")
    first = 0 if phase == "gather" else 1
    return [(rank + s) % world for s in range(first, first + world)]


def schedule(layout: ShardLayout, rank: int, chunks: int, order: str, phase: Phase) -> list[Piece]:
    """Every piece of the padded layout, in the order `rank` computes on it."""
    owners = owner_order(rank, layout.world, order, phase)
    return [p for owner in owners for p in pieces(layout, owner, chunks)]


def transfers(world: int, step: int, order: str, phase: Phase) -> list[tuple[int, int]]:
    """(source, destination) of every whole-slice transfer at `step`, over all ranks.

    In an all-gather the slice a rank consumes at a step comes from its owner; in a
    reduce-scatter the slice it produces goes to its owner. Local slices move nowhere.
    """
    moves = []
    for rank in range(world):
        owner = owner_order(rank, world, order, phase)[step]
        if owner != rank:
            moves.append((owner, rank) if phase == "gather" else (rank, owner))
    return moves


@dataclass(frozen=True)
class Plan:
    """The decomposition of one point: the layout, the pieces' order and the over-decomposition."""

    layout: ShardLayout
    chunks: int
    order: str

    def gather(self, rank: int) -> list[Piece]:
        return schedule(self.layout, rank, self.chunks, self.order, "gather")

    def scatter(self, rank: int) -> list[Piece]:
        return schedule(self.layout, rank, self.chunks, self.order, "scatter")

    def served(self, rank: int, peer: int) -> list[Piece]:
        """The pieces of `rank`'s shard that `peer` gathers, in the order `peer` takes them."""
        return [p for p in self.gather(peer) if p.owner == rank]

    def received(self, rank: int, peer: int) -> list[Piece]:
        """The pieces of `rank`'s shard whose partial sums `peer` sends, in the order it sends them."""
        return [p for p in self.scatter(peer) if p.owner == rank]
