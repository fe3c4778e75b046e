"""Sweep specs: YAML -> validated dataclasses -> the points of a sweep.

Everything here runs before any process starts (and again on each rank, cheaply), so a typo
costs a one-line error, not a cluster allocation. No torch at import.

The stand-alone sections (measure, strategies, comm) are in spec_sections.py, the batches and
the points in points.py; here the whole spec: the model, the workload, the cpu/cuda overrides.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from overlapbench import strategies, yamlio
from overlapbench.comm.sizes import DTYPES
from overlapbench.comm.spec import CommSpec
from overlapbench.errors import UserError, positive_int, reject_unknown_keys, shown, unreadable
from overlapbench.model import hf_config, models
from overlapbench.specs.points import parse_batches
from overlapbench.specs.spec_sections import Measure, StrategyGrid, strategy_grids
from overlapbench.tuning.rows import WORKLOADS, Decode, Gemm, Point

DEFAULT_TOLERANCE = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}
DEVICE_SECTIONS = ("cpu", "cuda")


@dataclass(frozen=True)
class SweepSpec:
    name: str
    model: str  # preset name, a config.json's model name (hf_config.model_name), or "custom"
    shape: models.ModelShape
    tp: int | str  # an int, or "auto": the world size
    dtype: str
    layers: int | tuple[int, ...]  # the stack's depth, or several (a list in the spec): each batch timed at each
    seed: int
    batches: tuple[tuple[int, ...], ...]  # each batch's prefill sequence lengths
    strategies: tuple[StrategyGrid, ...]
    measure: Measure = field(default_factory=Measure)
    output: str | None = None
    comm: CommSpec | None = None  # collective microbenchmarks after the layer points
    workload: str = "layer"  # or a micro workload (WORKLOADS), whose GEMM is `gemm`
    gemm: Gemm | None = None
    decodes: tuple[Decode | None, ...] = ()  # each batch's decode tokens (mixed batches); () for none
    for_device: bool = False  # the spec has a section (cpu: or cuda:) for the device it runs on
    source: str | None = field(default=None, compare=False)  # the spec file: errors found after loading start with it

    def compositions(self) -> list[tuple[tuple[int, ...], Decode | None]]:
        """(prefill sequence lengths, decode tokens or None) of each batch, in order."""
        return list(zip(self.batches, self.decodes or (None,) * len(self.batches), strict=True))

    @property
    def depths(self) -> tuple[int, ...]:
        """The stack depths each batch is timed at, in the spec's order (one for an int `layers`)."""
        return (self.layers,) if isinstance(self.layers, int) else self.layers

    def resolved_dtype(self, cuda: bool) -> str:
        return ("bf16" if cuda else "fp32") if self.dtype == "auto" else self.dtype

    def resolved_tp(self, world_size: int) -> int:
        tp = world_size if self.tp == "auto" else self.tp
        if tp != world_size:
            raise UserError(
                f"{self._file()}tp: {tp} but the sweep runs on {_processes(world_size)}; "
                f"launch {_processes(tp)} (--nproc {tp}) or set tp to {world_size} or 'auto'"
            )
        self.check_tp(tp)
        return tp

    def check_tp(self, tp: int) -> None:
        """The shape's divisibility by `tp`, its error starting with the spec file as every spec error does."""
        try:
            self.shape.check_tp(tp)
        except UserError as e:
            raise UserError(f"{self._file()}{e}") from None

    def _file(self) -> str:
        return f"{self.source}: " if self.source else ""

    def tolerance(self, dtype: str) -> float:
        return self.measure.tolerance or DEFAULT_TOLERANCE[dtype]

    def output_path(self, resume: bool = False, results_dir: Path = Path("results")) -> Path:
        """The spec's `output`, else a new results/<name>-<UTC time>.jsonl; when resuming,
        the newest of those."""
        if self.output:
            return Path(self.output)
        if resume:
            runs = sorted(results_dir.glob(f"{self.name}-*.jsonl"))
            if not runs:
                raise UserError(f"--resume: no earlier results/{self.name}-*.jsonl to continue; drop --resume or give --output")
            return runs[-1]
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        return results_dir / f"{self.name}-{stamp}.jsonl"

    def points(self, world_size: int, cuda: bool) -> list[Point]:
        """All points, grouped by batch and depth so each (batch, depth)'s weights and reference are
        made once, and each point is timed beside the reference of its own depth (a point at 8
        layers is never paired with 4 layers' baseline). A batch's depths follow each other, so its
        rows at every depth are timed close together: report's per-layer marginals subtract them."""
        tp, dtype = self.resolved_tp(world_size), self.resolved_dtype(cuda)
        depths = self.depths if self.workload == "layer" else (1,)  # a micro point is one GEMM
        settings, seen = [], set()
        for grid in self.strategies:
            for knobs in grid.settings():
                key = (grid.name, json.dumps(knobs, sort_keys=True))
                if key not in seen:
                    seen.add(key)
                    settings.append((grid.name, knobs))
        return [
            Point(self.name, self.model, self.shape, tp, dtype, layers, self.seed,
                  batch, name, knobs, self.workload, self.gemm, decode)
            for batch, decode in self.compositions()
            for layers in depths
            for name, knobs in settings
        ]


