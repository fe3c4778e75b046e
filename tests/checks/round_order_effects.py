"""Does a candidate's time depend on the one that ran before it in a paired run's rounds?

    PYTHONPATH=. python tests/checks/round_order_effects.py RUN.jsonl

(How noisy the rounds were, per batch, is `overlapbench report RUN.jsonl --rounds`.) For each batch
timed in one group, each round's order is drawn again as interleave.time_rounds drew it (one RNG
seeded with the rows' seed, the candidates shuffled per round, whole warm-up rounds first; the
number of those, and whether a candidate's last queued round was dropped, are not in the rows, so
every choice is tried and the one whose predecessor effects explain most is shown: an upper bound
on the effect), and each candidate's log deviation from its median is averaged by the candidate
that ran just before it. That is how the lag no_comm leaves between the ranks showed up (the
candidate after it 2.5-3% slow, results/h200x2/a034cb8/), which interleave.py now keeps out.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections import defaultdict
from pathlib import Path

from overlapbench.report.rounds import paired_batches
from overlapbench.tuning.results import read_rows


def predecessor_effects(members: list[dict], warm: int, queued_dropped: bool) -> tuple[dict[int, float], float, float]:
    """Mean log deviation of a candidate by the one before it, and the deviations' sd before and
    after those means are taken out. A candidate ran in the rounds it has samples of, and, where
    `queued_dropped` (since 3b4da9f), in the one after its last too."""
    first = members[0]["round_ids"][0]
    samples = [dict(zip(m["round_ids"], m["samples_ms"])) for m in members]
    ran = [set(s) | ({max(s) + 1} if queued_dropped else set()) for s in samples]
    rng = random.Random(members[0]["seed"])
    for _ in range(warm):
        rng.shuffle(list(range(len(members))))
    medians = [statistics.median(m["samples_ms"]) for m in members]
    records = []  # (predecessor or -1, log deviation)
    for r in range(first, first + len(members[0]["round_ids"])):
        order = sorted(i for i in range(len(members)) if r in ran[i])
        rng.shuffle(order)
        for k, i in enumerate(order):
            if r in samples[i]:
                records.append((order[k - 1] if k else -1, math.log(samples[i][r] / medians[i])))
    by = defaultdict(list)
    for before, dev in records:
        by[before].append(dev)
    means = {before: statistics.fmean(devs) for before, devs in by.items()}
    raw = statistics.pstdev(d for _, d in records)
    left = statistics.pstdev(d - means[b] for b, d in records)
    return means, raw, left


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path)
    args = p.parse_args()
    for members in paired_batches(read_rows(args.run)).values():
        tokens, ids = members[0]["tokens"], members[0]["round_ids"]
        if len({r["seed"] for r in members}) > 1 or ids != list(range(ids[0], ids[0] + len(ids))):
            print(f"{tokens:>7}: more than one group of candidates; skipped")
            continue
        warm, dropped = min(((w, d) for w in range(5) for d in (False, True)),
                            key=lambda wd: predecessor_effects(members, *wd)[2])
        means, raw, left = predecessor_effects(members, warm, dropped)
        names = [f"{m['strategy']}#{i}" for i, m in enumerate(members)]
        effects = ", ".join(f"after {names[b]} {means[b]:+.2%}" for b in sorted(means) if b >= 0)
        print(f"{tokens:>7} (warm-up rounds {warm}): sd {raw:.2%} -> {left:.2%} without them; {effects}")


if __name__ == "__main__":
    main()
