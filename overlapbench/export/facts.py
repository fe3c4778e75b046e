"""A fact about an engine's code, with where the code says it: the file (a path inside the
engine's wheel, or its repository at a commit), the line per release, and the text that line
holds. The value is what the export uses; the text is how a check finds it again: it reads the
cited line of each release's wheel and looks for the text there, and for a release not yet read
it searches the file for the text (tests/checks/engine_facts.py), so a new release is a re-run
that prints its lines, not a rewrite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Fact:
    """One value an engine's code holds, and where: `text` is a substring of `file` at
    `lines[release]`. A fact read from a repository rather than a wheel has no lines: `where`
    names the commit and the function instead."""

    value: Any
    file: str
    text: str
    lines: dict[str, int] = field(default_factory=dict, compare=False)
    where: str = ""  # for a fact without lines: the commit and function it was read in

    def cite(self, release: str | None = None) -> str:
        line = self.lines.get(release) if release else None
        if line is not None:
            return f"{self.file}:{line}"
        return f"{self.file} ({self.where})" if self.where else self.file


def walk(table: Any, name: str = "") -> list[tuple[str, Fact]]:
    """Every Fact in a (nested) dict of facts, with its path as a name: `FUSION_MAX_MB[90][2]`."""
    if isinstance(table, Fact):
        return [(name, table)]
    if isinstance(table, dict):
        return [item for key, value in table.items() for item in walk(value, f"{name}[{key}]" if name else str(key))]
    return []


def with_lines(tables: dict[str, Any], lines: dict[str, dict[str, int]]) -> dict[str, Any]:
    """The tables with each fact's line per release attached (`lines`: release -> fact name ->
    line, the name as `walk` gives it): the facts are written once, their lines per release
    beside them, as the check prints them for a new release."""

    def attach(table: Any, name: str) -> Any:
        if isinstance(table, Fact):
            found = {release: by_name[name] for release, by_name in lines.items() if name in by_name}
            return Fact(table.value, table.file, table.text, found, table.where)
        if isinstance(table, dict):
            return {key: attach(value, f"{name}[{key}]" if name else str(key)) for key, value in table.items()}
        return table

    return {name: attach(table, name) for name, table in tables.items()}


def releases_read(tables: dict[str, Any]) -> list[str]:
    """The releases every fact of the tables has a line for: those whose defaults were read."""
    facts = [fact for name, table in tables.items() for _, fact in walk(table, name)]
    common = set.intersection(*(set(f.lines) for f in facts)) if facts else set()
    return sorted(common, key=lambda v: tuple(int(x) for x in v.split(".")))


def find(tables: dict[str, Any], name: str, *keys) -> Fact | None:
    """One fact of the tables by name and table keys (find(FACTS, "FUSION_MAX_MB", 90, 2)); None
    where the table has no entry (another GPU or TP)."""
    found = tables.get(name)
    for key in keys:
        if not isinstance(found, dict) or key not in found:
            return None
        found = found[key]
    return found if isinstance(found, Fact) else None


def value(tables: dict[str, Any], name: str, *keys) -> Any:
    """A fact's value, or None where the table has no entry."""
    found = find(tables, name, *keys)
    return None if found is None else found.value
