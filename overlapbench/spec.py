"""Sweep specs: YAML -> validated dataclasses -> the points of a sweep.

Everything here runs before any process starts (and again on each rank, cheaply), so a typo
costs a one-line error, not a cluster allocation. No torch at import.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from overlapbench import models, strategies
from overlapbench.errors import UserError, did_you_mean

DTYPES = ("auto", "bf16", "fp16", "fp32")
DEFAULT_TOLERANCE = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}
DEVICE_SECTIONS = ("cpu", "cuda")


def _reject_unknown(data: dict, allowed, where: str) -> None:
    for key in data:
        if key not in allowed:
            prefix = f"{where}." if where else ""
            raise UserError(
                f"{prefix}{key}: unknown key{did_you_mean(key, allowed)}; "
                f"allowed: {', '.join(allowed)}"
            )


def _positive_int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UserError(f"{where}: must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class Measure:
    """How each point is timed and checked."""

    warmup: int = 10
    iters: int = 50
    graphs: bool = True
    tolerance: float | None = None  # None: by dtype (DEFAULT_TOLERANCE)
    timeout_s: int = 600  # process-group timeout: a dead or hung rank stops the sweep by then

    def __post_init__(self) -> None:
        if not isinstance(self.warmup, int) or isinstance(self.warmup, bool) or self.warmup < 0:
            raise UserError(f"measure.warmup: must be an integer >= 0, got {self.warmup!r}")
        _positive_int(self.iters, "measure.iters")
        _positive_int(self.timeout_s, "measure.timeout_s")
        if not isinstance(self.graphs, bool):
            raise UserError(f"measure.graphs: must be true or false, got {self.graphs!r}")
        if self.tolerance is not None and (
            not isinstance(self.tolerance, (int, float))
            or isinstance(self.tolerance, bool)
            or not self.tolerance > 0
        ):
            raise UserError(f"measure.tolerance: must be a positive number, got {self.tolerance!r}")

    @classmethod
    def from_yaml(cls, data: Any) -> "Measure":
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise UserError(f"measure: must be a mapping of settings, got {type(data).__name__}")
        _reject_unknown(data, [f.name for f in fields(cls)], "measure")
        return cls(**data)


@dataclass(frozen=True)
class StrategyGrid:
    """One strategy with a grid of knob settings (lists expand as a Cartesian product)."""

    name: str
    grid: dict[str, tuple]
    where: str  # the spec field it came from, for error messages

    def settings(self) -> list[dict]:
        """Every knob combination, validated and with defaults filled in."""
        cls = strategies.get(self.name)
        where = self.where
        names = list(self.grid)
        combos = itertools.product(*(self.grid[n] for n in names)) if names else [()]
        out, seen = [], set()
        for combo in combos:
            knobs = cls.check_knobs(dict(zip(names, combo)), where)
            key = json.dumps(knobs, sort_keys=True)
            if key not in seen:  # knobs that do not apply to a setting are reset: one point
                seen.add(key)
                out.append(knobs)
        return out


def _grid(name: str, knobs: Any, where: str) -> StrategyGrid:
    if not isinstance(knobs, dict):
        raise UserError(f"{where}: must map knob names to values or lists of values")
    grid = {}
    for knob, values in knobs.items():
        values = tuple(values) if isinstance(values, list) else (values,)
        if not values:
            raise UserError(f"{where}.{knob}: empty list; give at least one value")
        repeated = [v for i, v in enumerate(values) if v in values[:i]]
        if repeated:
            raise UserError(f"{where}.{knob}: {repeated[0]!r} is listed twice; remove the duplicate")
        grid[knob] = values
    return StrategyGrid(name, grid, where)


def _strategy_grids(data: Any) -> tuple[StrategyGrid, ...]:
    """{strategy: grid} or {strategy: [grid, grid, ...]} (grids expand separately), or names."""
    if isinstance(data, list):
        data = {name: {} for name in data}
    if not isinstance(data, dict) or not data:
        raise UserError(
            "strategies: must be a non-empty mapping {strategy: {knob: value or [values]}} "
            "or a list of strategy names"
        )
    grids = []
    for name, knobs in data.items():
        where = f"strategies.{name}"
        strategies.get(name, where)
        if isinstance(knobs, list):
            if not knobs:
                raise UserError(f"{where}: empty list of grids; give at least one {{knob: values}}")
            grids += [_grid(name, k or {}, f"{where}[{i}]") for i, k in enumerate(knobs)]
        else:
            grids.append(_grid(name, knobs or {}, where))
    return tuple(grids)


@dataclass(frozen=True)
class Point:
    """One measurement: a batch through the stack with one strategy and one knob setting."""

    spec: str
    model: str
    shape: models.ModelShape
    tp: int
    dtype: str
    layers: int
    seed: int
    batch: tuple[int, ...]
    strategy: str
    knobs: dict
    workload: str = "layer"

    @property
    def tokens(self) -> int:
        return sum(self.batch)

    @property
    def workload_key(self) -> tuple:
        """Points sharing this key share weights, inputs and the baseline's reference output."""
        return (self.workload, self.shape, self.tp, self.dtype, self.layers, self.seed, self.batch)

    def key(self) -> str:
        """Identity of the point in a results file (what `--resume` matches on)."""
        return json.dumps(
            {
                "workload": self.workload,
                "shape": self.shape.as_dict(),
                "tp": self.tp,
                "dtype": self.dtype,
                "layers": self.layers,
                "seed": self.seed,
                "batch": list(self.batch),
                "strategy": self.strategy,
                "knobs": self.knobs,
            },
            sort_keys=True,
        )