TOP_KEYS = (
    "name", "model", "shape", "tp", "dtype", "layers", "seed", "tokens", "batches",
    "strategies", "measure", "output", "comm", "workload", "gemm", *DEVICE_SECTIONS,
)


def _model(data: dict, base: Path | None) -> tuple[str, models.ModelShape]:
    """A preset, a custom shape, or a Hugging Face config.json (a relative path: from `base`,
    the spec file's folder): the row's model name and the shape."""
    if "model" in data and "shape" in data:
        raise UserError("model: give either a preset 'model' or a custom 'shape', not both")
    if "shape" in data:
        shape = data["shape"]
        if not isinstance(shape, dict):
            raise UserError("shape: must be a mapping with hidden, ffn, heads, kv_heads, head_dim")
        allowed = [f.name for f in fields(models.ModelShape)]
        reject_unknown_keys(shape, allowed, "shape")
        missing = [k for k in allowed[:5] if k not in shape]
        if missing:
            raise UserError(f"shape.{missing[0]}: missing; a custom shape needs {', '.join(allowed[:5])}")
        return "custom", models.ModelShape(**shape)
    name = data.get("model")
    if not isinstance(name, str):
        raise UserError("model: missing; name a preset (see `overlapbench models`), a config.json, or give 'shape'")
    if hf_config.is_config_path(name, base):
        try:
            read = hf_config.read(hf_config.resolve(name, base))
        except UserError as e:
            raise UserError(f"model: {e}") from None
        return read.name, read.shape
    return name, models.preset(name)


def _workload(data: dict, grids: tuple[StrategyGrid, ...]) -> tuple[str, Gemm | None]:
    """The workload; for a micro one also its GEMM's N and K, and only strategies that run it."""
    workload, gemm = data.get("workload", "layer"), data.get("gemm")
    if workload not in WORKLOADS:
        raise UserError(f"workload: {shown(workload)} is not one of {', '.join(map(str, WORKLOADS))}")
    if workload == "layer":
        if gemm is not None:
            raise UserError("gemm: only for the micro workloads gemm_ag and gemm_rs; set 'workload' or drop 'gemm'")
        return workload, None
    if not isinstance(gemm, dict):
        raise UserError(f"gemm: the {workload} workload needs 'gemm: {{n: N, k: K}}' (M is the tokens)")
    reject_unknown_keys(gemm, ("n", "k"), "gemm")
    for key in ("n", "k"):
        if key not in gemm:
            raise UserError(f"gemm.{key}: missing; the {workload} workload needs 'gemm: {{n: N, k: K}}'")
    for grid in grids:
        if workload not in strategies.get(grid.name).needs.workloads:
            able = [s.name for s in strategies.all_strategies() if workload in s.needs.workloads]
            raise UserError(f"strategies.{grid.name}: does not run the {workload} workload; these do: {', '.join(able)}")
    return workload, Gemm(positive_int(gemm["n"], "gemm.n"), positive_int(gemm["k"], "gemm.k"))


