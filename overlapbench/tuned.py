"""Tuned configs: the small loader an inference engine imports (stdlib and PyYAML only).

    config = overlapbench.tuned.load("llama3-70b-tp8-nvidia-h200-bf16.yaml")
    choice = config.choose(num_tokens)       # per batch: strategy, knobs, clamped, rule

A file holds sorted, non-overlapping token ranges that together cover 1..max, each with the
strategy and knobs to run there (format: `overlapbench/tuned-v1`, see docs/design.md). Keys this
module does not know (provenance, a rule's `why`) are kept, so load -> dump reproduces the text.
"""

from __future__ import annotations

import bisect
import operator
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from overlapbench import strategies, yamlio
from overlapbench.errors import UserError, shown, unreadable

SCHEMA = "overlapbench/tuned-v1"
HEADER = (
    "# overlapbench tuned config: which overlap strategy and knobs to run per batch size.\n"
    "# Written by `overlapbench tune`. In an engine: overlapbench.tuned.load(path).choose(num_tokens).\n"
    "# rules: sorted, non-overlapping token ranges [lo, hi] covering 1..max; above max the last rule answers.\n"
)
_TOP = ("schema", "device", "world_size", "tp", "model", "shape", "dtype", "rules")
_RULE = ("tokens", "strategy", "knobs", "ms", "speedup")


@dataclass(frozen=True)
class Rule:
    """Run `strategy` with `knobs` for batches of lo..hi tokens (both inclusive)."""

    lo: int
    hi: int
    strategy: str
    knobs: dict
    ms: float | None = None  # measured per-layer ms (informative)
    speedup: float | None = None  # over baseline with default knobs (informative)
    extra: dict = field(default_factory=dict)  # keys kept as read: why, measured, ...

    def as_dict(self) -> dict:
        known = {"tokens": [self.lo, self.hi], "strategy": self.strategy, "knobs": dict(self.knobs),
                 "ms": self.ms, "speedup": self.speedup}
        return known | self.extra


@dataclass(frozen=True)
class Choice:
    """The answer for one batch. `clamped`: the batch is larger than any measured one, so the
    last rule answered by extrapolation."""

    strategy: str
    knobs: dict
    clamped: bool
    rule: Rule


@dataclass(frozen=True)
class TunedConfig:
    device: str
    world_size: int
    tp: int
    model: str
    shape: dict
    dtype: str
    rules: tuple[Rule, ...]
    extra: dict = field(default_factory=dict)  # provenance and any other keys kept as read
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", tuple(rule.lo for rule in self.rules))

    @property
    def max_tokens(self) -> int:
        return self.rules[-1].hi

    def choose(self, num_tokens: int) -> Choice:
        """The strategy and knobs for a batch of `num_tokens` tokens (a ValueError below 1)."""
        if isinstance(num_tokens, bool):  # operator.index(True) is 1: a caller's bug, not a batch
            raise TypeError(f"num_tokens must be an int, got {num_tokens!r}")
        n = operator.index(num_tokens)
        if n < 1:
            raise ValueError(f"num_tokens must be at least 1, got {n}")
        rule = self.rules[bisect.bisect_right(self._starts, n) - 1]
        return Choice(rule.strategy, dict(rule.knobs), n > self.max_tokens, rule)

    def as_dict(self) -> dict:
        known = {"schema": SCHEMA, "device": self.device, "world_size": self.world_size, "tp": self.tp,
                 "model": self.model, "shape": dict(self.shape), "dtype": self.dtype,
                 "rules": [rule.as_dict() for rule in self.rules]}
        return known | self.extra


def dump(config: TunedConfig) -> str:
    """The YAML text: header comment, then the stable keys in a fixed order; leaf lists and
    mappings inline (`tokens: [1, 2048]`), no line wrapping, so load -> dump is the identity."""
    body = yaml.safe_dump(config.as_dict(), sort_keys=False, default_flow_style=None, width=1 << 16)
    return HEADER + body


def save(config: TunedConfig, path: str | Path) -> Path:
    """Write atomically (a temporary file renamed over the target): never half a file."""
    return write_atomic(Path(path), dump(config))


