"""Every figure docs/long-prompts.md publishes about issue 46's two TP=4 misses (llama3-70b at 2K,
llama3-8b at 4K) with the copy-engine split's cut moved off the middle, the pieces that say what an
uneven cut costs the compute, and the same misses through 4, 8 and 16 layers (20 rounds on two
machines, 60 on a third), computed again from the committed runs it cites (the mechanism:
tests/published.py). A figure changed in the text, or rows that no longer give it, fails with the
passage as it should read."""

from __future__ import annotations

import functools
import json

from tests import figures as f
from tests.published import Claim, bounds, claims_test
from tests.test_published_order import STEADY_TP4, _marginal_hidden, hidden

DOC = "docs/long-prompts.md"
CUT = {"a": ("results/h200x4/b55e655/ratio-70b-tp4-miss.jsonl", 2048),
       "b": ("results/h200x4/b55e655/ratio-8b-tp4-miss.jsonl", 4096)}
PIECES = {"a": "results/h200/e1dbb66/pieces-ratio-70b-tp4-miss-tp4.jsonl",
          "b": "results/h200/e1dbb66/pieces-ratio-8b-tp4-miss-tp4.jsonl"}
STEADY_8B = ("results/h200x4/accef7f/steady-cut-8b-tp4-4k.jsonl", "results/h200x4/e1dbb66/steady-cut-8b-tp4-4k.jsonl")
STEADY_70B = "results/h200x4/e1dbb66/steady-cut-70b-tp4-2k.jsonl"
ROUNDS_60 = {"b": "results/h200x4/e89fbc0/steady-cut-8b-tp4-4k-60.jsonl",  # the settings that matter, 60 rounds
             "a": "results/h200x4/e89fbc0/steady-cut-70b-tp4-2k-60.jsonl"}
CUTS = (0.375, 0.4375, None, 0.5625, 0.625, 0.6875)  # None: the equal cut (the knob unset)
ALONE_CUTS = (0.4375, 0.5625, 0.625)  # the cuts the split with no transfers ran at, beside the equal one

KERNEL = {"comm": "copy_engine", "ce_out": "kernel"}  # the copy-engine split 32/32, `ce_out: kernel`


def _split(ratio) -> tuple[str, dict]:
    return "token_split", KERNEL | {"split_ratio": ratio, "ce_chunks": None}


def _alone(ratio) -> tuple[str, dict]:
    return "token_split", {"comm": "none", "split_ratio": ratio}


@functools.cache  # the table and the brief read it
def _cut_row(k: str) -> dict:
    """One row of the cut table: the share the `kernel` split hides at each cut (4 layers)."""
    store, tokens = CUT[k]
    return {f"c{i}": hidden(store, tokens, **_split(r)[1]) for i, r in enumerate(CUTS)}


def _gain(k: str, a, b):
    store, tokens = CUT[k]
    return f.paired_gain(store, tokens, a, b)


def _cut_70b() -> dict:
    """At 70B 2K: every cut off the middle against the equal cut (paired), the transfers' cost over
    the split alone at each cut the split alone ran at, and the split alone off the middle."""
    off = {r: _gain("a", _split(r), _split(None)) for r in CUTS if r is not None}
    beyond = [r for r, g in off.items() if g.hi < 1]
    assert beyond == [0.375, 0.4375, 0.625, 0.6875], off
    cost = [_gain("a", _split(r), _alone(r)).speedup for r in (None, *ALONE_CUTS)]
    alone = [1 - _gain("a", _alone(r), _alone(None)).speedup for r in ALONE_CUTS]
    return {"mid": off[0.5625], "cost": bounds(cost), "alone": bounds(alone, 100)}


@functools.cache  # two claims read it
def _cut_8b() -> dict:
    """At 8B 4K: what the transfers cost over the split alone at the equal cut and at 0.5625, what
    that cut costs the split alone, and the whole against the equal cut (paired)."""
    return {"at": _gain("b", _split(0.5625), _alone(0.5625)), "eq": _gain("b", _split(None), _alone(None)),
            "alone": _gain("b", _alone(0.5625), _alone(None)), "whole": _gain("b", _split(0.5625), _split(None))}


