"""The sections of a sweep spec that stand alone: `measure` (how points are timed and checked) and
`strategies` (each strategy's knob grid), each validated beside its dataclass so a field's rule is
found next to the field. The `comm` section is comm's own (comm/spec.py). No torch at import."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, fields
from typing import Any

from overlapbench import strategies
from overlapbench.errors import UserError, field_name, positive_int, reject_unknown_keys, shown

CHECKS = ("auto", "baseline", "fp32")  # measure.check
# The deepest stack, in ranks x layers, whose bf16 points `check: auto` holds to baseline's output.
# Two correct bf16 schedules drift apart with both (results/h200x4/01de86b/, runs ebc7469aad23
# and 66a88f936fd2: 0.0057 / 0.0074 / 0.0096 at TP=2 through 4 / 8 / 16 layers of llama3-8b,
# 0.0073 / 0.0093 / 0.0119 at TP=4 through 4 / 8 / 16 of llama3-70b, against a tolerance of
# 0.01); deeper stacks are checked against the fp32 truth, whose bound grows with them.
ROUNDED_STACK = 16
MAX_PROFILE_REPLAYS = 16  # measure.profile_replays


@dataclass(frozen=True)
class Measure:
    """How each point is timed and checked."""

    warmup: int = 10
    iters: int = 50
    warmup_s: float = 0.5  # and at least this long: GPU clocks settle before timing
    min_time_s: float = 1.0  # timed iterations run at least this long (more iterations for small points)
    graphs: bool = True
    tolerance: float | None = None  # None: by dtype (spec.DEFAULT_TOLERANCE)
    timeout_s: int = 300  # per point, and the process-group timeout: a hung point stops the sweep by then
    # Interleaved timing (interleave.py): a batch's candidates in rounds, each run untimed for
    # `settle_ms` then timed for `span_ms` per round, until each speedup's 95% interval is within
    # +-`ci_target` (at most `rounds` rounds, and at most `time_factor` x the time the sequential
    # mode would time them: iters, min_time_s; settling counts in that time).
    interleave: bool | str = "auto"  # auto: on GPUs; on CPU the sequential mode (fast tests)
    # At the power cap the SM clock follows each candidate's load within 0.1-0.2 s; timed in 20 ms
    # spans with no settling, the candidates shared one clock and speedups over the baseline read
    # up to 0.13 high against 2 s spans (docs/timing.md, "Each choice at its own clock").
    settle_ms: float = 300.0
    span_ms: float = 200.0
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
    # their rounding, which grows with the ranks summed and the layers (ROUNDED_STACK) and jumps
    # where a token's top-k experts flip; the truth measures each against what it approximates.
    # auto: fp32 at tp >= 8, for MoE shapes and past ROUNDED_STACK (tp x layers) in bf16/fp16,
    # else baseline.
    check: str = "auto"
    # With --profile: how many CUDA-graph replays of the step the replay timeline records back to
    # back, as a timed span runs them after the ranks meet. One shows the first replay after the
    # meeting alone; more show whether what it pays recurs in the replays after it.
    profile_replays: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.warmup, int) or isinstance(self.warmup, bool) or self.warmup < 0:
            raise UserError(f"measure.warmup: must be an integer >= 0, got {shown(self.warmup)}")
        positive_int(self.iters, "measure.iters")
        for name in ("warmup_s", "min_time_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 600:
                raise UserError(f"measure.{name}: must be a number of seconds in [0, 600], got {shown(value)}")
        positive_int(self.timeout_s, "measure.timeout_s")
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
        positive_int(self.rounds, "measure.rounds")
        positive_int(self.profile_replays, "measure.profile_replays")
        if self.profile_replays > MAX_PROFILE_REPLAYS:
            raise UserError(f"measure.profile_replays: at most {MAX_PROFILE_REPLAYS} (each replay's kernels are "
                            f"written to the timeline), got {shown(self.profile_replays)}")
        for name, top in (("span_ms", 60_000), ("ci_target", 1), ("time_factor", 100)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= top:
                raise UserError(f"measure.{name}: must be a number in (0, {top}], got {shown(value)}")
        settle = self.settle_ms
        if not isinstance(settle, (int, float)) or isinstance(settle, bool) or not 0 <= settle <= 60_000:
            raise UserError(f"measure.settle_ms: must be a number in [0, 60000] (0: no settling), got {shown(settle)}")

    def checks_against_fp32(self, tp: int, moe: bool, dtype: str, layers: int) -> bool:
        """Whether points of `layers` layers are checked against the fp32 truth (see `check`), not
        baseline's output."""
        if self.check == "auto":
            return dtype != "fp32" and (tp >= 8 or moe or tp * layers > ROUNDED_STACK)
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


def strategy_grids(data: Any) -> tuple[StrategyGrid, ...]:
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
