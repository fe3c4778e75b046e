"""The in-layer term of `comm --beside-layer`: what one blocking all-reduce costs in line with the
layer beyond its time alone, as paired differences within one harness, and the row fields it fills.

comm.beside_layer captures three CUDA graphs the same way and times them in interleaved rounds
(timing/interleave.py: in each round every graph is replayed the same number of times back to
back, in a fresh order, the ranks meeting before each):

- in line: attention, the all-reduce, the MLP, the all-reduce, on one stream, as a serial plan
  runs them;
- the pass: the same attention and MLP, no all-reduce;
- the all-reduces: the two all-reduces alone.

In each round, extra = (in line - pass - all-reduces) / 2, per all-reduce; the term is the mean
of the rounds' extras with a tenth cut from each tail (as the paired speedups are taken,
timing/intervals.py), with its 95% interval. The three meet the same clocks in a round, so a
drift of the clocks, or the load before a graph, moves them alike and leaves the difference.

The fields (each row of a --beside-layer case): `in_layer_extra_ms` (the term, per all-reduce;
its presence marks a row of this measurement), `in_layer_extra_ci_ms` ([lo, hi]),
`in_layer_extra_samples_ms` (each round's extra), `in_layer_inline_ms`, `in_layer_pass_ms` and
`in_layer_ops_ms` (each graph's median over the rounds, ms per replay, the max over ranks),
`in_layer_rounds`, `in_layer_replays` (each graph's replays per round), `in_layer_graphs`
(whether the three were CUDA graphs: where one fails to capture, all three run eagerly) and
`in_layer_graph_error`.

Rows made before this measurement carry `inline_ms` and `inline_extra_ms` instead: the in-line
graph timed on its own (measure.time_step, back to back) less the pass timed once per row count
by another harness (each pass from an idle device) and the all-reduce's row time. From 4K tokens
(llama3-70b TP=2) that difference read the pass's two timings, 0-11% apart, not the all-reduce;
`predict` ignores it (predict/contention.py). No torch here: predict reads these names.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from overlapbench.timing.bench import Clock
    from overlapbench.timing.interleave import Timed

TERM = "in_layer_extra_ms"  # the term per all-reduce; a row that has it was measured this way
BEFORE = "inline_extra_ms"  # the term of rows made before: two harnesses, ignored by predict
FIELDS = (TERM, "in_layer_extra_ci_ms", "in_layer_extra_samples_ms", "in_layer_inline_ms", "in_layer_pass_ms",
          "in_layer_ops_ms", "in_layer_rounds", "in_layer_replays", "in_layer_graphs", "in_layer_graph_error")
INLINE, PASS, OPS = 0, 1, 2  # the graphs' order in a round's candidates
LEVEL = 0.95
# The rounds (interleave.Plan): each graph replayed as often as the in-line pass fills a span
# (SPAN_MS by default), whole rounds for WARMUP_S untimed first, then max(--iters, MIN_ROUNDS)
# rounds, none left early. By default nothing settles a graph before its span: the three share
# one clock, which at a power cap is not the in-line pass's own (docs/timing.md, "Each choice at
# its own clock"); `comm --settle-ms` settles each (comm/cases.BesideLayer), for as many of its
# own replays as fill the settling.
SPAN_MS = 20.0
WARMUP_S = 0.2
MIN_ROUNDS = 10


def time_paired(runs: Sequence[Callable[[], object]], per_replay_ms: float, iters: int, clock: Clock,
                gather: Callable[[list[float]], list[list[float]]] = lambda values: [values],
                align: Callable[[], None] = lambda: None, graphs: bool = True, graph_error: str | None = None,
                span_ms: float = SPAN_MS, settle_ms: float = 0.0, own_replay_ms: Sequence[float] | None = None) -> InLayer:
    """Time the three graphs `runs` (INLINE, PASS, OPS) in interleaved rounds, each replayed as
    often per round as the in-line pass (`per_replay_ms`, the same on every rank) fills a span of
    `span_ms`, after `settle_ms` of untimed replays (counted in each graph's `own_replay_ms`);
    `gather` and `align` as interleave.time_rounds takes them."""
    timed, replays = time_every_round(runs, per_replay_ms, iters, PASS, clock, gather, align, span_ms, settle_ms,
                                      own_replay_ms)
    return InLayer.from_rounds(timed, replays, graphs, graph_error)


def time_every_round(runs: Sequence[Callable[[], object]], per_replay_ms: float, iters: int, reference: int,
                     clock: Clock, gather: Callable[[list[float]], list[list[float]]] = lambda values: [values],
                     align: Callable[[], None] = lambda: None, span_ms: float = SPAN_MS,
                     settle_ms: float = 0.0, own_replay_ms: Sequence[float] | None = None) -> tuple[list[Timed], int]:
    """These rounds for any graphs `runs` (the in-layer term's, the pair window's: comm/pair.py):
    every graph in every one of max(`iters`, MIN_ROUNDS) rounds, each run untimed for `settle_ms`
    (as many of its replays as `own_replay_ms`, each graph's replay time the same on every rank,
    says fill it; default `per_replay_ms`) then replayed as often as `per_replay_ms` fills
    `span_ms`, after WARMUP_S of whole rounds; `reference` the candidate the others' speedups are
    taken over. Returns interleave.time_rounds' result and the replays per round."""
    from overlapbench.timing.interleave import Plan, repetitions, time_rounds

    rounds = max(iters, MIN_ROUNDS)
    plan = Plan(span_ms, rounds, ci_target=0.0, warmup_s=WARMUP_S, min_rounds=rounds,  # every graph in every round
                settle_ms=settle_ms)
    timed = time_rounds(runs, [per_replay_ms] * len(runs), reference, plan, clock, gather, align=align,
                        own_iter_ms=own_replay_ms)
    return timed, repetitions(span_ms, per_replay_ms)


@dataclass(frozen=True)
class InLayer:
    """The three graphs' times in the rounds all three took part in (ms per replay, each the max
    over ranks), round by round."""

    inline_ms: tuple[float, ...]
    pass_ms: tuple[float, ...]
    ops_ms: tuple[float, ...]
    replays: int  # each graph's replays per round
    graphs: bool
    graph_error: str | None = None

    def __post_init__(self) -> None:
        if not self.inline_ms or not len(self.inline_ms) == len(self.pass_ms) == len(self.ops_ms):
            raise ValueError(f"in-layer rounds: {len(self.inline_ms)} in line, {len(self.pass_ms)} passes, "
                             f"{len(self.ops_ms)} all-reduces; one or more of each, round by round")

    @classmethod
    def from_rounds(cls, timed: Sequence[Timed], replays: int, graphs: bool, graph_error: str | None = None) -> InLayer:
        """From interleave.time_rounds' result for the three graphs (INLINE, PASS, OPS): the rounds
        all three were timed in, in order."""
        from overlapbench.timing.interleave import shared_rounds

        return cls(*shared_rounds(timed), replays=replays, graphs=graphs, graph_error=graph_error)

    def extras(self) -> list[float]:
        """Each round's extra per all-reduce: (in line - pass - all-reduces) / 2."""
        return [extra_per_all_reduce(i, p, o) for i, p, o in zip(self.inline_ms, self.pass_ms, self.ops_ms)]

    def fields(self) -> dict:
        """The row's fields (the module's docstring names them)."""
        from overlapbench.timing.intervals import trimmed_mean_interval

        extras = self.extras()
        term, interval = trimmed_mean_interval(extras, LEVEL)
        return {
            TERM: term,
            "in_layer_extra_ci_ms": interval,
            "in_layer_extra_samples_ms": [round(e, 6) for e in extras],
            "in_layer_inline_ms": statistics.median(self.inline_ms),
            "in_layer_pass_ms": statistics.median(self.pass_ms),
            "in_layer_ops_ms": statistics.median(self.ops_ms),
            "in_layer_rounds": len(extras), "in_layer_replays": self.replays,
            "in_layer_graphs": self.graphs, "in_layer_graph_error": self.graph_error,
        }


def extra_per_all_reduce(inline_ms: float, pass_ms: float, ops_ms: float) -> float:
    """What each of a pass's two blocking all-reduces cost in line beyond their time alone:
    (in line - the pass - the two all-reduces) / 2. Negative where they ran faster together,
    which noise allows."""
    return (inline_ms - pass_ms - ops_ms) / 2
