"""The strategy contract: what a strategy builds from (`BuildContext`) and what it builds for one
point (`Step`), which the measurement times. Between the strategies, the mechanisms they share,
the micro and comm workloads, and `measure`. No torch at import: the strategies' declarations read it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from overlapbench.model.schedule import Batch

if TYPE_CHECKING:
    import torch

    from overlapbench.distributed.runtime import Runtime
    from overlapbench.model.chunks import DecodeCache
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import Stack


@dataclass
class Step:
    """What a strategy builds for one point.

    `forward(x)` runs the whole stack on the full, replicated input x ([tokens, hidden]) and is
    what gets timed (and captured in a CUDA graph where `graphable`). `to_full(y)` turns its
    output into the full replicated [tokens, hidden] result, for the correctness check only.
    """

    forward: Callable[[torch.Tensor], torch.Tensor]
    to_full: Callable[[torch.Tensor], torch.Tensor] = field(default=lambda y: y)
    graphable: bool = True


@dataclass
class BuildContext:
    """Everything a strategy needs to build a step for one point."""

    runtime: Runtime
    stack: Stack
    seq_lens: tuple[int, ...]  # the prefill sequences
    rope: RopeTable
    max_tokens: int  # the largest batch of the run: size buffers once, for all points
    decode: DecodeCache | None = None  # a mixed batch's decode tokens (first in the layout) and their cache

    @property
    def tokens(self) -> int:
        from overlapbench.model.chunks import decode_tokens

        return sum(self.seq_lens) + decode_tokens(self.decode)

    @property
    def eps(self) -> float:
        return self.stack.shape.eps

    @property
    def batch(self) -> Batch:
        """What a strategy's plan depends on (model/schedule.py)."""
        return Batch.of(self.seq_lens, self.decode, self.stack.shape, self.stack.tp)
