"""Do two runs of one spec agree? The acceptance check of paired timing.

    PYTHONPATH=. python tests/checks/paired_runs_agree.py A.jsonl B.jsonl [--sequential SEQ.jsonl]

Per point of the layer workload (strategy, knobs, batch) measured ok in both runs: the speedup
over the reference of each run (paired where the rows are), and how far apart the two are.
Prints the share of points within 1% and within 0.5% (targets: >= 95% and >= 80%), the widest
95% interval at 4096 tokens and above (target: <= +-0.5%), whether tune's rule picks the same
setting at every token count from both runs, and each run's wall time (first to last row), with
a sequential run's for comparison (target: interleaved <= 2x sequential). A table last.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.figures import picks, rows_wall_s, speedups


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--sequential", type=Path, help="a run of the same spec with measure.interleave: false")
    args = p.parse_args()
    run_a, run_b = str(args.a.resolve()), str(args.b.resolve())
    a, b = speedups(run_a), speedups(run_b)
    common = sorted(set(a) & set(b), key=lambda k: (sum(k[1]), k[0]))
    if not common:
        sys.exit("no points in common")
    diffs = {k: abs(a[k][0] / b[k][0] - 1) for k in common}
    within1 = sum(d <= 0.01 for d in diffs.values()) / len(common)
    within05 = sum(d <= 0.005 for d in diffs.values()) / len(common)
    widths = [(ci[1] - ci[0]) / 2 / s for run in (a, b) for k, (s, ci) in run.items() if ci and sum(k[1]) >= 4096]
    pa, pb = picks(run_a), picks(run_b)
    disagree = {k: (pa[k], pb.get(k)) for k in pa if pa[k] != pb.get(k)}
    print(f"{'tokens':>7} {'strategy knobs':<60} {'A':>16} {'B':>16} {'|A/B-1|':>8}")
    for k in common:
        (strategy, knobs), batch = k
        fmt = lambda s, ci: f"{s:.4f}" + (f" ±{(ci[1] - ci[0]) / 2 / s:.2%}" if ci else "")
        print(f"{sum(batch):>7} {(strategy + ' ' + knobs)[:60]:<60} {fmt(*a[k]):>16} {fmt(*b[k]):>16} {diffs[k]:8.2%}")
    print(f"\n{len(common)} points: within 1%: {within1:.0%} (target >= 95%), within 0.5%: {within05:.0%} (target >= 80%)")
    if widths:
        print(f"widest 95% interval at >= 4096 tokens: ±{max(widths):.2%} (target <= ±0.5%); "
              f"{sum(w <= 0.005 for w in widths)} of {len(widths)} within")
    else:
        print("no paired intervals at >= 4096 tokens (sequential rows?)")
    print(f"tune picks the same at {len(pa) - len(disagree)} of {len(pa)} token counts"
          + "".join(f"\n  differs at {k}: {x} vs {y}" for k, (x, y) in disagree.items()))
    wall_a, wall_b = rows_wall_s(run_a), rows_wall_s(run_b)
    walls = f"wall time (first to last row): A {wall_a:.0f} s, B {wall_b:.0f} s"
    if args.sequential:
        seq = rows_wall_s(str(args.sequential.resolve()))
        walls += f", sequential {seq:.0f} s (ratio {max(wall_a, wall_b) / seq:.2f}, target <= 2)"
    print(walls)


if __name__ == "__main__":
    main()
