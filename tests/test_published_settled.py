"""The first runs at `sweep`'s settling defaults (results/h200x4/168d2b0/): the defaults and half
of them against 2 s spans, tests/test_measure_gpu.py's idle chain, and the llama3-70b TP=4 study
timed at each choice's own clock; each figure of docs/timing.md, docs/results-tp4.md, README.md
and docs/predict.md that quotes them computed again from the committed files (tests/published.py)."""

from __future__ import annotations

import re

from tests import figures as f
from tests.published import ROOT, Claim, bounds, claims_test
from tests.test_published_span import GAPS, PICK, _rows, gap_conditions

RUN = "results/h200x4/168d2b0/"
TWO_SECONDS = RUN + "span-2s-70b-tp4-2k-8k.jsonl"
SETTLED = {"defaults": RUN + "settle-70b-tp4-2k-8k.jsonl", "half": RUN + "settle-150-70b-tp4-2k-8k.jsonl"}
STUDY = RUN + "llama3-70b-tp4.jsonl"  # at the defaults
SHORT_SPANS = "results/h200x4/f461a2e/llama3-70b-tp4.jsonl"  # the same grid, 20 ms spans, the last before settling
VALIDATION = "results/predicted-h200/validation.md"
PREDICTED = "llama3-70b TP=4, 168d2b0's study at each choice's own clock, f461a2e's table, layer and pair rows"


def _against_two_seconds(which: str) -> dict:
    """How many of the communicating choices' speedups (and no_comm's) are within 1% of the 2 s
    spans', the furthest (%), and the pick's at 2K in both."""
    a, ref = _rows(SETTLED[which]), _rows(TWO_SECONDS)
    off = {k: 100 * (a[k]["speedup"] / ref[k]["speedup"] - 1) for k in a if k[0] != "baseline"}
    return {"n": sum(abs(v) <= 1.0 for v in off.values()), "of": len(off), "worst": max(off.values(), key=abs),
            "pick": a[(*PICK, 2048)]["speedup"], "ref": ref[(*PICK, 2048)]["speedup"], "low": all(v < 0 for v in off.values())}


def _timing_table() -> dict:
    half = _against_two_seconds("half")
    assert half["low"], "docs/timing.md says every speedup at half the settling reads low"
    return {"d": _against_two_seconds("defaults"), "h": half}


IDLE_LINE = re.compile(r"idle/busy: long runs ([\d.]+) .*?; settled ([\d.]+) \[([\d.]+), ([\d.]+)\] over \d+ rounds; "
                       r"20 ms spans, no settling ([\d.]+)")


def _idle_chain() -> dict:
    (found,) = IDLE_LINE.findall((ROOT / RUN / "measure-gpu-idles.log").read_text())
    long, settled, lo, hi, short = map(float, found)
    return {"i": {"long": long, "settled": settled, "lo": lo, "hi": hi, "short": short}}


def _walls() -> dict:
    return {"w": {"settled": f.rows_wall_s(STUDY), "short": f.rows_wall_s(SHORT_SPANS)}}


def _picks_row(tokens: int) -> dict:
    short, settled = f.picks_by_tokens(SHORT_SPANS)[tokens], f.picks_by_tokens(STUDY)[tokens]
    return {"a": short, "b": settled}


def _pick_ranges() -> dict:
    short, settled = f.picks_by_tokens(SHORT_SPANS), f.picks_by_tokens(STUDY)
    return {"a": bounds(p["speedup"] for p in short.values()), "b": bounds(p["speedup"] for p in settled.values()),
            "best": bounds(p["vs_best"] for p in settled.values()), "hid": bounds(p["hidden"] for p in settled.values())}


def _exposed_at_8k() -> dict:
    """The default baseline less no_comm at 8K (ms per layer), at each choice's own clock and in 20 ms spans."""
    from overlapbench.tuning import analysis

    batches = {name: f.batch_at(store, 8192) for name, store in (("own", STUDY), ("short", SHORT_SPANS))}
    return {name: analysis.reference(batch).ms - analysis.bound(batch).ms for name, batch in batches.items()}


CARDS = re.compile(r"rank (\d) took ([\d.]+)% longer than rank (\d) at no_comm")


def _cards() -> dict:
    (found,) = CARDS.findall((ROOT / RUN / "report-llama3-70b-tp4.md").read_text())
    return dict(zip(("slow", "more", "fast"), found))


def _idle_rate() -> float:
    """How much less time the probe's GEMMs took per unit of idle gap share: the median over its
    files and gap shares of (1 - back to back's TFLOP/s / the gap's) / the share got."""
    import statistics

    return statistics.median((1 - 1 / (1 + r["gemm_tflops_vs_back_to_back"]["median"])) / r["gap_share"]["median"]
                             for path in GAPS for r in gap_conditions(path) if r["gap"] > 0)