def write_atomic(path: Path, content: str | bytes) -> Path:
    """Write to a temporary file beside `path`, flush it to disk, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the config from the engine's user
        with os.fdopen(fd, "wb" if isinstance(content, bytes) else "w") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load(path: str | Path) -> TunedConfig:
    """Read and validate a tuned YAML; a one-line UserError naming the file and field."""
    path = Path(path)
    try:
        data = yamlio.load(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such tuned config; run `overlapbench tune` first") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read: {unreadable(e)}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise UserError(f"{path}: not valid YAML{f' at line {mark.line + 1}' if mark else ''}") from None
    except UserError as e:  # a key given twice
        raise UserError(f"{path}: {e}") from None
    try:
        return from_dict(data)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None


def from_dict(data: Any) -> TunedConfig:
    if not isinstance(data, dict):
        raise UserError("not a tuned config (expected a YAML mapping)")
    if data.get("schema") != SCHEMA:
        raise UserError(f"schema: {shown(data.get('schema'))}, this overlapbench reads {shown(SCHEMA)}")
    for name in _TOP:
        if name not in data:
            raise UserError(f"{name}: missing")
    rules = data["rules"]
    if not isinstance(rules, list) or not rules:
        raise UserError("rules: must be a non-empty list of {tokens: [lo, hi], strategy, knobs, ms, speedup}")
    parsed = tuple(_rule(r, f"rules[{i}]") for i, r in enumerate(rules))
    _check_coverage(parsed)
    return TunedConfig(
        device=_typed(data["device"], str, "device"),
        world_size=_count(data["world_size"], "world_size"),
        tp=_count(data["tp"], "tp"),
        model=_typed(data["model"], str, "model"),
        shape=_typed(data["shape"], dict, "shape"),
        dtype=_typed(data["dtype"], str, "dtype"),
        rules=parsed,
        extra={k: v for k, v in data.items() if k not in _TOP and k != "schema"},
    )


def _rule(data: Any, where: str) -> Rule:
    if not isinstance(data, dict):
        raise UserError(f"{where}: must be a mapping with {', '.join(_RULE)}")
    for name in ("tokens", "strategy", "knobs"):
        if name not in data:
            raise UserError(f"{where}.{name}: missing")
    tokens = data["tokens"]
    if not (isinstance(tokens, list) and len(tokens) == 2):
        raise UserError(f"{where}.tokens: must be [lo, hi], got {shown(tokens)}")
    lo, hi = (_count(t, f"{where}.tokens") for t in tokens)
    if lo > hi:
        raise UserError(f"{where}.tokens: [{lo}, {hi}] is empty (lo > hi)")
    strategy = _typed(data["strategy"], str, f"{where}.strategy")
    knobs = _typed(data["knobs"] or {}, dict, f"{where}.knobs")
    _check_setting(strategy, knobs, where)
    return Rule(
        lo, hi,
        strategy=strategy,
        knobs=knobs,
        ms=_number(data.get("ms"), f"{where}.ms"),
        speedup=_number(data.get("speedup"), f"{where}.speedup"),
        extra={k: v for k, v in data.items() if k not in _RULE},
    )


def _check_setting(strategy: str, knobs: dict, where: str) -> None:
    """The strategy exists (built in, or a plugin named in OVERLAPBENCH_PLUGINS) and every knob
    is one of its knobs, inside its domain: what an engine would run, checked at load time. The
    knobs stay as written (the strategy fills in defaults when it builds)."""
    strategies.load_plugins()
    cls = strategies.get(strategy, f"{where}.strategy")
    names = {k.name for k in cls.knobs}
    # null: a knob that does not apply to this setting (the strategy resets it so)
    cls.check_knobs({k: v for k, v in knobs.items() if v is not None or k not in names}, f"{where}.knobs")


def _check_coverage(rules: tuple[Rule, ...]) -> None:
    """Sorted, non-overlapping, no gaps, starting at 1: every batch size has exactly one rule."""
    if rules[0].lo != 1:
        raise UserError(f"rules[0].tokens: starts at {rules[0].lo}; the first rule must start at 1")
    for i in range(1, len(rules)):
        prev, rule = rules[i - 1], rules[i]
        if rule.lo != prev.hi + 1:
            problem = "overlaps" if rule.lo <= prev.hi else "leaves a gap after"
            raise UserError(
                f"rules[{i}].tokens: starts at {rule.lo}, which {problem} rules[{i - 1}] (ends at {prev.hi}); "
                f"rules must be sorted and cover 1..max without gaps or overlaps"
            )


def _typed(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind):
        raise UserError(f"{where}: must be a {kind.__name__}, got {shown(value)}")
    return value


def _count(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"{where}: must be a positive integer, got {shown(value)}")
    return value


def _number(value: Any, where: str) -> float | None:
    if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        raise UserError(f"{where}: must be a number or null, got {shown(value)}")
    return value
