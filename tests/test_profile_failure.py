"""`sweep --profile`: a point whose profiling fails keeps its timed, ok row, with `profile_error`
naming the part that failed and why; the ranks agree and go on to the next point; `report
--profile` lists the points left without a profile. The rank code runs in-process on gloo (the
command refuses --profile without GPUs), profiling made to fail by tests/fault_plugin.py's modes
(on every rank before the forwards' collectives, or on rank 1 only after the eager timeline's),
and, at STRUCK_TOKENS, by a baseline whose profiled forwards raise: the interleaved mode's
reference among them."""

from __future__ import annotations

import importlib
import json
import os
import random
import re
from pathlib import Path

import pytest
import yaml

from overlapbench.timing import timeline
from overlapbench.tuning.results import profile_name, read_rows
from tests import distributed

TOKENS = (16, 24, 32)
STRUCK_TOKENS = 32  # baseline's profiled forwards raise here: the reference's, and fault's (built on baseline's step)
FAULT_TOKENS = 16
MODES = ("raise_in_profile", "oom_in_profile", "raise_in_timeline")
DEAD = "CUDA error: an illegal memory access was encountered (injected by the test's probe)"


def write_spec(tmp_path: Path, interleave: bool, modes=MODES, tokens=TOKENS) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({
        "name": "profile-failure", "model": "tiny", "layers": 1, "tokens": list(tokens),
        "strategies": {"baseline": {}, "fault": {"mode": list(modes), "at_tokens": FAULT_TOKENS, "on_rank": 1}},
        "measure": {"warmup": 1, "iters": 2, "timeout_s": 60, "interleave": interleave},
    }))
    return path


def _sweep(rank: int, world: int, spec_path: str, out: str, folder: str, dead_device: bool) -> int:
    """The rank code of `sweep --profile`, with the fault plugin's strategy registered, baseline's
    profiled forwards raising at STRUCK_TOKENS and, with `dead_device`, rank 1's device probe
    failing after a failed profile (a GPU a CUDA error left unusable)."""
    from overlapbench.run import sweep
    from overlapbench.run.command import work
    from overlapbench.specs import spec
    from overlapbench.strategies.baseline import Baseline

    # Loaded as OVERLAPBENCH_PLUGINS loads a plugin, by name: a `from tests import fault_plugin` would
    # be imported by tests/test_imports_resolve.py too, registering `fault` in the pytest process.
    fault_plugin = importlib.import_module("tests.fault_plugin")

    os.environ["COLUMNS"] = "400"  # rank 0's summary lines unwrapped
    build = Baseline.build.__func__

    def struck_build(cls, ctx, knobs):
        step = build(cls, ctx, knobs)
        return fault_plugin._in_profile(step, "raise_in_profile") if ctx.tokens == STRUCK_TOKENS else step

    Baseline.build = classmethod(struck_build)
    if dead_device:
        def probe(rt):
            if rt.rank == 1:
                raise RuntimeError(DEAD)

        sweep._probe_device = probe
    return work(spec.load(Path(spec_path), cuda=False), Path(out), False, Path(folder))


def _name(row: dict) -> str:
    return profile_name(row["strategy"], row["tokens"], row["knobs"], layers=row["layers"])


def _expected_error(row: dict) -> str | None:
    """What the row's profile_error must say (a regular expression), None where its profile is whole."""
    if row["tokens"] == STRUCK_TOKENS:
        return r"profiling the kernel table failed: rank 0: RuntimeError: injected in a profiled forward .*\[profile\]"
    if row["strategy"] != "fault" or row["tokens"] != FAULT_TOKENS:
        return None
    return {"raise_in_profile": r"profiling the kernel table failed: rank 0: RuntimeError: injected in a profiled forward",
            "oom_in_profile": r"profiling the kernel table failed: rank 0: OutOfMemoryError: CUDA out of memory",
            "raise_in_timeline": r"profiling the eager timeline failed: rank 1: RuntimeError: injected after the eager "
                                 r"timeline's forward"}[row["knobs"]["mode"]]


