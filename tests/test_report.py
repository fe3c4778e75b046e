"""Report: every format parses, the figures are right, plots are PNGs, compare gates on a threshold;
and tune and report through the CLI on a synthetic store."""

from __future__ import annotations

import io
import json
import random
import sys

import pandas as pd
import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from overlapbench import report, tuned
from overlapbench.cli import app
from overlapbench.errors import UserError
from overlapbench.tuning import analysis, tune
from tests import synthetic

TOKENS = (512, 2048, 8192)
OFFSETS, CTAS = (0, 128, 256), (2, 4)


@pytest.fixture
def store(tmp_path):
    """Baseline (default and 8 CTAs), fused_norm (noisy), a token_split knob grid, no_comm; plus a
    failed and a skipped row."""
    rng = random.Random(21)
    rows = []
    for tokens in TOKENS:
        base = tokens / 1000
        rows.append(synthetic.row("baseline", tokens, samples=synthetic.draw(base, 0.005, rng)))
        rows.append(synthetic.row("baseline", tokens, {"nccl_max_ctas": 8}, samples=synthetic.draw(base * 1.02, 0.005, rng)))
        rows.append(synthetic.row("fused_norm", tokens, samples=synthetic.draw(base * 0.99, 0.06, rng)))
        for offset in OFFSETS:
            for ctas in CTAS:
                speed = (0.9 if tokens >= 2048 else 1.01) + offset / 1e4 + ctas / 1e3
                rows.append(synthetic.row("token_split", tokens, {"split_offset": offset, "comm_ctas_attn": ctas},
                                          samples=synthetic.draw(base * speed, 0.005, rng)))
        rows.append(synthetic.row("no_comm", tokens, samples=synthetic.draw(base * 0.8, 0.005, rng)))
    rows.append(synthetic.failed("iso", 2048))
    rows.append(synthetic.row("async_tp", 2048, status="skipped", error="async_tp needs CUDA GPUs"))
    return synthetic.write(tmp_path / "store.jsonl", rows)


def captured(paths, fmt="table", **options) -> tuple[int, str]:
    out = io.StringIO()
    code = report.run(paths, fmt, Console(file=out, width=200), **options)
    return code, out.getvalue()


def records(store, **options) -> list[dict]:
    return json.loads(captured([store], "json", **options)[1])


def cell(recs, tokens, strategy) -> dict:
    (match,) = [r for r in recs if r["tokens"] == tokens and r["strategy"] == strategy]
    return match


def median(store, tokens, strategy, knobs) -> float:
    return next(m.ms for m in analysis.read([store]).measured if (m.tokens, m.strategy, m.knobs) == (tokens, strategy, knobs))


# -- the overview ------------------------------------------------------------------------


def test_json_is_one_record_per_strategy_and_token_count(store):
    recs = records(store)
    assert len(recs) == len(TOKENS) * 4
    assert {r["strategy"] for r in recs} == {"baseline", "fused_norm", "token_split", "no_comm"}
    ts = cell(recs, 8192, "token_split")
    assert ts["knobs"] == {"split_offset": 0, "comm_ctas_attn": 2}  # its best knobs
    assert ts["winner"] and sum(r["winner"] for r in recs if r["tokens"] == 8192) == 1
    assert cell(recs, 512, "baseline")["winner"] and cell(recs, 512, "baseline")["knobs"] == {"nccl_max_ctas": "default"}


def test_speedup_and_hidden_follow_their_definitions(store):
    recs = records(store)
    base = median(store, 2048, "baseline", {"nccl_max_ctas": "default"})
    free = median(store, 2048, "no_comm", {})
    ts = cell(recs, 2048, "token_split")
    assert ts["speedup"] == pytest.approx(base / ts["ms"])
    assert ts["hidden_pct"] == pytest.approx(100 * (base - ts["ms"]) / (base - free))  # percent, as the table
    assert 30 < ts["hidden_pct"] < 60
    assert cell(recs, 2048, "no_comm")["hidden_pct"] == pytest.approx(100.0)


def test_noisy_cells_are_flagged(store):
    recs = records(store)
    assert cell(recs, 512, "fused_norm")["noisy"] and cell(recs, 512, "fused_norm")["cv"] > analysis.NOISY_CV
    assert not cell(recs, 512, "baseline")["noisy"]
    _, text = captured([store], "markdown")
    assert "~" in text and "noisy" in text


