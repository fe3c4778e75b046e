"""Speedups over the fastest baseline setting ("vs best"), beside those over the default baseline:
in report's cells and records, in tune's reasons and in each tuned rule; round by round where the
rows were timed interleaved."""

from __future__ import annotations

import io
import json
import random

import pytest
import yaml
from rich.console import Console

from overlapbench import report
from overlapbench.timing import intervals
from overlapbench.tuning import analysis, tune
from tests import synthetic

BEST = {"nccl_max_ctas": "default", "allreduce": "one_shot"}  # PyTorch's symmetric-memory all-reduce


def paired_store(path, seed: int, split_speed: float, tokens: int = 4096, rounds: int = 30):
    """One batch timed interleaved: baseline at its default, a faster baseline setting (0.94),
    token_split and no_comm; the clock's drift common to each round, 0.2% noise of their own."""
    rng = random.Random(seed)
    drift = [1 + rng.gauss(0, 0.03) for _ in range(rounds)]
    rows = []
    for strategy, knobs, speed in (("baseline", None, 1.0), ("baseline", BEST, 0.94),
                                   ("token_split", None, split_speed), ("no_comm", {}, 0.85)):
        samples = [tokens / 1000 * d * speed * (1 + rng.gauss(0, 0.002)) for d in drift]
        rows.append(synthetic.row(strategy, tokens, knobs, samples=samples, pairing=f"run/{tokens}"))
    return synthetic.write(path, rows), rows


def by_round_ratio(numerator: dict, denominator: dict) -> float:
    return intervals.paired_estimate([a / b for a, b in zip(numerator["samples_ms"], denominator["samples_ms"])])


def report_records(path) -> list[dict]:
    out = io.StringIO()
    assert report.run([path], "json", Console(file=out, width=200)) == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize("seed", range(3))
def test_report_gives_both_speedups_round_by_round(tmp_path, seed):
    path, rows = paired_store(tmp_path / "r.jsonl", seed, split_speed=0.96)
    default, best, split, _ = rows
    recs = {(r["strategy"], json.dumps(r["knobs"])): r for r in report_records(path)}
    (ts,) = [r for r in recs.values() if r["strategy"] == "token_split"]
    assert ts["speedup"] == pytest.approx(by_round_ratio(default, split), rel=1e-9)
    assert ts["speedup_vs_best"] == pytest.approx(by_round_ratio(best, split), rel=1e-9)
    assert ts["speedup_vs_best"] == pytest.approx(0.94 / 0.96, rel=0.01) and ts["best_reference"] == BEST
    out = io.StringIO()
    report.run([path], "table", Console(file=out, width=200))
    text = out.getvalue()
    assert f"{ts['speedup_vs_best']:.3f}x vs best" in text and "vs best = speedup over baseline's fastest" in text


def test_tune_picks_the_best_baseline_setting_and_says_so(tmp_path):
    path, _ = paired_store(tmp_path / "r.jsonl", 4, split_speed=0.96)  # token_split beats the default, not the best
    p = tune.pick(analysis.read([path]).measured)
    assert p.chosen.strategy == "baseline" and p.chosen.knobs == BEST
    assert p.speedup_vs_best == pytest.approx(1.0) and "fastest baseline setting" in p.why
    (written,) = tune.run([path], tmp_path / "tuned", Console(file=io.StringIO()))
    (rule,) = yaml.safe_load(written.read_text())["rules"]
    assert rule["speedup_vs_best"] == 1.0 and rule["best_reference"] == "baseline allreduce=one_shot"
    assert "vs best" in yaml.safe_load(written.read_text())["provenance"]["method"]


def test_a_pick_that_beats_the_best_baseline_says_by_how_much(tmp_path):
    path, rows = paired_store(tmp_path / "r.jsonl", 5, split_speed=0.88)
    _, best, split, _ = rows
    p = tune.pick(analysis.read([path]).measured)
    assert p.chosen.strategy == "token_split"
    expected = by_round_ratio(best, split)
    assert p.speedup_vs_best == pytest.approx(expected, rel=1e-9) and expected == pytest.approx(0.94 / 0.88, rel=0.01)
    assert f"{expected:.3f}x vs best baseline (baseline allreduce=one_shot)" in p.why
    (written,) = tune.run([path], tmp_path / "tuned", Console(file=io.StringIO()))
    (rule,) = yaml.safe_load(written.read_text())["rules"]
    assert rule["speedup_vs_best"] == pytest.approx(expected, abs=1e-4) and rule["speedup"] > rule["speedup_vs_best"]


def test_where_the_default_is_the_best_nothing_extra_is_shown(tmp_path):
    rng = random.Random(6)
    rows = [synthetic.row("baseline", 2048, samples=synthetic.draw(1.0, 0.005, rng)),
            synthetic.row("baseline", 2048, {"nccl_max_ctas": 8}, samples=synthetic.draw(1.05, 0.005, rng)),
            synthetic.row("token_split", 2048, samples=synthetic.draw(0.9, 0.005, rng))]
    path = synthetic.write(tmp_path / "r.jsonl", rows)
    recs = report_records(path)
    assert all(r["speedup_vs_best"] == pytest.approx(r["speedup"]) for r in recs)
    out = io.StringIO()
    report.run([path], "table", Console(file=out, width=200))
    assert "vs best" not in out.getvalue()
