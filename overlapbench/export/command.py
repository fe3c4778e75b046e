"""`overlapbench export`: tuned configs (or the results to tune) -> one engine's files, or with
`--defaults` the engine's default against the tuned choice, from the rows behind each config.

Inputs: tuned YAMLs (`overlapbench/tuned-v1`) and results files (`.jsonl`, tuned here as `tune`
would, nothing written). Outputs: `OUT/ENGINE/CONFIG-NAME/`, one folder per tuned config.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.text import Text

from overlapbench import printing, tuned
from overlapbench.errors import UserError
from overlapbench.export import defaults, engines
from overlapbench.export.picks import write
from overlapbench.tuning import analysis, results, tune
from overlapbench.tuning.analysis import Measured


@dataclass(kw_only=True)
class Options:
    """Write the tuned choice as the files and flags an engine reads: TokenWeave's config JSON,
    vLLM's --compilation-config and env lines, SGLang's flags, TensorRT-LLM's YAML. vLLM, SGLang and
    TensorRT-LLM get the fastest setting they can express by the rows behind the config, never slower
    than their own defaults; each file's header says what it changes, what the host needs, what the
    engine cannot run and what that would add."""

    inputs: Annotated[list[Path], typer.Argument(metavar="TUNED.yaml|RESULTS.jsonl", help="Tuned configs, or results files to tune here (nothing else written).")]
    engine: Annotated[str, typer.Option("--engine", help=f"{engines.CHOICES} (any case).")]
    engine_version: Annotated[str | None, typer.Option("--engine-version", metavar="V", help="The engine release whose key names and defaults to judge against (vllm: 0.31.0 or 0.33.0, the default; sglang: 0.5.23; a leading v is fine). One whose code was not read is refused.")] = None
    out: Annotated[Path, typer.Option("--out", help="Folder; each config's files go to OUT/ENGINE/CONFIG-NAME/.")] = Path("results/exports")
    show_defaults: Annotated[bool, typer.Option("--defaults", help="Instead: per measured batch, what the engine's defaults run, what the export runs and the tuned pick, from the rows behind each config (markdown).")] = False


def main(options: Options) -> int:
    """`run`, saying each file written."""
    console = printing.console()
    for path in run(options.inputs, options.engine, options.engine_version, options.out, options.show_defaults, console):
        console.print(f"wrote {path}")
    return 0


@dataclass(frozen=True)
class Input:
    """One tuned config, where it came from, the name its exports go under, and its rows if read."""

    config: tuned.TunedConfig
    source: str
    name: str
    rows: list[Measured] | None = None


def release(version: str | None) -> str | None:
    """A release as given, with or without its tag's `v` (`v0.33.0` is 0.33.0)."""
    if version is None:
        return None
    text = version.strip()
    return text[1:] if text[:1] in "vV" and text[1:2].isdigit() else text


def inputs(paths: list[Path], console: Console) -> list[Input]:
    """Tuned YAMLs as they are; results files tuned here (their layer groups), rows kept."""
    out = []
    for path in paths:
        if path.suffix == ".jsonl":
            out += _tuned_from_results(path, console)
        else:
            _refuse_a_spec(path)
            out.append(Input(tuned.load(path), str(path), path.stem))
    if not out:
        raise UserError("no tuned config to export; name tuned YAMLs or results files")
    return _distinct_names(out)


def _distinct_names(items: list[Input]) -> list[Input]:
    """Configs of one name (results/x/tuned/a.yaml, results/x/tuned/sp/a.yaml) go under their
    folder's name too, so that neither export replaces the other."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item.name] = counts.get(item.name, 0) + 1
    renamed = [replace(item, name=f"{Path(item.source.split(' (')[0]).parent.name}-{item.name}")
               if counts[item.name] > 1 else item for item in items]
    seen: dict[str, str] = {}
    for item in renamed:
        if item.name in seen:
            raise UserError(f"{item.source} and {seen[item.name]} would both export to {item.name}/; export them one at a time")
        seen[item.name] = item.source
    return renamed


def _refuse_a_spec(path: Path) -> None:
    """A sweep spec (no schema, a `strategies` section) named where a tuned config belongs."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return  # tuned.load says what is wrong with it
    if isinstance(data, dict) and "schema" not in data and "strategies" in data:
        raise UserError(f"{path}: a sweep spec, not a tuned config: run `overlapbench sweep {path}`, then "
                        f"`overlapbench tune` on its results, and export the tuned YAML (or the results .jsonl)")


