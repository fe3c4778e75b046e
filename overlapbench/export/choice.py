"""The setting an export writes: of the settings an engine can express, the fastest by the measured
rows, never slower than the engine's own defaults.

An engine's `Model` says what it runs (a `Path`) at a token count under a setting, from its code's
facts. Each candidate setting is judged at every measured batch against the default setting:
where it runs something else, both paths need a stand-in row (stand_ins.py), and the candidate's
must be no slower (by the median); it wins there where tune's rule says it is faster beyond the
noise (tune.gain(...).beats). It is judged on a host with NVLink multicast and on one without
(where paths that need it turn themselves off), and must be no slower on either. Of the settings
that pass, the export takes the one with the largest win (the sum of log speedups where it wins,
on a host with multicast), then the one that changes the fewest measured batches, then the fewest
smaller, unmeasured sizes (powers of two below the smallest measured count: decode), then the
default's order. So the default stays wherever it measures as fast, and wherever a change cannot be
priced. Each measured count answers for its tuned range, as in the tuned config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from overlapbench.export.stand_ins import Path, stand_in
from overlapbench.tuned import TunedConfig
from overlapbench.tuning import batches, tune
from overlapbench.tuning.analysis import Measured


class Model(Protocol):
    """An engine as an export sees it, for one tuned config and release."""

    engine: str

    def default(self) -> Any: ...

    def candidates(self, counts: list[int]) -> list[Any]:
        """The settings to consider, the default first."""

    def runs(self, setting: Any, tokens: int, multicast: bool) -> Path: ...

    def step_cap(self) -> int | None:
        """The most tokens one step holds by default (None: not recorded for this GPU)."""


@dataclass(frozen=True)
class Line:
    """One measured batch: the default's path and the export's, their stand-in rows, the tuned
    pick's row; `cost`: the default's ms over the export's; `beyond`: the export's ms over the
    tuned pick's (what a pick the engine does not run would add)."""

    tokens: int
    label: str
    default: Path
    default_row: Measured | None
    chosen: Path
    chosen_row: Measured | None
    tuned_row: Measured | None
    cost: tune.Gain | None
    beyond: tune.Gain | None
    above_cap: bool


@dataclass(frozen=True)
class Choice:
    """The setting an export writes, the default it is judged against, and the measured lines."""

    setting: Any
    default: Any
    lines: list[Line]
    without_multicast: list[tuple[int, Path, Path]]  # (tokens, default's path, export's) where either changes


@dataclass(frozen=True)
class _Verdict:
    score: float
    changed: int


def choose(model: Model, config: TunedConfig, rows: list[Measured]) -> Choice:
    """The best setting (see the module docstring), with a line per measured batch."""
    measured = _batches(rows)
    counts = sorted({t for t, _ in measured})
    probes = [1 << i for i in range(20) if counts and (1 << i) < counts[0]]
    default = model.default()
    best, best_key = default, None
    for index, setting in enumerate(model.candidates(counts)):
        verdict = _judge(model, setting, default, measured)
        if verdict is None:
            continue
        unmeasured = sum(model.runs(setting, t, True) != model.runs(default, t, True) for t in probes)
        key = (-round(verdict.score, 12), verdict.changed, unmeasured, index)
        if best_key is None or key < best_key:
            best, best_key = setting, key
    return Choice(best, default, [_line(model, config, best, default, t, b) for t, b in measured],
                  _without_multicast(model, best, default, counts))


def _batches(rows: list[Measured]) -> list[tuple[int, list[Measured]]]:
    by_tokens: dict[int, list[Measured]] = {}
    for m in rows:
        by_tokens.setdefault(m.tokens, []).append(m)
    return [(t, b) for t, at in sorted(by_tokens.items()) for b in batches.by_batch(at).values()]


def _judge(model: Model, setting: Any, default: Any, measured: list[tuple[int, list[Measured]]]) -> _Verdict | None:
    """The setting's win and changes against the default; None where it is slower somewhere, or
    changes a batch whose paths cannot both be priced."""
    score, changed = 0.0, 0
    for multicast in (True, False):
        for tokens, rows in measured:
            ours, theirs = model.runs(setting, tokens, multicast), model.runs(default, tokens, multicast)
            if ours == theirs:
                continue
            mine, base = stand_in(ours, rows), stand_in(theirs, rows)
            if mine is None or base is None or mine.ms > base.ms:
                return None
            if multicast:
                changed += 1
                if mine is not base and tune.gain(mine, base).beats():
                    score += math.log(base.ms / mine.ms)
    return _Verdict(score, changed)


def _line(model: Model, config: TunedConfig, setting: Any, default: Any, tokens: int, rows: list[Measured]) -> Line:
    theirs, ours = model.runs(default, tokens, True), model.runs(setting, tokens, True)
    base, mine = stand_in(theirs, rows), stand_in(ours, rows)
    pick = config.choose(tokens)
    tuned_row = next((m for m in rows if m.strategy == pick.strategy and m.knobs == pick.knobs), None)
    cap = model.step_cap()
    return Line(tokens, batches.batch_label(rows[0]), theirs, base, ours, mine, tuned_row, _gain(mine, base),
                _gain(tuned_row, mine), cap is not None and tokens > cap)


def _gain(faster: Measured | None, slower: Measured | None) -> tune.Gain | None:
    """slower ms / faster ms, with tune's interval; 1 where both are the same row."""
    if faster is None or slower is None:
        return None
    if faster is slower:
        return tune.Gain(1.0, 1.0, 1.0, "same row")
    return tune.gain(faster, slower)


def _without_multicast(model: Model, setting: Any, default: Any, counts: list[int]) -> list[tuple[int, Path, Path]]:
    """The measured counts where a host without NVLink multicast runs something else, under the
    default or the export: what the export's header says such a host gets."""
    out = []
    for t in counts:
        theirs, ours = model.runs(default, t, False), model.runs(setting, t, False)
        if theirs != model.runs(default, t, True) or ours != model.runs(setting, t, True):
            out.append((t, theirs, ours))
    return out
