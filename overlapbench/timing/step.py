"""What a strategy builds for one point, and what the measurement times: the contract between the
strategies, the mechanisms they share, the micro and comm workloads, and `measure`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


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