def _refuse_comm_rows(path: Path) -> None:
    """A file of `overlapbench comm` rows (collectives by message size) named where a sweep's are wanted."""
    rows = results.read_rows(path)
    ok = [r for r in rows if r.get("status") == "ok"]
    if ok and not any(analysis.compared(r) for r in ok) and all(analysis.workload_of(r) == "comm" for r in ok):
        raise UserError(f"{path}: {len(ok)} ok rows of `overlapbench comm` (collectives by message size), none of a "
                        f"sweep's layer: export reads tuned configs or a sweep's results")


def _tuned_from_results(path: Path, console: Console) -> list[Input]:
    _refuse_comm_rows(path)
    grouped = analysis.by_point(tune.layer_rows(analysis.read([path]), console))
    names = tune.file_names(list(grouped))
    out = []
    for group, points in grouped.items():
        picks, _ = tune.picks_of(points)
        if picks:
            rows = [m for ms in points.values() for m in ms]
            out.append(Input(tune.config(group, picks, rows), f"{path} ({group.label()})",
                             names[group].removesuffix(".yaml"), rows))
    return out


def rows_of(item: Input) -> list[Measured]:
    """The rows behind a tuned config: those read with it, else the stores its provenance names,
    only the group's own (its device, measured or predicted as the config says); none of them is
    a UserError naming the devices the stores hold."""
    if item.rows is not None:
        return item.rows
    sources = (item.config.extra.get("provenance") or {}).get("sources") or []
    missing = [s for s in sources if not Path(s).is_file()]
    if not sources or missing:
        named = f"names {', '.join(missing or sources)}, not found here" if sources else "names no results file"
        raise UserError(f"{item.source}: its provenance {named}; an export is judged from the rows behind the config: "
                        f"pass the results .jsonl instead")
    c = item.config
    layer = [m for m in analysis.read(sources).measured if m.group.workload == analysis.LAYER]
    rows = [m for m in layer if (m.group.device_label, m.group.world_size, m.group.tp, m.group.shape_dict,
                                 m.group.dtype) == (c.device, c.world_size, c.tp, c.shape, c.dtype)]
    if not rows:
        held = ", ".join(sorted({m.group.label() for m in layer})) or "no layer rows"
        raise UserError(f"{item.source}: its provenance's rows ({', '.join(sources)}) hold {held}, none of "
                        f"{c.model} tp{c.tp} {c.device} {c.dtype}; rows of another device are never pooled with its own")
    return rows


def _judged_rows(item: Input) -> list[Measured]:
    """The rows an export is judged from; none of the config's own group is an error, not a silent
    keep-every-default."""
    rows = rows_of(item)
    if not rows:
        c = item.config
        raise UserError(f"{item.source}: the rows its provenance names hold none of its group ({c.model} TP={c.tp} "
                        f"{c.device} {c.dtype}); pass the results .jsonl it was tuned from")
    return rows


def run(paths: list[Path], engine: str, version: str | None, out_dir: Path, show_defaults: bool,
        console: Console) -> list[Path]:
    """Write each config's export (or print the defaults tables), each judged from the rows
    behind its config; return the paths written."""
    record, version = engines.get(engine), release(version)
    items = inputs(paths, console)
    if show_defaults:
        for item in items:
            console.print(defaults.markdown(record, item.config, _judged_rows(item), item.source, version))
        return []
    exports = [(item, record.export(item.config, _judged_rows(item) if record.judged else [], item.source, version))
               for item in items]  # all made (and checked) before any is written
    written = []
    for item, export in exports:
        for warning in export.warnings:
            console.print(Text(f"{item.name}: {warning}", style="yellow"))
        written += write(export, Path(out_dir) / record.name / item.name)
    return written
