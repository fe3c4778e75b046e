"""The compute's loss beside a transfer as paired rounds, and the row fields it fills. No torch:
`predict` reads these names.

comm.contention times, in each round, one compute pass beside the path, one pass alone and one
pass beside a single call of the path, the windows set up alike (the ranks meet, the same
streams, one pass timed on the compute's stream; beside, the path's ops start first and outlast
it; beside one call, the path's one op starts first, as a split issues a reduction when the next
compute block starts), their order reversed from one round to the next. Each round's loss is 1 - its pass alone
/ its pass beside (each the max over ranks); the loss is the mean of the rounds' losses with a
tenth cut from each tail (as comm/in_layer.py takes its term, timing/intervals.py), with its 95%
interval. Each round's one-call extra is its pass beside one call - its pass alone (ms), taken
the same way: the same trimmed mean and interval as the loss and the in-layer term
(intervals.trimmed_mean_interval; trimmed_log_mean's name notwithstanding, nothing in it is a
log). The passes of a round meet the same clocks, so a drift of the clocks moves them alike and
leaves the ratio and the difference.

The fields, per compute stream (`compute` for --beside-layer's layer, `gemm` for --beside-gemm's
GEMMs): `{prefix}_loss_paired` (the loss; its presence marks a row of this measurement),
`{prefix}_loss_paired_ci` ([lo, hi]), `{prefix}_loss_paired_samples` (each round's loss) and
`{prefix}_ms_alone_paired` (the pass alone, the median over the rounds, ms): `paired_fields`;
and `{prefix}_one_call_extra_ms` (the compute's extra beside one call, ms; its presence marks a
row timed with the one-call window), `{prefix}_one_call_extra_ci_ms` ([lo, hi]) and
`{prefix}_one_call_extra_samples_ms` (each round's extra) and `{prefix}_one_call_op_ms` (the one
call's own time beside the pass, the median over the rounds: its stretch as a split issues it,
over the row's `ms` alone): `one_call_fields`. The loss is taken
while the path's ops run back to back, and the transfer's stretch in another window; the extra is
what one call, as a split issues it, takes from the pass (predict's `--transfer-beside one-call`).

Rows made before hold only `{prefix}_loss` (`compute_loss`, `gemm_loss`), still written: 1 - the
pass timed alone from an idle device by its own harness (comm.contention.time_alone) / the median
pass beside the path. Two harnesses meet different clocks (the layer's pass read 0-11% apart);
`loss_of` prefers the paired loss and falls back on that one. Rows made before the one-call
window lack its fields.
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


def one_call_fields(prefix: str) -> tuple[str, ...]:
    """The row fields of the stream `prefix`'s one-call window (the module's docstring): the
    pass's extra, its interval and samples, and the call's own time beside the pass."""
    return (f"{prefix}_one_call_extra_ms", f"{prefix}_one_call_extra_ci_ms", f"{prefix}_one_call_extra_samples_ms",
            f"{prefix}_one_call_op_ms")


def loss_of(row: dict, prefix: str) -> float | None:
    """A row's compute loss: the paired one where the row has it, else the two-harness one."""
    paired = row.get(f"{prefix}_loss_paired")
    return paired if paired is not None else row.get(f"{prefix}_loss")


@dataclass(frozen=True)
class PairedLoss:
    """One compute pass alone, one beside the path and, where timed, one beside a single call of
    the path per round (ms, each the max over ranks), round by round."""

    alone_ms: tuple[float, ...]
    beside_ms: tuple[float, ...]
    one_call_ms: tuple[float, ...] = ()  # none: rows made before the one-call window
    one_call_op_ms: tuple[float, ...] = ()  # the one call's own time beside the pass, per round

    def __post_init__(self) -> None:
        if not self.alone_ms or len(self.alone_ms) != len(self.beside_ms):
            raise ValueError(f"paired loss: {len(self.alone_ms)} passes alone, {len(self.beside_ms)} beside; "
                             f"one or more of each, round by round")
        if self.one_call_ms and len(self.one_call_ms) != len(self.alone_ms):
            raise ValueError(f"paired loss: {len(self.alone_ms)} passes alone, {len(self.one_call_ms)} beside one call; "
                             f"none beside one call, or one per round")
        if len(self.one_call_op_ms) != len(self.one_call_ms):
            raise ValueError(f"paired loss: {len(self.one_call_ms)} passes beside one call, {len(self.one_call_op_ms)} "
                             f"times of the call; one of each per round")

    def losses(self) -> list[float]:
        """Each round's loss: 1 - its pass alone / its pass beside."""
        return [compute_loss(a, b) for a, b in zip(self.alone_ms, self.beside_ms)]

    def one_call_extras(self) -> list[float]:
        """Each round's extra beside one call (ms): its pass beside one call - its pass alone."""
        return [one - a for a, one in zip(self.alone_ms, self.one_call_ms)]

    def loss(self) -> float:
        """The rounds' trimmed mean loss (the value `fields` writes)."""
        loss, _, _ = _trimmed(self.losses())
        return loss

    def fields(self, prefix: str) -> dict:
        """The row's fields for the stream `prefix` (paired_fields names them, and one_call_fields
        where the pass was timed beside one call)."""
        fields = dict(zip(paired_fields(prefix), (*_trimmed(self.losses()), statistics.median(self.alone_ms))))
        if self.one_call_ms:
            fields |= dict(zip(one_call_fields(prefix), (*_trimmed(self.one_call_extras()),
                                                         statistics.median(self.one_call_op_ms))))
        return fields


def _trimmed(values: list[float]) -> tuple[float, list[float], list[float]]:
    """The rounds' trimmed mean, its interval [lo, hi] and each round's value, as the fields hold them."""
    from overlapbench.timing.intervals import trimmed_mean_interval

    return (*trimmed_mean_interval(values, LEVEL), [round(x, 6) for x in values])
