"""The pair window of `comm --beside-layer`: one call of the path beside one block of the layer,
both released at once as a split releases them, and the row fields it fills. No torch: `predict`
reads these names.

A split issues chunk k's reduction when chunk k's block ends, on the communication lane, and the
next chunk's block on the compute lane at the same moment; the next compute that needs the
reduction waits for both. `predict` times the split's compute from its chain (`sweep --pieces`:
the same stack with each reduction a local residual add + RMSNorm on the reduction's lane), so
what a transfer costs the split is what the pair takes beyond the same pair with that add + norm
in the call's place: the compute it loses beside the call, and the call's tail where it outlasts
the block. Which kernel takes the SMs first (the block's first GEMM or the call's first kernels)
decides much of it (docs/predict.md, Why TP=4 misses), so the pair is timed as the split runs it:
one CUDA graph in which a block runs, and its end releases the call, forked onto a high-priority
side stream, and the block again, on the capturing stream; then joins them. Released from an idle
device instead, with the ranks in step, the call's first kernels took the SMs before the block's
first GEMM, which waited for them, where in the split the GEMM started right after the call's
opening barrier (2x H200, llama3-70b TP=2 at 4096 rows, the copy-engine path: docs/predict.md,
the pair window).

comm.beside_layer captures five graphs alike and times them in interleaved rounds (as the
in-layer term's three: timing/interleave.py, each replayed as often per round, the ranks meeting
before each): per block, the block then the call beside the block again, and the block then the
add + norm of the call's rows beside it (the chain's reduction); and the call alone (forked and
joined the same way). Per round and block, extra = the pair with the call - the pair with the add
+ norm (ms). The value is the rounds' trimmed mean with its 95% interval (as comm/in_layer.py
takes its term).

The fields, for each block B of BLOCKS: `pair_B_extra_ms` (its presence marks a row of this
window), `pair_B_extra_ci_ms` ([lo, hi]), `pair_B_extra_samples_ms` (each round's extra),
`pair_B_ms` and `pair_B_norm_ms` (the two graphs' medians over the rounds, ms per replay, the max
over ranks); and `pair_op_ms` (the call alone, forked and joined alike), `pair_rounds`,
`pair_replays`, `pair_graphs` (whether the five were CUDA graphs: where one fails to capture, all
five run eagerly) and `pair_graph_error`. The blocks' rows are the call's rows.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from overlapbench.comm.in_layer import LEVEL, SPAN_MS, time_every_round  # the in-layer term's rounds
from overlapbench.model.schedule import ATTENTION, MLP

if TYPE_CHECKING:
    from overlapbench.timing.bench import Clock
    from overlapbench.timing.interleave import Timed

BLOCKS = (ATTENTION, MLP)  # the blocks a split's transfer runs beside
# The graphs' order in a round's candidates: per block, the pair with the call, then with the chain's
# add + norm in its place; the call alone last.
PAIR_ATTENTION, NORM_ATTENTION, PAIR_MLP, NORM_MLP, OP_ALONE = range(5)
GRAPHS = ("pair_attention", "norm_attention", "pair_mlp", "norm_mlp", "op")  # their names, in that order
PAIR_TIMELINES = "OVERLAPBENCH_PAIR_TIMELINES"  # a folder: each rank writes the five graphs' timelines there


def extra_field(block: str) -> str:
    """The field of a block's extra beside one call (a row that has it was timed with this window)."""
    return f"pair_{block}_extra_ms"


def fields_of(block: str) -> tuple[str, ...]:
    return (extra_field(block), f"pair_{block}_extra_ci_ms", f"pair_{block}_extra_samples_ms", f"pair_{block}_ms",
            f"pair_{block}_norm_ms")


FIELDS = (*fields_of(ATTENTION), *fields_of(MLP), "pair_op_ms", "pair_rounds", "pair_replays", "pair_graphs",
          "pair_graph_error")


def time_pairs(runs: Sequence[Callable[[], object]], per_replay_ms: float, iters: int, clock: Clock,
               gather: Callable[[list[float]], list[list[float]]] = lambda values: [values],
               align: Callable[[], None] = lambda: None, graphs: bool = True, graph_error: str | None = None,
               span_ms: float = SPAN_MS, settle_ms: float = 0.0, own_replay_ms: Sequence[float] | None = None) -> Pairs:
    """Time the five graphs `runs` (in the order PAIR_ATTENTION .. OP_ALONE) in the in-layer term's
    interleaved rounds, each replayed as often per round as the longest pair (`per_replay_ms`, the
    same on every rank) fills a span of `span_ms` after `settle_ms` untimed (counted in each
    graph's `own_replay_ms`); `gather` and `align` as interleave.time_rounds takes them."""
    timed, replays = time_every_round(runs, per_replay_ms, iters, PAIR_MLP, clock, gather, align, span_ms, settle_ms,
                                      own_replay_ms)
    return Pairs.from_rounds(timed, replays, graphs, graph_error)


@dataclass(frozen=True)
class Pairs:
    """The five graphs' times in the rounds all five took part in (ms per replay, each the max
    over ranks), round by round."""

    attention_pair_ms: tuple[float, ...]
    attention_norm_ms: tuple[float, ...]  # the same pair with the chain's add + norm in the call's place
    mlp_pair_ms: tuple[float, ...]
    mlp_norm_ms: tuple[float, ...]
    op_ms: tuple[float, ...]
    replays: int  # each graph's replays per round
    graphs: bool
    graph_error: str | None = None

    def __post_init__(self) -> None:
        counts = {len(t) for t in (self.attention_pair_ms, self.attention_norm_ms, self.mlp_pair_ms, self.mlp_norm_ms,
                                   self.op_ms)}
        if counts != {len(self.op_ms)} or not self.op_ms:
            raise ValueError(f"pair rounds: {sorted(counts)} times per graph; one or more of each, round by round")

    @classmethod
    def from_rounds(cls, timed: Sequence[Timed], replays: int, graphs: bool, graph_error: str | None = None) -> Pairs:
        """From interleave.time_rounds' result for the five graphs: the rounds all five were timed in, in order."""
        from overlapbench.timing.interleave import shared_rounds

        return cls(*shared_rounds(timed), replays=replays, graphs=graphs, graph_error=graph_error)

    def series(self, block: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """`block`'s two graphs' times, round by round: with the call, with the add + norm."""
        return ((self.attention_pair_ms, self.attention_norm_ms) if block == ATTENTION
                else (self.mlp_pair_ms, self.mlp_norm_ms))

    def extras(self, block: str) -> list[float]:
        """Each round's extra of the pair with `block` (ms): with the call - with the add + norm."""
        pair, norm = self.series(block)
        return [p - n for p, n in zip(pair, norm)]

    def fields(self) -> dict:
        """The row's fields (the module's docstring names them)."""
        from overlapbench.timing.intervals import trimmed_mean_interval

        out = {}
        for block in BLOCKS:
            pair, norm = self.series(block)
            extras = self.extras(block)
            extra, interval = trimmed_mean_interval(extras, LEVEL)
            out |= dict(zip(fields_of(block), (extra, interval, [round(e, 6) for e in extras],
                                               statistics.median(pair), statistics.median(norm))))
        return out | {"pair_op_ms": statistics.median(self.op_ms), "pair_rounds": len(self.op_ms),
                      "pair_replays": self.replays, "pair_graphs": self.graphs, "pair_graph_error": self.graph_error}
