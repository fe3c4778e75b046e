"""Every third-party package the code imports is one `pyproject.toml` declares.

A package that arrives only because another one happens to bring it (click came with typer until
typer 0.29) works on the developer's machine and breaks a new user's install. So: each import in
`overlapbench/` and `kernels/` names a required dependency, or an optional extra whose import is
guarded (inside `try: ... except ImportError`) and whose handler names the extra to install; each
import in `tests/` names a required dependency or one of the `test` extra. The import's
distribution is found from the installed packages' metadata, or, for one that is not installed
at all, from its own name (a module nobody declared and nobody installed fails too).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the test extra brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = {"overlapbench", "kernels", "tests"}
# Import names whose distribution is named otherwise, for when the package is not installed here.
DISTRIBUTION_OF = {"yaml": "pyyaml", "pynvml": "nvidia-ml-py"}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalized(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


@dataclass(frozen=True)
class Declared:
    required: frozenset[str]
    extras: dict[str, frozenset[str]]  # extra -> its distributions

    @classmethod
    def of(cls, pyproject: dict) -> Declared:
        project = pyproject["project"]
        optional = project.get("optional-dependencies", {})
        extras = {extra: frozenset(map(requirement_name, reqs)) for extra, reqs in optional.items()}
        return cls(frozenset(map(requirement_name, project["dependencies"])), extras)

    def extras_of(self, distribution: str) -> list[str]:
        return sorted(extra for extra, names in self.extras.items() if distribution in names)


@dataclass(frozen=True)
class Import:
    module: str  # top-level name
    path: Path
    line: int
    guard: str | None  # the source of the `except ImportError` handlers around it, if any


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = {n.id for n in ast.walk(handler.type) if isinstance(n, ast.Name)} if handler.type else {"BaseException"}
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def third_party_imports(path: Path) -> list[Import]:
    source = path.read_text()
    tree = ast.parse(source, str(path))
    guards: dict[int, str] = {}  # id of an import node -> the handlers guarding it
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            text = "\n".join(ast.get_source_segment(source, h) or "" for h in node.handlers)
            for inner in node.body:
                for sub in ast.walk(inner):
                    guards[id(sub)] = text
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top not in FIRST_PARTY and top != "__future__":
                found.append(Import(top, path, node.lineno, guards.get(id(node))))
    return found


def distributions(module: str, installed: dict[str, list[str]]) -> list[str]:
    """The distributions that provide `module` (typer 0.12's comes from typer and typer-slim)."""
    return sorted({normalized(d) for d in installed.get(module) or [DISTRIBUTION_OF.get(module, module)]})


def undeclared(imports: list[Import], declared: Declared, allowed_extras: set[str] = frozenset()) -> list[str]:
    """What is wrong with each import, one line each: nothing for a declared one."""
    installed = importlib.metadata.packages_distributions()
    problems = []
    for imp in imports:
        where = f"{imp.path.relative_to(ROOT) if imp.path.is_relative_to(ROOT) else imp.path}:{imp.line}"
        dists = distributions(imp.module, installed)
        if any(d in declared.required or any(d in declared.extras.get(e, ()) for e in allowed_extras) for d in dists):
            continue
        extras = sorted({extra for d in dists for extra in declared.extras_of(d)})
        if not extras:
            problems.append(f"{where}: imports {imp.module} ({', '.join(dists)}), which pyproject.toml does not declare")
        elif imp.guard is None:
            problems.append(f"{where}: imports {imp.module} from the optional extra {extras} without an ImportError guard")
        elif not any(f"overlapbench[{extra}]" in imp.guard for extra in extras):
            problems.append(f"{where}: a missing {imp.module} must say which extra to install: 'overlapbench[{extras[0]}]'")
    return problems


def declared_here() -> Declared:
    return Declared.of(tomllib.loads((ROOT / "pyproject.toml").read_text()))


def sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_the_package_imports_only_what_it_declares():
    imports = [imp for path in sources("overlapbench", "kernels") for imp in third_party_imports(path)]
    assert imports, "no third-party import found: the scan is broken"
    problems = undeclared(imports, declared_here())
    assert not problems, "\n".join(problems)


def test_the_tests_import_only_what_the_test_extra_brings():
    imports = [imp for path in sources("tests") for imp in third_party_imports(path)]
    problems = undeclared(imports, declared_here(), allowed_extras={"test"})
    assert not problems, "\n".join(problems)


# -- the check itself can fail -----------------------------------------------------------------


def _problems_of(tmp_path: Path, code: str, pyproject: str) -> list[str]:
    module = tmp_path / "module.py"
    module.write_text(code)
    return undeclared(third_party_imports(module), Declared.of(tomllib.loads(pyproject)))


PYPROJECT = """
[project]
dependencies = ["typer>=0.12", "PyYAML>=6.0", "torch>=2.4; sys_platform == 'linux'"]
[project.optional-dependencies]
plot = ["matplotlib>=3.7"]
"""


@pytest.mark.parametrize("code, problem", [
    ("import click\n", "imports click (click), which pyproject.toml does not declare"),
    ("def f():\n    from click import Context\n", "imports click"),  # inside a function too
    ("import a_module_nobody_installed\n", "imports a_module_nobody_installed"),
    ("import matplotlib.pyplot\n", "without an ImportError guard"),
    ("try:\n    import matplotlib\nexcept ImportError:\n    raise SystemExit('no plots')\n", "which extra to install"),
])
def test_an_undeclared_or_unguarded_import_is_named(tmp_path, code, problem):
    problems = _problems_of(tmp_path, code, PYPROJECT)
    assert len(problems) == 1 and problem in problems[0], problems


@pytest.mark.parametrize("code", [
    "import typer\nimport yaml\nimport torch.nn.functional as F\nimport os, json\nfrom overlapbench import spec\n",
    "try:\n    from matplotlib.figure import Figure\n"
    "except ImportError:\n    raise RuntimeError(\"pip install 'overlapbench[plot]'\")\n",
])
def test_declared_imports_pass(tmp_path, code):
    assert _problems_of(tmp_path, code, PYPROJECT) == []
