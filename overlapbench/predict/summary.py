"""What a prediction extrapolated, interpolated, substituted, rescaled, assumed or skipped, said at
the terminal in a few lines: each kind once, with the points it touched and its first few
distinct notes (every row's `predicted.notes` holds its own in full)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from overlapbench.predict.notes import KINDS, Note

SHOWN = 4  # distinct notes said per kind; the rest counted


@dataclass
class Summary:
    """Counts of a run's points and, per kind of note, how many points each note touched."""

    points: int = 0
    ok: int = 0
    no_speedup: int = 0  # batches (a token count's batch at one depth) whose default baseline was not predicted
    touched: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    inputs: list[Note] = field(default_factory=list)  # the tables' own (rescaling, cut-off files, gaps)
    transfers: str = "as fast as alone, taking nothing from the compute (no contention given)"  # a split's, beside compute
    contention: str = "none given: transfers beside compute cost it nothing"
    in_layer: str = "not charged: blocking all-reduces cost their time in the table"  # a serial plan's term

    def add(self, notes: list[Note], ok: bool) -> None:
        """One point's notes (each counted once for it)."""
        self.points += 1
        self.ok += ok
        for note in sorted(set(notes), key=lambda n: (n.kind, n.text)):  # ties in most_common: in text order, every run
            self.touched[note.kind][note.text] += 1

    def lines(self) -> list[str]:
        """The summary: the points, then one line per kind of note: the inputs' own notes (a
        rescaled table, a cut-off file, a gap), then those of the points, with how many each touched;
        then how a split's transfers beside compute were charged, where the contention came from and
        whether blocking all-reduces paid an in-layer term."""
        out = [f"{self.points} points: {self.ok} predicted, {self.points - self.ok} skipped"
               + (f"; no speedups in {self.no_speedup} batches (their default baseline was skipped)"
                  if self.no_speedup else "")]
        for kind in KINDS:
            said = list(dict.fromkeys(n.text for n in self.inputs if n.kind == kind))
            said += [f"{text} ({n} points)" for text, n in self.touched.get(kind, Counter()).most_common()]
            if said:
                more = f"; and {len(said) - SHOWN} more" if len(said) > SHOWN else ""
                out.append(f"{kind}: {'; '.join(said[:SHOWN])}{more}")
        return out + [f"split transfers: {self.transfers}", f"contention: {self.contention}",
                      f"in-layer term: {self.in_layer}"]
