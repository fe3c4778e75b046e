"""Sweep specs: YAML -> validated dataclasses -> the points of a sweep.

Everything here runs before any process starts (and again on each rank, cheaply), so a typo
costs a one-line error, not a cluster allocation. No torch at import.

Long because each section's validation sits beside its dataclass (model, batches, strategies,
measure, comm, cpu overrides), so a field's rule is found next to the field.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from overlapbench import hf_config, models, strategies, yamlio
from overlapbench.comm.paths import DEFAULT_PATHS as COMM_DEFAULT_PATHS
from overlapbench.comm.paths import OPS as COMM_OPS
from overlapbench.comm.paths import PATHS as COMM_PATHS
from overlapbench.comm.paths import PATHS_BY_OP
from overlapbench.comm.sizes import comm_sizes
from overlapbench.errors import UserError, did_you_mean, field_name, reject_unknown_keys, shown, unreadable

DTYPES = ("auto", "bf16", "fp16", "fp32")
DEFAULT_TOLERANCE = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}
DEVICE_SECTIONS = ("cpu", "cuda")
CHECKS = ("auto", "baseline", "fp32")  # measure.check
WORKLOADS = ("layer", "gemm_ag", "gemm_rs")  # the layer stack, or one GEMM with its all-gather / reduce-scatter


def _positive_int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UserError(f"{where}: must be a positive integer, got {shown(value)}")
    return value


@dataclass(frozen=True)
class Measure:
    """How each point is timed and checked."""

    warmup: int = 10
    iters: int = 50
    warmup_s: float = 0.5  # and at least this long: GPU clocks settle before timing
    min_time_s: float = 1.0  # timed iterations run at least this long (more iterations for small points)
    graphs: bool = True
    tolerance: float | None = None  # None: by dtype (DEFAULT_TOLERANCE)
    timeout_s: int = 300  # per point, and the process-group timeout: a hung point stops the sweep by then
    # Interleaved timing (interleave.py): a batch's candidates in rounds, each for `span_ms` per
    # round, until each speedup's 95% interval is within +-`ci_target` (at most `rounds` rounds,
    # and at most `time_factor` x the time the sequential mode would time them: iters, min_time_s).
    interleave: bool | str = "auto"  # auto: on GPUs; on CPU the sequential mode (fast tests)
    # On an H200 the paired ratio at spans of 10-25 ms matched 1 s runs within 0.1%, longer spans
    # strayed by up to 0.8% (results/h200x2/probes/probe_clock.log): with no idle gap the clock
    # stays in its sustained regime, and short spans pair candidates closer in time.
    span_ms: float = 20.0
    # On 2x H200, rounds' log ratios to the reference spread by 2.4-3.4% at 1-8K tokens (0.8-1.3%
    # above) while the ranks' lag from the candidate before counted in; with it kept out
    # (interleave.py), 1.8-2.7%, and 5x the sequential time, 400 rounds at most, brought every
    # interval at >= 4K tokens within +-0.5%, at 1.55x the sequential wall time
    # (results/h200x2/3b4da9f/check-paired.txt, round-spread.txt).
    rounds: int = 400
    ci_target: float = 0.005
    time_factor: float = 5.0
    # What a point's output is checked against: `baseline`'s output within `tolerance`, or
    # (fp32) the truth, baseline's arithmetic in fp32 on the same rounded weights and input, within
    # max(tolerance, 2 x baseline's own distance from it). Two correct bf16 schedules differ by
    # their rounding, which grows with the ranks summed (7.5e-3 at TP=4 against 1e-2) and jumps
    # where a token's top-k experts flip; the truth measures each against what it approximates.
    # auto: fp32 at tp >= 8 and for MoE shapes in bf16/fp16, else baseline.
    check: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.warmup, int) or isinstance(self.warmup, bool) or self.warmup < 0:
            raise UserError(f"measure.warmup: must be an integer >= 0, got {shown(self.warmup)}")
        _positive_int(self.iters, "measure.iters")
        for name in ("warmup_s", "min_time_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 600:
                raise UserError(f"measure.{name}: must be a number of seconds in [0, 600], got {shown(value)}")
        _positive_int(self.timeout_s, "measure.timeout_s")
        if not isinstance(self.graphs, bool):
            raise UserError(f"measure.graphs: must be true or false, got {shown(self.graphs)}")
        if self.tolerance is not None and (
            not isinstance(self.tolerance, (int, float))
            or isinstance(self.tolerance, bool)
            or not self.tolerance > 0
        ):
            raise UserError(f"measure.tolerance: must be a positive number, got {shown(self.tolerance)}")
        if self.check not in CHECKS:
            raise UserError(f"measure.check: must be one of {', '.join(CHECKS)}, got {shown(self.check)}")
        if self.interleave not in (True, False, "auto"):
            raise UserError(f"measure.interleave: must be true, false or auto, got {shown(self.interleave)}")
        _positive_int(self.rounds, "measure.rounds")
        for name, top in (("span_ms", 60_000), ("ci_target", 1), ("time_factor", 100)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= top:
                raise UserError(f"measure.{name}: must be a number in (0, {top}], got {shown(value)}")

    def checks_against_fp32(self, tp: int, moe: bool, dtype: str) -> bool:
        """Whether points are checked against the fp32 truth (see `check`), not baseline's output."""
        if self.check == "auto":
            return dtype != "fp32" and (tp >= 8 or moe)
        return self.check == "fp32"

    def interleaved(self, cuda: bool) -> bool:
        """Whether a batch's candidates are timed interleaved (else one after the other)."""
        return cuda if self.interleave == "auto" else bool(self.interleave)

    @classmethod
    def from_yaml(cls, data: Any) -> Measure:
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise UserError(f"measure: must be a mapping of settings, got {type(data).__name__}")
        reject_unknown_keys(data, [f.name for f in fields(cls)], "measure")
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
            raise UserError(f"{where}.{knob}: {shown(repeated[0])} is listed twice; remove the duplicate")
        grid[knob] = values
    return StrategyGrid(name, grid, where)


