"""The engines' default-path facts (overlapbench/export/*_facts.py): each names its file, the text of
its line and the line per release read; tests/checks/engine_facts.py reads them back from the
wheels. Here: the tables are whole, the check finds a moved or missing fact in a wheel made up on
the spot, and, where the engines' wheels are on this machine, every fact holds in them."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from overlapbench.export import sglang_facts, trtllm_facts, vllm_facts
from overlapbench.export.facts import Fact, find, releases_read, walk, with_lines
from tests.checks import engine_facts

WHEELS = sorted(Path("/work/wheels").glob("*.whl"))


def test_every_default_path_fact_has_a_line_in_each_release_read():
    assert vllm_facts.DEFAULTS_READ == ["0.31.0", "0.33.0"] and sglang_facts.DEFAULTS_READ == ["0.5.23"]
    for module in (vllm_facts, sglang_facts):
        for name, fact in walk(module.FACTS):
            assert fact.file.startswith(("vllm/", "sglang/")) and fact.text, name
            assert all(isinstance(line, int) and line > 0 for line in fact.lines.values()), name
    assert walk(vllm_facts.SP_FACTS) and all(f.lines == {"0.31.0": f.lines["0.31.0"]} for _, f in walk(vllm_facts.SP_FACTS))
    for name, fact in walk(trtllm_facts.FACTS):  # from a repository: a commit and a function instead of lines
        assert fact.where and not fact.lines, name


def test_the_tables_hold_what_the_exports_use():
    assert find(vllm_facts.FACTS, "FUSION_MAX_MB", 90, 8).value == 0.5
    assert find(vllm_facts.FACTS, "SYMM_MEM_MAX", 90, 4).value == 32 << 20
    assert find(vllm_facts.FACTS, "FUSION_MAX_MB", 100, 2) is None  # not read: no number guessed
    assert find(sglang_facts.FACTS, "CUSTOM_AR_V2_MAX").value == 16 << 20
    assert find(vllm_facts.FACTS, "STEP_CAP_SERVE").cite("0.33.0") == "vllm/engine/arg_utils.py:2991"


def test_a_release_is_read_only_where_every_fact_has_its_line():
    tables = {"A": Fact(1, "f.py", "a = 1"), "B": {2: Fact(2, "f.py", "b = 2")}}
    lines = {"1.0": {"A": 3, "B[2]": 4}, "2.0": {"A": 5}}
    attached = with_lines(tables, lines)
    assert find(attached, "B", 2).lines == {"1.0": 4} and releases_read(attached) == ["1.0"]


def _wheel(tmp_path: Path, text: str) -> zipfile.ZipFile:
    path = tmp_path / "w.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pkg/f.py", text)
    return zipfile.ZipFile(path)


def test_the_check_finds_a_fact_in_place_moved_missing_or_not_yet_cited(tmp_path):
    wheel = _wheel(tmp_path, "x = 0\nMAX = 64  # MiB\ny = 1\n")
    fact = Fact(64, "pkg/f.py", "MAX = 64", {"1.0": 2})
    assert engine_facts.check_fact(wheel, "1.0", fact)["status"] == "ok"
    moved = engine_facts.check_fact(wheel, "1.0", Fact(64, "pkg/f.py", "MAX = 64", {"1.0": 1}))
    assert moved["status"] == "moved" and moved["lines"] == [2]
    assert engine_facts.check_fact(wheel, "1.0", Fact(32, "pkg/f.py", "MAX = 32", {"1.0": 2}))["status"] == "missing"
    found = engine_facts.check_fact(wheel, "2.0", fact)
    assert found["status"] == "found" and found["lines"] == [2] and found["near"] == 2
    assert engine_facts.check_fact(wheel, "1.0", Fact(1, "pkg/g.py", "z", {"1.0": 1}))["status"] == "missing"


@pytest.mark.skipif(not WHEELS, reason="the engines' wheels are not on this machine (/work/wheels)")
@pytest.mark.parametrize("wheel", WHEELS, ids=lambda p: p.name.split("-")[0] + "-" + p.name.split("-")[1])
def test_every_fact_holds_in_the_engines_wheels(wheel):
    engine, release, results = engine_facts.check_wheel(wheel)
    read = vllm_facts.DEFAULTS_READ if engine == "vllm" else sglang_facts.DEFAULTS_READ
    if release not in read:
        pytest.skip(f"{engine} {release}: its defaults were not read")
    assert results and {name: r for name, r in results.items() if r["status"] != "ok"} == {}