@dataclass(frozen=True)
class SweepSpec:
    name: str
    model: str  # preset name, or "custom"
    shape: models.ModelShape
    tp: int | str  # an int, or "auto": the world size
    dtype: str
    layers: int
    seed: int
    batches: tuple[tuple[int, ...], ...]
    strategies: tuple[StrategyGrid, ...]
    measure: Measure = field(default_factory=Measure)
    output: str | None = None

    def resolved_dtype(self, cuda: bool) -> str:
        return ("bf16" if cuda else "fp32") if self.dtype == "auto" else self.dtype

    def resolved_tp(self, world_size: int) -> int:
        tp = world_size if self.tp == "auto" else self.tp
        if tp != world_size:
            raise UserError(
                f"tp: {tp} but the sweep runs on {world_size} processes; "
                f"launch {tp} processes (--nproc {tp}) or set tp to {world_size} or 'auto'"
            )
        self.shape.check_tp(tp)
        return tp

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
        """All points, grouped by batch so each batch's weights and reference are made once."""
        tp, dtype = self.resolved_tp(world_size), self.resolved_dtype(cuda)
        settings, seen = [], set()
        for grid in self.strategies:
            for knobs in grid.settings():
                key = (grid.name, json.dumps(knobs, sort_keys=True))
                if key not in seen:
                    seen.add(key)
                    settings.append((grid.name, knobs))
        return [
            Point(self.name, self.model, self.shape, tp, dtype, self.layers, self.seed,
                  batch, name, knobs)
            for batch in self.batches
            for name, knobs in settings
        ]


TOP_KEYS = (
    "name", "model", "shape", "tp", "dtype", "layers", "seed", "tokens", "batches",
    "strategies", "measure", "output", *DEVICE_SECTIONS,
)


def _batches(data: dict) -> tuple[tuple[int, ...], ...]:
    batches: list[tuple[int, ...]] = []
    tokens = data.get("tokens", [])
    if not isinstance(tokens, list):
        tokens = [tokens]
    for i, n in enumerate(tokens):
        batches.append((_positive_int(n, f"tokens[{i}]"),))
    raw = data.get("batches", [])
    if not isinstance(raw, list):
        raise UserError("batches: must be a list of batches, each a list of sequence lengths")
    for i, batch in enumerate(raw):
        if isinstance(batch, int) and not isinstance(batch, bool):
            batch = [batch]
        if not isinstance(batch, list) or not batch:
            raise UserError(f"batches[{i}]: must be a non-empty list of sequence lengths")
        batches.append(tuple(_positive_int(n, f"batches[{i}][{j}]") for j, n in enumerate(batch)))
    if not batches:
        raise UserError("tokens: no batches; give 'tokens: [1024, ...]' or 'batches: [[512, 512], ...]'")
    if len(set(batches)) != len(batches):
        dup = next(b for b in batches if batches.count(b) > 1)
        raise UserError(f"tokens: the batch {list(dup)} appears twice; remove the duplicate")
    return tuple(batches)


