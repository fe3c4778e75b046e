"""The engine-side loader: choose() per batch, exact YAML round-trips, one-line errors."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from overlapbench import tuned
from overlapbench.errors import UserError
from overlapbench.tuning import tune
from tests import synthetic

REPO = Path(__file__).resolve().parent.parent

RULES = [
    tuned.Rule(1, 724, "baseline", {"nccl_max_ctas": "default"}, 0.5, 1.0),
    tuned.Rule(725, 2896, "token_split", {"split_offset": 128}, 1.1, 1.07, {"why": "faster"}),
    tuned.Rule(2897, 4096, "fused_norm", {}, 3.9, 1.02),
]


def config(rules=RULES) -> tuned.TunedConfig:
    return tuned.TunedConfig("NVIDIA H200", 2, 2, "llama3-8b", {"hidden": 4096, "ffn": 14336}, "bf16", tuple(rules),
                             {"provenance": {"sources": ["results/x.jsonl"]}})


# -- choose --------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens, strategy", [
    (1, "baseline"), (500, "baseline"), (724, "baseline"),
    (725, "token_split"), (2048, "token_split"), (2896, "token_split"),
    (2897, "fused_norm"), (4096, "fused_norm"),
])
def test_choose_inside_the_measured_range(tokens, strategy):
    choice = config().choose(tokens)
    assert choice.strategy == strategy and not choice.clamped
    assert choice.rule.lo <= tokens <= choice.rule.hi
    assert choice.knobs == choice.rule.knobs


def test_choose_above_the_largest_measured_count_is_clamped_to_the_last_rule():
    choice = config().choose(100_000)
    assert choice.clamped and choice.strategy == "fused_norm" and choice.rule is RULES[-1]
    assert not config().choose(4096).clamped


@pytest.mark.parametrize("tokens", [0, -1, -4096])
def test_choose_below_one_is_a_value_error(tokens):
    with pytest.raises(ValueError, match="at least 1"):
        config().choose(tokens)


def test_choose_returns_a_copy_of_the_knobs():
    cfg = config()
    cfg.choose(800).knobs["split_offset"] = 0
    assert cfg.choose(800).knobs == {"split_offset": 128}


# -- files ---------------------------------------------------------------------------------


def test_save_load_dump_round_trips_to_identical_text(tmp_path):
    path = tuned.save(config(), tmp_path / "c.yaml")
    text = path.read_text()
    loaded = tuned.load(path)
    assert tuned.dump(loaded) == text
    assert loaded == config()
    assert loaded.rules[1].extra == {"why": "faster"}


def test_a_tune_written_file_round_trips(tmp_path):
    rng = random.Random(12)
    rows = []
    for tokens, speed in ((128, 1.0), (1024, 0.9), (8192, 0.95)):
        rows.append(synthetic.row("baseline", tokens, samples=synthetic.draw(tokens / 500, 0.01, rng)))
        rows.append(synthetic.row("iso", tokens, {"split_ratio": 0.5}, samples=synthetic.draw(tokens / 500 * speed, 0.01, rng)))
    (path,) = tune.run([synthetic.write(tmp_path / "s.jsonl", rows)], tmp_path / "out", Console(quiet=True))
    text = path.read_text()
    assert tuned.dump(tuned.load(path)) == text
    assert text.startswith("# overlapbench tuned config")
    assert "tokens: [1, 362]" in text  # flow style: one line per range


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tuned.save(config(), tmp_path / "c.yaml")
    before = path.read_text()

    def crash(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        tuned.save(config(RULES[:1]), path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.yaml"]  # no temporary file left behind


def _mutate(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


BAD = {
    "schema": (("schema: overlapbench/tuned-v1", "schema: overlapbench/tuned-v9"), "schema"),
    "gap": (("tokens: [725, 2896]", "tokens: [800, 2896]"), r"rules\[1\]\.tokens: starts at 800.*gap"),
    "overlap": (("tokens: [725, 2896]", "tokens: [700, 2896]"), r"rules\[1\]\.tokens: starts at 700.*overlaps"),
    "start": (("tokens: [1, 724]", "tokens: [2, 724]"), r"rules\[0\]\.tokens: starts at 2"),
    "empty range": (("tokens: [725, 2896]", "tokens: [725, 700]"), r"rules\[1\]\.tokens: \[725, 700\] is empty"),
    "not a pair": (("tokens: [725, 2896]", "tokens: 725"), r"rules\[1\]\.tokens: must be \[lo, hi\]"),
    "strategy": (("strategy: fused_norm", "strategy: 3"), r"rules\[2\]\.strategy: must be a str"),
    "tp": (("tp: 2", "tp: zero"), "tp: must be a positive integer"),
    "missing": (("dtype: bf16\n", ""), "dtype: missing"),
    "rules": (("rules:\n", "rules: []\nunused:\n"), "rules: must be a non-empty list"),
    "speedup": (("speedup: 1.07", "speedup: fast"), r"rules\[1\]\.speedup: must be a number"),
    "syntax": (("tp: 2", "tp: [2"), "not valid YAML"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_tuned_file_is_a_one_line_user_error(tmp_path, case):
    (old, new), message = BAD[case]
    path = tmp_path / "bad.yaml"
    path.write_text(_mutate(tuned.dump(config()), old, new))
    with pytest.raises(UserError, match=message) as e:
        tuned.load(path)
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("content", ["just text\n", "- a list\n", ""])
def test_a_file_that_is_not_a_tuned_config_is_a_user_error(tmp_path, content):
    path = tmp_path / "other.yaml"
    path.write_text(content)
    with pytest.raises(UserError, match="other.yaml"):
        tuned.load(path)


def test_a_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such tuned config"):
        tuned.load(tmp_path / "nope.yaml")


def test_the_analysis_modules_import_neither_torch_nor_pandas():
    code = (
        "import sys, overlapbench.tuned; assert set(sys.modules) & {'torch', 'pandas', 'numpy'} == set(), 'tuned'\n"
        "import overlapbench.tuning.tune, overlapbench.report\n"
        "assert set(sys.modules) & {'torch', 'pandas', 'matplotlib'} == set(), sorted(set(sys.modules) & {'torch', 'pandas'})\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
