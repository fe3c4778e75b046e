"""A row knows where it came from: rows of another GPU, or predictions, never replace or pool with
measurements of the same point in `tune`, `report`, `export` or `--compare`; predicted rows say so
wherever they appear. First on the committed files where it was seen, then on fresh random rows."""

from __future__ import annotations

import dataclasses
import io
import json
import random

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from overlapbench import report, tuned
from overlapbench.cli import app
from overlapbench.errors import UserError
from overlapbench.export import command as export_mod
from overlapbench.tuning import analysis, origin, tune
from tests import synthetic
from tests.results_readme import ROOT

H100 = "results/h100x2/331cb63/llama3-8b-tp2.jsonl"
H200 = "results/h200x2/9f356d8/llama3-8b-tp2.jsonl"
MEASURED = "results/h100x2/331cb63/llama3-70b-tp2.jsonl"
PREDICTED = "results/predicted-h100/predicted-llama3-70b-tp2.jsonl"
H100_NAME = "NVIDIA H100 80GB HBM3"


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the committed files are named from the repository root


def json_records(paths, **options) -> list[dict]:
    out = io.StringIO()
    report.run([ROOT / p for p in paths], "json", Console(file=out, width=200), **options)
    return json.loads(out.getvalue())


def decisions(folder) -> dict[str, list]:
    """Each tuned file's rules: range, strategy and knobs."""
    return {p.name: [(r["tokens"], r["strategy"], r["knobs"]) for r in yaml.safe_load(p.read_text())["rules"]]
            for p in sorted(folder.glob("*.yaml"))}


def tuned_in(folder, paths) -> str:
    out = io.StringIO()
    tune.run([ROOT / p for p in paths], folder, Console(file=out, width=300))
    return out.getvalue()


# -- the committed files where it was seen -------------------------------------------------------


def test_tuning_two_devices_gives_each_the_config_it_gets_alone(tmp_path):
    said = tuned_in(tmp_path / "both", [H100, H200])
    tuned_in(tmp_path / "h100", [H100])
    tuned_in(tmp_path / "h200", [H200])
    both = decisions(tmp_path / "both")
    assert both == decisions(tmp_path / "h100") | decisions(tmp_path / "h200")
    assert set(both) == {"llama3-8b-tp2-nvidia-h100-80gb-hbm3-bf16.yaml", "llama3-8b-tp2-nvidia-h200-bf16.yaml"}
    assert f"rows of 2 devices kept apart, never pooled (a config each): 70 of {H100_NAME}; 138 of NVIDIA H200" in said


def test_a_report_of_two_devices_shows_every_row_of_each():
    alone = json_records([H100])
    both = json_records([H100, H200])
    mine = [r for r in both if r["device"] == H100_NAME]
    assert mine == alone and len({r["device"] for r in both}) == 2
    (split,) = [r for r in mine if r["tokens"] == 1024 and r["strategy"] == "token_split"]
    assert split["speedup"] == pytest.approx(1.088, abs=5e-4)  # not the 0.984x it read with the H200 rows over it


def test_the_report_says_what_it_kept_apart():
    out = io.StringIO()
    report.run([ROOT / H100, ROOT / H200], "markdown", Console(file=out, width=300))
    text = out.getvalue()
    assert f"### llama3-8b tp2 {H100_NAME} bf16" in text and "### llama3-8b tp2 NVIDIA H200 bf16" in text
    assert f"rows of 2 devices kept apart, never pooled (a table each): 70 of {H100_NAME}; 138 of NVIDIA H200" in text


def test_measured_and_predicted_rows_of_one_study_stay_apart(tmp_path):
    both = json_records([MEASURED, PREDICTED])
    alone = json_records([MEASURED]) + json_records([PREDICTED])
    assert sorted(map(json.dumps, both)) == sorted(map(json.dumps, alone)) and len(both) == len(alone)
    said = tuned_in(tmp_path / "both", [MEASURED, PREDICTED])
    tuned_in(tmp_path / "measured", [MEASURED])
    tuned_in(tmp_path / "predicted", [PREDICTED])
    assert decisions(tmp_path / "both") == decisions(tmp_path / "measured") | decisions(tmp_path / "predicted")
    assert "llama3-70b-tp2-nvidia-h100-80gb-hbm3-predicted-bf16.yaml" in decisions(tmp_path / "both")
    assert "measured and predicted rows kept apart" in said