def _strategy_grids(data: Any) -> tuple[StrategyGrid, ...]:
    """{strategy: grid} or {strategy: [grid, grid, ...]} (grids expand separately), or names."""
    if isinstance(data, list):
        if not all(isinstance(name, str) for name in data):
            raise UserError("strategies: a list of strategies must hold names, e.g. [baseline, no_comm]")
        data = {name: {} for name in data}
    if not isinstance(data, dict) or not data:
        raise UserError(
            "strategies: must be a non-empty mapping {strategy: {knob: value or [values]}} "
            "or a list of strategy names"
        )
    grids = []
    for name, knobs in data.items():
        where = f"strategies.{field_name(name)}"
        if not isinstance(name, str):
            raise UserError(f"{where}: a strategy name must be a string")
        strategies.get(name, where)
        if isinstance(knobs, list):
            if not knobs:
                raise UserError(f"{where}: empty list of grids; give at least one {{knob: values}}")
            grids += [_grid(name, k or {}, f"{where}[{i}]") for i, k in enumerate(knobs)]
        else:
            grids.append(_grid(name, knobs or {}, where))
    return tuple(grids)


@dataclass(frozen=True)
class Gemm:
    """The GEMM of a micro workload: [M, K] @ [K, N], M being the tokens."""

    n: int
    k: int


@dataclass(frozen=True)
class Decode:
    """A mixed batch's decode tokens: `tokens` sequences, each decoding its next token after
    `context` cached ones."""

    tokens: int
    context: int

    def as_dict(self) -> dict:
        return asdict(self)


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
    gemm: Gemm | None = None  # a micro workload's N and K
    decode: Decode | None = None  # a mixed batch's decode tokens (`batch`: its prefill sequences)

    @property
    def tokens(self) -> int:
        return sum(self.batch) + (self.decode.tokens if self.decode else 0)

    @property
    def workload_key(self) -> tuple:
        """Points sharing this key share weights, inputs and the baseline's reference output."""
        return (self.workload, self.gemm, self.shape, self.tp, self.dtype, self.layers, self.seed, self.batch,
                self.decode)

    def key(self) -> str:
        """Identity of the point in a results file (what `--resume` matches on)."""
        return json.dumps(
            {
                "workload": self.workload,
                **({"gemm": {"n": self.gemm.n, "k": self.gemm.k}} if self.gemm else {}),
                "shape": self.shape.as_dict(),
                "tp": self.tp,
                "dtype": self.dtype,
                "layers": self.layers,
                "seed": self.seed,
                "batch": list(self.batch),
                # only mixed batches carry it, so the keys of prefill-only points stay as they were
                **({"decode": self.decode.as_dict()} if self.decode else {}),
                "strategy": self.strategy,
                "knobs": self.knobs,
            },
            sort_keys=True,
        )


def _items(value: Any, where: str) -> tuple:
    """A YAML list, a scalar, or a comma-separated string, as a tuple without duplicates."""
    if isinstance(value, str):
        value = [int(s) if s.strip().isdigit() else s.strip() for s in value.split(",") if s.strip()]
    items = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not items:
        raise UserError(f"{where}: empty; give at least one value")
    repeated = [v for i, v in enumerate(items) if v in items[:i]]
    if repeated:
        raise UserError(f"{where}: {shown(repeated[0])} is listed twice; remove the duplicate")
    return items


