"""Which card is slow: each rank's own time of `no_comm`, the one candidate that never syncs the ranks.

Rows carry `rank_ms`, each rank's median ms per layer over its rounds (interleaved timing) or its
timed iterations (sequential; docs/timing.md, "Every rank's time"), where the row's `ms` is the
slowest rank's. A candidate whose transfers join the ranks (every correct strategy) makes the
faster ranks wait for the slowest at each transfer, so its ranks' times come out alike and say
nothing of their cards. `no_comm` runs the same work on every rank with nothing to wait for: its
ranks' times are the cards' own speeds. (A split with `comm: none` never syncs the ranks either;
`no_comm` is in every layer sweep, and one candidate keeps the line one number.)

The line, per group (a table) whose `no_comm` rows carry `rank_ms` of two ranks or more:
- the slowest and fastest rank: each rank's time in a row over the row's median over its ranks,
  the median of that over the rows, the largest and the least;
- the gap: the median over the rows of the slowest rank's time over the fastest's, less 1;
- the noise: the median over the same rows of their `cv` (the sd over the mean of the rounds'
  times, or the iterations': how far a round typically lies from the others);
- shown only where the gap exceeds the noise. The gap is between two medians over every round of
  the row, far surer than one round, so the rule is strict on purpose: a card it names is slower
  by more than a round of the rows typically wanders, worth checking; a real but smaller gap goes
  unnamed.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from overlapbench.tuning.analysis import BOUND, Group, Measured

SAMPLES = {"interleaved": "rounds", "sequential": "iterations"}  # what a row's samples are, by its timing


@dataclass(frozen=True)
class SlowCard:
    """One group's slowest rank against its fastest at `no_comm`, and the rows' noise."""

    group: Group
    slowest: int
    fastest: int
    gap: float  # median over the rows of slowest / fastest - 1
    noise: float  # median over the rows of their cv
    samples: str  # what the rows' samples are: "rounds" (interleaved), "iterations" (sequential), else "samples"
    points: int  # the rows it is the median over
    token_counts: bool  # each row a token count of its own (else: points of several batches or depths)

    @property
    def beyond_noise(self) -> bool:
        return self.gap > self.noise

    def line(self) -> str:
        over = f"{self.points} token counts" if self.token_counts else f"{self.points} points"
        return (f"cards ({self.group.label()}): rank {self.slowest} took {self.gap:.1%} longer than rank "
                f"{self.fastest} at {BOUND} (median over {over}; the {self.samples}' spread: cv {self.noise:.1%}); "
                f"every choice that communicates runs at the slowest card's pace")


def slow_cards(measured: Iterable[Measured]) -> list[SlowCard]:
    """Per group with `no_comm` rows that carry every rank's time (two ranks or more) and a cv:
    its slowest and fastest rank, whether or not the gap is beyond the noise."""
    by_group: dict[Group, list[Measured]] = {}
    for m in measured:
        if m.strategy == BOUND and len(m.rank_ms) >= 2 and m.cv is not None:
            by_group.setdefault(m.group, []).append(m)
    found = []
    for group, rows in by_group.items():
        ranks = len(rows[0].rank_ms)  # one per rank, and a group is of one world size
        relative = [[m.rank_ms[k] / statistics.median(m.rank_ms) for m in rows] for k in range(ranks)]
        typical = [statistics.median(r) for r in relative]
        slowest, fastest = typical.index(max(typical)), typical.index(min(typical))
        gap = statistics.median(m.rank_ms[slowest] / m.rank_ms[fastest] for m in rows) - 1
        noise = statistics.median(m.cv for m in rows)
        distinct = len({m.tokens for m in rows}) == len(rows)
        (timing, *others) = {m.timing for m in rows}
        samples = "samples" if others else SAMPLES.get(timing, "samples")
        found.append(SlowCard(group, slowest, fastest, gap, noise, samples, len(rows), distinct))
    return found


def card_notes(measured: Iterable[Measured]) -> list[str]:
    """The report's lines: one per group whose slowest card is slower beyond the rows' noise."""
    return [card.line() for card in slow_cards(measured) if card.beyond_noise]
