"""Read the engines' default-path facts (overlapbench/export/*_facts.py) back from their wheels.

    python tests/checks/engine_facts.py [WHEEL...] [--out results/cpu-checks] [--lines]

Each fact names a file inside the engine's wheel, the text its line holds, and that line per
release. For every wheel given (default: /work/wheels/*.whl; vllm-*.whl and sglang-*.whl, the
release from the file name), each fact of the engine is read from the wheel itself (a zip; no
install): where the fact has a line for that release, the line must hold the text (else the fact
is reported as moved, with the lines that hold it now, or missing); a release with no lines yet
gets the lines where each text is found. `--lines` prints them as the `_LINES` entry to paste
into the facts module: a new release is a re-run, not a rewrite. TensorRT-LLM's facts name a
repository commit, not a wheel (its PyPI package is a stub); they are listed, not read.

Writes engine_facts.txt and engine_facts.json under --out (a CPU check's output, not a GPU result).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from overlapbench.export import sglang_facts, trtllm_facts, vllm_facts  # noqa: E402
from overlapbench.export.facts import Fact, walk  # noqa: E402

WHEEL = re.compile(r"^(?P<engine>vllm|sglang)-(?P<release>[0-9][0-9.]*[0-9])-")


def tables(engine: str, release: str) -> dict:
    """The fact tables that apply to a release of an engine."""
    if engine == "vllm":
        keys = vllm_facts.VERSIONS.get(release)
        sp = {"SP": vllm_facts.SP_FACTS} if keys is not None and keys.sp is not None else {}
        return {**vllm_facts.FACTS, **sp}
    return dict(sglang_facts.FACTS)


def check_fact(wheel: zipfile.ZipFile, release: str, fact: Fact) -> dict:
    """The fact against the wheel: ok (its line holds its text), moved, missing, or found (no line yet)."""
    try:
        lines = wheel.read(fact.file).decode().splitlines()
    except KeyError:
        return {"status": "missing", "file": fact.file, "why": "no such file in the wheel"}
    found = [n for n, text in enumerate(lines, 1) if fact.text in text]
    line = fact.lines.get(release)
    if line is None:
        near = next(iter(fact.lines.values()), None)  # where another release has it
        return {"status": "found" if found else "missing", "file": fact.file, "lines": found, "near": near}
    if line <= len(lines) and fact.text in lines[line - 1]:
        return {"status": "ok", "file": fact.file, "line": line}
    return {"status": "moved" if found else "missing", "file": fact.file, "line": line, "lines": found}


def check_wheel(path: Path) -> tuple[str, str, dict]:
    match = WHEEL.match(path.name)
    if match is None:
        raise SystemExit(f"{path}: not a vllm-*.whl or sglang-*.whl file name")
    engine, release = match["engine"], match["release"]
    results = {}
    with zipfile.ZipFile(path) as wheel:
        for table_name, table in tables(engine, release).items():
            for name, fact in walk(table, table_name):
                results[name] = {"value": fact.value, "text": fact.text, **check_fact(wheel, release, fact)}
    return engine, release, results


def lines_entry(release: str, results: dict) -> str:
    """The `_LINES` entry for a release: each fact at the line holding its text (the cited
    line where it still does, else of the lines holding it the nearest to where another
    release has it: a text such as `2: 64 * MiB` stands in more than one table)."""
    chosen = {name: r.get("line") if r["status"] == "ok" else _nearest(r.get("lines") or [], r.get("near"))
              for name, r in results.items()}
    body = ", ".join(f'"{name}": {line}' for name, line in chosen.items())
    return f'"{release}": {{{body}}},'


def _nearest(lines: list[int], near: int | None) -> int | None:
    if not lines:
        return None
    return min(lines, key=lambda n: abs(n - near)) if near is not None else lines[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheels", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "results/cpu-checks")
    parser.add_argument("--lines", action="store_true", help="Print each release's _LINES entry instead.")
    opts = parser.parse_args()
    wheels = opts.wheels or sorted(Path("/work/wheels").glob("*.whl"))
    log = [f"engine_facts.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; wheels: "
           + ", ".join(p.name for p in wheels)]
    report: dict = {}
    bad = 0
    for path in wheels:
        engine, release, results = check_wheel(path)
        if opts.lines:
            print(f"# {engine}\n{lines_entry(release, results)}")
            continue
        report[f"{engine} {release}"] = results
        counts = {s: sum(r["status"] == s for r in results.values()) for s in ("ok", "moved", "missing", "found")}
        log.append(f"{engine} {release}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
        for name, r in results.items():
            if r["status"] != "ok":
                bad += r["status"] in ("moved", "missing")
                log.append(f"  {name}: {r['status']} ({r['file']}: {r.get('why') or r.get('lines')}) {r['text']!r}")
    if opts.lines:
        return 0
    log.append("trtllm: facts from its repository (not a wheel: its PyPI package is a stub), not read here:")
    for name, fact in walk(trtllm_facts.FACTS):
        log.append(f"  {name} = {fact.value!r}: {fact.cite()}")
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "engine_facts.txt").write_text("\n".join(log) + "\n")
    (opts.out / "engine_facts.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    print("\n".join(log))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