def _names(value: Any, allowed: tuple[str, ...], where: str) -> tuple[str, ...]:
    items = _items(value, where)
    for item in items:
        if item not in allowed:
            raise UserError(f"{where}: unknown {shown(item)}{did_you_mean(item, allowed)}; known: {', '.join(allowed)}")
    return items


@dataclass(frozen=True)
class CommSpec:
    """Collective microbenchmarks (`overlapbench comm`, overlapbench/comm.py) that a study runs
    after its layer points, into the same results file."""

    ops: tuple[str, ...]
    paths: tuple[str, ...]
    sizes: tuple[int, ...]  # bytes
    nccl_max_ctas: tuple  # NCCL CTA budgets: "default" or ints
    comm_ctas: tuple[int, ...]  # the fused kernel's CTA budgets
    hidden: int | None = None  # fused_norm measures rows x hidden; None: the study's hidden

    KEYS = ("ops", "paths", "sizes", "nccl_max_ctas", "comm_ctas", "hidden")
    DEFAULT_NCCL_MAX_CTAS = (strategies.DEFAULT, 4, 8, 16, 32)
    DEFAULT_COMM_CTAS = (1, 2, 4, 8, 16, 32, 64)

    @classmethod
    def build(cls, *, ops: Any, paths: Any, sizes: tuple[int, ...], nccl_max_ctas: Any, comm_ctas: Any,
              hidden: Any, name: Callable[[str], str]) -> CommSpec:
        """Validated; `name(field)` is how an error names a field (comm.ops in a spec, --ops on
        the command line)."""
        from overlapbench.knobs import NCCL_MAX_CTAS
        from overlapbench.knobs import comm_ctas as comm_ctas_knob

        ops, paths = _names(ops, COMM_OPS, name("ops")), _names(paths, COMM_PATHS, name("paths"))
        if not any(p in paths for op in ops for p in PATHS_BY_OP[op]):
            runs = "; ".join(f"{op}: {', '.join(PATHS_BY_OP[op])}" for op in ops)
            raise UserError(f"{name('paths')}: none of {', '.join(paths)} runs the chosen ops ({runs})")
        budget = comm_ctas_knob("comm_ctas", "")
        nccl = tuple(NCCL_MAX_CTAS.check(v, name("nccl_max_ctas")) for v in _items(nccl_max_ctas, name("nccl_max_ctas")))
        fused = tuple(budget.check(v, name("comm_ctas")) for v in _items(comm_ctas, name("comm_ctas")))
        if hidden is not None:
            _positive_int(hidden, name("hidden"))
        return cls(ops, paths, tuple(sizes), nccl, fused, hidden)

    @classmethod
    def from_yaml(cls, data: Any, cuda: bool) -> CommSpec:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise UserError(f"comm: must be a mapping with any of {', '.join(cls.KEYS)} ({{}} for the defaults)")
        reject_unknown_keys(data, cls.KEYS, "comm")
        return cls.build(
            ops=data.get("ops", COMM_OPS), paths=data.get("paths", COMM_DEFAULT_PATHS),
            sizes=comm_sizes(data.get("sizes"), cuda, "comm.sizes"),
            nccl_max_ctas=data.get("nccl_max_ctas", cls.DEFAULT_NCCL_MAX_CTAS),
            comm_ctas=data.get("comm_ctas", cls.DEFAULT_COMM_CTAS), hidden=data.get("hidden"),
            name=lambda field: f"comm.{field}",
        )


@dataclass(frozen=True)
class SweepSpec:
    name: str
    model: str  # preset name, a config.json's model name (hf_config.model_name), or "custom"
    shape: models.ModelShape
    tp: int | str  # an int, or "auto": the world size
    dtype: str
    layers: int
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

    def compositions(self) -> list[tuple[tuple[int, ...], Decode | None]]:
        """(prefill sequence lengths, decode tokens or None) of each batch, in order."""
        return list(zip(self.batches, self.decodes or (None,) * len(self.batches), strict=True))

    def resolved_dtype(self, cuda: bool) -> str:
        return ("bf16" if cuda else "fp32") if self.dtype == "auto" else self.dtype

    def resolved_tp(self, world_size: int) -> int:
        tp = world_size if self.tp == "auto" else self.tp
        if tp != world_size:
            raise UserError(
                f"tp: {tp} but the sweep runs on {_processes(world_size)}; "
                f"launch {_processes(tp)} (--nproc {tp}) or set tp to {world_size} or 'auto'"
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
        layers = self.layers if self.workload == "layer" else 1  # a micro point is one GEMM
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
            for name, knobs in settings
        ]


