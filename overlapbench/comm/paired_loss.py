"""The compute's loss beside a transfer as paired rounds, and the row fields it fills. No torch:
`predict` reads these names.

comm.contention times, in each round, one compute pass beside the path and one pass alone, the
two windows set up alike (the ranks meet, the same streams, one pass timed on the compute's
stream; beside, the path's ops start first and outlast it), their order alternating by round.
Each round's loss is 1 - its pass alone / its pass beside (each the max over ranks); the loss is
the mean of the rounds' losses with a tenth cut from each tail (as comm/in_layer.py takes its
term, timing/intervals.py), with its 95% interval. Both passes of a round meet the same clocks,
so a drift of the clocks moves them alike and leaves the ratio.

The fields, per compute stream (`compute` for --beside-layer's layer, `gemm` for --beside-gemm's
GEMMs): `{prefix}_loss_paired` (the loss; its presence marks a row of this measurement),
`{prefix}_loss_paired_ci` ([lo, hi]), `{prefix}_loss_paired_samples` (each round's loss) and
`{prefix}_ms_alone_paired` (the pass alone, the median over the rounds, ms).

Rows made before hold only `{prefix}_loss` (`compute_loss`, `gemm_loss`), still written: 1 - the
pass timed alone from an idle device by its own harness (comm.contention.time_alone) / the median
pass beside the path. Two harnesses meet different clocks (the layer's pass read 0-11% apart);
`loss_of` prefers the paired loss and falls back on that one.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

LAYER, GEMM = "compute", "gemm"  # the prefixes of the two compute streams' fields
LEVEL = 0.95


def compute_loss(alone_ms: float, beside_ms: float) -> float:
    """The share of the compute's throughput a transfer beside it takes: 1 - alone / beside (0:
    none; negative where the pass ran faster beside it, which noise allows)."""
    return 1 - alone_ms / beside_ms


def paired_fields(prefix: str) -> tuple[str, ...]:
    """The row fields of the paired loss of the stream `prefix` (the module's docstring)."""
    return (f"{prefix}_loss_paired", f"{prefix}_loss_paired_ci", f"{prefix}_loss_paired_samples",
            f"{prefix}_ms_alone_paired")


def loss_of(row: dict, prefix: str) -> float | None:
    """A row's compute loss: the paired one where the row has it, else the two-harness one."""
    paired = row.get(f"{prefix}_loss_paired")
    return paired if paired is not None else row.get(f"{prefix}_loss")


@dataclass(frozen=True)
class PairedLoss:
    """One compute pass alone and one beside the path per round (ms, each the max over ranks),
    round by round."""

    alone_ms: tuple[float, ...]
    beside_ms: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.alone_ms or len(self.alone_ms) != len(self.beside_ms):
            raise ValueError(f"paired loss: {len(self.alone_ms)} passes alone, {len(self.beside_ms)} beside; "
                             f"one or more of each, round by round")

    def losses(self) -> list[float]:
        """Each round's loss: 1 - its pass alone / its pass beside."""
        return [compute_loss(a, b) for a, b in zip(self.alone_ms, self.beside_ms)]

    def loss(self) -> float:
        """The rounds' trimmed mean loss."""
        import numpy as np

        from overlapbench.timing.intervals import trimmed_log_mean

        return float(trimmed_log_mean(np.asarray(self.losses(), dtype=float)))

    def fields(self, prefix: str) -> dict:
        """The row's fields for the stream `prefix` (paired_fields names them)."""
        from overlapbench.timing.intervals import paired_interval

        losses = self.losses()
        lo, hi = paired_interval(losses, LEVEL)  # the trimmed mean's interval: nothing in it is a log
        return dict(zip(paired_fields(prefix), (self.loss(), [lo, hi], [round(x, 6) for x in losses],
                                                statistics.median(self.alone_ms))))
