"""What each field of a result row may hold: the one place a store's values are checked on read.

`tune` and `report` compute with these fields (medians, ratios, logs of samples, intervals). A value
of the wrong type or out of range (a hand-edited line, a half-merged file, another tool's JSON)
would otherwise surface as a traceback deep in the statistics; `results.read_rows` checks every
row against FIELDS and names the file, the line and the field instead. Absent and null fields are
not checked here: which fields a row must have depends on who reads it (analysis: an ok row of a
compared workload needs its timing), so the reader names them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def _integer(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class Kind:
    """A field's kind: a test of one value and how a message says what was expected."""

    expected: str
    test: Callable[[object], bool]

    def ok(self, value) -> bool:
        return self.test(value)


POSITIVE = Kind("a positive finite number", lambda x: _number(x) and 0 < x < math.inf)
NON_NEGATIVE = Kind("a finite number >= 0", lambda x: _number(x) and 0 <= x < math.inf)
ERROR = Kind("a number >= 0 (Infinity for a non-finite output)", lambda x: _number(x) and x >= 0)
COUNT = Kind("a whole number >= 1", lambda x: _integer(x) and x >= 1)
INDEX = Kind("a whole number >= 0", lambda x: _integer(x) and x >= 0)
TEXT = Kind("a string", lambda x: isinstance(x, str))
FLAG = Kind("true or false", lambda x: isinstance(x, bool))
MAPPING = Kind("an object ({...})", lambda x: isinstance(x, dict))
SAMPLES = Kind("a list of positive finite numbers", lambda x: isinstance(x, list) and all(POSITIVE.ok(v) for v in x))
ROUNDS = Kind("a list of whole numbers >= 0", lambda x: isinstance(x, list) and all(INDEX.ok(v) for v in x))
COUNTS = Kind("a non-empty list of whole numbers >= 1", lambda x: isinstance(x, list) and bool(x) and all(COUNT.ok(v) for v in x))
INTERVAL = Kind("[lo, hi], positive finite numbers with lo <= hi",
                lambda x: isinstance(x, list) and len(x) == 2 and all(POSITIVE.ok(v) for v in x) and x[0] <= x[1])
DECODE = Kind('{"tokens": N, "context": N}, whole numbers >= 1',
              lambda x: isinstance(x, dict) and COUNT.ok(x.get("tokens")) and COUNT.ok(x.get("context")))
GEMM = Kind('{"n": N, "k": N}, whole numbers >= 1',
            lambda x: isinstance(x, dict) and COUNT.ok(x.get("n")) and COUNT.ok(x.get("k")))
FINITE = Kind("a finite number", lambda x: _number(x) and math.isfinite(x))
SPREAD = Kind("[lo, hi], finite numbers with lo <= hi",
              lambda x: isinstance(x, list) and len(x) == 2 and all(FINITE.ok(v) for v in x) and x[0] <= x[1])

# Every field a reader computes with or groups by (docs/design.md, "Result rows"); others pass as they are.
FIELDS: dict[str, Kind] = {
    "status": Kind('one of "ok", "failed", "skipped"', lambda x: x in ("ok", "failed", "skipped")),
    "run_id": TEXT, "git": TEXT, "key": TEXT, "spec": TEXT, "error": TEXT, "profile_error": TEXT,
    "workload": TEXT, "strategy": TEXT, "model": TEXT, "device": TEXT, "dtype": TEXT, "pairing": TEXT,
    "knobs": MAPPING, "shape": MAPPING, "gemm": GEMM, "decode": DECODE,
    "tokens": COUNT, "tp": COUNT, "world_size": COUNT, "layers": COUNT, "iters": INDEX, "batch": COUNTS,
    "ms": POSITIVE, "p10_ms": POSITIVE, "p90_ms": POSITIVE, "iqr_ms": NON_NEGATIVE, "cv": NON_NEGATIVE,
    "rel_err": ERROR, "tolerance": NON_NEGATIVE, "checked": FLAG, "graphs": FLAG,
    "samples_ms": SAMPLES, "round_ids": ROUNDS, "speedup": POSITIVE, "speedup_ci": INTERVAL,
    "span_ms": NON_NEGATIVE,  # 0: one iteration a round, no span (the shared rounds of `sweep --pieces`)
    "settle_ms": NON_NEGATIVE, "rank_ms": SAMPLES,
    "tflops": NON_NEGATIVE, "peak_frac": NON_NEGATIVE, "peak_tflops": POSITIVE,
    # comm rows (report's comm table)
    "bytes": INDEX, "count": INDEX, "algbw": NON_NEGATIVE, "busbw": NON_NEGATIVE, "wrong": INDEX,
    "beside_ms": POSITIVE, "beside_busbw": NON_NEGATIVE, "gemm_loss": FINITE,
    "gemm_loss_paired": FINITE, "gemm_loss_paired_ci": SPREAD, "gemm_ms_alone_paired": POSITIVE,
    "gemm_one_call_extra_ms": FINITE, "gemm_one_call_extra_ci_ms": SPREAD, "gemm_one_call_op_ms": POSITIVE,
    # comm --beside-layer rows (predict's contention)
    "beside_layer": MAPPING, "compute_ms_alone": POSITIVE, "compute_ms_beside": POSITIVE, "compute_loss": FINITE,
    "compute_loss_paired": FINITE, "compute_loss_paired_ci": SPREAD, "compute_ms_alone_paired": POSITIVE,
    "compute_one_call_extra_ms": FINITE, "compute_one_call_extra_ci_ms": SPREAD, "compute_one_call_op_ms": POSITIVE,
    "in_layer_extra_ms": FINITE, "in_layer_extra_ci_ms": SPREAD, "in_layer_inline_ms": POSITIVE,
    "in_layer_pass_ms": POSITIVE, "in_layer_ops_ms": POSITIVE, "in_layer_rounds": COUNT, "in_layer_replays": COUNT,
    "inline_ms": POSITIVE, "inline_extra_ms": FINITE,  # rows made before the in-layer term's paired rounds
}


def problem(row: dict, required: tuple[str, ...] = ()) -> str | None:
    """What is wrong with the row (the first field that breaks FIELDS, or a required field that
    is absent or null), as the end of a sentence; None for a sound row."""
    for name in required:
        if row.get(name) is None:
            return f"an ok {row.get('strategy') or 'row'} row has no '{name}'"
    for name, kind in FIELDS.items():
        value = row.get(name)
        if value is not None and not kind.ok(value):
            return f"'{name}' is {_shown(value)}, not {kind.expected}"
    samples, rounds = row.get("samples_ms"), row.get("round_ids")
    if isinstance(samples, list) and isinstance(rounds, list) and rounds and len(rounds) != len(samples):
        return f"'round_ids' has {len(rounds)} entries, 'samples_ms' {len(samples)}: one per round in each"
    ranks, world = row.get("rank_ms"), row.get("world_size")
    if isinstance(ranks, list) and isinstance(world, int) and len(ranks) != world:
        return f"'rank_ms' has {len(ranks)} entries, 'world_size' is {world}: one per rank"
    return None


def _shown(value) -> str:
    """A value as the file holds it (JSON), cut short."""
    text = json.dumps(value, allow_nan=True)
    return text if len(text) <= 40 else text[:37] + "..."