@pytest.mark.slow
@pytest.mark.parametrize("interleave", [False, True], ids=["sequential", "interleaved"])
def test_a_failed_profile_keeps_the_rows_timing_and_says_why(tmp_path, capfd, interleave):
    out, folder = tmp_path / "r.jsonl", tmp_path / "profile"
    folder.mkdir()
    knobs = {"mode": "raise_in_profile", "at_tokens": FAULT_TOKENS, "on_rank": 1}
    stale = folder / f"{profile_name('fault', FAULT_TOKENS, knobs, layers=1)}.txt"
    stale.write_text(f"{random.randrange(2, 9)} eager forwards\n(an earlier run's table)\n")  # a failed profile removes it
    # every rank's timelines of the failed part and the later ones are removed, rank 1's too: an earlier
    # run's rank-1 eager timeline where the kernel table fails, and where the eager timeline fails on rank 1
    # (which then writes none of its own)
    stale_timelines = [folder / timeline.file_name(profile_name("fault", FAULT_TOKENS, knobs | {"mode": mode}, layers=1),
                                                   rank=rank)
                       for mode in ("raise_in_profile", "raise_in_timeline") for rank in (0, 1)]
    for path in stale_timelines:
        path.write_text(json.dumps({"schema": timeline.SCHEMA, "stale": random.random()}))
    points = len(TOKENS) * (1 + len(MODES))
    # every rank returns from the sweep (rank 0 wrote every row): none waits for another in a collective
    assert distributed.run(_sweep, str(write_spec(tmp_path, interleave)), str(out), str(folder), False,
                           timeout=400) == [points, 0]
    rows = read_rows(out)
    assert len(rows) == points and {r["status"] for r in rows} == {"ok"}, [(r["strategy"], r["error"]) for r in rows]
    assert {r["timing"] for r in rows} == {"interleaved" if interleave else "sequential"}
    assert all(r["ms"] > 0 and len(r["samples_ms"]) >= 2 and r["error"] is None for r in rows)
    failed = 0
    for r in rows:
        name, expected = _name(r), _expected_error(r)
        table, eager = folder / f"{name}.txt", [folder / timeline.file_name(name, rank=rank) for rank in (0, 1)]
        if expected is None:
            assert r["profile_error"] is None, (name, r["profile_error"])
            assert table.read_text().startswith("3 eager forwards\n")
            assert [(json.loads(e.read_text())["device"], json.loads(e.read_text())["rank"]) for e in eager] == [
                ("cpu", 0), ("cpu", 1)], name  # each rank's own
            continue
        failed += 1
        assert re.fullmatch(expected + ".*", r["profile_error"]), (name, r["profile_error"])
        assert "\n" not in r["profile_error"]
        assert not [e.name for e in eager if e.exists()], name  # the failed part's files are removed, every rank's
        assert table.is_file() == ("eager timeline" in r["profile_error"]), name  # the parts before it are kept
    assert failed == len(MODES) + 1 + len(MODES)  # fault's at FAULT_TOKENS, every point at STRUCK_TOKENS
    assert stale.name in {f"{_name(r)}.txt" for r in rows} and not stale.exists()
    assert not [path.name for path in stale_timelines if path.exists()]

    printed = capfd.readouterr().out  # rank 0's summary lines: ok, the time, then why there is no profile
    for r in rows:
        if r["profile_error"] is not None:
            assert re.search(rf"ok {re.escape(r['strategy'])} tokens={r['tokens']} .*ms/layer.* · "
                             rf"{re.escape(r['profile_error'])}", printed), (r["profile_error"], printed)

    report = distributed.overlapbench("report", str(out), "--profile", str(folder), env={"COLUMNS": "250"})
    assert report.returncode == 0, report.stderr
    for r in rows:
        name = _name(r)
        if r["profile_error"] is None:
            assert re.search(rf"^{re.escape(name)}: no device kernels in its timeline", report.stdout, re.M), report.stdout
        elif "eager timeline" in r["profile_error"]:  # its table is whole: tallied, its missing timeline says why
            assert f"{name}: no timeline beside its table ({r['profile_error']})" in report.stdout, report.stdout
        else:
            assert f"{name}: no profile: {r['profile_error']}" in report.stdout, report.stdout


