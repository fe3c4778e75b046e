"""Published figures held to the committed files they come from.

A `Claim` is a passage of a document as it is printed, with a `{name}` (and a format spec where
needed) for each figure, and a function that computes those figures again from the committed
files the passage cites (tests/figures.py has the computations). The claim holds when the passage,
filled in with today's figures, is in the document (whitespace aside: markdown wraps lines).
So a figure changed in the text, or rows that no longer give it, fails, and the message shows the
passage as it should read and what the document says there instead.

    Claim("README.md", "flash_agrs {lo:.3f}-{hi:.3f}x over async_tp",
          lambda: bounds(relative(best_speedups(RUNS, "flash_agrs"), best_speedups(RUNS, "async_tp"))))

A module of claims makes its test with `claims_test(CLAIMS)`: one case per claim.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def flat(text: str) -> str:
    """Text with every run of whitespace one space, as markdown reads it."""
    return re.sub(r"\s+", " ", text).strip()


@dataclass(frozen=True)
class Claim:
    doc: str  # the document, from the repository root
    text: str  # the passage with {figure} fields (str.format)
    figures: Callable[[], dict]

    def expected(self) -> str:
        return flat(self.text.format(**self.figures()))

    def problem(self, doc_text: str | None = None) -> str | None:
        """None where the document says the passage with today's figures; else what is wrong."""
        doc = flat(doc_text if doc_text is not None else (ROOT / self.doc).read_text())
        expected = self.expected()
        if expected in doc:
            return None
        return (f"{self.doc} should say '{expected}' (its figures computed again from the files it cites); "
                f"it says {self._nearest(doc, expected)}")

    def _nearest(self, doc: str, expected: str) -> str:
        """The document's passage where the claim's fixed words are, as long as the expected one."""
        literals = [flat(text) for text, *_ in string.Formatter().parse(self.text) if text.strip()]
        for literal in sorted(literals, key=len, reverse=True):
            at = doc.find(literal)
            if at >= 0:
                start = max(0, at - expected.find(literal)) if literal in expected else at
                return f"'{doc[start:start + len(expected) + 10]}...'"
        return "nothing like it (no fixed word of the passage found)"


def bounds(values: Iterable[float], scale: float = 1.0) -> dict[str, float]:
    """{'lo', 'hi'} of some figures (times `scale`: 100 for percent), for `{lo:.1f}-{hi:.1f}`."""
    values = [v * scale for v in values]
    if not values:
        raise AssertionError("no values to take the range of: the cited files hold none")
    return {"lo": min(values), "hi": max(values)}


def claims_test(claims: list[Claim]) -> Callable[[Claim], None]:
    """A test with one case per claim, named by its document and the passage's first words; a
    case fails with the passage as it should read and what the document says instead."""

    @pytest.mark.parametrize("claim", claims, ids=lambda c: f"{c.doc}: {flat(c.text)[:60]}")
    def test_each_figure_follows_from_the_files_it_cites(claim: Claim) -> None:
        problem = claim.problem()
        if problem:
            pytest.fail(problem, pytrace=False)

    return test_each_figure_follows_from_the_files_it_cites
