"""Each interval tune and report use keeps its stated coverage, checked by simulation (seeded,
many trials): fed two samples of one distribution, the interval of their ratio misses 1 about as
often as its level says, not more; where the samples are too few for the level, the verdict is
"too few samples", never a claim."""

from __future__ import annotations

import math
import random
from statistics import NormalDist

import numpy as np
import pytest

from overlapbench.timing import intervals
from overlapbench.tuning import analysis, tune
from tests import synthetic

TRIALS = 2000


def miss_rate(n_a: int, n_b: int, level: float, sd: float, seed: int, drift: float = 0.0) -> float:
    """How often the rank-sum interval of two lognormal samples of one distribution misses 0."""
    rng = np.random.default_rng(seed)
    misses = 0
    for _ in range(TRIALS):
        a, b = (np.exp(rng.normal(0, sd, n)) for n in (n_a, n_b))
        interval = intervals.shift_interval(list(a), list(b), level)
        misses += not (interval[0] <= 0 <= interval[1])
    return misses / TRIALS


def tolerance(level: float) -> float:
    """Three binomial standard errors of the miss rate over TRIALS, at the nominal rate."""
    p = 1 - level
    return 3 * math.sqrt(p * (1 - p) / TRIALS)


@pytest.mark.parametrize("n, level", [(5, 0.99), (20, 0.99), (5, 0.95), (12, 0.95), (40, 0.95)])
def test_the_rank_sum_interval_keeps_its_coverage(n, level):
    """Issue 34's case: lognormal sd 0.3; the moving-block bootstrap missed in 43% of trials at 5
    samples a side and 5.5% at 20, against 1% nominal."""
    assert miss_rate(n, n, level, 0.3, seed=n) <= (1 - level) + tolerance(level)


def test_unequal_sides_keep_it_too():
    assert miss_rate(7, 30, 0.95, 0.2, seed=1) <= 0.05 + tolerance(0.95)


def drifting(n: int, rng: np.random.Generator, phi: float = 0.9, sd: float = 0.05) -> np.ndarray:
    """AR(1) log times: neighbouring iterations correlated, as drifting GPU clocks make them."""
    x, out = 0.0, []
    for _ in range(n):
        x = phi * x + rng.normal(0, sd * math.sqrt(1 - phi * phi))
        out.append(x)
    return np.exp(np.array(out))


def test_blocks_keep_it_near_nominal_on_drifting_samples():
    """Blocks of ~sqrt(n) iterations: on AR(1) noise of 0.7 the 95% interval misses in ~7% of
    trials, where one over single samples misses in ~38%. (A limit: at 0.9, blocks of 8 of 60
    samples are still correlated, and it misses in ~20%.)"""
    rng = np.random.default_rng(11)
    blocked = single = 0
    for _ in range(600):
        a, b = drifting(60, rng, phi=0.7), drifting(60, rng, phi=0.7)
        lo, hi = intervals.shift_interval(list(a), list(b), 0.95)
        blocked += not lo <= 0 <= hi
        diffs = np.sort((np.log(a)[:, None] - np.log(b)[None, :]).ravel())
        c = intervals._critical(60, 60, 0.95)
        single += not diffs[c - 1] <= 0 <= diffs[-c]
    assert blocked / 600 < 0.1 and single / 600 > 3 * blocked / 600


@pytest.mark.parametrize("n, level", [(3, 0.95), (2, 0.95), (4, 0.99)])
def test_too_few_samples_give_no_interval(n, level):
    rng = random.Random(n)
    a, b = ([math.exp(rng.gauss(0, 0.3)) for _ in range(n)] for _ in range(2))
    assert intervals.shift_interval(a, b, level) is None


def test_the_rank_sum_distribution_is_exact():
    counts = intervals._rank_sum_counts(5, 5)
    assert sum(counts) == math.comb(10, 5) and counts[0] == counts[-1] == 1 and list(counts) == list(reversed(counts))
    assert intervals._critical(5, 5, 0.99) == 1 and intervals._critical(3, 3, 0.95) == 0
    z = NormalDist().inv_cdf(0.975)  # far out the normal approximation agrees with the count
    assert abs(intervals._critical(100, 100, 0.95) - (5000 - z * math.sqrt(100 * 100 * 201 / 12))) < 2


@pytest.mark.parametrize("df, expected", [(1, 12.706), (2, 4.303), (5, 2.571), (30, 2.042)])
def test_t_quantiles(df, expected):
    assert intervals.t_quantile(0.95, df) == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize("n", [4, 6, 8, 12, 20, 40])
def test_the_paired_interval_keeps_its_coverage(n):
    """Rounds of Gaussian log ratios: the trimmed-t interval below 10 rounds (the bootstrap missed
    in 20% of trials at 4 rounds, 13% at 8), the bootstrap from there (7% at 10-16, 6% at 20,
    5.5% at 30, so its tolerance is wider)."""
    rng = np.random.default_rng(100 + n)
    trials = 800 if n >= intervals.BOOTSTRAP_MIN_ROUNDS else TRIALS
    misses = 0
    for _ in range(trials):
        ratios = list(np.exp(rng.normal(0, 0.02, n)))
        lo, hi = intervals.paired_ci(ratios)
        misses += not lo <= 1 <= hi
    allowed = 0.05 + (3 * math.sqrt(0.05 * 0.95 / trials)) + (0.03 if n >= intervals.BOOTSTRAP_MIN_ROUNDS else 0)
    assert misses / trials <= allowed


# -- the verdicts tune gives ------------------------------------------------------------------


def measured(*rows):
    return [analysis.Measured.of(r, "test") for r in rows]


def test_a_baseline_spread_6x_over_five_samples_decides_nothing():
    """Issue 34: `61: 1.730x [1.666, 1.730] over baseline, beats noise` from a baseline whose five
    samples spread 6x. Now the interval is as wide as that spread, and where one baseline sample
    is as fast as the challenger's, the challenger does not beat the noise."""
    base = [2.1, 12.6, 1.5, 2.4, 9.8]
    fast = [1.55, 1.61, 1.58, 1.49, 1.66]
    b, f = measured(synthetic.row("baseline", 61, samples=base), synthetic.row("iso", 61, samples=fast))
    g = tune.gain(f, b)
    assert g.method == "rank-sum" and g.lo < 1 and g.hi > 5
    p = tune.pick([b, f])
    assert p.chosen is b and "within noise" in p.why


def test_too_few_samples_is_a_verdict_and_never_a_pick():
    rng = random.Random(2)
    b, f = measured(synthetic.row("baseline", 64, samples=[rng.uniform(1.0, 1.01) for _ in range(3)]),
                    synthetic.row("iso", 64, samples=[rng.uniform(0.5, 0.51) for _ in range(3)]))
    g = tune.gain(f, b)
    assert not g.decided and not g.beats() and "too few samples" in g.text()
    p = tune.pick([b, f])
    assert p.chosen is b and "too few samples" in p.why