def _model(data: dict) -> tuple[str, models.ModelShape]:
    if "model" in data and "shape" in data:
        raise UserError("model: give either a preset 'model' or a custom 'shape', not both")
    if "shape" in data:
        shape = data["shape"]
        if not isinstance(shape, dict):
            raise UserError("shape: must be a mapping with hidden, ffn, heads, kv_heads, head_dim")
        allowed = [f.name for f in fields(models.ModelShape)]
        _reject_unknown(shape, allowed, "shape")
        missing = [k for k in allowed[:5] if k not in shape]
        if missing:
            raise UserError(f"shape.{missing[0]}: missing; a custom shape needs {', '.join(allowed[:5])}")
        return "custom", models.ModelShape(**shape)
    name = data.get("model")
    if not isinstance(name, str):
        raise UserError("model: missing; name a preset (see `overlapbench models`) or give 'shape'")
    return name, models.preset(name)


def from_dict(data: Any, name: str, cuda: bool) -> SweepSpec:
    """Validate a parsed YAML document; `cuda` picks the device section that applies."""
    if not isinstance(data, dict):
        raise UserError(f"spec: must be a YAML mapping of settings, got {type(data).__name__}")
    _reject_unknown(data, TOP_KEYS, "")
    section = data.get("cuda" if cuda else "cpu") or {}
    if not isinstance(section, dict):
        raise UserError(f"{'cuda' if cuda else 'cpu'}: must be a mapping of settings to override")
    _reject_unknown(section, [k for k in TOP_KEYS if k not in DEVICE_SECTIONS], "cpu" if not cuda else "cuda")
    data = {k: v for k, v in data.items() if k not in DEVICE_SECTIONS}
    if "model" in section or "shape" in section:
        data.pop("model", None), data.pop("shape", None)
    if "tokens" in section or "batches" in section:
        data.pop("tokens", None), data.pop("batches", None)
    data.update(section)

    spec_name = data.get("name", name)
    if not isinstance(spec_name, str) or not spec_name or "/" in spec_name:
        raise UserError(f"name: must be a non-empty string without '/', got {spec_name!r}")
    model, shape = _model(data)
    tp = data.get("tp", "auto")
    if tp != "auto":
        _positive_int(tp, "tp")
    dtype = data.get("dtype", "auto")
    if dtype not in DTYPES:
        raise UserError(f"dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    layers = _positive_int(data.get("layers", 4), "layers")
    seed = data.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise UserError(f"seed: must be an integer >= 0, got {seed!r}")
    output = data.get("output")
    if output is not None and (not isinstance(output, str) or not output.endswith(".jsonl")):
        raise UserError(f"output: must be a path ending in .jsonl, got {output!r}")
    spec = SweepSpec(
        name=spec_name,
        model=model,
        shape=shape,
        tp=tp,
        dtype=dtype,
        layers=layers,
        seed=seed,
        batches=_batches(data),
        strategies=_strategy_grids(data.get("strategies")),
        measure=Measure.from_yaml(data.get("measure")),
        output=output,
    )
    for grid in spec.strategies:  # expand once now, so bad knobs fail before any launch
        grid.settings()
    return spec


def load(path: str | Path, cuda: bool) -> SweepSpec:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: no such spec file; see sweeps/ for examples") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read the spec ({e.__class__.__name__}: {e})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}: not valid YAML{at}; fix the syntax") from None
    if data is None:
        raise UserError(f"{path}: the spec is empty; see sweeps/quick.yaml for an example")
    try:
        return from_dict(data, path.stem, cuda)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
