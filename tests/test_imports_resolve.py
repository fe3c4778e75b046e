"""Every import of the project's own code names a module and a name that exist.

Much of the code runs only on GPUs and imports inside functions (torch stays out of the paths that
do not need it), so a CPU run never executes those imports: a module moved or a name renamed would
break them silently. This reads every `import` and `from ... import` in `overlapbench/`, `kernels/`
and `tests/` (at any depth: module level, inside functions, under `if TYPE_CHECKING:`) and checks
that each first-party target imports and holds the names taken from it.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = ("overlapbench", "kernels", "tests")
SCANNED = ("overlapbench", "kernels", "tests")


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None) of every first-party import in the file."""
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    return imports_in(path.read_text(), package, str(path))


def imports_in(source: str, package: str, where: str = "<source>") -> list[tuple[int, str, str | None]]:
    """(line, module, name or None) of every first-party import in `source`, at any depth;
    relative imports resolved against `package`."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found += [(node.lineno, base, alias.name) for alias in node.names if alias.name != "*"]
    return [(line, module, name) for line, module, name in found if module.split(".")[0] in FIRST_PARTY]


def unresolved(module: str, name: str | None) -> str | None:
    """Why `import module` / `from module import name` would fail, or None."""
    try:
        target = importlib.import_module(module)
    except ImportError as e:
        return f"no module {module} ({e})"
    if name is None or hasattr(target, name):
        return None
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return f"{module} has no {name}"
    return None


def files() -> list[Path]:
    return sorted(p for package in SCANNED for p in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_first_party_import_resolves(path):
    broken = [f"line {line}: {why}" for line, module, name in imports(path)
              if (why := unresolved(module, name)) is not None]
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_check_catches_a_moved_module_and_a_renamed_name():
    """Can fail: a module that is not there, a name its module lacks; imports inside functions and
    relative ones are read."""
    assert unresolved("overlapbench.no_such_module", None) is not None
    assert unresolved("overlapbench.errors", "NoSuchName") == "overlapbench.errors has no NoSuchName"
    assert unresolved("overlapbench.errors", "UserError") is None
    assert unresolved("overlapbench", "errors") is None  # a submodule taken by name
    inside = ROOT / "overlapbench" / "timing" / "measure.py"
    assert ("overlapbench.timing.step", "Step") in {(m, n) for _, m, n in imports(inside)}
    source = "def f():\n    from ..errors import Gone\n    import overlapbench.gone\n"
    assert [(m, n) for _, m, n in imports_in(source, "overlapbench.timing")] == [
        ("overlapbench.errors", "Gone"), ("overlapbench.gone", None)]
    assert all(unresolved(m, n) for _, m, n in imports_in(source, "overlapbench.timing"))


PLUGINS = ("tests.fault_plugin",)  # modules that register a strategy when imported (OVERLAPBENCH_PLUGINS)


def test_no_file_imports_a_plugin_by_an_import_statement():
    """A plugin is loaded by name (OVERLAPBENCH_PLUGINS, importlib): an import statement of it would be
    resolved by the test above, in the pytest process, registering its strategy there for every
    later test of the registry."""
    found = [f"{path.relative_to(ROOT)}: line {line}" for path in files() for line, module, name in imports(path)
             if module in PLUGINS or (name is not None and f"{module}.{name}" in PLUGINS)]
    assert not found, "import the plugin by name instead: " + "; ".join(found)