def _settled_against_predicted() -> dict:
    """The validation's summary of the settled study (predict's defaults, and --in-layer none), and
    per token count from 1K up: no_comm's signed error, the baseline's gain implied (1 - measured /
    predicted no_comm speedup), the all-reduce's share of the predicted baseline (1 - 1 / predicted
    no_comm speedup), and that gain over the probe's idle rate times the share."""
    points = f.validation_points(VALIDATION, PREDICTED, "no_comm")
    rate = _idle_rate()
    gain = {t: 1 - m / p for t, (m, p, _) in points.items()}
    share = {t: 1 - 1 / p for t, (_, p, _) in points.items()}
    short = f.validation_points(VALIDATION, "llama3-70b TP=4, f461a2e's study, table, layer and pair rows", "no_comm")
    listed = lambda values, fmt: ", ".join(format(v, fmt) for v in values[:-1]) + " and " + format(values[-1], fmt)
    order = sorted(points)
    return {"d": f.validation_line(VALIDATION, PREDICTED),
            "n": f.validation_line(VALIDATION, PREDICTED + ", with --in-layer none"),
            "errors": listed([points[t][2] for t in order], "s"), "short": bounds(float(e) for _, _, e in short.values()),
            "gains": listed([100 * gain[t] for t in order], ".1f"), "shares": listed([100 * share[t] for t in order], ".0f"),
            "rate": rate, "alphas": listed([gain[t] / (rate * share[t]) for t in order], ".2f")}


TIMING = "docs/timing.md"
RESULTS = "docs/results-tp4.md"
CLAIMS = [
    Claim(TIMING, "| the defaults: 300 ms settling, 200 ms spans | {d[n]} of {d[of]} | {d[worst]:+.2f}% (the pick at 2K: "
                  "{d[pick]:.3f} against {d[ref]:.3f}) |", _timing_table),
    Claim(TIMING, "| half of each: 150 ms, 100 ms | {h[n]} of {h[of]} | {h[worst]:+.2f}% (the pick at 2K: {h[pick]:.3f}) |",
          _timing_table),
    Claim(TIMING, "{i[long]:.4f} in long runs of each (2 s after 1 s of settling), {i[settled]:.4f} [{i[lo]:.4f}, "
                  "{i[hi]:.4f}] at the defaults, {i[short]:.4f} in 20 ms spans with no settling", _idle_chain),
    Claim(TIMING, "took {w[settled]:.0f} s from its first row to its last at the defaults, against {w[short]:.0f} s in "
                  "20 ms spans (f461a2e)", _walls),
    *[Claim(RESULTS, f"| {tokens} | `{{a[strategy]}}` {{a[how]}} | {{a[speedup]:.3f}}x | {{a[hidden]:.0f}}% | "
                     "`{b[strategy]}` {b[how]} | {b[speedup]:.3f}x ±{b[pm]:.1f}% | {b[vs_best]:.3f}x | {b[hidden]:.0f}% |",
            lambda tokens=tokens: _picks_row(tokens)) for tokens in f.TOKENS],
    Claim(RESULTS, "the pick gains {b[lo]:.3f}-{b[hi]:.3f}x over NCCL's default ring where the 20 ms spans read "
                   "{a[lo]:.3f}-{a[hi]:.3f}x, and {best[lo]:.3f}-{best[hi]:.3f}x over the fastest baseline; it hides "
                   "{hid[lo]:.0f}-{hid[hi]:.0f}% of the exposed communication", _pick_ranges),
    Claim(RESULTS, "At 8K it is {own:.3f} ms per layer here against {short:.3f} ms in the 20 ms spans", _exposed_at_8k),
    Claim(RESULTS, "rank {slow} took {more}% longer than rank {fast} at `no_comm`", _cards),
    Claim("docs/predict.md", "measured in-layer term read high by a\nmedian {d[median]} and at worst {d[worst]}, though its "
                             "picks are within 0.01 at {d[picks]}", _settled_against_predicted),
    Claim("docs/predict.md", "median {d[median]}, worst {d[worst]}, picks within 0.01 at {d[picks]}; with `--in-layer none` "
                             "median {n[median]}, worst {n[worst]}, {n[picks]}", _settled_against_predicted),
    Claim("docs/predict.md", "`no_comm` by {errors} from 1K to 32K, where against f461a2e's 20 ms spans it was "
                             "+{short[lo]:.3f} to +{short[hi]:.3f}", _settled_against_predicted),
    Claim("docs/predict.md", "the baseline running {gains}% faster than predicted (1 - measured / predicted `no_comm` speedup), "
                             "with {shares}% of its predicted time in the all-reduce. The probe's idle gaps made the GEMMs "
                             "about {rate:.2f} of the gap's share faster (4K-32K rows), so the all-reduce counts as {alphas} "
                             "of an idle gap", _settled_against_predicted),
    Claim("README.md", "at its defaults those TP=4 points came within 1% of 2 s spans at {d[n]} of {d[of]}", _timing_table),
    Claim("README.md", "gains {b[lo]:.3f}-{b[hi]:.3f}x over NCCL's default ring (it read {a[lo]:.3f}-{a[hi]:.3f}x in "
                       "20 ms spans) and {best[lo]:.3f}-{best[hi]:.3f}x over the fastest baseline", _pick_ranges),
]

test_claim = claims_test(CLAIMS)
