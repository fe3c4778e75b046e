"""A note on rows timed with no settling: at a GPU's power cap their speedups read high.

Interleaved rows record `settle_ms`, how long each candidate ran untimed before its timed span
in every round (timing/interleave.py). Rows without the field (made before it) or with 0 were
timed in spans back to back: at a power cap a round's candidates then share one clock, and the
speedups of the choices that hide a blocking all-reduce read high against each choice at its own
clock (docs/timing.md, "Each choice at its own clock"). Spans of OWN_CLOCK_SPAN_MS or more are
what that section takes for each choice's own clock, settled or not. The report says so in one
line and `tune` on the terminal, so a reader of older results, or of a spec that sets
`settle_ms: 0`, knows.
"""

from __future__ import annotations

from collections.abc import Iterable

SECTION = 'docs/timing.md, "Each choice at its own clock"'
OWN_CLOCK_SPAN_MS = 2000.0


def at_own_clock(row: dict) -> bool:
    """Whether a row was timed at its own clock: settled before its spans, or in spans of
    OWN_CLOCK_SPAN_MS or more (rows without the fields were timed at a shared clock)."""
    return (row.get("settle_ms") or 0) > 0 or (row.get("span_ms") or 0) >= OWN_CLOCK_SPAN_MS


def unsettled_note(rows: Iterable[dict]) -> str | None:
    """One line where some ok interleaved rows were timed with no settling; None where none were."""
    interleaved = [r for r in rows if r.get("status") == "ok" and r.get("timing") == "interleaved"]
    unsettled = [r for r in interleaved if not at_own_clock(r)]
    if not unsettled:
        return None
    spans = sorted({r["span_ms"] for r in unsettled if r.get("span_ms")})
    span = f" of {'/'.join(f'{s:g}' for s in spans)} ms" if spans else ""
    return (f"timing: {len(unsettled)} of {len(interleaved)} interleaved rows were timed in spans{span} with no "
            f"settling: at a GPU's power cap a round's candidates share one clock, and speedups over a baseline "
            f"whose all-reduce leaves the SMs idle read high ({SECTION})")
