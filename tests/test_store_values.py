"""A results file with a damaged value: one line naming the file, the line and the field, never a
traceback, from every reader (report, tune, report --compare); a folder given for a file; files
that are not text."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from overlapbench.cli import app
from overlapbench.tuning import row_schema
from tests import synthetic


def sound_rows(seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for tokens in (1024, 4096):
        base = tokens / 1000 * (1 + rng.random())
        rows.append(synthetic.row("baseline", tokens, samples=synthetic.draw(base, 0.01, rng, n=12), pairing=f"p{tokens}"))
        rows.append(synthetic.row("token_split", tokens, samples=synthetic.draw(base * 0.9, 0.01, rng, n=12),
                                  pairing=f"p{tokens}"))
        rows.append(synthetic.row("no_comm", tokens, {}, samples=synthetic.draw(base * 0.8, 0.01, rng, n=12)))
    return rows


# (field, a damaged value): wrong types and values out of range in every field tune and report compute with
DAMAGE = [
    ("ms", "fast"), ("ms", -1.0), ("ms", 0), ("ms", float("inf")), ("ms", float("nan")), ("ms", True),
    ("p10_ms", "x"), ("p90_ms", -0.5), ("cv", -0.1), ("cv", [1]),
    ("samples_ms", [1.0, "fast", 1.1]), ("samples_ms", [1.0, -2.0]), ("samples_ms", "1,2,3"),
    ("round_ids", [0, -1, 2]), ("round_ids", [0, 1]),  # the second: fewer than the samples
    ("rank_ms", [1.0, -1.0]), ("rank_ms", "1,2"), ("rank_ms", [1.0, 1.1, 1.2]),  # the last: 3 ranks of a world of 2
    ("speedup", -1.0), ("speedup", "1.1"), ("speedup_ci", [1.2, 1.1]), ("speedup_ci", [1.0]), ("speedup_ci", "wide"),
    ("tokens", "4096"), ("tokens", 0), ("tokens", 4096.5), ("batch", [4096, -1]), ("batch", []),
    ("tp", 0), ("world_size", "two"), ("layers", -4),
    ("rel_err", -0.1), ("rel_err", "small"), ("tflops", -3.0), ("peak_frac", "high"),
    ("knobs", "split_offset=0"), ("shape", [1, 2]), ("decode", {"tokens": 64}), ("checked", "yes"),
    ("strategy", 7), ("device", None),  # device: a field an ok row must have
]


@pytest.mark.parametrize("field, value", DAMAGE, ids=[f"{f}={json.dumps(v)}" for f, v in DAMAGE])
@pytest.mark.parametrize("command", ["report", "tune", "compare"])
def test_a_damaged_value_is_one_line_naming_file_line_and_field(tmp_path, field, value, command):
    rows = sound_rows(random.randrange(1 << 30))
    target = random.choice([i for i, r in enumerate(rows) if r["strategy"] != "no_comm"])
    rows[target][field] = value
    damaged = synthetic.write(tmp_path / "damaged.jsonl", rows)
    args = {"report": ["report", str(damaged)], "tune": ["tune", str(damaged), "--out-dir", str(tmp_path / "t")],
            "compare": ["report", "--compare", str(synthetic.write(tmp_path / "sound.jsonl", sound_rows(1))), str(damaged)]}
    result = CliRunner().invoke(app, args[command])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    error = result.output.strip().splitlines()[-1]
    assert error.startswith(f"error: {damaged}:{target + 1}: ") and f"'{field}'" in error and "damaged" in error, error
    assert "None" not in error and "True" not in error  # values as the file holds them
    assert not (tmp_path / "t").exists()  # nothing written


def test_sound_rows_pass_and_every_checked_field_has_a_failing_value():
    for row in sound_rows(3):
        assert row_schema.problem(row) is None
    assert {f for f, _ in DAMAGE} >= {"ms", "samples_ms", "round_ids", "speedup", "speedup_ci", "tokens", "rel_err", "cv"}


def test_a_failed_row_with_null_timing_is_sound(tmp_path):
    path = synthetic.write(tmp_path / "r.jsonl", [*sound_rows(4), synthetic.failed("iso", 1024)])
    assert CliRunner().invoke(app, ["report", str(path)]).exit_code == 0


def test_infinite_rel_err_of_a_broken_output_is_a_value_not_damage():
    row = sound_rows(5)[1] | {"rel_err": float("inf"), "status": "failed"}
    assert row_schema.problem(row) is None


def test_a_folder_means_its_newest_results_file(tmp_path):
    older = synthetic.write(tmp_path / "runs" / "a.jsonl", sound_rows(6))
    newer = synthetic.write(tmp_path / "runs" / "sub" / "b.jsonl", [r | {"run_id": "newer"} for r in sound_rows(7)])
    newer.touch()
    assert newer.stat().st_mtime >= older.stat().st_mtime
    result = CliRunner().invoke(app, ["report", str(tmp_path / "runs"), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert f"reading {newer}" in result.stderr


def test_a_binary_file_is_named_in_words_not_by_exception_class(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(bytes(range(256)) * 4)
    result = CliRunner().invoke(app, ["report", str(path)])
    assert result.exit_code == 2
    assert "not text" in result.output and "Error" not in result.output.replace("error:", ""), result.output
