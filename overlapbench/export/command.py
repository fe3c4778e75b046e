"""`overlapbench export`: tuned configs (or the results to tune) -> one engine's files, or with
`--defaults` the engine's default against the tuned choice, from the rows behind each config.

Inputs: tuned YAMLs (`overlapbench/tuned-v1`) and results files (`.jsonl`, tuned here as `tune`
would, nothing written). Outputs: `OUT/ENGINE/CONFIG-NAME/`, one folder per tuned config.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.text import Text

from overlapbench import tuned
from overlapbench.errors import UserError
from overlapbench.export import defaults, sglang, tokenweave, trtllm, vllm
from overlapbench.export.picks import write
from overlapbench.tuning import analysis, tune
from overlapbench.tuning.analysis import Measured

EXPORTERS = {"tokenweave": tokenweave.export, "vllm": vllm.export, "sglang": sglang.export, "trtllm": trtllm.export}
ENGINES = tuple(EXPORTERS)


@dataclass(frozen=True)
class Input:
    """One tuned config, where it came from, the name its exports go under, and its rows if read."""

    config: tuned.TunedConfig
    source: str
    name: str
    rows: list[Measured] | None = None


def check_engine(engine: str) -> str:
    if engine not in EXPORTERS:
        raise UserError(f"--engine: {engine!r} is not one of {' | '.join(ENGINES)}")
    return engine


def inputs(paths: list[Path], console: Console) -> list[Input]:
    """Tuned YAMLs as they are; results files tuned here (their layer groups), rows kept."""
    out = []
    for path in paths:
        if path.suffix == ".jsonl":
            out += _tuned_from_results(path, console)
        else:
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


def _tuned_from_results(path: Path, console: Console) -> list[Input]:
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
        raise UserError(f"{item.source}: its provenance {named}; pass the results .jsonl to export --defaults instead")
    c = item.config
    layer = [m for m in analysis.read(sources).measured if m.group.workload == analysis.LAYER]
    rows = [m for m in layer if (m.group.device_label, m.group.world_size, m.group.tp, m.group.shape_dict,
                                 m.group.dtype) == (c.device, c.world_size, c.tp, c.shape, c.dtype)]
    if not rows:
        held = ", ".join(sorted({m.group.label() for m in layer})) or "no layer rows"
        raise UserError(f"{item.source}: its provenance's rows ({', '.join(sources)}) hold {held}, none of "
                        f"{c.model} tp{c.tp} {c.device} {c.dtype}; rows of another device are never pooled with its own")
    return rows


def run(paths: list[Path], engine: str, version: str | None, out_dir: Path, show_defaults: bool,
        console: Console) -> list[Path]:
    """Write each config's export (or print the defaults tables); return the paths written."""
    check_engine(engine)
    items = inputs(paths, console)
    if show_defaults:
        defaults.check_engine_version(engine, version)
        for item in items:
            console.print(defaults.markdown(engine, item.config, rows_of(item), item.source))
        return []
    exports = [(item, EXPORTERS[engine](item.config, item.source, version)) for item in items]  # all checked first
    written = []
    for item, export in exports:
        for warning in export.warnings:
            console.print(Text(f"{item.name}: {warning}", style="yellow"))
        written += write(export, Path(out_dir) / engine / item.name)
    return written
