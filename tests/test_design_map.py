"""docs/design.md opens with a map of the package: each folder, what it holds, and the folders it
imports, from the top floor down. These tests keep the map and the tree in step: a folder missing
from the map, a map line with no folder behind it, an arrow the imports do not draw (or one they
draw and the map does not), or an arrow that points to a folder above its own line fails, naming
it. Imports are read at any depth (inside functions too), so the folders are layers: no folder
cycle, however indirect."""

from __future__ import annotations

import re

from tests.test_layout import ROOT, find_cycle, import_graph

PACKAGE = "overlapbench"
# a folder line of the map: two-space indent under overlapbench/ (or none: kernels/), the folder,
# its description, and optionally `-> folder folder ...`
FOLDER_LINE = re.compile(r"^(?:  )?(?P<folder>[a-z_]+)/\s+(?P<what>.*?)(?:\s+->\s+(?P<uses>[a-z_ ]+))?\s*$")


def map_block(text: str) -> list[str]:
    """The lines of the fenced block under '## The map'."""
    section = text.split("## The map", 1)[1]
    return section.split("```", 2)[1].splitlines()


def parse_map(lines: list[str]) -> dict[str, set[str]]:
    """folder -> the folders its line says it imports, in the map's order (the top floor first);
    kernels/ at the top level, the package's folders indented under overlapbench/ (which is no
    entry itself)."""
    folders = {}
    for line in lines:
        match = FOLDER_LINE.match(line)
        if match and match["folder"] != PACKAGE:
            folders[match["folder"]] = set((match["uses"] or "").split())
    return folders


def tree_folders() -> set[str]:
    """The package's subpackages, and kernels/."""
    found = {p.parent.name for p in (ROOT / PACKAGE).glob("*/__init__.py")}
    return found | {"kernels"}


def folder_arrows() -> dict[str, set[str]]:
    """folder -> the other folders its modules import (top-level modules, errors and printing
    included, are no folder and draw no arrow)."""
    folders = tree_folders()

    def folder(module: str) -> str | None:
        parts = module.split(".")
        if parts[0] == "kernels":
            return "kernels"
        return parts[1] if len(parts) > 1 and parts[1] in folders else None

    arrows: dict[str, set[str]] = {f: set() for f in folders}
    for module, deps in import_graph().items():
        source = folder(module)
        for dep in deps:
            target = folder(dep)
            if source and target and source != target:
                arrows[source].add(target)
    return arrows


def test_every_folder_is_on_the_map_and_every_map_line_is_a_folder():
    drawn = parse_map(map_block((ROOT / "docs" / "design.md").read_text()))
    tree = tree_folders()
    assert not tree - drawn.keys(), f"folders missing from docs/design.md's map: {sorted(tree - drawn.keys())}"
    assert not drawn.keys() - tree, f"docs/design.md's map names folders the tree lacks: {sorted(drawn.keys() - tree)}"


def test_the_maps_arrows_are_the_imports():
    drawn = parse_map(map_block((ROOT / "docs" / "design.md").read_text()))
    wrong = {}
    for source, targets in folder_arrows().items():
        if drawn.get(source, set()) != targets:
            wrong[source] = f"map: {' '.join(sorted(drawn.get(source, ()))) or '-'}; imports: {' '.join(sorted(targets)) or '-'}"
    assert not wrong, f"docs/design.md's map draws other arrows than the imports: {wrong}"


def test_the_parser_catches_a_missing_and_an_extra_folder():
    """The checks above can fail: a map without run/ and with a folder the tree lacks."""
    lines = map_block((ROOT / "docs" / "design.md").read_text())
    drawn = parse_map([line for line in lines if not line.lstrip().startswith("run/")] + ["  nowhere/   x -> run"])
    assert "run" in tree_folders() - drawn.keys()
    assert drawn.keys() - tree_folders() == {"nowhere"}
    assert drawn["nowhere"] == {"run"}
    assert parse_map(["  model/   the layer   -> kernels", "                  continued text"]) == {"model": {"kernels"}}


def upward(drawn: dict[str, set[str]]) -> list[str]:
    """The arrows of a map that point to a folder on the same line or above it (the map lists the
    top floor first), or to a folder the map lacks."""
    order = list(drawn)
    return [f"{source} -> {target}" for source, targets in drawn.items() for target in sorted(targets)
            if target not in drawn or order.index(target) <= order.index(source)]


def test_the_map_lists_the_floors_top_down():
    """Every folder imports only folders below its line: the map's order is the floor order."""
    drawn = parse_map(map_block((ROOT / "docs" / "design.md").read_text()))
    assert not upward(drawn), f"docs/design.md's map has arrows that point up: {upward(drawn)}"


def test_no_folder_cycle():
    """No folders import each other, however indirectly, at any depth of a module's body."""
    cycle = find_cycle(folder_arrows())
    assert cycle is None, "folder cycle: " + " -> ".join(cycle)


def test_the_floor_checks_can_fail():
    """An arrow up the map, and a cycle of folders, are caught."""
    assert upward({"run": {"comm"}, "comm": {"run"}}) == ["comm -> run"]
    assert upward({"run": {"comm"}, "comm": set()}) == []
    assert find_cycle({"run": {"comm"}, "comm": {"specs"}, "specs": {"run"}}) == ["comm", "specs", "run", "comm"]
