"""What a prediction assumed where its inputs lack a point: one `Note` per assumption, of a kind
that the terminal's summary counts (predict/summary.py) and each row's `predicted.notes` holds as
text."""

from __future__ import annotations

from dataclasses import dataclass

# The kinds, in the order the summary says them.
SKIPPED = "skipped"  # a point not predicted (its reason)
EXTRAPOLATED = "extrapolated"  # outside the measured sizes: above at the largest's bus bandwidth, below at the smallest's time
INTERPOLATED = "interpolated across a gap"  # between two measured sizes further apart than the table's step
SUBSTITUTED = "substituted"  # another CTA budget, hidden, path or table stood in for the one asked
RESCALED = "rescaled"  # a table of another world size scaled to the one predicted
ASSUMED = "assumed"  # no measurement at all: a default stood in
FLAGGED = "flagged"  # an input that looks cut off, has holes, or holds rows left out
KINDS = (SKIPPED, EXTRAPOLATED, INTERPOLATED, SUBSTITUTED, RESCALED, ASSUMED, FLAGGED)
# What a row's contention and in-layer term were measured beside, with their values: in its notes
# only (the summary says it once, for the whole run: Contention.described).
MEASURED = "measured"


@dataclass(frozen=True)
class Note:
    kind: str  # one of KINDS
    text: str

    def __str__(self) -> str:
        return self.text


def joined(notes) -> str | None:
    """The notes' texts in one line (what a lookup's `note` says), or None for none."""
    texts = [n.text for n in notes]
    return "; ".join(texts) or None
