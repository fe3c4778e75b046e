"""`report --compare`: two runs of the same code are not a regression (the noise between runs
counts, not only each run's own), and a real slowdown still is."""

from __future__ import annotations

import io
import itertools
import json
import random
from pathlib import Path

import pytest
from rich.console import Console

from overlapbench import report
from overlapbench.report import compare
from overlapbench.tuning import analysis
from tests import synthetic

CPU_RUNS = sorted((Path(__file__).parent / "data" / "cpu-demo").glob("run-*.jsonl"))


def run_compare(old, new, fail_above=5.0) -> tuple[int, list[dict]]:
    out = io.StringIO()
    code = report.run([], "json", Console(file=out, width=200), compare_paths=(old, new), fail_above=fail_above)
    return code, json.loads(out.getvalue())


@pytest.mark.parametrize("old, new", list(itertools.permutations(CPU_RUNS, 2)), ids=lambda p: p.stem)
def test_runs_of_the_same_code_on_a_cpu_are_no_regression(old, new):
    code, records = run_compare(old, new)
    assert code == 0 and not any(r["regression"] for r in records)
    assert all(r["verdict"] != "slower" or r["ratio"] <= 1.05 for r in records)


def test_their_own_samples_alone_would_have_called_them_regressions():
    """Without the noise between runs (run_sd 0: each run's samples alone), the same pairs flag
    points: what the test above guards against."""
    flagged = 0
    for old, new in itertools.permutations(CPU_RUNS, 2):
        pairs = compare.compare_pairs(analysis.read([old]), analysis.read([new]))
        flagged += sum(compare.compare_record(o, n, 1.05, 0.0)["regression"] for o, n in pairs)
    assert flagged >= 5


def gpu_runs(tmp_path, slower: dict[str, float], seed: int):
    """Two runs of 5 token counts x 4 strategies on a GPU: 0.4% noise within a run, and 0.4%
    between runs at each point (their measured size on the H200); `slower` slows strategies."""
    rng = random.Random(seed)
    old, new = [], []
    for tokens in (512, 1024, 2048, 4096, 8192):
        for strategy in ("baseline", "fused_norm", "token_split", "iso"):
            old.append(synthetic.row(strategy, tokens, samples=synthetic.draw(1.0, 0.004, rng)))
            shift = (1 + rng.gauss(0, 0.004)) * slower.get(strategy, 1.0)
            new.append(synthetic.row(strategy, tokens, samples=synthetic.draw(shift, 0.004, rng)))
    return synthetic.write(tmp_path / "old.jsonl", old), synthetic.write(tmp_path / "new.jsonl", new)


@pytest.mark.parametrize("seed", range(4))
def test_a_real_slowdown_on_a_gpu_is_still_flagged(tmp_path, seed):
    old, new = gpu_runs(tmp_path, {"iso": 1.06}, seed)
    code, records = run_compare(old, new, fail_above=3.0)
    assert code == 1 and {(r["strategy"], r["tokens"]) for r in records if r["regression"]} == {
        ("iso", t) for t in (512, 1024, 2048, 4096, 8192)}
    same_old, same_new = gpu_runs(tmp_path, {}, seed + 100)
    code, records = run_compare(same_old, same_new, fail_above=0.0)
    assert code == 0


def test_too_few_samples_is_no_verdict(tmp_path):
    rng = random.Random(8)
    old, new = (synthetic.write(tmp_path / f"{name}.jsonl", [synthetic.row(
        "baseline", 64, samples=[factor * rng.uniform(1, 1.01) for _ in range(3)])]) for name, factor in (("a", 1.0), ("b", 2.0)))
    code, (record,) = run_compare(old, new)
    assert code == 0 and record["ratio_ci"] is None and record["verdict"] == "too few samples" and not record["regression"]
