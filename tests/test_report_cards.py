"""report's card line: which rank's card computes slower, from every rank's time of no_comm; named
only where rows carry every rank's time and the gap lies beyond the rows' noise (report/cards.py)."""

from __future__ import annotations

import io
import json
import random

import pytest
from rich.console import Console

from overlapbench import report
from overlapbench.report.cards import slow_cards
from overlapbench.tuning import analysis, results
from tests import synthetic

TP = 4
TOKENS = (1024, 4096, 16384)


def cards_store(tmp_path, rng: random.Random, gap: float, spread: float, with_ranks: bool = True,
                interleaved: bool = True):
    """A TP=4 store: baseline, token_split and no_comm per token count, their rounds (or, not
    `interleaved`, their iterations) drawn with a relative sd of `spread`. no_comm's ranks: one
    card `gap` slower than 1, the others at most 0.5% from 1 (the constructed factors, returned);
    the row's ms is the slowest rank's."""
    slow = rng.randrange(TP)
    factors = [1 + (gap if k == slow else rng.uniform(0.0, 0.005)) for k in range(TP)]
    rows = []
    for tokens in TOKENS:
        base = tokens / 1000 * (1 + rng.random())
        pairing = f"p{tokens}" if interleaved else None
        free = base * 0.8
        rank_ms = [free * f / max(factors) for f in factors] if with_ranks else None
        rows += [
            synthetic.row("baseline", tokens, samples=synthetic.draw(base, spread, rng), pairing=pairing, tp=TP),
            synthetic.row("token_split", tokens, {"split_offset": 0}, samples=synthetic.draw(base * 0.9, spread, rng),
                          pairing=pairing, tp=TP),
            synthetic.row("no_comm", tokens, {}, samples=synthetic.draw(free, spread, rng), pairing=pairing,
                          rank_ms=rank_ms, tp=TP),
        ]
    for row in rows if not interleaved else ():
        row["timing"] = "sequential"
    return synthetic.write(tmp_path / "store.jsonl", rows), factors


def report_text(path, fmt: str, capsys) -> str:
    """What report prints in `fmt`, stdout and stderr together (csv and json notes go to stderr)."""
    out = io.StringIO()
    assert report.run([path], fmt, Console(file=out, width=400)) == 0
    return out.getvalue() + capsys.readouterr().err


def expected_line(factors: list[float]) -> str:
    slow = factors.index(max(factors))
    fastest = factors.index(min(factors))
    return f"rank {slow} took {factors[slow] / factors[fastest] - 1:.1%} longer than rank {fastest} at no_comm"


def test_every_ranks_time_round_trips_through_the_store(tmp_path):
    rng = random.Random()
    path, factors = cards_store(tmp_path, rng, gap=rng.uniform(0.02, 0.06), spread=0.005)
    rows = [r for r in results.read_rows(path) if r["strategy"] == "no_comm"]
    measured = [m for m in analysis.read([path]).measured if m.strategy == "no_comm"]
    assert len(rows) == len(measured) == len(TOKENS)
    for row, m in zip(rows, measured):
        assert len(row["rank_ms"]) == TP and m.rank_ms == tuple(row["rank_ms"])
        assert [t / max(row["rank_ms"]) for t in row["rank_ms"]] == pytest.approx([f / max(factors) for f in factors])


@pytest.mark.parametrize("fmt", ["table", "markdown", "json"])
def test_a_card_slower_beyond_the_noise_is_named_in_every_format(tmp_path, capsys, fmt):
    rng = random.Random()
    path, factors = cards_store(tmp_path, rng, gap=rng.uniform(0.02, 0.06), spread=0.005)
    (card,) = slow_cards(analysis.read([path]).measured)
    slow, fastest = factors.index(max(factors)), factors.index(min(factors))
    assert (card.slowest, card.fastest, card.points) == (slow, fastest, len(TOKENS)) and card.token_counts
    assert card.gap == pytest.approx(factors[slow] / factors[fastest] - 1, rel=1e-9) and card.beyond_noise
    text = " ".join(report_text(path, fmt, capsys).split())  # the table's notes wrap at the console's width
    assert expected_line(factors) in text
    assert f"median over {len(TOKENS)} token counts" in text and "runs at the slowest card's pace" in text
    if fmt == "markdown":
        assert f"- cards (llama3-8b tp{TP} " in text  # a note's bullet, as the footer's
    if fmt == "json":  # stdout holds the records alone; the line goes with the other notes
        out = io.StringIO()
        report.run([path], fmt, Console(file=out, width=400))
        assert "cards" not in out.getvalue() and json.loads(out.getvalue())


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "sequential"])
def test_the_line_says_what_the_rows_samples_are(tmp_path, capsys, interleaved):
    rng = random.Random()
    path, _ = cards_store(tmp_path, rng, gap=rng.uniform(0.02, 0.06), spread=0.005, interleaved=interleaved)
    text = " ".join(report_text(path, "table", capsys).split())
    assert f"the {'rounds' if interleaved else 'iterations'}' spread: cv" in text


def test_a_gap_within_the_rows_noise_is_not_named(tmp_path, capsys):
    rng = random.Random()
    spread = rng.uniform(0.03, 0.05)
    path, factors = cards_store(tmp_path, rng, gap=spread / 3, spread=spread)
    (card,) = slow_cards(analysis.read([path]).measured)
    assert card.slowest == factors.index(max(factors)) and not card.beyond_noise
    assert card.gap < card.noise
    for fmt in ("table", "markdown", "json"):
        assert "cards (" not in report_text(path, fmt, capsys)


def test_rows_without_every_ranks_time_say_nothing_of_the_cards(tmp_path, capsys):
    rng = random.Random()
    path, _ = cards_store(tmp_path, rng, gap=rng.uniform(0.02, 0.06), spread=0.005, with_ranks=False)
    assert slow_cards(analysis.read([path]).measured) == []
    for fmt in ("table", "markdown", "json"):
        assert "cards (" not in report_text(path, fmt, capsys)


def test_the_committed_results_have_no_rank_times_and_read_as_before():
    """Rows made before `rank_ms` existed load everywhere; no card line comes from them."""
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "results/h200x4/a3860b5/llama3-70b-tp4.jsonl"
    measured = analysis.read([path]).measured
    assert measured and all(m.rank_ms == () for m in measured) and slow_cards(measured) == []