TOP_KEYS = (
    "name", "model", "shape", "tp", "dtype", "layers", "seed", "tokens", "batches",
    "strategies", "measure", "output", "comm", "workload", "gemm", *DEVICE_SECTIONS,
)


def _mixed(batch: dict, where: str) -> tuple[tuple[int, ...], Decode]:
    """`{prefill: [lengths], decode: N, context: C}`: prefill may be empty or absent (decode only)."""
    reject_unknown_keys(batch, ("prefill", "decode", "context"), where)
    prefill = batch.get("prefill") or []
    if isinstance(prefill, int) and not isinstance(prefill, bool):
        prefill = [prefill]
    if not isinstance(prefill, list):
        raise UserError(f"{where}.prefill: must be a list of sequence lengths, got {shown(prefill)}")
    lengths = tuple(_positive_int(n, f"{where}.prefill[{j}]") for j, n in enumerate(prefill))
    for name in ("decode", "context"):
        if name not in batch:
            raise UserError(f"{where}.{name}: missing; a mixed batch is {{prefill: [2048], decode: 256, context: 4096}}")
    return lengths, Decode(_positive_int(batch["decode"], f"{where}.decode"), _positive_int(batch["context"], f"{where}.context"))


def _batches(data: dict) -> tuple[tuple[tuple[int, ...], ...], tuple[Decode | None, ...]]:
    """Each batch's prefill sequence lengths, and its decode tokens (None: prefill only)."""
    batches: list[tuple[tuple[int, ...], Decode | None]] = []
    tokens = data.get("tokens", [])
    if not isinstance(tokens, list):
        tokens = [tokens]
    for i, n in enumerate(tokens):
        batches.append(((_positive_int(n, f"tokens[{i}]"),), None))
    raw = data.get("batches", [])
    if not isinstance(raw, list):
        raise UserError("batches: must be a list of batches, each a list of sequence lengths or {prefill, decode, context}")
    for i, batch in enumerate(raw):
        if isinstance(batch, int) and not isinstance(batch, bool):
            batch = [batch]
        if isinstance(batch, dict):
            batches.append(_mixed(batch, f"batches[{i}]"))
            continue
        if not isinstance(batch, list) or not batch:
            raise UserError(f"batches[{i}]: must be a non-empty list of sequence lengths, "
                            "or {prefill: [...], decode: N, context: C}")
        lengths = tuple(_positive_int(n, f"batches[{i}][{j}]") for j, n in enumerate(batch))
        batches.append((lengths, None))
    if not batches:
        raise UserError("tokens: no batches; give 'tokens: [1024, ...]' or 'batches: [[512, 512], ...]'")
    if len(set(batches)) != len(batches):
        dup = next(b for b in batches if batches.count(b) > 1)
        shown = list(dup[0]) if dup[1] is None else {"prefill": list(dup[0]), **dup[1].as_dict()}
        raise UserError(f"tokens: the batch {shown} appears twice; remove the duplicate")
    return tuple(b for b, _ in batches), tuple(d for _, d in batches)


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
    return workload, Gemm(_positive_int(gemm["n"], "gemm.n"), _positive_int(gemm["k"], "gemm.k"))


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

    spec_name = data.get("name", name)
    if not isinstance(spec_name, str) or not spec_name or "/" in spec_name:
        raise UserError(f"name: must be a non-empty string without '/', got {shown(spec_name)}")
    model, shape = _model(data, base)
    tp = data.get("tp", "auto")
    if tp != "auto":
        _positive_int(tp, "tp")
    dtype = data.get("dtype", "auto")
    if dtype not in DTYPES:
        raise UserError(f"dtype: {shown(dtype)} is not one of {', '.join(DTYPES)}")
    layers = _positive_int(data.get("layers", 4), "layers")
    seed = data.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise UserError(f"seed: must be an integer >= 0, got {shown(seed)}")
    output = data.get("output")
    if output is not None and (not isinstance(output, str) or not output.endswith(".jsonl")):
        raise UserError(f"output: must be a path ending in .jsonl, got {shown(output)}")
    grids = _strategy_grids(data.get("strategies"))
    workload, gemm = _workload(data, grids)
    batches, decodes = _batches(data)
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
        for_device=bool(section),
    )
    for grid in spec.strategies:  # expand once now, so bad knobs fail before any launch
        grid.settings()
    return spec


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
        return from_dict(data, path.stem, cuda, path.parent)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None


def _processes(n: int) -> str:
    return "1 process" if n == 1 else f"{n} processes"
