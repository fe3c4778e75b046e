"""The map a machine folder's README draws of its files, read the way the tests check it.

`results/<machine>/README.md` lists every committed file in tables whose header starts
`| files | command | code |`. A row's first cell names its files as backticked patterns relative
to the machine folder: `{a,b}` for either name, `*` for any characters within one name, a trailing
`/` for a whole folder. Commits are named by 7 to 11 hex digits (or all 40), runs by their
12-digit run_id.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
HEADER = ("files", "command", "code")
_HEX = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{7,40}(?![0-9A-Za-z])")
RUN_ID_LENGTH = 12


@dataclass(frozen=True)
class Entry:
    """One row of a README's file tables."""

    readme: Path
    line: int  # 1-based, for messages
    patterns: tuple[str, ...]
    command: str
    code: str
    text: str  # the whole row

    @property
    def folder(self) -> Path:
        return self.readme.parent

    def where(self) -> str:
        return f"{self.readme.relative_to(ROOT)}:{self.line}"

    def matches(self, relative: str) -> bool:
        return any(matches(p, relative) for p in self.patterns)

    def commands(self) -> list[str]:
        """The command cell's code spans that run overlapbench."""
        return [c for c in re.findall(r"`([^`]+)`", self.command) if c.startswith("python -m overlapbench ")]


def readmes() -> list[Path]:
    return sorted(RESULTS.glob("*/README.md"))


def cells(row: str) -> list[str]:
    """A markdown table row's cells; a `|` inside a code span does not split."""
    out, cell, code = [], "", False
    for ch in row.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            out.append(cell.strip())
            cell = ""
        else:
            cell += ch
    return out + [cell.strip()]


def entries(readme: Path) -> list[Entry]:
    """Every row of the README's file tables."""
    found, in_table = [], False
    for number, line in enumerate(readme.read_text().splitlines(), 1):
        if not line.startswith("|"):
            in_table = False
            continue
        row = cells(line)
        if tuple(c.lower() for c in row[:3]) == HEADER:
            in_table = True
        elif in_table and not set(line) <= set("|-: "):
            patterns = tuple(re.findall(r"`([^`]+)`", row[0]))
            found.append(Entry(readme, number, patterns, row[1] if len(row) > 1 else "", row[2] if len(row) > 2 else "", line))
    return found


def expand(pattern: str) -> list[str]:
    """Brace alternatives spelled out: `a-{x,y}.{jsonl,log}` -> four names."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [e for alt in m[1].split(",") for e in expand(pattern[: m.start()] + alt + pattern[m.end():])]


def matches(pattern: str, relative: str) -> bool:
    """Whether a file (path relative to the machine folder) is one the pattern names."""
    for p in expand(pattern):
        if p.endswith("/"):
            if relative.startswith(p):
                return True
            continue
        parts, names = p.split("/"), relative.split("/")
        if len(parts) == len(names) and all(fnmatch.fnmatchcase(n, q) for n, q in zip(names, parts)):
            return True
    return False


def hex_words(text: str) -> list[str]:
    """Commit hashes and run ids named in a text (hex words with at least one digit)."""
    return [w for w in _HEX.findall(text) if re.search(r"\d", w)]


def commits_named(text: str) -> list[str]:
    return [w for w in hex_words(text) if len(w) != RUN_ID_LENGTH]


def run_ids_named(text: str) -> list[str]:
    return [w for w in hex_words(text) if len(w) == RUN_ID_LENGTH]


def git(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, input=stdin)


def in_git_checkout() -> str | None:
    """None where the tree is a full git checkout, else why the git checks cannot run."""
    try:
        shallow = git("rev-parse", "--is-shallow-repository")
    except OSError:
        return "git is not installed"
    if shallow.returncode:
        return "not a git checkout"
    if shallow.stdout.strip() == "true":
        return "a shallow clone: old commits are not here"
    return None


def tracked(folder: Path) -> list[str]:
    """The committed files under a folder, relative to it."""
    out = git("ls-files", "-z", "--", str(folder.relative_to(ROOT)))
    prefix = folder.relative_to(ROOT).as_posix() + "/"
    return sorted(p[len(prefix):] for p in out.stdout.split("\0") if p)


def missing_commits(hashes: set[str]) -> list[str]:
    """The hashes that name no commit of this repository."""
    order = sorted(hashes)
    out = git("cat-file", "--batch-check", stdin="".join(f"{h}^{{commit}}\n" for h in order))
    answers = out.stdout.splitlines()
    return [h for h, answer in zip(order, answers) if " commit " not in answer]