@pytest.mark.parametrize("old, new, said", [
    (H100, H200, f"OLD holds rows of {H100_NAME} on 2 ranks, NEW of NVIDIA H200 on 2 ranks"),
    (MEASURED, PREDICTED, f"OLD holds rows of {H100_NAME} on 2 ranks, NEW of {H100_NAME} (predicted) on 2 ranks"),
])
def test_compare_across_devices_or_kinds_is_refused_in_one_line(old, new, said):
    result = CliRunner().invoke(app, ["report", "--compare", old, new, "--fail-above", "5"])
    assert result.exit_code == 2, result.output
    assert said in result.stderr and "--across-devices" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_compare_across_devices_says_so_in_every_heading():
    result = CliRunner().invoke(app, ["report", "--compare", MEASURED, PREDICTED, "--across-devices", "--format", "markdown"])
    assert result.exit_code == 0, result.output
    headings = [line for line in result.stdout.splitlines() if line.startswith("### ")]
    assert headings and all("across devices" in h for h in headings)
    assert f"NEW: {H100_NAME} (predicted); OLD: {H100_NAME}" in result.stdout
    records = json.loads(CliRunner().invoke(app, ["report", "--compare", MEASURED, PREDICTED, "--across-devices",
                                                  "--format", "json"]).stdout)
    assert {(r["old_timing"], r["new_timing"], r["old_device"]) for r in records} == {("interleaved", "predicted", H100_NAME)}


def test_across_devices_is_only_for_compare():
    result = CliRunner().invoke(app, ["report", H100, "--across-devices"])
    assert result.exit_code == 2 and "--across-devices: only with --compare" in result.stderr


def test_compare_of_one_device_names_it():
    result = CliRunner().invoke(app, ["report", "--compare", H100, H100, "--format", "markdown"])
    assert result.exit_code == 0 and f"### llama3-8b tp2 {H100_NAME} bf16: NEW / OLD ms per layer" in result.stdout


# -- predicted rows say so ---------------------------------------------------------------------


def test_predicted_records_carry_no_measured_statistics():
    both = json_records([MEASURED, PREDICTED])
    predicted = [r for r in both if r["timing"] == "predicted"]
    measured = [r for r in both if r["timing"] != "predicted"]
    assert predicted and measured and {r["device"] for r in predicted} == {f"{H100_NAME} (predicted)"}
    assert all(r[k] is None for r in predicted for k in ("p10_ms", "p90_ms", "cv", "noisy"))
    assert all(r["cv"] is not None and r["p10_ms"] < r["p90_ms"] for r in measured)
    run_ids = lambda path: {json.loads(line)["run_id"] for line in (ROOT / path).read_text().splitlines()}
    assert {r["run_id"] for r in predicted} == run_ids(PREDICTED) and {r["run_id"] for r in measured} == run_ids(MEASURED)


def test_a_predicted_table_says_so_in_its_heading_and_legend():
    out = io.StringIO()
    report.run([ROOT / PREDICTED], "markdown", Console(file=out, width=300))
    text = out.getvalue()
    assert f"### llama3-70b tp2 {H100_NAME} (predicted) bf16" in text
    assert "their ± is the model's assumed error (predict --error), not a measured interval" in text


def test_export_defaults_labels_a_predicted_cost_predicted(tmp_path):
    out = io.StringIO()
    export_mod.run([ROOT / PREDICTED], "vllm", None, tmp_path, True, Console(file=out, width=400))
    predicted = out.getvalue()
    errors = {json.loads(line)["predicted"]["error"] for line in (ROOT / PREDICTED).read_text().splitlines()}
    assert len(errors) == 1 and f"(predicted, ±{errors.pop():.1%})" in predicted and "(paired)" not in predicted
    out = io.StringIO()
    export_mod.run([ROOT / MEASURED], "vllm", None, tmp_path, True, Console(file=out, width=400))
    assert "(paired)" in out.getvalue() and "predicted" not in out.getvalue()


