"""The shape of the code: no import circles between the project's modules, modules small enough to
read at once, and every results path the README names present in the tree."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("overlapbench", "kernels")
MAX_LINES = 400  # a longer module says why in its docstring ("long because ...")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(module: str, path: Path, known: set[str]) -> set[str]:
    """Every project module `module` imports, at any depth of its body (imports inside functions
    are circles too: they only move the failure to run time). A module also depends on the
    packages above it, whose __init__ runs first."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in known else base)
    deps = set()
    for target in targets:
        parts = target.split(".")
        deps.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {d for d in deps if d in known and d != module and not module.startswith(d + ".")}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imported(name, path, set(modules)) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_a_function_level_import_counts():
    graph = import_graph()
    assert "overlapbench.comm.run" in graph["overlapbench.run.command"]  # imported inside a function


@pytest.mark.parametrize("name, path", sorted(_modules().items()))
def test_modules_are_short_or_say_why(name, path):
    lines = path.read_text().count("\n")
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert lines <= MAX_LINES or "long because" in doc.lower(), f"{name}: {lines} lines; split it, or say why in its docstring"


def test_strategies_folder_holds_only_strategies():
    """A newcomer opening strategies/ finds the registered strategies, the registry, the base, the
    knobs they declare and the command that lists them."""
    from overlapbench.strategies import all_strategies

    files = {p.stem for p in (ROOT / "overlapbench" / "strategies").glob("*.py")}
    registered = {cls.__module__.rpartition(".")[2] for cls in all_strategies()}
    assert files == registered | {"__init__", "base", "knobs", "command"}


def test_kernels_holds_only_kernels_the_package_runs():
    """kernels/ is the product's kernels: each module is imported by the package (at any depth);
    benchmarks, probes and checks live under tests/, by kind."""
    graph = import_graph()
    used = {dep for name, deps in graph.items() if name.startswith("overlapbench") for dep in deps}
    reached, frontier = set(used), list(used)
    while frontier:  # a kernel imported only by another kernel the package runs counts too
        for dep in graph.get(frontier.pop(), ()):
            if dep not in reached:
                reached.add(dep)
                frontier.append(dep)
    kernels = {name for name in graph if name.startswith("kernels.")}
    assert kernels - reached == set(), f"kernels/ modules the package never imports: {sorted(kernels - reached)}"
    assert not list((ROOT / "kernels").glob("*.sh")), "scripts go to tests/benchmarks, tests/probes or tests/checks"


def test_kernels_import_nothing_from_the_package():
    """kernels/ is the lowest floor: what a kernel needs from the package (its symmetric memory) is
    passed in by the caller, so no kernel imports overlapbench (at any depth)."""
    graph = import_graph()
    upward = {name: sorted(d for d in deps if d.startswith("overlapbench"))
              for name, deps in graph.items() if name.startswith("kernels")}
    assert not {name: deps for name, deps in upward.items() if deps}


def _tracked() -> set[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        pytest.skip("not a git checkout")
    return set(out.stdout.split())


def test_results_the_readme_names_are_in_the_tree():
    tracked = _tracked()
    named = set(re.findall(r"results/[\w./*{},-]+", (ROOT / "README.md").read_text()))
    missing = []
    for ref in sorted(named):
        ref = ref.rstrip(".,)")
        if "{" in ref or "*" in ref or "<" in ref or ref.startswith("results/tuned/"):  # patterns and defaults
            continue
        if not any(t == ref or t.startswith(ref.rstrip("/") + "/") for t in tracked):
            missing.append(ref)
    assert not missing, f"README names results that are not committed: {missing}"


@pytest.mark.parametrize("path, ignored", [
    ("results/quick-20261122-1200.jsonl", True),  # an ad-hoc sweep
    ("results/tuned/llama3-8b-tp2-cpu-fp32.yaml", True),  # tune's default output
    ("results/h200x2/new-run.jsonl", False),  # a machine's committed runs
    ("results/h200x8/any/depth/run.jsonl", False),  # whatever the machine folder
])
def test_machine_result_folders_are_never_ignored(path, ignored):
    _tracked()
    out = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT)
    assert (out.returncode == 0) == ignored
