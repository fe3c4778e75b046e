"""Tables fit 80 columns, in a terminal and in a pipe, without cutting numbers or names; messages
and grids say values as a spec writes them (null, true), not as Python prints them; a bound is
never starred."""

from __future__ import annotations

import io
import json
import random
import re

import pytest
from rich.console import Console

from overlapbench import report
from overlapbench.errors import UserError, shown
from overlapbench.model.models import PRESETS
from overlapbench.specs import spec
from overlapbench.strategies import all_strategies
from tests import synthetic
from tests.distributed import overlapbench

ANSI = re.compile(r"\x1b\[[0-9;]*m")
WAYS = [{}, {"FORCE_COLOR": "1"}]  # a pipe; a terminal (rich takes FORCE_COLOR for one)
KNOBS = {
    "baseline": [{"nccl_max_ctas": "default"}, {"nccl_max_ctas": 16}],
    "fused_norm": [{"comm_ctas": 16}],
    "token_split": [{"align": 256, "split_offset": 128, "comm": "copy_engine", "comm_ctas_attn": 16, "comm_ctas_mlp": 32}],
    "iso": [{"split_ratio": "balanced", "align": 64, "comm": "fused", "comm_ctas": 16}],
    "sp_baseline": [{"nccl_max_ctas": "default"}],
    "async_tp": [{}],
    "flash_agrs": [{"transport": "copy_engine", "chunks_per_rank": 2, "order": "local_first_last", "attention": "whole"}],
    "no_comm": [{}],
}


def wide_store(tmp_path):
    """Every family with long knob settings at three token counts: 8 columns of figures wide."""
    rng = random.Random(34)
    rows = []
    for tokens in (1024, 8192, 32768):
        for strategy, settings in KNOBS.items():
            for knobs in settings:
                base = tokens / 700 * rng.uniform(0.8, 1.1) * (1.03 if knobs.get("nccl_max_ctas") == 16 else 1)
                rows.append(synthetic.row(strategy, tokens, knobs, samples=synthetic.draw(base, 0.004, rng, n=12)))
    return synthetic.write(tmp_path / "wide.jsonl", rows)


def lines_of(result) -> list[str]:
    assert result.returncode == 0, result.stderr
    return ANSI.sub("", result.stdout).splitlines()


@pytest.mark.parametrize("way", WAYS, ids=["piped", "terminal"])
def test_the_report_fits_80_columns_with_every_number_whole(tmp_path, way):
    store = wide_store(tmp_path)
    lines = lines_of(overlapbench("report", str(store), env={"COLUMNS": "80", **way}))
    assert max(map(len, lines)) <= 80, "\n".join(lines)
    text = "\n".join(lines)
    assert "…" not in text
    out = io.StringIO()
    report.run([store], "json", Console(file=out))
    for record in json.loads(out.getvalue()):
        assert f"{record['ms']:.4g}" in text and f"{record['speedup']:.3f}x" in text
    for settings in KNOBS.values():
        for knobs in settings:
            for name, value in knobs.items():
                if value != "default":
                    assert f"{name}={value}" in text  # under the table, whole


@pytest.mark.parametrize("way", WAYS, ids=["piped", "terminal"])
def test_compare_fits_80_columns(tmp_path, way):
    store = wide_store(tmp_path)
    lines = lines_of(overlapbench("report", "--compare", str(store), str(store), env={"COLUMNS": "80", **way}))
    assert max(map(len, lines)) <= 80 and "…" not in "\n".join(lines)


@pytest.mark.parametrize("way", WAYS, ids=["piped", "terminal"])
@pytest.mark.parametrize("command", ["models", "env", "strategies"])
def test_listings_fit_80_columns_with_names_whole(command, way):
    lines = lines_of(overlapbench(command, env={"COLUMNS": "80", **way}))
    text = "\n".join(lines)
    assert max(map(len, lines)) <= 80, text
    assert "…" not in text and "None" not in text and "True" not in text
    names = {"models": list(PRESETS), "env": ["device", "versions", "git"],
             "strategies": [k.name for cls in all_strategies() for k in cls.knobs]}[command]
    for name in names:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), name


# -- messages: the problem, in the user's terms -------------------------------------------------


def test_values_read_as_yaml_writes_them():
    assert [shown(v) for v in (None, True, False, 1.5, "fast", {"a": 1}, [1, 2])] == [
        "null", "true", "false", "1.5", "'fast'", '{"a": 1}', "[1, 2]"]
    assert shown("two\nlines") == '"two\\nlines"'  # never breaks the line


GOOD = {"model": "tiny", "tokens": [16], "strategies": {"baseline": {}}}


@pytest.mark.parametrize("overrides, said", [
    ({"measure": {"warmup": None}}, "null"), ({"measure": {"iters": True}}, "true"),
    ({"seed": True}, "true"), ({"dtype": None}, "null"),
])
def test_spec_errors_say_null_and_true(overrides, said):
    with pytest.raises(UserError) as info:
        spec.from_dict(GOOD | overrides, "s", False)
    message = str(info.value)
    assert said in message and "None" not in message and "True" not in message, message


def test_the_tp_message_gives_the_numbers_and_counts_processes():
    with pytest.raises(UserError) as info:
        PRESETS["tiny"].check_tp(3)
    assert "heads (4), kv_heads (2) and ffn (128)" in str(info.value)
    with pytest.raises(UserError) as info:
        spec.from_dict(GOOD | {"tp": 2}, "s", False).resolved_tp(1)
    assert "runs on 1 process;" in str(info.value) and "1 processes" not in str(info.value)


def test_a_store_without_ok_rows_says_its_counts_in_words(tmp_path):
    path = synthetic.write(tmp_path / "r.jsonl", [synthetic.failed("iso", 1024), synthetic.failed("baseline", 1024)])
    with pytest.raises(UserError) as info:
        report.run([path], "table", Console(file=io.StringIO()))
    assert "2 failed rows" in str(info.value) and "{" not in str(info.value)


def test_a_bound_is_never_the_starred_setting(tmp_path):
    """`--sensitivity`: token_split with `comm: none` (no communication, not a correct result) is
    the fastest setting; the star goes to the fastest correct one, as tune picks."""
    rng = random.Random(9)
    rows = []
    for comm, speed in (("none", 0.7), ("nccl", 0.95), ("copy_engine", 0.9)):
        row = synthetic.row("token_split", 4096, {"comm": comm}, samples=synthetic.draw(speed, 0.004, rng))
        rows.append(row | {"checked": comm != "none"})
    rows.append(synthetic.row("baseline", 4096, samples=synthetic.draw(1.0, 0.004, rng)))
    path = synthetic.write(tmp_path / "r.jsonl", rows)
    out = io.StringIO()
    report.run([path], "markdown", Console(file=out, width=200), sensitivity="token_split", tokens=4096)
    starred = [line for line in out.getvalue().splitlines() if "★" in line and line.startswith("|")]
    assert len(starred) == 1 and "copy_engine" in starred[0] and "none" not in starred[0], out.getvalue()
    assert "bound" in out.getvalue()


@pytest.mark.parametrize("way", WAYS, ids=["piped", "terminal"])
def test_a_real_run_with_every_column_fits_80_columns(way):
    """A committed 2-GPU run: speedup, vs best (its fastest baseline is not the default), hidden
    and TF/s all filled, the widest stacked form there is."""
    lines = lines_of(overlapbench("report", "results/h100x2/331cb63/llama3-8b-tp2.jsonl", env={"COLUMNS": "80", **way}))
    assert max(map(len, lines)) <= 80, "\n".join(lines)
    assert any("vs best" in line and "TF/s" in line for line in lines)
