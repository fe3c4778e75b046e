"""Confidence intervals that keep their stated coverage at the sample sizes runs have.

Percentile bootstraps undercover at few samples: fed rounds of one distribution, the paired
bootstrap of a 95% interval missed the truth in 20% of trials at 4 rounds and 13% at 8; the
moving-block bootstrap of a ratio of medians, at "99%", in 43% at 5 samples a side and 5.5% at 20.
So:

- paired rounds (each a ratio taken at one moment): below BOOTSTRAP_MIN_ROUNDS, the
  Tukey-McLaughlin trimmed-t interval of the trimmed mean of log ratios (winsorized variance,
  Student's t on the kept rounds' degrees of freedom), near exact for Gaussian logs at any count
  and robust to a stray round; from there on, where its coverage is within a point of nominal,
  the percentile bootstrap of that mean (the interval every committed GPU run was timed and
  published with: the sweep stops timing a candidate when it is narrow enough);
- two independent series (rows not timed together, two runs compared): the exact rank-sum
  (Mann-Whitney) interval of the shift between their log times, distribution-free for any shape,
  computed on block means of consecutive samples so that drifting clocks (correlated
  neighbours) widen it. Where the samples are too few for the level at all (5 against 5 reach
  99.2%, 3 against 3 only 90%), there is no interval: `None`, and callers say "too few samples".

No torch and no scipy: `tune` and `report` use these; numpy is imported where needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

TRIM = 0.1  # share of the rounds cut from each tail of the paired log ratios
# Paired rounds from which the bootstrap keeps its coverage: on Gaussian log ratios its 95%
# interval misses in 20% of trials at 4 rounds, 13.5% at 8, 6.5% at 12 and 5-6% from 20 on
# (tests/test_intervals.py); below this count the trimmed-t interval.
BOOTSTRAP_MIN_ROUNDS = 10
RESAMPLES = 2000
SEED = 0
LEVEL = 0.95  # the paired speedup's interval, as rows store it (speedup_ci)


def trim_count(n: int) -> int:
    return int(n * TRIM) if n > 2 else 0


def trimmed_log_mean(logs, axis: int = -1):
    """Mean of `logs` along `axis` after cutting TRIM of them from each tail."""
    import numpy as np

    logs = np.sort(logs, axis=axis)
    n = logs.shape[axis]
    cut = trim_count(n)
    return np.take(logs, range(cut, n - cut), axis=axis).mean(axis=axis)


def paired_interval(logs: Sequence[float], level: float) -> tuple[float, float]:
    """Interval (in logs) of the trimmed mean of paired log ratios: trimmed-t below
    BOOTSTRAP_MIN_ROUNDS rounds, the percentile bootstrap (fixed seed: the same data give the
    same interval) from there on."""
    import numpy as np

    x = np.asarray(logs, dtype=float)
    if x.size < BOOTSTRAP_MIN_ROUNDS:
        return trimmed_t(x, level)
    index = np.random.default_rng(SEED).integers(0, x.size, size=(RESAMPLES, x.size))
    estimates = trimmed_log_mean(x[index], axis=1)
    tail = (1 - level) / 2
    lo, hi = np.quantile(estimates, [tail, 1 - tail])
    return float(lo), float(hi)


def trimmed_mean_interval(values: Sequence[float], level: float) -> tuple[float, list[float]]:
    """The trimmed mean of paired rounds' values and its `level` interval [lo, hi], for values
    that are not logs (comm's losses and ms differences): trimmed_log_mean and paired_interval
    take any values, and nothing here exponentiates them."""
    import numpy as np

    lo, hi = paired_interval(values, level)
    return float(trimmed_log_mean(np.asarray(values, dtype=float))), [lo, hi]


def trimmed_t(logs: Sequence[float], level: float) -> tuple[float, float]:
    """Interval (in logs) of the trimmed mean: mean +- t * s_w / ((1 - 2 TRIM') sqrt(n)), s_w the
    winsorized sd, t Student's on n - 2 cut - 1 degrees of freedom."""
    import numpy as np

    x = np.sort(np.asarray(logs, dtype=float))
    n, cut = x.size, trim_count(x.size)
    centre = float(x[cut:n - cut].mean())
    if n < 2:
        return centre, centre
    winsorized = np.clip(x, x[cut], x[n - cut - 1])
    kept = n - 2 * cut
    half = t_quantile(level, kept - 1) * float(winsorized.std(ddof=1)) * n / kept / math.sqrt(n)
    return centre - half, centre + half


def t_quantile(level: float, df: int) -> float:
    """t such that P(|T| <= t) = level for Student's T with `df` degrees of freedom (bisection
    on the exact closed-form distribution for whole df, Abramowitz & Stegun 26.7.3-4)."""
    lo, hi = 0.0, 1.0
    while _t_central(hi, df) < level:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_central(mid, df) < level else (lo, mid)
    return hi


def _t_central(t: float, df: int) -> float:
    """P(|T| <= t)."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + s * math.cos(theta) * total)
    term, total = 1.0, 1.0  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return s * total


# -- two independent series ----------------------------------------------------------------


EXACT_MAX = 10_000  # m * n up to which the rank-sum distribution is counted exactly


@lru_cache(maxsize=256)
def _rank_sum_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the C(m+n, m) orderings give U = 0, 1, ..., m*n: the coefficients of the
    Gaussian binomial [m+n choose m]_q, built factor by factor (each step stays a polynomial)."""
    poly = [1]
    for i in range(1, m + 1):
        grown = poly + [0] * (n + i)  # times (1 - q^(n+i))
        for u in range(len(poly)):
            grown[u + n + i] -= poly[u]
        for u in range(i, len(grown)):  # divided by (1 - q^i)
            grown[u] += grown[u - i]
        poly = grown[: i * n + 1]
    return tuple(poly)


def _critical(m: int, n: int, level: float) -> int:
    """The largest c >= 1 with P(U <= c - 1) <= (1 - level) / 2; 0 where even c = 1 is too many."""
    alpha = (1 - level) / 2
    if m * n > EXACT_MAX:
        from statistics import NormalDist

        z = NormalDist().inv_cdf(1 - alpha)
        return max(0, math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12)))
    counts, total, below = _rank_sum_counts(min(m, n), max(m, n)), math.comb(m + n, m), 0
    for u, count in enumerate(counts):
        below += count
        if below / total > alpha:
            return u
    return len(counts)


def min_per_side(level: float) -> int:
    """The fewest values a side (equal sides) for which a rank-sum interval reaches `level`."""
    k = 1
    while _critical(k, k, level) < 1:
        k += 1
    return k


def block_means(logs: Sequence[float], blocks: int) -> list[float]:
    """Means of `blocks` runs of consecutive values (lengths differing by at most one)."""
    n = len(logs)
    edges = [round(i * n / blocks) for i in range(blocks + 1)]
    return [sum(logs[a:b]) / (b - a) for a, b in zip(edges, edges[1:])]


def shift_interval(a: Sequence[float], b: Sequence[float], level: float) -> tuple[float, float] | None:
    """Interval of log(location of a / location of b) from two series of positive times, or None
    where they are too few for `level`. Each series is cut into blocks of about sqrt(n)
    consecutive samples (fewer, longer blocks would leave too few for the level: then shorter
    ones, down to single samples), and the exact rank-sum interval of the shift taken over the
    blocks' mean logs."""
    need = min_per_side(level)
    la, lb = [math.log(x) for x in a], [math.log(x) for x in b]
    ma, mb = (block_means(x, _blocks(len(x), need)) for x in (la, lb))
    c = _critical(len(ma), len(mb), level)
    if c < 1:
        return None
    diffs = sorted(x - y for x in ma for y in mb)
    return diffs[c - 1], diffs[len(diffs) - c]


def _blocks(n: int, need: int) -> int:
    """How many blocks a series of n samples is cut into: n / ceil(sqrt n); where that is fewer
    than `need`, `need` blocks of at least two samples, or where n is too short for those, every
    sample on its own."""
    blocks = n // math.ceil(math.sqrt(n))
    if blocks >= need:
        return blocks
    return need if n >= 2 * need else n


def paired_estimate(ratios: list[float]) -> float:
    """A paired speedup from its per-round ratios: their geometric mean, 10% trimmed at each tail.

    On the H200 the per-round log ratios are white and near Gaussian (lag-1 autocorrelation ~0,
    1.7% of them beyond 2.5 sd), where a mean needs ~1/1.5 the rounds a median needs for the same
    interval; the trim keeps a stray round from moving it. Re-scored this way, the two committed
    paired runs of sp-llama3-70b-tp2 agree within 1% at 47 of 48 points (44 with the median), and
    their median interval at >= 4096 tokens is +-0.60% (0.66%): results/h200x2/paired/check-paired-trimmed.txt.
    """
    import numpy as np

    return float(np.exp(trimmed_log_mean(np.log(np.asarray(ratios, dtype=float)))))


def paired_ci(ratios: list[float], level: float = LEVEL) -> tuple[float, float]:
    """The `level` interval of `paired_estimate`: rounds are independent draws (each ratio is
    taken at one moment); paired_interval keeps its coverage at a few rounds too."""
    lo, hi = paired_interval([math.log(r) for r in ratios], level)
    return math.exp(lo), math.exp(hi)
