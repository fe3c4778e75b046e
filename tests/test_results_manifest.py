"""Every committed result file is mapped to the command and commit that made it.

Each machine folder under results/ has a README whose file tables (tests/results_readme.py says
how they are read) list every committed file there; every pattern there names a file that exists,
every commit named exists, and every run id named is a run of the rows it stands beside. Rows carry
`run_id` and `git`; the files written before they did are the ones the README lists as such.
"""

from __future__ import annotations

import json

import pytest

from overlapbench.timing import timeline
from tests import results_readme as rr

READMES = rr.readmes()


def _need_git() -> None:
    why = rr.in_git_checkout()
    if why:
        pytest.skip(why)


def _id(readme) -> str:
    return readme.parent.name


def test_every_machine_folder_has_a_readme():
    _need_git()
    folders = {p.split("/")[1] for p in rr.git("ls-files", "results").stdout.split() if p.count("/") >= 2}
    without = sorted(f for f in folders if not (rr.RESULTS / f / "README.md").is_file())
    assert not without, f"results/{without[0]}/ has committed files but no README.md mapping them to commands"


@pytest.mark.parametrize("readme", READMES, ids=_id)
def test_every_committed_file_is_mapped(readme):
    _need_git()
    entries = rr.entries(readme)
    unmapped = [f for f in rr.tracked(readme.parent) if f != "README.md" and not any(e.matches(f) for e in entries)]
    assert not unmapped, (f"{readme.relative_to(rr.ROOT)} does not say which command made "
                          f"{len(unmapped)} committed files, e.g. {unmapped[:5]}: add them to a row of its file tables")


@pytest.mark.parametrize("readme", READMES, ids=_id)
def test_every_pattern_names_a_committed_file(readme):
    _need_git()
    files = rr.tracked(readme.parent)
    empty = [(e.where(), p) for e in rr.entries(readme) for p in e.patterns
             if not any(rr.matches(p, f) for f in files)]
    assert not empty, f"patterns that name no committed file: {empty}"


@pytest.mark.parametrize("readme", READMES, ids=_id)
def test_every_commit_named_exists(readme):
    _need_git()
    named = set(rr.commits_named(readme.read_text()))
    missing = rr.missing_commits(named)
    assert not missing, (f"{readme.relative_to(rr.ROOT)} names commits this repository does not have: {missing} "
                         f"(find the true one with `git log --all -- <file>`)")


def _run_ids(folder, files) -> set[str]:
    ids = set()
    for name in files:
        if name.endswith(".jsonl"):
            for line in (folder / name).read_text().splitlines():
                if line.strip():
                    ids.add(json.loads(line).get("run_id"))
    return ids


@pytest.mark.parametrize("readme", READMES, ids=_id)
def test_every_run_id_named_is_in_its_rows(readme):
    """A table row's run ids are runs of that row's files (a replaced run: of the files at a commit
    the row names); run ids elsewhere in the README are runs of some file of the folder."""
    _need_git()
    folder, files = readme.parent, rr.tracked(readme.parent)
    wrong = []
    for entry in rr.entries(readme):
        own = _run_ids(folder, [f for f in files if entry.matches(f)])
        for run in rr.run_ids_named(entry.text):
            in_history = any(rr.git("grep", "-q", run, c, "--", str(folder.relative_to(rr.ROOT))).returncode == 0
                             for c in rr.commits_named(entry.text))
            if run not in own and not in_history:
                wrong.append((entry.where(), run))
    rows_text = "\n".join(line for line in readme.read_text().splitlines() if not line.startswith("|"))
    every = _run_ids(folder, files)
    wrong += [("outside the tables", run) for run in rr.run_ids_named(rows_text) if run not in every]
    assert not wrong, f"run ids not found in the rows they are named with: {wrong}"


# The reading itself -----------------------------------------------------------------------


def test_patterns_name_what_they_say():
    assert rr.expand("a-{x,y}.{jsonl,log}") == ["a-x.jsonl", "a-x.log", "a-y.jsonl", "a-y.log"]
    assert rr.matches("df28d53/report-*.md", "df28d53/report-llama3-8b-tp2.md")
    assert not rr.matches("report-*.md", "df28d53/report-llama3-8b-tp2.md")  # `*` stays within a name
    assert rr.matches("tuned/", "tuned/sp/llama3-8b-tp2-nvidia-h200-bf16.yaml")
    assert not rr.matches("tuned/", "tuned-a/x.yaml")
    assert not rr.matches("llama3-8b-tp2.{jsonl,log}", "llama3-8b-tp2.csv")


def test_a_table_row_is_read_into_files_command_and_code(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("intro 1234abc\n\n| files | command | code |\n|---|---|---|\n"
                      "| `a.{jsonl,log}` (run 0123456789ab), `b/` | `python -m overlapbench tune a.jsonl \\| x` | 1234abc |\n"
                      "\n| other | table |\n|---|---|\n| `c.txt` | no |\n")
    (entry,) = rr.entries(readme)
    assert entry.patterns == ("a.{jsonl,log}", "b/") and entry.code == "1234abc" and entry.line == 5
    assert entry.commands() == ["python -m overlapbench tune a.jsonl \\| x"]
    assert rr.run_ids_named(entry.text) == ["0123456789ab"] and rr.commits_named(entry.text) == ["1234abc"]


def test_a_missing_commit_is_reported():
    _need_git()
    head = rr.git("rev-parse", "--short=7", "HEAD").stdout.strip()
    assert rr.missing_commits({head, "1f03c49"}) == ["1f03c49"]


WITHOUT = "## Files without `run_id` or `git`"


def _records(path) -> list[dict]:
    text = path.read_text()
    if path.suffix == ".json":
        return [json.loads(text)]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def lacks_provenance(path) -> bool:
    """Whether some record of a committed JSON or JSONL file has no run_id or no git commit."""
    return any(not isinstance(r, dict) or not r.get("run_id") or not r.get("git") for r in _records(path))


@pytest.mark.parametrize("readme", READMES, ids=_id)
def test_files_without_run_id_or_git_are_the_ones_the_readme_names(readme):
    """New runs carry both fields (OVERLAPBENCH_GIT in every device run); the files written
    before they did are listed once, in the README's section of that name, and no others."""
    _need_git()
    # A profile's timelines (<point>.timeline.json, a graph replay's <point>.replay.timeline.json: both end
    # in timeline.SUFFIX) are the rows' beside their folder: their run_id and git.
    files = [f for f in rr.tracked(readme.parent) if f.endswith((".jsonl", ".json")) and not f.endswith(timeline.SUFFIX)]
    lacking = {f for f in files if lacks_provenance(readme.parent / f)}
    text = readme.read_text()
    section = text.split(WITHOUT, 1)[1].split("\n## ", 1)[0] if WITHOUT in text else ""
    named = {f for f in files if f"`{f}`" in section}
    assert not lacking - named, f"rows without run_id or git (set OVERLAPBENCH_GIT; write run_id): {sorted(lacking - named)}"
    assert not named - lacking, f"the README says these lack run_id or git, but they carry both: {sorted(named - lacking)}"


def test_a_record_without_git_lacks_provenance(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"run_id": "0123456789ab", "git": "1234abc"}\n{"run_id": "0123456789ab", "git": null}\n')
    assert lacks_provenance(rows)
    rows.write_text('{"run_id": "0123456789ab", "git": "1234abc"}\n')
    assert not lacks_provenance(rows)