def _pieces(store: str) -> dict[tuple[int, int], dict[str, float]]:
    """Each chunk's (first row, end row) -> its attention block's and MLP's ms alone on one GPU. A
    chunk's MLP and norm depend on its rows alone, so they are timed once per row count."""
    rows = [json.loads(line) for line in f.path(store).read_text().splitlines() if line.strip()]
    mlp = {r["rows"]: r["ms"] for r in rows if r["piece"] == "mlp"}
    attention = {tuple(json.loads(r["key"])["chunk"]["rows"]): r["ms"] for r in rows if r["piece"] == "attention"}
    return {span: {"attention": ms, "mlp": mlp[span[1] - span[0]]} for span, ms in attention.items()}


def _layer_us(pieces: dict, first: int, tokens: int) -> dict[str, float]:
    """The attention and MLP of the two chunks cut at `first` rows, in us per layer."""
    chunks = [pieces[(0, first)], pieces[(first, tokens)]]
    return {kind: 1000 * sum(c[kind] for c in chunks) for kind in ("attention", "mlp")}


def _pieces_figures(k: str, first: int, tokens: int) -> dict:
    """What the cut at `first` rows costs one rank's attention and MLP over the equal cut, and the
    MLP's ns per row at the equal size and at each uneven one."""
    pieces = _pieces(PIECES[k])
    uneven, equal = _layer_us(pieces, first, tokens), _layer_us(pieces, tokens // 2, tokens)
    per_row = lambda rows: 1e6 * pieces[(0, rows)]["mlp"] / rows if (0, rows) in pieces else None
    return {"uneven": sum(uneven.values()), "equal": sum(equal.values()),
            "more": sum(uneven.values()) - sum(equal.values()),
            "mlp": uneven["mlp"] - equal["mlp"], "attention": uneven["attention"] - equal["attention"],
            "row_eq": per_row(tokens // 2), "row_a": per_row(first), "row_b": per_row(tokens - first)}


def _pieces_both() -> dict:
    return {"b": _pieces_figures("b", 2304, 4096), "a": _pieces_figures("a", 1152, 2048)}


def _depths(store: str, tokens: int, **knobs) -> dict:
    """A setting's share hidden at 4, 8 and 16 layers and per added layer, with the interval."""
    m, lo, hi = _marginal_hidden(store, tokens, **knobs)
    return {"d4": hidden(store, tokens, layers=4, **knobs), "d8": hidden(store, tokens, layers=8, **knobs),
            "d16": hidden(store, tokens, layers=16, **knobs), "m": m, "lo": lo, "hi": hi}


STEADY_ROW = "| {d4:.0f}% | {d8:.0f}% | {d16:.0f}% | {m:.0f}% [{lo:.0f}%, {hi:.0f}%] |"
STEADY_ROWS = [
    ("| llama3-8b, 4K | e0f76c3bd17b | cut 0.5625 ", lambda: _depths(STEADY_8B[0], 4096, **_split(0.5625)[1])),
    ("| | | equal cut ", lambda: _depths(STEADY_8B[0], 4096, **_split(None)[1])),
    ("| | ec34c40267fd | cut 0.5625 ", lambda: _depths(STEADY_8B[1], 4096, **_split(0.5625)[1])),
    ("| | | equal cut ", lambda: _depths(STEADY_8B[1], 4096, **_split(None)[1])),
    ("| llama3-70b, 2K | c39783526993 | equal cut ", lambda: _depths(STEADY_70B, 2048, **_split(None)[1])),
    ("| | | equal cut, one piece per reduction ", lambda: _depths(STEADY_70B, 2048, **(KERNEL | {"ce_chunks": 1}))),
    ("| | | cut 0.5625 ", lambda: _depths(STEADY_70B, 2048, **_split(0.5625)[1])),
    ("| llama3-8b, 4K | 0e4eefe6921c, 60 rounds | cut 0.5625 ", lambda: _depths(ROUNDS_60["b"], 4096, **_split(0.5625)[1])),
    ("| | | equal cut ", lambda: _depths(ROUNDS_60["b"], 4096, **_split(None)[1])),
    ("| llama3-70b, 2K | 633c3bbeb497, 60 rounds | equal cut ", lambda: _depths(ROUNDS_60["a"], 2048, **_split(None)[1])),
]


@functools.cache  # three claims read it
def _steady_brief() -> dict:
    """Per added layer: 70B 2K's equal cut (20 and 60 rounds) and 8B 4K's cut at 0.5625 on the three
    machines; and the most any choice that communicates hides at 4 layers in the cut runs."""
    best = {k: max(_cut_row(k).values()) for k in CUT}
    assert best == {"a": _cut_row("a")["c2"], "b": _cut_row("b")["c3"]}, best  # the equal cut, the cut at 0.5625
    marginal = lambda store, tokens, ratio: _marginal_hidden(store, tokens, **_split(ratio)[1])[0]
    return {"a": [marginal(store, 2048, None) for store in (STEADY_70B, ROUNDS_60["a"])],
            "ea": _marginal_hidden(STEADY_TP4, 2048, comm="copy_engine")[0],
            "b": [marginal(store, 4096, 0.5625) for store in (*STEADY_8B, ROUNDS_60["b"])],
            "a4": best["a"], "b4": best["b"]}


CUT_ROW = "| {c0:.0f}% | {c1:.0f}% | {c2:.0f}% | {c3:.0f}% | {c4:.0f}% | {c5:.0f}% |"

CLAIMS = [
    Claim(DOC, "| llama3-70b, 2K | b72e295ffa22 " + CUT_ROW, lambda: _cut_row("a")),
    Claim(DOC, "| llama3-8b, 4K | bc4026239362 " + CUT_ROW, lambda: _cut_row("b")),
    Claim(DOC, "every other cut is slower beyond the noise but 0.5625 ({mid.speedup:.3f}x, {mid.lo:.3f}-{mid.hi:.3f}). "
               "The transfers cost the split about the same at every cut ({cost[lo]:.3f}-{cost[hi]:.3f}x the split with "
               "no transfers at that cut), and the split with no transfers runs {alone[lo]:.1f}-{alone[hi]:.1f}% slower "
               "off the middle", _cut_70b),
    Claim(DOC, "At 0.5625 the transfers cost the split {at.speedup:.3f}x the split with no transfers at that cut "
               "({at.lo:.3f}-{at.hi:.3f}), against {eq.speedup:.3f}x at the equal cut ({eq.lo:.3f}-{eq.hi:.3f})", _cut_8b),
    Claim(DOC, "the split with no transfers runs {alone.speedup:.3f}x at that cut ({alone.lo:.3f}-{alone.hi:.3f}) against "
               "the equal one, so the whole is {whole.speedup:.3f}x the equal cut ({whole.lo:.3f}-{whole.hi:.3f})", _cut_8b),
    Claim(DOC, "at 8B 4K the chunks of 2304 and 1792 rows take {b[uneven]:.0f} us per layer of attention and MLP against "
               "{b[equal]:.0f} us for two of 2048 (+{b[more]:.0f} us: the MLP +{b[mlp]:.0f}, attention +{b[attention]:.0f}); "
               "at 70B 2K 1152 and 896 rows take {a[uneven]:.0f} against {a[equal]:.0f} us (+{a[more]:.0f}: the MLP "
               "+{a[mlp]:.0f}, attention +{a[attention]:.0f}). The MLP's GEMMs take longer per row at both uneven sizes: "
               "at 8B {b[row_eq]:.0f} ns per row at 2048, {b[row_a]:.0f} at 2304, {b[row_b]:.0f} at 1792; at 70B "
               "{a[row_eq]:.0f}, {a[row_a]:.0f} (1152) and {a[row_b]:.0f} (896)", _pieces_both),
    *[Claim(DOC, label + STEADY_ROW, figures) for label, figures in STEADY_ROWS],
    Claim(DOC, "per added layer 70B 2K's equal cut hides {a[0]:.0f}% and {a[1]:.0f}% ({ea:.0f}% at ea96619, above), at "
               "or past its 85% as a point estimate in three runs; 8B 4K's cut at 0.5625 hides {b[0]:.0f}%, {b[1]:.0f}% "
               "and {b[2]:.0f}% on three machines, at its 80% rather than past it", _steady_brief),
    Claim(DOC, "at 4 layers 70B 2K hides {a4:.0f}% and 8B 4K {b4:.0f}% at best, both missed; per added layer {a[0]:.0f}% and "
               "{a[1]:.0f}% (70B, the equal cut) and {b[0]:.0f}%, {b[1]:.0f}% and {b[2]:.0f}% (8B, the cut at 0.5625)",
          _steady_brief),
    Claim(DOC, "At 4 layers the misses stay (70B {a4:.0f}%, 8B {b4:.0f}% at best in these runs)", _steady_brief),
]


test_each_published_figure_follows_from_its_rows = claims_test(CLAIMS)
