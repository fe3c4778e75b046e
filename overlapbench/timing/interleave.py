"""Interleaved timing: a batch's candidates in rounds, so that clock drift hits them all alike.

GPU clocks wander by a few percent over hundreds of milliseconds. Timed one after the other,
two candidates meet different clocks; timed in the same round, they meet the same one, and the
ratio of their times in that round is free of the drift. But the clock also follows the load:
at the power cap, a candidate that leaves the SMs idle for part of its step (a blocking
all-reduce) lets the clock rise, one that keeps them busy holds it down, and within 0.1-0.2 s of a
change of load the clock has moved (docs/timing.md, "Each choice at its own clock"). Timed in
short spans back to back, a round's candidates share one clock set by the round's mix, which no
deployment running one of them meets. So each round runs every active candidate, in a fresh
random order that every rank draws alike (one seeded RNG), first untimed for about `settle_ms`
(its clock moves to its own load's), then timed for about `span_ms`. Before each timed span the
ranks meet in a device-side barrier (`align`), and the span is timed from there: a candidate that never
syncs the ranks (no_comm) leaves them apart by a millisecond or so, and the first collective of
the next one would otherwise count that wait into its time (on 2x H200 the candidate after
no_comm came out 2.3-4% slow on average at 1-8K tokens: tests/checks/round_order_effects.py). The host queues round
r+1 before it waits for round r: the device never idles between candidates or rounds, and the
host syncs once per round.

A candidate's speedup is the trimmed geometric mean over rounds of t_reference / t in the same
round (analysis.paired_estimate), with a 95% bootstrap interval over rounds. A candidate leaves
once that interval is within +-`ci_target` of its speedup (after `min_rounds`), and the round
already queued when it left does not count (it would move the interval it left with); the reference
stays to the end. Rounds stop at the plan's budget of time. Everything
device-specific is in the `Clock` and the `gather` and `align` functions, so the scheduler runs
on a fake clock, and fake ranks, in the tests; `ranks_gather` and `ranks_barrier` are those of a
run's ranks (run/paired.py and comm/beside_layer.py time with them).

Every rank's own times are kept. A round's time of a candidate is the slowest rank's (what the
speedups and a row's `samples_ms` are made of: a choice whose transfers join the ranks runs at
that pace), but the ranks need not compute at one speed: `Timed.rank_samples_ms` holds each
rank's time in each round, so a row can say which card is slow (`rank_ms`, docs/timing.md). The
ranks exchange their times by one all-gather on the CPU control group per round, and take the
max from what it gathers. It costs what an all-reduce of the max would: one small collective
(world size x candidates float64s, a few hundred bytes to a few KiB) of host memory, at the
same host step (after the host has waited for the round's last span, while the next round stays
queued on the device), so keeping every rank's times adds no host sync and no wait for the
device, and the max is the same number.

A candidate's span is `bench.timed_span` on bench's clocks, but the rounds do not call
`bench.bench`: it waits for its own samples before it returns, where a round's spans are read
only once the next round is queued behind them (the device never idles between candidates).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from overlapbench.timing.bench import Clock, timed_span
from overlapbench.timing.intervals import paired_ci, paired_estimate


@dataclass(frozen=True)
class Plan:
    span_ms: float  # per candidate per round, timed
    max_rounds: int
    ci_target: float  # a candidate leaves when its interval's half-width is within this share of its speedup
    warmup_s: float = 0.0  # whole rounds, untimed, first: the clock reaches the interleaved regime
    min_rounds: int = 10  # before a candidate may leave: percentile intervals of fewer rounds are too narrow
    seed: int = 0
    # Before each candidate's timed span, its iterations run untimed for about this long, so the
    # span is timed at the clock of the candidate's own load (the module says why).
    settle_ms: float = 0.0
    # The time the sequential mode would time each candidate (max(iters x its iteration,
    # min_time_s)); rounds stop once they have taken `budget_factor` times that, summed over the
    # candidates. The budget is of time, not of rounds: once the quiet candidates have left,
    # rounds of the reference and the noisy ones cost less, and the time left goes to them.
    iters: int = 0
    min_time_s: float = 0.0
    budget_factor: float = 3.0

    def budget_ms(self, per_iter_ms: Sequence[float]) -> float:
        """The milliseconds the rounds may take, their settling included (inf where the plan sets
        no budget)."""
        budget = self.budget_factor * sum(max(self.iters * p, self.min_time_s * 1e3) for p in per_iter_ms)
        return budget if budget > 0 else math.inf


@dataclass
class Timed:
    """One candidate's rounds: ms per iteration in each (max over ranks), and its speedup; and
    every rank's ms per iteration in each round (rank order), whose max `samples_ms` holds."""

    samples_ms: list[float]
    round_ids: list[int]
    iters: int  # iterations timed in all
    speedup: float | None = None  # analysis.paired_estimate of t_reference / t over rounds
    speedup_ci: tuple[float, float] | None = None
    rank_samples_ms: list[list[float]] = field(default_factory=list)  # per round: each rank's ms

    def add(self, other: Timed) -> None:
        """Append `other`'s rounds (a later group's timing of the same candidate)."""
        self.samples_ms.extend(other.samples_ms)
        self.round_ids.extend(other.round_ids)
        self.rank_samples_ms.extend(other.rank_samples_ms)
        self.iters += other.iters

    def rank_medians(self) -> list[float]:
        """Each rank's median ms per iteration over the rounds taken (rank order); empty where
        no round was."""
        return [statistics.median(one) for one in zip(*self.rank_samples_ms)]


