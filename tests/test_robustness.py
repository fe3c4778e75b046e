"""Nothing lost, nothing hangs: failing points, dying and hanging ranks, bad files, fuzzed specs."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from overlapbench.cli import app
from overlapbench.errors import UserError
from overlapbench.specs import spec
from overlapbench.tuning.results import read_rows
from tests import distributed
from tests.test_launch import launch_log_of

PLUGINS = {"OVERLAPBENCH_PLUGINS": "tests.fault_plugin"}


def write_spec(tmp_path: Path, strategies: dict, tokens=(16, 29, 40), timeout_s: int = 60) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({
        "name": "robust", "model": "tiny", "layers": 1, "tokens": list(tokens),
        "strategies": strategies, "measure": {"warmup": 0, "iters": 2, "timeout_s": timeout_s},
    }))
    return path


def sweep(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return distributed.overlapbench("sweep", *args, env=PLUGINS, timeout=timeout)


@pytest.mark.slow
def test_a_failing_point_is_a_row_and_the_sweep_goes_on(tmp_path: Path):
    grid = {"baseline": {}, "fault": {"mode": ["raise", "oom", "oom_in_check", "wrong"], "at_tokens": 29},
            "token_split": {"align": 8}}
    path = write_spec(tmp_path, grid)
    out = tmp_path / "r.jsonl"
    done = sweep(str(path), "--output", str(out))
    assert done.returncode == 0, done.stderr
    rows = read_rows(out)
    assert len(rows) == 3 * 6
    failed = [r for r in rows if r["status"] != "ok"]
    assert [(r["strategy"], r["knobs"]["mode"], r["tokens"]) for r in failed] == [
        ("fault", "raise", 29), ("fault", "oom", 29), ("fault", "oom_in_check", 29), ("fault", "wrong", 29)]
    wrong = failed[3]  # a timing of it would be a result of a wrong computation: there is none
    assert wrong["rel_err"] == pytest.approx(0.05, rel=1e-3) and wrong["ms"] is None and wrong["check"] == "baseline"
    assert wrong["error"] == ("wrong result: rel_err 0.05 > tolerance 0.0001 of baseline's output "
                              "(measure.check: fp32 checks against the fp32 truth)")
    assert failed[0]["error"] == "rank 1: RuntimeError: injected kernel error"
    assert "OutOfMemoryError" in failed[1]["error"] and failed[0]["ms"] is None
    assert failed[2]["error"].startswith("rank 1: OutOfMemoryError") and "in the check" in failed[2]["error"]
    assert all(r["status"] == "ok" for r in rows if r["tokens"] == 40)  # and it went on


@pytest.mark.slow
def test_a_dead_rank_stops_the_sweep_and_resume_completes_it(tmp_path: Path):
    path = write_spec(tmp_path, {"baseline": {}, "fault": {"mode": "crash", "at_tokens": 29}, "no_comm": {}})
    out = tmp_path / "r.jsonl"
    start = time.monotonic()
    died = sweep(str(path), "--output", str(out))
    assert died.returncode != 0 and time.monotonic() - start < 120
    assert "--resume" in died.stderr and "Traceback" not in died.stderr
    assert died.stderr.strip().splitlines() == [died.stderr.strip()]  # one paragraph
    assert "rank 1 exited with code 9 while running point 'fault tokens=29" in died.stderr, died.stderr
    log = launch_log_of(out)  # what the rank printed: named in the paragraph, kept
    assert f"what it printed is in {log}" in died.stderr
    rows = read_rows(out)  # every finished row intact, the point in flight absent
    assert [(r["strategy"], r["tokens"]) for r in rows] == [("baseline", 16), ("fault", 16), ("no_comm", 16), ("baseline", 29)]

    healed = write_spec(tmp_path, {"baseline": {}, "no_comm": {}})
    resumed = sweep(str(healed), "--output", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "4 of 6 points already done" not in resumed.stdout  # a different spec: 3 of 6 are done
    rows = read_rows(out)
    done = {(r["strategy"], r["tokens"]) for r in rows if r["status"] == "ok"}
    assert {(s, t) for s in ("baseline", "no_comm") for t in (16, 29, 40)} <= done
    assert len(rows) == 4 + 3
    assert launch_log_of(out) == log and "exitcode" in log.read_text()  # the clean resume keeps the earlier run's log


@pytest.mark.slow
def test_a_hanging_rank_stops_the_sweep_in_bounded_time(tmp_path: Path):
    path = write_spec(tmp_path, {"baseline": {}, "fault": {"mode": "hang", "at_tokens": 29}}, timeout_s=15)
    out = tmp_path / "r.jsonl"
    start = time.monotonic()
    hung = sweep(str(path), "--output", str(out), timeout=200)
    elapsed = time.monotonic() - start
    assert hung.returncode != 0 and elapsed < 100, (elapsed, hung.stderr[-2000:])
    lines = hung.stderr.strip().splitlines()
    assert len(lines) == 1 and "ran longer than 15 s (measure.timeout_s)" in lines[0], hung.stderr[-2000:]
    assert "point 'fault tokens=29" in lines[0] and "Traceback" not in hung.stderr
    log = launch_log_of(out)
    stacks = log.read_text()  # where each thread was, named in that paragraph
    assert f"stack is in {log}" in lines[0], lines[0]
    assert "where it was" in stacks and "fault_plugin.py" in stacks, stacks[-3000:]
    assert [(r["strategy"], r["tokens"]) for r in read_rows(out)] == [("baseline", 16), ("fault", 16), ("baseline", 29)]


@pytest.mark.slow
def test_same_spec_and_seed_give_the_same_numbers(tmp_path: Path):
    path = write_spec(tmp_path, {"token_split": {"align": 8}, "iso": {}}, tokens=(29,))
    errors = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.jsonl"
        assert sweep(str(path), "--output", str(out)).returncode == 0
        errors.append([r["rel_err"] for r in read_rows(out)])
    assert errors[0] == errors[1] and all(e is not None for e in errors[0])


# --- results files that are not (whole) ours -------------------------------------------------

def ok_row() -> dict:
    from tests import synthetic

    return synthetic.row("baseline", 1024)


@pytest.mark.parametrize(
    "content, message",
    [
        (lambda: json.dumps(ok_row()) + "\n" + json.dumps(ok_row())[:40], "truncated"),
        (lambda: json.dumps(ok_row() | {"schema": "overlapbench/result-v0"}) + "\n", "schema is"),
        (lambda: "time,ms\n1,2\n", "not a JSON line"),
        (lambda: json.dumps({"hello": 1}) + "\n", "no 'schema' field"),
        (lambda: json.dumps([1, 2]) + "\n", "no 'schema' field"),
    ],
)
@pytest.mark.parametrize("command", ["tune", "report"])
def test_bad_results_files_are_one_line_errors(tmp_path: Path, content, message: str, command: str):
    path = tmp_path / "bad.jsonl"
    path.write_text(content())
    result = CliRunner().invoke(app, [command, str(path)])
    assert result.exit_code == 2, result.output
    assert message in result.output and str(path) in result.output and "Traceback" not in result.output


def test_resume_refuses_a_file_that_is_not_ours(tmp_path: Path):
    from overlapbench.tuning.results import ResultStore

    path = tmp_path / "r.jsonl"
    path.write_text("this is a csv,not ours\n")
    with pytest.raises(UserError, match="not a JSON line"):
        ResultStore(path).open(resume=True)
    assert path.read_text() == "this is a csv,not ours\n"  # nothing lost


def test_unwritable_output_is_refused(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    path = write_spec(tmp_path, {"baseline": {}})
    result = CliRunner().invoke(app, ["sweep", str(path), "--output", str(blocker / "r.jsonl")])
    assert result.exit_code == 2 and "cannot write" in result.output


# --- fuzzing spec validation -------------------------------------------------------------------

GOOD = {"name": "f", "model": "tiny", "tp": 2, "layers": 1, "tokens": [16],
        "strategies": {"baseline": {"nccl_max_ctas": [4, 8]}, "token_split": {"align": 8}}}
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 70000), st.floats(allow_nan=True),
                    st.text(max_size=8), st.sampled_from(["default", "balanced", "nccl", "fused", "tiny"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=6)


def _mutate(data, path: list, value):
    if not path:
        return value
    if isinstance(data, dict) and data:
        key = sorted(data, key=str)[path[0] % len(data)]
        return data | {key: _mutate(data[key], path[1:], value)}
    if isinstance(data, list) and data:
        i = path[0] % len(data)
        return data[:i] + [_mutate(data[i], path[1:], value)] + data[i + 1:]
    return value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.lists(st.integers(0, 10), max_size=4), value=values,
       extra=st.dictionaries(st.text(max_size=6), values, max_size=2))
def test_mutated_specs_fail_only_with_a_clean_error(path, value, extra):
    data = _mutate(GOOD, path, value)
    if isinstance(data, dict):
        data = data | extra
    try:
        s = spec.from_dict(data, "fuzz", cuda=False)
        s.points(world_size=2, cuda=False)
    except UserError as e:
        assert str(e) and "\n" not in str(e)


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200))
def test_random_text_is_never_a_traceback(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "s.yaml"
    path.write_text(text)
    try:
        spec.load(path, cuda=False)
    except UserError as e:
        assert "\n" not in str(e)


@pytest.mark.slow
def test_interleaved_candidates_that_do_not_fit_together_are_timed_in_groups_with_the_reference(tmp_path: Path):
    """`fault` runs out of memory beside token_split once: the first group is timed without it,
    then it is timed in a group of its own with baseline; `fault` raising is its own failed row,
    and so is one that runs out of memory in its warm-up, without the group it was in."""
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({
        "name": "groups", "model": "tiny", "layers": 1, "tokens": [29],
        "strategies": {"baseline": {}, "token_split": {"align": 8},
                       "fault": {"mode": ["oom_once", "raise", "oom_in_warmup"], "at_tokens": 29}},
        "measure": {"warmup": 0, "timeout_s": 60, "interleave": True, "span_ms": 2, "settle_ms": 2, "rounds": 5, "warmup_s": 0},
    }, sort_keys=False))
    out = tmp_path / "r.jsonl"
    done = sweep(str(path), "--output", str(out))
    assert done.returncode == 0, done.stderr
    rows = {(r["strategy"], r["knobs"].get("mode")): r for r in read_rows(out)}
    assert len(rows) == 5
    keys = (("baseline", None), ("token_split", None), ("fault", "oom_once"), ("fault", "raise"), ("fault", "oom_in_warmup"))
    base, split, once, raised, warm = (rows[k] for k in keys)
    assert raised["status"] == "failed" and raised["error"] == "rank 1: RuntimeError: injected kernel error"
    assert warm["status"] == "failed" and "OutOfMemoryError" in warm["error"] and "in warm-up" in warm["error"]
    assert {base["status"], split["status"], once["status"]} == {"ok"}
    assert split["pairing"] == once["pairing"] == base["pairing"]
    first, second = set(split["round_ids"]), set(once["round_ids"])
    assert first and second and not first & second and first | second == set(base["round_ids"])
    # the reference's every-rank medians are over its rounds of both groups, none above its ms (the slowest rank's)
    assert len(base["rank_ms"]) == base["world_size"] and max(base["rank_ms"]) <= base["ms"] + 1e-6
    assert once["rel_err"] < 1e-5 and once["speedup_ci"][0] <= once["speedup"] <= once["speedup_ci"][1]


def test_a_scripts_run_log_appends_stamped_rows_and_keeps_what_was_there(tmp_path: Path):
    from overlapbench.tuning.results import RunLog

    path = tmp_path / "deeper" / "bench.jsonl"
    first, second = RunLog(path, "abc123"), RunLog(path, None)
    first.write({"tokens": 7, "ms": 0.25})
    second.write({"tokens": 9, "run_id": "not this"})  # a row cannot pass off another run's id
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["tokens"] for r in rows] == [7, 9] and [r["git"] for r in rows] == ["abc123", None]
    assert rows[0]["run_id"] == first.stamp["run_id"] != rows[1]["run_id"] == second.stamp["run_id"]
