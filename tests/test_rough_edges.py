"""What a new user's afternoon at 6c9c587 tripped over besides pooled devices (test_origin.py), each
where they met it: piped tables wider than 80 columns, headings without the device, a failure
summary that merged two models, CSV/JSON units, the strategies' order, spec messages that named the
wrong field or no file or an unreadable figure, where `output:` lands, output paths that are no
results file or no folder, and how long the tests take."""

from __future__ import annotations

import io
import json
import random
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from overlapbench import report, strategies
from overlapbench.cli import app
from overlapbench.errors import UserError
from overlapbench.printing import gib
from overlapbench.specs import spec
from overlapbench.strategies.command import show_strategies
from overlapbench.tuning import results, tune
from overlapbench.tuning.results import read_rows
from tests import synthetic
from tests.distributed import overlapbench
from tests.results_readme import ROOT

ANSI = re.compile(r"\x1b\[[0-9;]*m")
WAYS = [{}, {"FORCE_COLOR": "1"}]  # a pipe; a terminal (rich takes FORCE_COLOR for one)
H100 = "results/h100x2/331cb63/llama3-8b-tp2.jsonl"
COMM = ["results/h100x2/cc10b27/comm.jsonl", "results/h100x2/cc10b27/comm-beside.jsonl"]
GOOD = {"model": "tiny", "tokens": [16], "strategies": ["baseline"]}


def lines_of(result) -> list[str]:
    assert result.returncode == 0, result.stderr
    return ANSI.sub("", result.stdout).splitlines()