@pytest.mark.slow
@pytest.mark.parametrize("interleave", [False, True], ids=["sequential", "interleaved"])
def test_a_device_left_unusable_by_a_failed_profile_fails_the_row(tmp_path, interleave):
    """A profile that fails and leaves the GPU unusable (its probe fails on some rank) fails the
    point as any phase does: its timing is not trusted, and the rows after it say the same."""
    out, folder = tmp_path / "r.jsonl", tmp_path / "profile"
    folder.mkdir()
    spec = write_spec(tmp_path, interleave, modes=("raise_in_profile",), tokens=(FAULT_TOKENS, 24))
    assert distributed.run(_sweep, str(spec), str(out), str(folder), True, timeout=300) == [4, 0]
    rows = {(r["strategy"], r["tokens"]): r for r in read_rows(out)}
    struck = rows["fault", FAULT_TOKENS]
    assert struck["status"] == "failed" and struck["ms"] is None and struck["profile_error"] is None
    assert struck["error"] == ("profiling the kernel table failed: rank 0: RuntimeError: injected in a profiled forward "
                               f"by the fault plugin [profile]; then the device failed: rank 1: RuntimeError: {DEAD}")
    for key in [("baseline", FAULT_TOKENS), ("baseline", 24), ("fault", 24)]:  # profiled whole: the probe never ran
        assert rows[key]["status"] == "ok" and rows[key]["profile_error"] is None, rows[key]


def test_the_report_of_a_folder_where_every_profile_failed_lists_them(tmp_path):
    """No table at all: not the 'give the results file of the sweep' error, but each point and why."""
    from tests import synthetic

    rng = random.Random()
    why = lambda: f"profiling the kernel table failed: rank {rng.randrange(2)}: RuntimeError: [bold]x{rng.random()}"
    rows = [synthetic.row(s, t, samples=synthetic.draw(rng.uniform(0.5, 2), 0.01, rng, n=6)) | {"profile_error": why()}
            for s in ("baseline", "token_split") for t in (1024, 4096)]
    path = synthetic.write(tmp_path / "r.jsonl", rows)
    folder = tmp_path / "profile"
    folder.mkdir()
    for fmt, stream in (("table", "stdout"), ("markdown", "stdout"), ("json", "stderr")):
        result = distributed.overlapbench("report", str(path), "--profile", str(folder), "--format", fmt,
                                          env={"COLUMNS": "250"})
        assert result.returncode == 0, result.stderr
        for r in rows:
            name = profile_name(r["strategy"], r["tokens"], r["knobs"], r.get("decode"), r.get("layers"))
            assert f"{name}: no profile: {r['profile_error']}" in getattr(result, stream), (fmt, result.stdout, result.stderr)
    empty = distributed.overlapbench("report", str(synthetic.write(tmp_path / "ok.jsonl", [r | {"profile_error": None}
                                                                                          for r in rows])),
                                     "--profile", str(folder))
    assert empty.returncode == 2 and "no table in" in empty.stderr, empty.stderr


class MatmulStep:
    """A step whose forward is one matmul: enough for a CPU profile's files."""

    def __init__(self) -> None:
        import torch

        self.w = torch.randn(32, 48)

    def forward(self, x):
        return x @ self.w


def test_a_profile_that_kept_its_timelines_but_failed_later_says_so_under_its_line(tmp_path):
    """Where a later part failed (the replay's timeline, on GPUs), the point's line is as ever and
    a note under it says its profile is incomplete and why; its record carries profile_error."""
    import torch

    from overlapbench.report.exposed_view import sections
    from overlapbench.report.profile import Account, profile_view
    from overlapbench.timing import measure

    rng = random.Random()
    table = tmp_path / "baseline-16-1layers.txt"
    for part in measure.profile_parts(MatmulStep(), torch.randn(16, 32), table):
        part.run()
    error = f"profiling the replay timeline failed: rank {rng.randrange(2)}: RuntimeError: CUPTI [x{rng.random()}]"
    found = {("g", 16): [Account("baseline-16-1layers", 16, "g", {"gemm": rng.random()}, rng.random(), error)]}
    parts, records = sections(found, tmp_path)
    assert parts[0].line.splitlines()[0].startswith("baseline-16-1layers: no device kernels in its timeline")
    assert parts[0].line.splitlines()[1] == f"  profile incomplete: {error}"
    assert profile_view(found)[1][0]["profile_error"] == error
    whole = {("g", 16): [Account("baseline-16-1layers", 16, "g", {"gemm": rng.random()}, rng.random())]}
    assert len(sections(whole, tmp_path)[0][0].line.splitlines()) == 1 and "profile_error" not in profile_view(whole)[1][0]
