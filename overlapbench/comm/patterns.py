"""Verifiable inputs: rank q's chunk c is 1 + (j + 3q + 5*seed + 11c) % 13 at offset j.

Values 1..13 are never zero; a sum over up to 9 sources (8 ranks + a residual) stays <= 117,
exact in bf16; a rank's or a chunk's data in the wrong place differs from what belongs there.
So a right collective has exactly zero wrong elements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MODULUS = 13


def _ints(source: int, chunk: int, count: int, seed: int, device) -> torch.Tensor:
    import torch

    shift = (3 * source + 5 * seed + 11 * chunk) % MODULUS
    index = torch.int32 if count + MODULUS < 2**31 else torch.int64
    return torch.arange(count, dtype=index, device=device).add_(shift).remainder_(MODULUS).add_(1)


def pattern(source: int, chunk: int, count: int, seed: int, dtype, device) -> torch.Tensor:
    """Rank `source`'s input chunk `chunk` ([count]) for a case's `seed`."""
    return _ints(source, chunk, count, seed, device).to(dtype)


def pattern_sum(sources: range, chunk: int, count: int, seed: int, dtype, device) -> torch.Tensor:
    """The exact sum over `sources` of their chunk `chunk`."""
    total = _ints(sources[0], chunk, count, seed, device)
    for source in sources[1:]:
        total += _ints(source, chunk, count, seed, device)
    return total.to(dtype)


def op_input(op: str, rank: int, world: int, count: int, seed: int, dtype, device) -> torch.Tensor:
    """What `rank` contributes: the whole buffer (all-reduce), its shard (all-gather), or one
    chunk per destination rank (reduce-scatter)."""
    import torch

    if op == "all_reduce":
        return pattern(rank, 0, count, seed, dtype, device)
    shard = count // world
    if op == "all_gather":
        return pattern(rank, rank, shard, seed, dtype, device)
    return torch.cat([pattern(rank, c, shard, seed, dtype, device) for c in range(world)])


def op_expected(op: str, rank: int, world: int, count: int, seed: int, dtype, device) -> torch.Tensor:
    """What `rank` must hold afterwards."""
    import torch

    if op == "all_reduce":
        return pattern_sum(range(world), 0, count, seed, dtype, device)
    shard = count // world
    if op == "all_gather":
        return torch.cat([pattern(q, q, shard, seed, dtype, device) for q in range(world)])
    return pattern_sum(range(world), rank, shard, seed, dtype, device)


def count_wrong(result: torch.Tensor, expected: torch.Tensor) -> int:
    """Elements that differ (NaN counts as wrong); a shape mismatch makes every element wrong."""
    if result.numel() != expected.numel():
        return max(result.numel(), expected.numel())
    return int((result.reshape(-1) != expected.reshape(-1)).sum())