def error_of(args: list[str]) -> str:
    """A command refused as bad input is: exit 2, one line, no traceback; the line."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return lines[0]


# -- widths and headings -----------------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS, ids=["piped", "terminal"])
@pytest.mark.parametrize("path", COMM)
def test_a_comm_report_fits_80_columns_with_every_figure_whole(path, way):
    lines = lines_of(overlapbench("report", path, env={"COLUMNS": "80", **way}))
    text = "\n".join(lines)
    assert max(map(len, lines)) <= 80, text
    assert "…" not in text
    for row in read_rows(ROOT / path):
        if row["status"] == "ok":
            assert f"{row['busbw']:.2f}" in text and str(row["bytes"]) in text
            assert row.get("nccl_kernel") is None or f"{row['nccl_kernel']} x{row['nccl_channels']}" in text
            assert row.get("beside_ms") is None or f"{row['beside_ms'] * 1e3:.2f}" in text


@pytest.mark.parametrize("way", WAYS, ids=["piped", "terminal"])
def test_sensitivity_fits_80_columns_with_every_setting_whole(way):
    lines = lines_of(overlapbench("report", H100, "--sensitivity", "token_split", "--tokens", "1024",
                                  env={"COLUMNS": "80", **way}))
    text = "\n".join(lines)
    assert max(map(len, lines)) <= 80, text
    rows = [r for r in read_rows(ROOT / H100) if r["strategy"] == "token_split" and r["tokens"] == 1024]
    assert rows
    for row in rows:
        assert f"{row['ms']:.4g}" in text
        assert f"comm={row['knobs']['comm']}" in text
    assert "★" in text and "(bound)" in text


def test_rounds_has_a_heading_per_model_and_device():
    out = io.StringIO()
    report.run([ROOT / H100, ROOT / "results/h200x2/9f356d8/llama3-8b-tp2.jsonl"], "markdown",
               Console(file=out, width=200), rounds=True)
    headings = [line for line in out.getvalue().splitlines() if line.startswith("### ")]
    assert headings == ["### llama3-8b tp2 NVIDIA H100 80GB HBM3 bf16: rounds of the paired timing, per batch",
                        "### llama3-8b tp2 NVIDIA H200 bf16: rounds of the paired timing, per batch"]


def test_the_skipped_summary_names_each_models_places(tmp_path):
    rng = random.Random(7)
    rows = []
    for model, tokens in (("llama3-8b", (512, 2048)), ("llama3-70b", (1024,))):
        for n in tokens:
            rows.append(synthetic.row("baseline", n, median=n / 1000 * rng.uniform(0.9, 1.1), rng=rng, model=model))
            rows.append(synthetic.row("async_tp", n, status="skipped", model=model))
    out = io.StringIO()
    report.run([synthetic.write(tmp_path / "two.jsonl", rows)], "markdown", Console(file=out, width=300))
    assert "- skipped: async_tp needs CUDA GPUs (llama3-8b: async_tp@512, async_tp@2048; llama3-70b: async_tp@1024)" \
        in out.getvalue()


def test_records_give_hidden_in_percent_as_the_table_and_the_run_id(tmp_path):
    out = io.StringIO()
    report.run([ROOT / H100], "json", Console(file=out, width=200))
    records = json.loads(out.getvalue())
    out = io.StringIO()
    report.run([ROOT / H100], "markdown", Console(file=out, width=400))
    shown = set(re.findall(r"(-?\d+)% hidden", out.getvalue()))
    assert shown and shown == {f"{round(r['hidden_pct'] / 100, 2) * 100 + 0.0:.0f}" for r in records
                               if r["hidden_pct"] is not None and r["strategy"] != "no_comm"}
    assert {r["run_id"] for r in records} == {r["run_id"] for r in read_rows(ROOT / H100)}
    assert "hidden" not in records[0]


# -- one order of strategies -------------------------------------------------------------------


def test_every_list_of_strategies_is_in_the_registrys_order():
    order = [cls.name for cls in strategies.all_strategies()]
    readme = (ROOT / "README.md").read_text()
    listed = readme[readme.index("Strategies: "):].split("\n\n")[0]
    assert re.findall(r"`(\w+)`", listed) == order
    docs = re.findall(r"^\| `(\w+)` \|", (ROOT / "docs/workload.md").read_text(), re.M)
    assert docs[:len(order)] == order
    out = io.StringIO()
    show_strategies(Console(file=out, width=200))
    assert [line.split(":")[0] for line in out.getvalue().splitlines() if line.split(":")[0] in order] == order
    with pytest.raises(UserError) as info:
        strategies.get("bsaeline")
    assert str(info.value).endswith("known: " + ", ".join(order))


# -- spec messages -----------------------------------------------------------------------------


@pytest.mark.parametrize("cuda", [False, True])
def test_a_device_sections_field_is_named_as_written(cuda):
    section = "cuda" if cuda else "cpu"
    with pytest.raises(UserError) as info:
        spec.from_dict(GOOD | {section: {"tokens": "lots"}}, "s", cuda)
    assert str(info.value).startswith(f"{section}.tokens: must be a positive integer, got 'lots'")
    with pytest.raises(UserError) as info:
        spec.from_dict(GOOD | {section: {"layers": 0}}, "s", cuda)
    assert str(info.value).startswith(f"{section}.layers:")
    with pytest.raises(UserError) as info:
        spec.from_dict(GOOD | {"tokens": "lots"}, "s", cuda)
    assert str(info.value).startswith("tokens: must be")  # a scalar, not a list's tokens[0]


@pytest.mark.parametrize("tp, world", [(3, 3), (4, 2)])
def test_tp_errors_start_with_the_spec_file(tmp_path, tp, world):
    path = tmp_path / "s.yaml"
    path.write_text(f"model: llama3-8b\ntp: {tp}\ntokens: [16]\nstrategies: [baseline]\n")
    with pytest.raises(UserError) as info:
        spec.load(path, cuda=False).points(world, cuda=False)
    assert str(info.value).startswith(f"{path}: tp: {tp} ")


def test_a_huge_token_count_is_refused_with_a_readable_size(tmp_path):
    """On CPU, a batch no machine holds is refused before launch (`--force` runs it anyway, and
    its batch fails: test_sweep.py); the size reads in the largest unit that fits."""
    path = tmp_path / "s.yaml"
    path.write_text("model: tiny\ntokens: [16, 100000000000]\nstrategies: [baseline]\n")
    message = error_of(["sweep", str(path)])
    need = re.search(r"needs about ([\d,.]+) (\w+) of host memory", message)
    assert need and need.group(2) == "ZiB" and 1 <= float(need.group(1).replace(",", "")) < 1024, message
    assert "GiB of activations" not in message and "make it smaller (model, layers, tokens" in message
    assert [gib(n) for n in (0.5 * 2**20, 1.5 * 2**30, 1.5 * 2**40, 447 * 2**50, 3 * 2**80)] == [
        "<1 MiB", "1.5 GiB", "1.5 TiB", "447.0 PiB", "3.0 YiB"]


# -- where files go ----------------------------------------------------------------------------


def test_with_no_results_here_tune_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = error_of(["tune"])
    assert "reads the newest .jsonl under results/ of the current folder" in message
    assert "a spec's `output:` is a path from the folder the sweep ran in" in message
    docs = (ROOT / "docs/sweeps.md").read_text()
    assert "the spec's `output` (a path from the folder `sweep` runs in" in " ".join(docs.split())


@pytest.mark.parametrize("name, text, said", [
    ("spec.yaml", "name: s\nmodel: tiny\n", "is a YAML file (a spec?), not a results file (it is left as it is)"),
    ("new.yml", None, "is named like a spec (YAML), not a results file; results go to a .jsonl file"),
    ("notes.txt", "my notes\n", "holds something else (its first line is not a JSON row)"),
])
def test_an_output_that_is_no_results_file_is_refused_and_kept(tmp_path, name, text, said):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    for resume in (False, True):
        with pytest.raises(UserError) as info:
            results.ResultStore(path).open(resume)
        assert said in str(info.value) and str(info.value).startswith(f"output: {path} ")
    assert (path.read_text() if text is not None else None) == text and not path.with_name(name + ".lock").exists()


def test_a_results_file_named_yaml_still_resumes(tmp_path):
    path = synthetic.write(tmp_path / "old.yaml", [synthetic.row("baseline", 16, rng=random.Random(1))])
    store = results.ResultStore(path)
    try:
        assert store.open(resume=True) == {read_rows(path)[0]["key"]}
    finally:
        store.close()


def test_the_spec_is_refused_as_output_from_the_command_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: tiny\ntokens: [16]\nstrategies: [baseline]\n")
    before = path.read_text()
    assert "is a YAML file (a spec?)" in error_of(["sweep", str(path), "-o", str(path)])
    assert path.read_text() == before


@pytest.mark.parametrize("where", ["file", "below a file"])
def test_tune_out_dir_on_a_file_says_so(tmp_path, where):
    file = tmp_path / "taken"
    file.write_text("kept\n")
    out_dir = file if where == "file" else file / "tuned"
    with pytest.raises(UserError) as info:
        tune.run([ROOT / H100], out_dir, Console(file=io.StringIO()))
    assert str(info.value) == f"--out-dir: {file} is a file, not a folder; give a folder for the tuned YAMLs"
    assert file.read_text() == "kept\n"


def test_the_readme_says_how_long_the_tests_take():
    assert "about 40 minutes on 2 cores" in " ".join((ROOT / "README.md").read_text().split())