def from_dict(data: Any, name: str, cuda: bool, base: Path | None = None) -> SweepSpec:
    """Validate a parsed YAML document; `cuda` picks the device section that applies; a
    relative `model: path/config.json` is read from `base` (the spec's folder; None: the cwd)."""
    if not isinstance(data, dict):
        raise UserError(f"spec: must be a YAML mapping of settings, got {type(data).__name__}")
    reject_unknown_keys(data, TOP_KEYS, "")
    section = data.get("cuda" if cuda else "cpu") or {}
    if not isinstance(section, dict):
        raise UserError(f"{'cuda' if cuda else 'cpu'}: must be a mapping of settings to override")
    reject_unknown_keys(section, [k for k in TOP_KEYS if k not in DEVICE_SECTIONS], "cpu" if not cuda else "cuda")
    data = {k: v for k, v in data.items() if k not in DEVICE_SECTIONS}
    if "model" in section or "shape" in section:
        data.pop("model", None), data.pop("shape", None)
    if "tokens" in section or "batches" in section:
        data.pop("tokens", None), data.pop("batches", None)
    data.update(section)
    try:
        return _merged(data, name, cuda, base, bool(section))
    except UserError as e:
        raise _in_section(e, section, "cuda" if cuda else "cpu") from None


def _in_section(error: UserError, section: dict, where: str) -> UserError:
    """An error about a field the device section set, named as the user wrote it: `cpu.tokens`."""
    field = re.match(r"[^.\[:\s]+", str(error))
    return UserError(f"{where}.{error}") if field and field.group(0) in section else error


def _merged(data: dict, name: str, cuda: bool, base: Path | None, for_device: bool) -> SweepSpec:
    """A spec's settings, its device section already merged in, validated."""
    spec_name = data.get("name", name)
    if not isinstance(spec_name, str) or not spec_name or "/" in spec_name:
        raise UserError(f"name: must be a non-empty string without '/', got {shown(spec_name)}")
    model, shape = _model(data, base)
    tp = data.get("tp", "auto")
    if tp != "auto":
        positive_int(tp, "tp")
    dtype = data.get("dtype", "auto")
    if dtype not in DTYPES:
        raise UserError(f"dtype: {shown(dtype)} is not one of {', '.join(DTYPES)}")
    layers = parse_layers(data.get("layers", 4))
    seed = data.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise UserError(f"seed: must be an integer >= 0, got {shown(seed)}")
    output = data.get("output")
    if output is not None and (not isinstance(output, str) or not output.endswith(".jsonl")):
        raise UserError(f"output: must be a path ending in .jsonl, got {shown(output)}")
    grids = strategy_grids(data.get("strategies"))
    workload, gemm = _workload(data, grids)
    batches, decodes = parse_batches(data)
    if workload != "layer" and any(decodes):
        raise UserError(f"batches: mixed prefill + decode batches are for the layer workload, not {workload}")
    spec = SweepSpec(
        name=spec_name,
        model=model,
        shape=shape,
        tp=tp,
        dtype=dtype,
        layers=layers,
        seed=seed,
        batches=batches,
        strategies=grids,
        measure=Measure.from_yaml(data.get("measure")),
        output=output,
        comm=CommSpec.from_yaml(data["comm"], cuda) if "comm" in data else None,
        workload=workload,
        gemm=gemm,
        decodes=decodes if any(decodes) else (),
        for_device=for_device,
    )
    for grid in spec.strategies:  # expand once now, so bad knobs fail before any launch
        grid.settings()
    return spec


def parse_layers(value: Any) -> int | tuple[int, ...]:
    """`layers`: one depth (an int, kept an int so specs and rows read as before), or a list of
    distinct depths, each batch timed at each (report's per-layer marginals need two or more)."""
    if not isinstance(value, list):
        return positive_int(value, "layers")
    if not value:
        raise UserError("layers: an empty list; give one depth such as 4, or several such as [4, 8]")
    depths = tuple(positive_int(n, f"layers[{i}]") for i, n in enumerate(value))
    twice = next((n for n in depths if depths.count(n) > 1), None)
    if twice is not None:
        raise UserError(f"layers: {twice} appears twice; list each depth once, such as [4, 8]")
    return depths


def load(path: str | Path, cuda: bool) -> SweepSpec:
    strategies.load_plugins()
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: no such spec file; see sweeps/ for examples") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read the spec: {unreadable(e)}") from None
    try:
        data = yamlio.load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}: not valid YAML{at}; fix the syntax") from None
    except UserError as e:  # a key given twice
        raise UserError(f"{path}: {e}") from None
    if data is None:
        raise UserError(f"{path}: the spec is empty; see sweeps/quick.yaml for an example")
    try:
        return replace(from_dict(data, path.stem, cuda, path.parent), source=str(path))
    except UserError as e:
        raise UserError(f"{path}: {e}") from None


def _processes(n: int) -> str:
    return "1 process" if n == 1 else f"{n} processes"
