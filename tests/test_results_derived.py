"""The committed reports and tuned YAMLs are what today's `report` and `tune` write from their rows.

A machine README's file-table rows whose code cell says "today's" hold the commands that made
them (`python -m overlapbench tune ROWS --out-dir DIR`, `python -m overlapbench report ROWS
--format markdown > FILE`); each runs again here. A report must match byte for byte; a tuned YAML
in what it decides (each range's strategy, knobs and measured counts, the group, the provenance),
not in the timings and reasons printed beside them. So a change to tune's rule or report's table
fails here until the committed files are made again with the commands the README gives.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from overlapbench.cli import app
from tests import results_readme as rr

PREFIX = ["python", "-m", "overlapbench"]


def _commands() -> list[tuple[rr.Entry, str, list[str]]]:
    found = []
    for readme in rr.readmes():
        for entry in rr.entries(readme):
            if entry.code.startswith("today"):
                found.extend((entry, c, shlex.split(c)) for c in entry.commands())
    return found


COMMANDS = _commands()


def _id(item) -> str:
    args = item[2]
    return args[args.index("--out-dir") + 1] if "--out-dir" in args else args[-1]


def _run(args: list[str]) -> str:
    assert args[:3] == PREFIX, f"not an overlapbench command: {shlex.join(args)}"
    result = CliRunner().invoke(app, args[3:])
    assert result.exit_code == 0, f"{shlex.join(args)} failed: {result.output}"
    return result.stdout


def decisions(doc: dict) -> dict:
    """What a tuned YAML decides: everything but each rule's ms, speedup and why."""
    rules = [{k: r[k] for k in ("tokens", "strategy", "knobs", "measured")} for r in doc["rules"]]
    return {**{k: v for k, v in doc.items() if k != "rules"}, "rules": rules}


def _tuned_files(folder: Path) -> dict[str, dict]:
    return {p.name: decisions(yaml.safe_load(p.read_text())) for p in sorted(folder.glob("*.yaml"))}


def _differences(committed: dict[str, dict], today: dict[str, dict]) -> str:
    """Where two sets of tuned files part: files only in one, else the first rule or field."""
    if set(committed) != set(today):
        return f"files committed {sorted(committed)}, written today {sorted(today)}"
    for name, doc in committed.items():
        for old, new in zip(doc["rules"], today[name]["rules"]):
            if old != new:
                return f"{name}: committed {old}, today {new}"
        for key in doc:
            if doc[key] != today[name][key]:
                return f"{name}: {key} differs"
    return "no difference found"


@pytest.mark.parametrize("item", COMMANDS, ids=_id)
def test_committed_file_is_todays_output(item, tmp_path, monkeypatch):
    entry, command, args = item
    monkeypatch.chdir(rr.ROOT)  # rows are named from the repository root, as tune records them
    again = f"run again: {command} (from {entry.where()})"
    if args[3] == "tune":
        at = args.index("--out-dir") + 1
        _run(args[:at] + [str(tmp_path)] + args[at + 1:])
        today, committed = _tuned_files(tmp_path), _tuned_files(rr.ROOT / args[at])
        assert today == committed, f"{args[at]} is not what tune picks today ({_differences(committed, today)}); {again}"
    elif args[3] == "report" and ">" in args:
        at = args.index(">")
        committed = rr.ROOT / args[at + 1]
        assert _run(args[:at]) == committed.read_text(), f"{args[at + 1]} is not what report prints today; {again}"
    else:
        pytest.fail(f"{entry.where()}: a 'today's' row runs tune --out-dir or report ... > FILE, not {command}")


def test_every_report_and_tuned_yaml_is_made_by_a_command_here():
    """None escapes the check above: each committed report-*.md and tuned YAML is one of the
    files a "today's" command writes."""
    if rr.in_git_checkout():
        pytest.skip(rr.in_git_checkout())
    made = set()
    for _, _, args in COMMANDS:
        if ">" in args:
            made.add(args[args.index(">") + 1])
        elif "--out-dir" in args:
            folder = args[args.index("--out-dir") + 1]
            made.update(p.relative_to(rr.ROOT).as_posix() for p in (rr.ROOT / folder).glob("*.yaml"))
    derived = [p for p in rr.git("ls-files", "results").stdout.split()
               if (Path(p).name.startswith("report-") and p.endswith(".md")) or ("/tuned" in p and p.endswith(".yaml"))]
    assert derived, "no committed reports or tuned YAMLs found"
    assert not sorted(set(derived) - made), f"made by no 'today's' command of a results README: {sorted(set(derived) - made)}"


def test_decisions_leave_out_only_timings_and_reasons():
    rule = {"tokens": [1, 10], "strategy": "iso", "knobs": {"align": 64}, "ms": 1.0, "speedup": 1.1,
            "measured": [8], "why": "8: faster"}
    doc = {"model": "m", "rules": [rule], "provenance": {"sources": ["a.jsonl"]}}
    assert decisions(doc) == decisions({**doc, "rules": [{**rule, "ms": 2.0, "speedup": 1.2, "why": "other"}]})
    assert decisions(doc) != decisions({**doc, "rules": [{**rule, "strategy": "baseline"}]})
    assert decisions(doc) != decisions({**doc, "provenance": {"sources": ["b.jsonl"]}})
