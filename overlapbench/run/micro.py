"""Micro workloads: one GEMM with its all-gather or reduce-scatter, to compare the SP
decompositions on a single matrix product of a chosen size.

- `gemm_ag`: rank r holds rows r of A ([M, K], sharded on dim 0, as ShardLayout cuts the
  tokens); C_r = all_gather(A) @ B_r.T, [M, N] on every rank (B_r: its column shard).
- `gemm_rs`: rank r holds A_r [M, K] (its slice of the K dimension's activations);
  C = sum_r A_r @ B_r.T, reduce-scattered on dim 0: rank r keeps its rows of C.

B_r is [N, K] (nn.Linear layout), different on every rank. M that the world size does not
divide is padded with zero rows, as in the SP layer. The step's input is the rank's own
operand, the padding included (gemm_ag: its A shard; gemm_rs: its A_r). The sweep's reference
is sp_baseline's output; `reference` computes the same unsharded, on one process, for tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from overlapbench.distributed.runtime import Runtime
from overlapbench.model.weights import random_input, seeded_randn, stable_seed
from overlapbench.overlap.sp_schedule import ShardLayout
from overlapbench.timing.step import Step

WORKLOADS = ("gemm_ag", "gemm_rs")


@dataclass
class MicroContext:
    """What an SP strategy needs to build a micro-workload step (cf. BuildContext)."""

    runtime: Runtime
    workload: str
    m: int
    n: int
    k: int
    weight: torch.Tensor  # this rank's B, [N, K]
    max_tokens: int  # the largest M of the run: size buffers once

    @property
    def tokens(self) -> int:
        return self.m

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    @property
    def widths(self) -> tuple[int, int]:
        """Row widths of the all-gathered operand and of the reduce-scattered result."""
        return (self.k, 0) if self.workload == "gemm_ag" else (0, self.n)

    def step(self, exchange) -> Step:
        """The micro workload through an SP strategy's Exchange (sequence_parallel.sp_step calls it)."""
        from overlapbench.overlap.sequence_parallel import ATTENTION, gather_rows

        layout = exchange.layout
        if self.workload == "gemm_ag":

            def forward(x: torch.Tensor) -> torch.Tensor:
                exchange.fence()  # peers are done reading the last call's shard
                shard = exchange.shard_buffer(ATTENTION)
                shard = x if shard is None else shard.copy_(x)
                return exchange.gather_matmul(ATTENTION, shard, self.weight)

            return Step(forward, lambda y: y[: layout.tokens])

        def forward(x: torch.Tensor) -> torch.Tensor:
            exchange.fence()  # peers are done summing the last call's slots
            return exchange.matmul_scatter(ATTENTION, lambda lo, hi: x[lo:hi], self.weight)

        return Step(forward, lambda y: gather_rows(y, layout))


def weight(workload: str, n: int, k: int, rank: int, seed: int, dtype, device) -> torch.Tensor:
    return seeded_randn((n, k), stable_seed(seed, 0, f"{workload}_b", rank), device, k**-0.5).to(dtype)


def operand(workload: str, m: int, k: int, world: int, rank: int, seed: int, dtype, device) -> torch.Tensor:
    """Rank `rank`'s input: its zero-padded shard of A (gemm_ag) or its padded A_r (gemm_rs)."""
    layout = ShardLayout(m, world)
    if workload == "gemm_ag":
        lo, hi = layout.real_rows(rank)
        a, rows = random_input(m, k, seed, dtype, device)[lo:hi], layout.shard
    else:
        a, rows = seeded_randn((m, k), stable_seed(seed, m, "gemm_rs_a", rank), device, 1.0).to(dtype), layout.padded
    return torch.cat([a, a.new_zeros(rows - a.shape[0], k)])


def reference(workload: str, m: int, n: int, k: int, world: int, seed: int, dtype=torch.float32,
              device="cpu") -> list[torch.Tensor]:
    """Every rank's full result ([M, N]), computed unsharded on one process."""
    device = torch.device(device)
    b = [weight(workload, n, k, r, seed, dtype, device) for r in range(world)]
    if workload == "gemm_ag":
        a = random_input(m, k, seed, dtype, device)
        return [a @ b_r.t() for b_r in b]
    a = [operand(workload, m, k, world, r, seed, dtype, device)[:m] for r in range(world)]
    total = sum(a_r.float() @ b_r.float().t() for a_r, b_r in zip(a, b))
    return [total.to(dtype)] * world


def build(rt: Runtime, point, dtype: torch.dtype, max_tokens: int) -> tuple[MicroContext, torch.Tensor]:
    """The context and this rank's input for a micro point (`point.gemm` gives N and K)."""
    m, n, k = point.tokens, point.gemm.n, point.gemm.k
    w = weight(point.workload, n, k, rt.rank, point.seed, dtype, rt.device)
    x = operand(point.workload, m, k, rt.world_size, rt.rank, point.seed, dtype, rt.device)
    return MicroContext(rt, point.workload, m, n, k, w, max_tokens), x