def test_export_defaults_never_takes_another_devices_rows(tmp_path):
    tuned_in(tmp_path, [H100])
    config = tuned.load(tmp_path / "llama3-8b-tp2-nvidia-h100-80gb-hbm3-bf16.yaml")
    elsewhere = dataclasses.replace(config, extra={"provenance": {"sources": [H200]}})
    with pytest.raises(UserError) as info:
        export_mod.rows_of(export_mod.Input(elsewhere, "h100.yaml", "h100"))
    assert "NVIDIA H200" in str(info.value) and "never pooled" in str(info.value)


def test_tune_decides_predicted_rows_alike_with_or_without_their_old_percentiles(tmp_path):
    """Rows `predict` wrote before held p10/p90 of the model's error (ms -+ half of it); now those
    are null and the error is taken from the row's `predicted.error`: the same picks either way."""
    rows = [json.loads(line) for line in (ROOT / PREDICTED).read_text().splitlines()]
    assert all(r["p10_ms"] is None for r in rows)  # the committed rows: today's format
    def with_percentiles(r: dict) -> dict:
        if r["ms"] is None:
            return r
        half = r["ms"] * r["predicted"]["error"] / 2
        return r | {"p10_ms": r["ms"] - half, "p90_ms": r["ms"] + half, "iqr_ms": half, "cv": 0.0}
    synthetic.write(tmp_path / "old.jsonl", [with_percentiles(r) for r in rows])
    synthetic.write(tmp_path / "stripped.jsonl", rows)
    tune.run([tmp_path / "old.jsonl"], tmp_path / "old", Console(file=io.StringIO()))
    tune.run([tmp_path / "stripped.jsonl"], tmp_path / "new", Console(file=io.StringIO()))
    assert decisions(tmp_path / "old") == decisions(tmp_path / "new")
    store = analysis.read([tmp_path / "stripped.jsonl"])
    gains = {tune.gain(m, analysis.reference([r for r in store.measured if r.composition == m.composition])).method
             for m in store.measured if m.strategy != "baseline"}
    assert gains == {origin.PREDICTED}


# -- fresh random rows -------------------------------------------------------------------------


def _rows(rng: random.Random, device: str, world: int = 2, predicted: bool = False) -> list[dict]:
    rows = []
    for tokens in (1024, 4096):
        for strategy, factor in (("baseline", 1.0), ("fused_norm", rng.uniform(0.8, 1.2))):
            row = synthetic.row(strategy, tokens, median=tokens / 1000 * factor * rng.uniform(0.5, 2), rng=rng,
                                device=device)
            row["world_size"] = world
            if predicted:
                row |= {"timing": "predicted", "predicted": {"error": 0.05}}
            rows.append(row)
    return rows


def test_the_later_row_wins_only_on_its_own_device_world_and_kind(tmp_path):
    rng = random.Random(44)
    first = _rows(rng, "GPU A")
    again = _rows(rng, "GPU A")  # the same points re-run on the same setup: they replace the first
    others = _rows(rng, "GPU B") + _rows(rng, "GPU A", world=4) + _rows(rng, "GPU A", predicted=True)
    kept = origin.last_per_key((row, "f") for row in first + others + again)
    assert len(kept) == len(first) + len(others)
    assert [row for row, _ in kept[-len(again):]] == again
    store = analysis.read([synthetic.write(tmp_path / "a.jsonl", first + again), synthetic.write(tmp_path / "b.jsonl", others)])
    assert {m.group.setup for m in store.measured} == {("GPU A", 2), ("GPU B", 2), ("GPU A", 4), ("GPU A (predicted)", 2)}
    note = analysis.separated(store.measured)
    assert note.startswith("rows of 4 setups (measured and predicted) kept apart") and "GPU A (predicted) on 2 ranks" in note


def test_rows_of_one_setup_need_no_note():
    rng = random.Random(45)
    rows = [analysis.Measured.of(r, "f") for r in _rows(rng, "GPU A") if r["status"] == "ok"]
    assert analysis.separated(rows) is None