def shared_rounds(timed: Sequence[Timed]) -> list[tuple[float, ...]]:
    """Each candidate's times in the rounds every candidate was timed in, in round order: paired
    differences of the candidates are taken round by round (comm/in_layer.py, comm/pair.py)."""
    by_round = [dict(zip(t.round_ids, t.samples_ms)) for t in timed]
    common = sorted(set.intersection(*(set(one) for one in by_round)))
    return [tuple(one[r] for r in common) for one in by_round]


def repetitions(span_ms: float, per_iter_ms: float) -> int:
    """Iterations that fill one span (at least one)."""
    return max(1, round(span_ms / max(per_iter_ms, 1e-6)))


def settling(settle_ms: float, per_iter_ms: float) -> int:
    """Untimed iterations that fill at least `settle_ms` (none where it is 0)."""
    return math.ceil(settle_ms / max(per_iter_ms, 1e-6)) if settle_ms > 0 else 0


def round_ms(per_iter_ms: Sequence[float], span_ms: float, settle_ms: float = 0.0) -> float:
    """How long a round of these candidates takes, their settling included."""
    return sum((settling(settle_ms, p) + repetitions(span_ms, p)) * p for p in per_iter_ms)


def longest_s(per_iter_ms: Sequence[float], plan: Plan) -> float:
    """The most seconds time_rounds can take (warm-up, the minimum rounds, the budget, and the
    rounds in flight when it runs out)."""
    full = round_ms(per_iter_ms, plan.span_ms, plan.settle_ms)
    timed = min(plan.budget_ms(per_iter_ms), plan.max_rounds * full)
    return plan.warmup_s + (max(timed, plan.min_rounds * full) + 2 * full) / 1e3


def time_rounds(
    runs: Sequence[Callable[[], None]],
    per_iter_ms: Sequence[float],
    reference: int,
    plan: Plan,
    clock: Clock,
    gather: Callable[[list[float]], list[list[float]]] = lambda values: [values],
    first_round: int = 0,
    align: Callable[[], None] = lambda: None,
    own_iter_ms: Sequence[float] | None = None,
) -> list[Timed]:
    """Time `runs` interleaved; one Timed per run, in order. `per_iter_ms` (one estimate per run)
    must be the same on every rank; `gather` returns every rank's values, in rank order (every
    rank calls it at the same moments); `align` queues a barrier of the ranks on the device;
    round ids count from `first_round`. `own_iter_ms` (default `per_iter_ms`, the same on every
    rank too): each run's own time per iteration, which its settling is counted in, where
    `per_iter_ms` sets the spans otherwise (runs replayed as often as one of them fills a span)."""
    reps = [repetitions(plan.span_ms, p) for p in per_iter_ms]
    own = list(own_iter_ms if own_iter_ms is not None else per_iter_ms)
    settle = [settling(plan.settle_ms, p) for p in own]
    cost = [s * o + r * p for s, r, o, p in zip(settle, reps, own, per_iter_ms)]  # ms a candidate adds to a round
    warm = math.ceil(plan.warmup_s * 1e3 / sum(cost)) if plan.warmup_s > 0 else 0
    budget_ms, spent_ms = plan.budget_ms(per_iter_ms), 0.0
    min_rounds = min(plan.min_rounds, plan.max_rounds)
    rng = random.Random(plan.seed)
    timed = [Timed([], [], 0) for _ in runs]
    active = set(range(len(runs)))
    in_flight: deque = deque()
    queued, next_check = 0, min_rounds

    def enqueue(members: set[int]) -> tuple[list[int], list]:
        order = sorted(members)
        rng.shuffle(order)
        spans = []
        for i in order:
            for _ in range(settle[i]):  # queued like the span: the host does not wait
                runs[i]()
            align()
            spans.append(timed_span(clock, runs[i], reps[i]))
        return order, spans

    def next_round_ms() -> float:  # ranks agree on `active`, so on this too
        return sum(cost[i] for i in active)

    def wanted() -> bool:
        done = queued - warm
        affordable = spent_ms + next_round_ms() <= budget_ms
        return done < min_rounds or (done < plan.max_rounds and len(active) > 1 and affordable)

    while wanted() or in_flight:
        if wanted():
            if queued >= warm:
                spent_ms += next_round_ms()
            in_flight.append((queued, *enqueue(active)))
            queued += 1
            if len(in_flight) < 2 and wanted():
                continue  # keep one round queued behind the one the host waits for
        number, order, spans = in_flight.popleft()
        clock.wait(spans[-1][1])
        local = [clock.elapsed_ms(*span) / reps[i] for span, i in zip(spans, order)]
        ranks = gather(local)
        if number < warm:
            continue
        for i, t, each in zip(order, slowest(ranks), zip(*ranks)):
            if i not in active:  # it left after this round was queued
                continue
            timed[i].samples_ms.append(t)
            timed[i].rank_samples_ms.append(list(each))
            timed[i].round_ids.append(first_round + number - warm)
            timed[i].iters += reps[i]
        done = number - warm + 1
        if done >= next_check:  # on a geometric schedule: the bootstrap is not free
            next_check = max(done + 1, math.ceil(done * 1.2))
            _score(timed, reference, active)
            needed = [0.0 if i == reference or i not in active or _narrow(timed[i], plan.ci_target, min_rounds) else 1.0
                      for i in range(len(runs))]
            needed = slowest(gather(needed))  # every rank drops the same candidates
            active = {reference} | {i for i in active if needed[i] > 0}
    _score(timed, reference, range(len(runs)))
    return timed