def test_csv_parses_with_pandas(store):
    _, text = captured([store], "csv")
    frame = pd.read_csv(io.StringIO(text))
    assert len(frame) == len(TOKENS) * 4
    assert {"tokens", "strategy", "knobs", "ms", "speedup", "hidden_pct", "winner", "noisy", "device", "run_id",
            "timing"} <= set(frame.columns)
    assert json.loads(frame.loc[frame.strategy == "token_split", "knobs"].iloc[0])["comm_ctas_attn"] in CTAS


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Each markdown table as rows of cells (header and separator included)."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif current:
            tables.append(current)
            current = []
    return tables


def test_markdown_is_a_well_formed_table_per_group(store):
    _, text = captured([store], "markdown")
    (table,) = markdown_tables(text)
    header, separator, *rows = table
    assert header == ["tokens", "baseline", "fused_norm", "token_split", "no_comm"]
    assert all(set(c) <= set("-:") and c for c in separator)
    assert [r[0] for r in rows] == [str(t) for t in TOKENS]
    assert {len(r) for r in table} == {len(header)}
    assert "**" in rows[2][3] and "★" in rows[2][3]  # the winner at 8192: token_split
    assert "1 failed" in text and "1 skipped" in text


def test_the_table_shows_winners_and_the_failures(store):
    code, text = captured([store])
    assert code == 0
    assert "token_split" in text and "★" in text and "hidden" in text
    assert "1 failed" in text and "OutOfMemoryError: synthetic" in text and "async_tp needs CUDA GPUs" in text


def test_groups_get_separate_tables(store, tmp_path):
    synthetic.append(store, [synthetic.row("baseline", 1024, model="llama3-70b", tp=4)])
    _, text = captured([store], "markdown")
    assert len(markdown_tables(text)) == 2 and "llama3-70b tp4" in text


def test_a_store_with_nothing_ok_is_a_user_error(tmp_path):
    path = synthetic.write(tmp_path / "bad.jsonl", [synthetic.failed("baseline", 64)])
    with pytest.raises(UserError, match=r"bad\.jsonl: no ok rows.*OutOfMemoryError"):
        report.run([path], "table", Console(quiet=True))


@pytest.mark.parametrize("options, message", [
    ({"fmt": "xml"}, "--format"),
    ({"sensitivity": "token_split"}, "--tokens"),
    ({"fail_above": 5.0}, "--fail-above"),
    ({"plot_path": "out.svg"}, ".png"),
    ({"plot_metric": "cv"}, "--plot-metric"),
])
def test_bad_options_are_user_errors(store, options, message):
    fmt = options.pop("fmt", "table")
    if "plot_path" in options:
        options["plot_path"] = store.parent / options["plot_path"]
    with pytest.raises(UserError, match=message):
        report.run([store], fmt, Console(quiet=True), **options)


# -- sensitivity ---------------------------------------------------------------------------


def test_sensitivity_is_the_knob_grid(store):
    _, text = captured([store], "markdown", sensitivity="token_split", tokens=8192)
    (table,) = markdown_tables(text)
    header, _, *rows = table
    assert header == ["split_offset", *(f"comm_ctas_attn={c}" for c in CTAS)]
    assert [r[0] for r in rows] == [str(o) for o in OFFSETS]
    best = median(store, 8192, "token_split", {"split_offset": 0, "comm_ctas_attn": 2})
    assert rows[0][1].startswith(f"**{best:.4g} ms") and "★" in rows[0][1]
    assert sum("★" in c for r in rows for c in r) == 1


def test_sensitivity_records(store):
    recs = records(store, sensitivity="token_split", tokens=512)
    assert len(recs) == len(OFFSETS) * len(CTAS)
    assert {(r["knobs"]["split_offset"], r["knobs"]["comm_ctas_attn"]) for r in recs} == {(o, c) for o in OFFSETS for c in CTAS}
    assert all(r["status"] == "ok" and r["speedup"] < 1.0 for r in recs)


def test_sensitivity_shows_failed_settings(store):
    _, text = captured([store], "markdown", sensitivity="iso", tokens=2048)
    assert "failed" in text


