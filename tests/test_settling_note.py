"""The note on rows timed with no settling (overlapbench/tuning/settling.py), which report and tune print."""

from __future__ import annotations

import random

from overlapbench.tuning.settling import OWN_CLOCK_SPAN_MS, at_own_clock, unsettled_note


def _row(timing: str, span_ms: float | None, settle_ms: float | None, status: str = "ok") -> dict:
    row = {"status": status, "timing": timing, "span_ms": span_ms, "strategy": "baseline"}
    if settle_ms is not None:  # rows made before settle_ms lack the field
        row["settle_ms"] = settle_ms
    return row


def test_rows_in_short_spans_with_no_settling_are_counted_and_their_spans_named(rng):
    short = rng.choice([5.0, 20.0, 50.0])
    unsettled = [_row("interleaved", short, rng.choice([None, 0.0])) for _ in range(rng.randint(1, 9))]
    settled = [_row("interleaved", rng.uniform(10, 500), rng.uniform(1, 900)) for _ in range(rng.randint(1, 9))]
    others = [_row("sequential", None, None), _row("interleaved", short, None, status="failed")]
    rows = unsettled + settled + others
    random.Random(rng.random()).shuffle(rows)
    note = unsettled_note(rows)
    assert note is not None
    assert note.startswith(f"timing: {len(unsettled)} of {len(unsettled) + len(settled)} interleaved rows")
    assert f"spans of {short:g} ms with no settling" in note and "Each choice at its own clock" in note


def test_settled_rows_long_spans_and_sequential_rows_need_no_note(rng):
    rows = [_row("interleaved", rng.uniform(10, 500), rng.uniform(1, 900)) for _ in range(5)]
    rows += [_row("interleaved", OWN_CLOCK_SPAN_MS * rng.uniform(1, 3), 0.0), _row("sequential", None, None)]
    assert unsettled_note(rows) is None
    assert unsettled_note([]) is None


def test_a_row_is_at_its_own_clock_where_settled_or_timed_in_long_spans(rng):
    """The one reading of a row's clock that report, tune, predict and the validation share."""
    short = rng.uniform(0, OWN_CLOCK_SPAN_MS - 1)
    assert at_own_clock(_row("interleaved", short, rng.uniform(1, 900)))
    assert at_own_clock(_row("interleaved", OWN_CLOCK_SPAN_MS * rng.uniform(1, 3), rng.choice([None, 0.0])))
    assert not at_own_clock(_row("interleaved", short, rng.choice([None, 0.0])))
    assert not at_own_clock(_row("interleaved", None, None))  # pieces before the fields: shared rounds