def _score(timed: list[Timed], reference: int, which) -> None:
    """Speedups over the reference of the candidates `which`, in the rounds both took part in."""
    ref = dict(zip(timed[reference].round_ids, timed[reference].samples_ms))
    for i in which:
        t = timed[i]
        if i == reference:
            t.speedup, t.speedup_ci = 1.0, (1.0, 1.0)
            continue
        ratios = [ref[r] / ms for r, ms in zip(t.round_ids, t.samples_ms) if r in ref and ms > 0]
        if ratios:
            t.speedup, t.speedup_ci = paired_estimate(ratios), paired_ci(ratios)


def _narrow(t: Timed, target: float, min_rounds: int) -> bool:
    if len(t.samples_ms) < min_rounds or t.speedup_ci is None:
        return False
    lo, hi = t.speedup_ci
    return (hi - lo) / 2 <= target * t.speedup


def slowest(ranks: Sequence[Sequence[float]]) -> list[float]:
    """The elementwise max of every rank's values (a round's time: the slowest rank's)."""
    return [max(each) for each in zip(*ranks)]


def ranks_gather(rt) -> Callable[[list[float]], list[list[float]]]:
    """`time_rounds`' gather for the ranks of the runtime `rt`: every rank's values, in rank
    order, by one all-gather on the CPU control group: it never waits for queued GPU work, so
    the next round stays queued while the host reads this one. A lone rank's are its own."""
    if rt.world_size == 1:
        return lambda values: [list(values)]
    import torch
    import torch.distributed as dist

    def gather(values: list[float]) -> list[list[float]]:
        mine = torch.tensor(values, dtype=torch.float64)
        every = [torch.empty_like(mine) for _ in range(rt.world_size)]
        dist.all_gather(every, mine, group=rt.control)
        return [t.tolist() for t in every]

    return gather


def ranks_max(rt) -> Callable[[list[float]], list[float]]:
    """The elementwise max over the ranks of `rt` (every rank calls it at the same moments), on
    the CPU control group, as `ranks_gather` reads them: what the ranks agree on before they
    time (an iteration's estimate), and comm's paired losses."""
    gather = ranks_gather(rt)
    return lambda values: slowest(gather(values))


def ranks_barrier(rt) -> Callable[[], None]:
    """`time_rounds`' align for the ranks of `rt` (the module says why they meet before each
    candidate): a one-element all-reduce, queued on the device like the work around it, so the
    host does not wait for it (on CPUs, where work runs as it is issued, it is a barrier of the host)."""
    if rt.world_size == 1:
        return lambda: None
    import torch
    import torch.distributed as dist

    token = torch.zeros(1, dtype=torch.int32, device=rt.device)
    return lambda: dist.all_reduce(token, op=dist.ReduceOp.MAX)