@pytest.mark.parametrize("strategy, tokens, message", [
    ("token_splt", 512, "did you mean 'token_split'"),
    ("token_split", 1000, "measured at 512, 2048, 8192 tokens"),
])
def test_sensitivity_names_what_was_measured(store, strategy, tokens, message):
    with pytest.raises(UserError, match=message):
        report.run([store], "table", Console(quiet=True), sensitivity=strategy, tokens=tokens)


# -- plot ----------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", ["ms", "speedup"])
def test_the_plot_is_a_png(store, tmp_path, metric):
    pytest.importorskip("matplotlib")
    path = tmp_path / "plots" / "layer.png"
    code, _ = captured([store], "csv", plot_path=path, plot_metric=metric)
    assert code == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_the_plot_without_matplotlib_says_how_to_install_it(store, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    with pytest.raises(UserError, match=r"pip install 'overlapbench\[plot\]'"):
        report.run([store], "table", Console(quiet=True), plot_path=tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# -- compare -------------------------------------------------------------------------------


def slower_copy(store, tmp_path, factor: float):
    """The same store with token_split at 2048 tokens `factor` times slower."""
    rows = [json.loads(line) for line in store.read_text().splitlines()]
    for row in rows:
        if row["strategy"] == "token_split" and row["tokens"] == 2048 and row["status"] == "ok":
            row["samples_ms"] = [s * factor for s in row["samples_ms"]]
            row["ms"] *= factor
    return synthetic.write(tmp_path / "new.jsonl", rows)


@pytest.mark.parametrize("fail_above, code", [(None, 0), (9.0, 1), (9.9, 1), (10.1, 0), (50.0, 0)])
def test_compare_exit_code_flips_at_the_threshold(store, tmp_path, fail_above, code):
    new = slower_copy(store, tmp_path, 1.10)
    got, text = captured([], "json", compare_paths=(store, new), fail_above=fail_above)
    assert got == code
    recs = json.loads(text)
    assert len(recs) == len(TOKENS) * (2 + 1 + len(OFFSETS) * len(CTAS) + 1)
    slowed = [r for r in recs if r["ratio"] > 1.0 + 1e-9]
    assert len(slowed) == len(OFFSETS) * len(CTAS) and all(r["ratio"] == pytest.approx(1.10) for r in slowed)
    assert sum(r["regression"] for r in recs) == (len(slowed) if code else 0)


def test_compare_needs_points_in_common(store, tmp_path):
    other = synthetic.write(tmp_path / "other.jsonl", [synthetic.row("baseline", 64, model="tiny", tp=2, dtype="fp32")])
    with pytest.raises(UserError, match="share no points"):
        report.run([], "table", Console(quiet=True), compare_paths=(store, other))


# -- micro workloads: one GEMM with its all-gather or reduce-scatter --------------------------


RS_70B = ("gemm_rs", 8192, 14336)  # (workload, N, K): what `synthetic.row(gemm=...)` takes


def rows_of(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def steady(ms: float) -> list[float]:
    """Samples with no noise: the median, and so every speedup, is exact."""
    return [ms] * 20


# per token count: (strategy, knobs, ms); flash_agrs at its best knobs 1.25x faster than sp_baseline
MICRO_MS = {
    4096: [("sp_baseline", None, 2.0), ("async_tp", None, 1.9),
           ("flash_agrs", {"order": "ring"}, 1.6), ("flash_agrs", {"order": "local_first_last"}, 1.7)],
    8192: [("sp_baseline", None, 4.0), ("async_tp", None, 3.6),
           ("flash_agrs", {"order": "ring"}, 3.0), ("flash_agrs", {"order": "local_first_last"}, 3.4)],
}


@pytest.fixture
def micro_store(tmp_path):
    """gemm_rs at Llama-3-70B's down projection, timed without noise (MICRO_MS)."""
    rows = [synthetic.row(strategy, tokens, knobs, samples=steady(ms), model="llama3-70b", gemm=RS_70B)
            for tokens, settings in MICRO_MS.items() for strategy, knobs, ms in settings]
    return synthetic.write(tmp_path / "micro.jsonl", rows)


def test_a_micro_store_reports_speedups_over_sp_baseline(micro_store):
    recs = records(micro_store)
    assert {(r["workload"], r["gemm"]["n"], r["gemm"]["k"]) for r in recs} == {RS_70B}
    flash = cell(recs, 4096, "flash_agrs")
    assert flash["knobs"] == {"order": "ring"} and flash["speedup"] == pytest.approx(1.25)
    assert cell(recs, 4096, "async_tp")["speedup"] == pytest.approx(2.0 / 1.9)
    assert cell(recs, 8192, "flash_agrs")["speedup"] == pytest.approx(4.0 / 3.0)
    assert cell(recs, 4096, "sp_baseline")["speedup"] == 1.0
    assert all(r["hidden_pct"] is None for r in recs)  # no no_comm bound for one GEMM
    assert [r["winner"] for r in recs if r["tokens"] == 4096] == [False, False, True]  # flash_agrs, beyond any noise


def test_a_micro_table_names_its_gemm_and_reference(micro_store):
    _, text = captured([micro_store], "markdown")
    (table,) = markdown_tables(text)
    assert "### llama3-70b gemm_rs n=8192 k=14336 tp2 NVIDIA H200 bf16" in text
    assert table[0] == ["tokens", "sp_baseline", "async_tp", "flash_agrs"]
    assert table[2][3].startswith("**1.6 ms, 1.250x") and "★" in table[2][3]
    assert "speedup over sp_baseline" in text and "hidden" not in text and "baseline (layer)" not in text


def test_layer_and_micro_rows_land_in_separate_groups(store, micro_store):
    """One store with the layer, gemm_rs at two GEMMs and gemm_ag at the first one's N, K: four
    groups; sp_baseline measured in the layer is not the micro reference, and vice versa."""
    synthetic.append(store, rows_of(micro_store))
    synthetic.append(store, [
        synthetic.row("sp_baseline", 4096, samples=steady(0.5), model="llama3-70b", gemm=("gemm_rs", 4096, 7168)),
        synthetic.row("flash_agrs", 4096, samples=steady(0.4), model="llama3-70b", gemm=("gemm_rs", 4096, 7168)),
        synthetic.row("sp_baseline", 4096, samples=steady(3.0), model="llama3-70b", gemm=("gemm_ag", 8192, 14336)),
        synthetic.row("sp_baseline", 2048, samples=steady(9.0), model="llama3-8b"),  # in the layer workload
    ])
    recs = records(store)
    assert len({(r["workload"], json.dumps(r["gemm"])) for r in recs}) == 4
    _, text = captured([store], "markdown")
    titles = [line for line in text.splitlines() if line.startswith("### ")]
    assert titles == [
        "### llama3-70b gemm_ag n=8192 k=14336 tp2 NVIDIA H200 bf16",
        "### llama3-70b gemm_rs n=4096 k=7168 tp2 NVIDIA H200 bf16",
        "### llama3-70b gemm_rs n=8192 k=14336 tp2 NVIDIA H200 bf16",
        "### llama3-8b tp2 NVIDIA H200 bf16",  # the layer group's label is unchanged
    ]
    (small,) = [r for r in recs if r["gemm"] == {"n": 4096, "k": 7168} and r["strategy"] == "flash_agrs"]
    assert small["speedup"] == pytest.approx(0.5 / 0.4)
    (layer_sp,) = [r for r in recs if r["workload"] == "layer" and r["strategy"] == "sp_baseline"]
    assert layer_sp["speedup"] < 1  # against the layer's baseline (2 ms), not itself
    assert "the reference: baseline (layer), sp_baseline (gemm_ag, gemm_rs)" in text


def test_old_layer_rows_without_a_workload_read_as_layer():
    row = synthetic.row("baseline", 1024)
    old = {k: v for k, v in row.items() if k not in ("workload", "key")}
    new_group, old_group = analysis.Measured.of(row, "x").group, analysis.Measured.of(old, "x").group
    assert old_group == new_group and old_group.workload == "layer" and old_group.label() == "llama3-8b tp2 NVIDIA H200 bf16"


def test_rows_of_other_workloads_are_counted_not_shown(micro_store):
    comm = synthetic.row("sp_baseline", 1) | {"workload": "comm", "key": "comm-1", "shape": None, "tokens": None}
    synthetic.append(micro_store, [comm])
    _, text = captured([micro_store], "markdown")
    assert len(markdown_tables(text)) == 1 and "9 ok rows (1 of the comm workload, not shown)" in text


def test_micro_sensitivity_plot_and_compare(micro_store, tmp_path):
    _, text = captured([micro_store], "markdown", sensitivity="flash_agrs", tokens=4096)
    (table,) = markdown_tables(text)
    assert table[0] == ["order", "ms"] and table[2:] == [["local_first_last", "1.7 ms, 1.176x"], ["ring", "**1.6 ms, 1.250x** ★"]]
    assert "speedup over sp_baseline" in text
    slower = [r | {"ms": r["ms"] * 1.2, "samples_ms": r["samples_ms"] and [s * 1.2 for s in r["samples_ms"]]}
              for r in rows_of(micro_store)]
    new = synthetic.write(tmp_path / "new.jsonl", slower)
    code, text = captured([], "markdown", compare_paths=(micro_store, new), fail_above=10.0)
    assert code == 1 and "llama3-70b gemm_rs n=8192 k=14336 tp2 NVIDIA H200 bf16" in text and "ms per GEMM" in text
    pytest.importorskip("matplotlib")
    code, _ = captured([micro_store], "csv", plot_path=tmp_path / "micro.png", plot_metric="speedup")
    assert code == 0 and (tmp_path / "micro.png").read_bytes()[:4] == b"\x89PNG"


# -- the CLI -------------------------------------------------------------------------------


runner = CliRunner()


def test_cli_tune_then_load(store, tmp_path):
    out = tmp_path / "tuned"
    result = runner.invoke(app, ["tune", str(store), "--out-dir", str(out)])
    assert result.exit_code == 0, result.output
    (path,) = out.iterdir()
    assert f"wrote {path}" in result.stdout.replace("\n", "")
    cfg = tuned.load(path)
    assert cfg.choose(512).strategy == "baseline" and cfg.choose(8192).strategy == "token_split"
    assert cfg.choose(10**6).clamped
    assert yaml.safe_load(path.read_text())["schema"] == "overlapbench/tuned-v1"


def test_cli_tune_on_a_store_without_ok_rows_exits_2(tmp_path):
    bad = synthetic.write(tmp_path / "bad.jsonl", [synthetic.failed("baseline", 64)])
    result = runner.invoke(app, ["tune", str(bad), "--out-dir", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "bad.jsonl" in result.output and "Traceback" not in result.output


def test_cli_tune_on_a_micro_store_exits_2_with_one_line(micro_store, tmp_path):
    result = runner.invoke(app, ["tune", str(micro_store), "--out-dir", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: {micro_store}: no ok rows of the layer workload; "
                                     f"tune writes layer configs (micro runs: use report)")
    assert not (tmp_path / "out").exists()


def test_tune_on_a_mixed_store_writes_the_layer_config_only(store, micro_store, tmp_path):
    synthetic.append(store, rows_of(micro_store))
    console = Console(record=True, width=200)
    (path,) = tune.run([store], tmp_path / "tuned", console)
    assert [p.name for p in (tmp_path / "tuned").iterdir()] == [path.name] == ["llama3-8b-tp2-nvidia-h200-bf16.yaml"]
    assert tuned.load(path).choose(8192).strategy == "token_split"
    assert "8 ok rows of micro workloads left out" in console.export_text()


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv", "json"])
def test_cli_report_formats(store, fmt):
    result = runner.invoke(app, ["report", str(store), "--format", fmt])
    assert result.exit_code == 0, result.output
    if fmt == "csv":
        assert len(pd.read_csv(io.StringIO(result.stdout))) == len(TOKENS) * 4
    elif fmt == "json":
        assert len(json.loads(result.stdout)) == len(TOKENS) * 4
    elif fmt == "markdown":
        assert len(markdown_tables(result.stdout)) == 1
    else:
        assert "token_split" in result.stdout


def test_cli_report_sensitivity_and_compare(store, tmp_path):
    result = runner.invoke(app, ["report", str(store), "--sensitivity", "token_split", "--tokens", "2048", "--format", "json"])
    assert result.exit_code == 0 and len(json.loads(result.stdout)) == len(OFFSETS) * len(CTAS)
    new = slower_copy(store, tmp_path, 1.2)
    result = runner.invoke(app, ["report", "--compare", str(store), str(new), "--fail-above", "5"])
    assert result.exit_code == 1
    regressions = [line for line in result.stderr.splitlines() if "regression:" in line]
    assert regressions and all(" tp2 " in line and ": token_split" in line for line in regressions)  # group named
    result = runner.invoke(app, ["report", "--compare", str(store), str(new), "--fail-above", "25"])
    assert result.exit_code == 0


def test_cli_report_bad_option_exits_2(store):
    result = runner.invoke(app, ["report", str(store), "--format", "xml"])
    assert result.exit_code == 2 and "--format" in result.output


# -- paired rows and noise-aware compare -------------------------------------------------------


def paired_store(path, seed: int, factor: float = 1.0):
    """Two batches timed interleaved: baseline, token_split 3% faster, no_comm; the clock's drift
    common to each round."""
    rng = random.Random(seed)
    rows = []
    for tokens in (2048, 8192):
        drift = [1 + rng.gauss(0, 0.03) for _ in range(10)]
        for strategy, speed in (("baseline", 1.0), ("token_split", 0.97), ("no_comm", 0.9)):
            samples = [tokens / 1000 * d * speed * factor * (1 + rng.gauss(0, 0.001)) for d in drift]
            rows.append(synthetic.row(strategy, tokens, {} if strategy == "no_comm" else None,
                                      samples=samples, pairing=f"{path.stem}/{tokens}"))
    return synthetic.write(path, rows)


def test_paired_speedups_show_their_interval(tmp_path):
    path = paired_store(tmp_path / "p.jsonl", 1)
    recs = records(path)
    split, base, free = (cell(recs, 8192, s) for s in ("token_split", "baseline", "no_comm"))
    lo, hi = split["speedup_ci"]
    assert lo < split["speedup"] < hi and hi - lo < 0.005 and split["speedup"] == pytest.approx(1 / 0.97, rel=0.002)
    assert base["speedup"] == 1.0 and base["speedup_ci"] is None
    assert split["hidden_pct"] == pytest.approx(100 * (1 - 0.97) / (1 - 0.9), rel=0.03)
    assert split["winner"]
    _, text = captured([path])
    assert "1.031x ±" in text


def test_compare_flags_only_what_lies_beyond_the_noise_of_both_runs(tmp_path):
    """Two runs of the same code differ by their noise; only a real slowdown is a regression."""
    rng = random.Random(3)
    old, same, slow = [], [], []
    for tokens in (512, 1024, 2048, 4096, 8192):
        for strategy in ("baseline", "fused_norm", "token_split", "iso"):
            old.append(synthetic.row(strategy, tokens, samples=synthetic.draw(1.0, 0.03, rng)))
            same.append(synthetic.row(strategy, tokens, samples=synthetic.draw(1.0, 0.03, rng)))
            slow.append(synthetic.row(strategy, tokens, samples=synthetic.draw(1.0 if strategy != "iso" else 1.08, 0.03, rng)))
    paths = [synthetic.write(tmp_path / f"{name}.jsonl", rows) for name, rows in (("old", old), ("same", same), ("slow", slow))]
    code, text = captured([], "json", compare_paths=(paths[0], paths[1]), fail_above=0.0)
    recs = json.loads(text)
    assert sum(r["ratio"] > 1 for r in recs) >= 5  # slower by its median at many points: noise
    assert code == 0 and not any(r["regression"] for r in recs)
    code, text = captured([], "json", compare_paths=(paths[0], paths[2]), fail_above=2.0)
    flagged = {(r["strategy"], r["tokens"]) for r in json.loads(text) if r["regression"]}
    assert code == 1 and flagged == {("iso", t) for t in (512, 1024, 2048, 4096, 8192)}


def test_mixed_compositions_get_their_own_rows(tmp_path):
    """Two compositions of 4096 tokens: two points of the table, each with its own baseline; the
    records say which decode tokens a row had."""
    rng = random.Random(5)
    rows = []
    for where, base in (({}, 1.0), ({"decode": (256, 4096)}, 1.4)):
        rows.append(synthetic.row("baseline", 4096, samples=synthetic.draw(base, 0.005, rng), **where))
        rows.append(synthetic.row("token_split", 4096, samples=synthetic.draw(base * 0.9, 0.005, rng), **where))
    path = synthetic.write(tmp_path / "mixed.jsonl", rows)
    recs = records(path)
    split = {json.dumps(r["decode"]): r for r in recs if r["strategy"] == "token_split"}
    assert set(split) == {"null", json.dumps({"tokens": 256, "context": 4096})}
    for r in split.values():
        assert r["speedup"] == pytest.approx(1 / 0.9, rel=0.02)  # each against its own composition's baseline
    code, text = captured([path])
    assert code == 0 and "[3840]+256 decode@4096" in text
