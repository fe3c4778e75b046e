"""How noisy are a paired run's rounds, and does a candidate's time depend on the one before it?

    PYTHONPATH=. python kernels/round_spread.py RUN.jsonl [--predecessors]

Per batch: the reference's rounds, the median over candidates of the sd of their per-round log
ratios to the reference (what sets the interval: +-0.5% takes about (1.96 sd / 0.5%)^2 rounds),
and the widest interval. With --predecessors, for each batch timed in one group, each round's
order is drawn again as interleave.time_rounds drew it (one RNG seeded with the rows' seed, the
candidates still in shuffled per round, whole warm-up rounds first; the number of those, and
whether a candidate's last queued round was dropped, are not in the rows, so every choice is
tried and the one whose predecessor effects explain most is shown: an upper bound on the
effect), and each candidate's log deviation from its median is averaged by the candidate that
ran just before it. That is how the lag no_comm leaves between the ranks showed up (the
candidate after it 2.5-3% slow, results/h200x2/a034cb8/), which interleave.py now keeps out.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from collections import defaultdict
from pathlib import Path


def batches(path: Path) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = defaultdict(list)
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["status"] == "ok" and row.get("round_ids"):
            out[row["tokens"]].append(row)
    return dict(sorted(out.items()))


def log_ratio_sd(ref: dict, row: dict) -> float:
    by_round = dict(zip(ref["round_ids"], ref["samples_ms"]))
    logs = [math.log(by_round[r] / t) for r, t in zip(row["round_ids"], row["samples_ms"]) if r in by_round]
    return statistics.pstdev(logs) if len(logs) > 2 else float("nan")


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
    p.add_argument("--predecessors", action="store_true")
    args = p.parse_args()
    print(f"{'tokens':>7} {'rounds':>6} {'median sd':>10} {'widest ci':>10}")
    found = batches(args.run)
    for tokens, rows in found.items():
        ref = next(r for r in rows if r["strategy"] == "baseline")
        others = [r for r in rows if r is not ref]
        sds = [log_ratio_sd(ref, r) for r in others]
        widths = [(r["speedup_ci"][1] - r["speedup_ci"][0]) / 2 / r["speedup"] for r in others if r.get("speedup_ci")]
        print(f"{tokens:>7} {len(ref['round_ids']):>6} {statistics.median(sds):>10.2%} {max(widths, default=0):>10.2%}")
    if not args.predecessors:
        return
    for tokens, rows in found.items():
        ref = next(r for r in rows if r["strategy"] == "baseline")
        members = [ref] + [r for r in rows if r is not ref]  # the order paired.py times them in
        ids = ref["round_ids"]
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
