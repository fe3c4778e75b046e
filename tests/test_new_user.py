"""What a new user meets first, each through the command line where they meet it: literal text,
tables at any width, an installed package, the files commands read and write, progress and
Ctrl-C, help text."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from overlapbench import strategies, tuned
from overlapbench.errors import UserError
from overlapbench.tuning.results import read_rows
from tests import synthetic
from tests.distributed import REPO, overlapbench

TINY = """
name: tiny-new-user
model: tiny
layers: 2
tokens: [16]
strategies:
  baseline: {}
  token_split: {align: 8}
measure: {warmup: 1, iters: 2, timeout_s: 60}
"""
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def spec(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The command failed as bad input does: exit 2, one line on stderr, no traceback."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def store(tmp_path: Path, name: str = "r.jsonl", **where) -> Path:
    """A layer results file where token_split (long knob values) wins at every size."""
    rng = random.Random(name)
    rows = []
    for tokens in (512, 2048, 8192):
        rows.append(synthetic.row("baseline", tokens, median=tokens / 1000, rng=rng, **where))
        rows.append(synthetic.row("token_split", tokens, {"comm": "nccl", "align": 128, "split_offset": 64},
                                  median=tokens / 1300, rng=rng, **where))
        rows.append(synthetic.row("iso", tokens, {"comm": "nccl", "split_ratio": "balanced", "align": 64},
                                  median=tokens / 1200, rng=rng, **where))
    return synthetic.write(tmp_path / name, rows)


# -- user text and our own brackets print literally -----------------------------------------


@pytest.mark.parametrize("key", ["[/bold]", "[red]layers", "[link=x]y[/link]"])
def test_a_spec_key_that_looks_like_markup_is_quoted_as_written(tmp_path, key):
    path = spec(tmp_path, TINY + f'"{key}": 1\n')
    line = one_line_error(overlapbench("sweep", str(path)))
    assert f"{key}: unknown key" in line


def test_our_own_brackets_survive(tmp_path):
    path = spec(tmp_path, "model: tiny\ntokens: [8]\nstrategies: {}\n")
    assert "{strategy: {knob: value or [values]}}" in one_line_error(overlapbench("sweep", str(path)))


def test_the_plot_hint_names_the_extra(tmp_path):
    fake = tmp_path / "fake" / "matplotlib"  # an installed-but-broken matplotlib: the import fails
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    result = overlapbench("report", str(store(tmp_path)), "--plot", str(tmp_path / "p.png"),
                          env={"PYTHONPATH": f"{tmp_path / 'fake'}{os.pathsep}{REPO}"})
    assert "pip install 'overlapbench[plot]'" in one_line_error(result)


def test_a_path_with_brackets_prints_as_given(tmp_path):
    out = tmp_path / "tun[v2]"
    result = overlapbench("tune", str(store(tmp_path)), "--out-dir", str(out))
    assert result.returncode == 0, result.stderr
    written = [line.removeprefix("wrote ") for line in result.stdout.splitlines() if line.startswith("wrote ")]
    assert written and all(Path(w).exists() and Path(w).parent == out for w in written)


def test_no_console_interprets_markup():
    """The class, not the cases: every console comes from printing.console (markup off), and no
    message carries rich markup (our colours are Text styles)."""
    offenders = []
    for path in (REPO / "overlapbench").rglob("*.py"):
        if path.name == "printing.py":
            continue
        text = path.read_text()
        if re.search(r"\bConsole\(", text) or re.search(r"\[/?(bold|red|green|yellow|dim)\b[^\]]*\]", text):
            offenders.append(path.relative_to(REPO))
    assert not offenders


# -- tables at 80 columns and in pipes ------------------------------------------------------


WINNING_KNOBS = ("align=128", "split_offset=64", "comm=nccl")


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal-80"])
def test_the_report_never_cuts_knob_values(tmp_path, terminal):
    env = {"COLUMNS": "80", **({"FORCE_COLOR": "1"} if terminal else {})}
    result = overlapbench("report", str(store(tmp_path)), env=env)
    assert result.returncode == 0, result.stderr
    text = ANSI.sub("", result.stdout)
    assert "…" not in text
    for knob in WINNING_KNOBS:
        assert knob in text, text
    if terminal:
        assert max(len(line) for line in text.splitlines()) <= 80, text


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal-80"])
def test_models_shows_every_preset_name_whole(terminal):
    from overlapbench.model.models import PRESETS

    result = overlapbench("models", env={"COLUMNS": "60", **({"FORCE_COLOR": "1"} if terminal else {})})
    text = ANSI.sub("", result.stdout)
    assert "…" not in text
    for name in PRESETS:
        assert re.search(rf"\b{re.escape(name)}\b", text), text


# -- an installed package runs the default spec from any folder -----------------------------


def test_the_packaged_default_spec_is_sweeps_quick():
    assert (REPO / "overlapbench" / "specs" / "quick.yaml").read_text() == (REPO / "sweeps" / "quick.yaml").read_text()


def test_the_demo_shows_every_family_within_a_minute_of_points():
    from overlapbench.specs import spec as spec_mod

    loaded = spec_mod.load(REPO / "sweeps" / "quick.yaml", cuda=True)
    points = loaded.points(2, cuda=True)
    names = {p.strategy for p in points}
    assert {"baseline", "fused_norm", "token_split", "iso", "sp_baseline", "async_tp", "flash_agrs"} <= names
    assert len(points) <= 22  # ~2.5 s a point on 2 H200s with the demo's short timing


@pytest.mark.slow
def test_an_installed_overlapbench_runs_its_default_sweep_from_any_folder(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for part in ("pyproject.toml", "README.md", "overlapbench", "kernels"):
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copy
        copy(REPO / part, source / part, **({"ignore": shutil.ignore_patterns("__pycache__")} if (REPO / part).is_dir() else {}))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, timeout=300)
    assert (target / "overlapbench" / "specs" / "quick.yaml").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(target)}
    result = subprocess.run([sys.executable, "-m", "overlapbench", "sweep", "-o", "r.jsonl"], cwd=elsewhere, env=env,
                            capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr
    rows = read_rows(elsewhere / "r.jsonl")
    assert {r["strategy"] for r in rows} >= {"baseline", "sp_baseline", "async_tp", "flash_agrs", "iso", "token_split"}
    by = {(r["strategy"], r["status"]) for r in rows}
    assert ("sp_baseline", "ok") in by and ("flash_agrs", "ok") in by  # the SP family runs on gloo
    assert all(r["error"] for r in rows if r["status"] == "skipped")  # async_tp, fused: skipped with the reason
    assert "FutureWarning" not in result.stderr + result.stdout  # torch 2.13's renamed collectives


# -- which files are read and written --------------------------------------------------------


@pytest.mark.parametrize("command", ["tune", "report"])
def test_a_command_given_no_file_says_which_it_read(tmp_path, command):
    store(tmp_path / "results", "mine.jsonl")
    result = overlapbench(command, cwd=tmp_path, env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert f"reading {Path('results') / 'mine.jsonl'}" in result.stderr


def test_two_custom_shapes_get_two_tuned_files(tmp_path):
    outs = []
    for i, hidden in enumerate((256, 512)):
        rows = [json.loads(line) for line in store(tmp_path, f"s{i}.jsonl").read_text().splitlines()]
        shape = {"hidden": hidden, "ffn": 2 * hidden, "heads": 4, "kv_heads": 2, "head_dim": hidden // 4}
        for row in rows:
            row["model"], row["shape"] = "custom", shape
            row["key"] = None  # the key holds the shape; rebuilt from the fields
        synthetic.write(tmp_path / f"s{i}.jsonl", rows)
        result = overlapbench("tune", str(tmp_path / f"s{i}.jsonl"), "--out-dir", str(tmp_path / "tuned"))
        assert result.returncode == 0, result.stderr
        outs += [line.removeprefix("wrote ") for line in result.stdout.splitlines() if line.startswith("wrote ")]
    assert len(set(outs)) == 2
    shapes = {json.dumps(tuned.load(p).shape, sort_keys=True) for p in outs}
    assert len(shapes) == 2  # both still there, each its own shape


@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_output_on_a_folder_is_one_clear_line(tmp_path, resume):
    line = one_line_error(overlapbench("sweep", str(spec(tmp_path, TINY)), "-o", str(tmp_path), *resume))
    assert "is a folder" in line and ".jsonl" in line


def test_a_key_given_twice_is_refused_with_its_line(tmp_path):
    path = spec(tmp_path, "model: tiny\nlayers: 2\ntokens: [8]\nlayers: 3\nstrategies: [baseline]\n")
    line = one_line_error(overlapbench("sweep", str(path)))
    assert "line 4: layers is given twice (first at line 2)" in line


# -- tuned configs: what an engine loads is checked against the strategies ------------------


def tuned_text(strategy: str = "token_split", knobs: str = "{comm: nccl, align: 128}") -> str:
    return (f"schema: {tuned.SCHEMA}\ndevice: cpu\nworld_size: 2\ntp: 2\nmodel: tiny\nshape: {{hidden: 64}}\n"
            f"dtype: fp32\nrules:\n- {{tokens: [1, 100], strategy: {strategy}, knobs: {knobs}}}\n")


@pytest.mark.parametrize("strategy, knobs, message", [
    ("tokn_split", "{}", "unknown strategy 'tokn_split' (did you mean 'token_split'?)"),
    ("token_split", "{align: 0}", "rules[0].knobs.align: 0 is outside"),
    ("token_split", "{comm: magic}", "rules[0].knobs.comm: 'magic' is not one of"),
    ("token_split", "{chunk: 2}", "rules[0].knobs.chunk: unknown knob for 'token_split'"),
])
def test_tuned_load_checks_strategies_and_knobs(tmp_path, strategy, knobs, message):
    path = spec(tmp_path, tuned_text(strategy, knobs), "t.yaml")
    with pytest.raises(UserError, match=re.escape(message)):
        tuned.load(path)


def test_tuned_load_accepts_what_tune_writes_with_reset_knobs(tmp_path):
    knobs = json.dumps(strategies.get("token_split").check_knobs({"comm": "nccl"}, "x"))  # comm_ctas_* reset to null
    assert tuned.load(spec(tmp_path, tuned_text("token_split", knobs), "t.yaml")).choose(5).strategy == "token_split"


def test_choose_refuses_a_bool(tmp_path):
    config = tuned.load(spec(tmp_path, tuned_text(), "t.yaml"))
    with pytest.raises(TypeError):
        config.choose(True)


def test_a_tuned_key_given_twice_is_refused(tmp_path):
    with pytest.raises(UserError, match="line 3: world_size is given twice"):
        tuned.load(spec(tmp_path, "schema: x\nworld_size: 2\nworld_size: 4\n", "t.yaml"))


# -- progress, Ctrl-C, --profile, oversubscription ------------------------------------------


@pytest.mark.slow
def test_progress_says_what_runs_and_counts(tmp_path):
    path = spec(tmp_path, TINY.replace("token_split: {align: 8}", "token_split: {align: 8}\n  sp_baseline: {}"))
    result = overlapbench("sweep", str(path), "-o", str(tmp_path / "r.jsonl"), env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "tiny-new-user: 3 points on 2 CPU processes (gloo)" in result.stdout
    assert [m for m in re.findall(r"\[(\d)/3\]", result.stdout)] == ["1", "2", "3"]
    assert "=None" not in result.stdout
    assert "Warning" not in result.stdout + result.stderr  # e.g. torch's deprecation of all_gather_into_tensor


def _processes_naming(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace"):
                found.append(cmdline.parent.name)
        except OSError:  # gone meanwhile
            pass
    return found


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["ctrl_c", "sigterm"])
def test_ctrl_c_says_one_thing_and_exits_130(tmp_path, stop):
    """The terminal's Ctrl-C (SIGINT to the whole foreground group), or a SIGTERM to the command
    alone (a scheduler's): one line, exit 130, the finished rows kept, no worker left running."""
    out = tmp_path / "r.jsonl"
    path = spec(tmp_path, TINY.replace("tokens: [16]", "tokens: [16, 17, 18, 19, 20, 21, 22, 23]"))
    env = os.environ | {"PYTHONPATH": str(REPO), "COLUMNS": "200"}
    child = subprocess.Popen([sys.executable, "-m", "overlapbench", "sweep", str(path), "-o", str(out)], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    for line in child.stdout:  # once a point is done
        if re.search(r"\[\s*1/\d+\]", line):
            break
    if stop == "ctrl_c":
        os.killpg(child.pid, signal.SIGINT)
    else:
        child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 130
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    count = len(read_rows(out))
    assert lines[0].startswith(f"interrupted; {count} finished row") and f"in {out};" in lines[0]
    assert f"--output {out} --resume" in lines[0]
    assert read_rows(out)  # the finished rows are there
    assert _processes_naming(str(path)) == []  # torchrun and its workers are gone too


def test_profile_on_cpu_says_it_needs_cuda(tmp_path):
    folder = tmp_path / "prof"
    line = one_line_error(overlapbench("sweep", str(spec(tmp_path, TINY)), "--profile", str(folder)))
    assert "needs CUDA" in line and not folder.exists()


def test_more_processes_than_cores_warns(tmp_path):
    bad = spec(tmp_path, TINY.replace("model: tiny", "model: tiny\ntp: 1"))  # refused before anything launches
    result = overlapbench("sweep", str(bad), "--nproc", str((os.cpu_count() or 1) + 1))
    assert result.returncode == 2
    assert "warning: --nproc" in result.stderr and "more processes than the" in result.stderr


def test_report_renders_a_comm_results_file():
    result = overlapbench("report", str(REPO / "results" / "h200x2" / "comm-h200x2.jsonl"), env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "busbw" in result.stdout and "#wrong total: 0" in result.stdout


# -- help text --------------------------------------------------------------------------------


COMMANDS = ["sweep", "comm", "tune", "report", "strategies", "models", "env"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_no_type_placeholders_for_flags_or_files(command):
    result = overlapbench(command, "--help", env={"COLUMNS": "120"})
    assert result.returncode == 0
    assert "<bool>" not in result.stdout and "<list[" not in result.stdout


def test_short_flags_mean_one_thing():
    """`-f` is comm's --factor (as in nccl-tests); report's --format has no short form."""
    shorts = {}
    for command in COMMANDS:
        for flag, long in re.findall(r"│ (--[\w-]+)\s+(-\w)\b", overlapbench(command, "--help", env={"COLUMNS": "200"}).stdout):
            shorts.setdefault(long, set()).add(flag)
    assert all(len(longs) == 1 for longs in shorts.values()), shorts


def test_version():
    from overlapbench import __version__

    result = overlapbench("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"overlapbench {__version__}"


def test_strategies_descriptions_use_the_width_and_defaults_read_as_yaml():
    text = overlapbench("strategies", env={"COLUMNS": "100"}).stdout
    lines = text.splitlines()
    for cls in strategies.all_strategies():
        full = f"{cls.name}: {cls.summary}"
        header = next(line for line in lines if line.startswith(f"{cls.name}: "))
        assert header.rstrip() == full or len(header.rstrip()) > 80, header  # wrapped at the width, not at 40
    assert " None " not in text and " null " in text


def test_a_wrong_knob_type_reads_as_english(tmp_path):
    path = spec(tmp_path, "model: tiny\ntokens: [8]\nstrategies: {token_split: {align: abc}}\n")
    assert "'abc' is not an int in [1, 4096]" in one_line_error(overlapbench("sweep", str(path)))
