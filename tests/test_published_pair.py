"""docs/predict.md, "The pair window, and predict's defaults since": its figures, from the pair
window's timelines and the H200 validation's summary lines (tests/published.py)."""

from __future__ import annotations

import functools
import json
import statistics

from tests import figures as f
from tests.published import Claim, bounds, claims_test

VALIDATION = "results/predicted-h200/validation.md"
# the four predictions of each study with the pair rows, as predict_validate.py titles them
VARIANTS = ("", ", with --in-layer none", ", with --transfer-beside auto", ", with --in-layer none and --transfer-beside auto")
STUDIES = (
    ("llama3-70b TP=2, 1K-32K at 60ae8af", "llama3-70b TP=2, 1K-32K measured at 60ae8af, pair rows"),
    ("llama3-70b TP=2, 1K-16K at a3860b5", "llama3-70b TP=2, 1K-16K measured at a3860b5, pair rows"),
    ("llama3-8b TP=2, 1K-32K at 60ae8af", "llama3-8b TP=2, 1K-32K measured at 60ae8af, pair rows"),
    *((f"{m} TP=4, {commit}", f"{m} TP=4, {title}, pair rows")
      for m in ("llama3-70b", "llama3-8b")
      for commit, title in (("2112bbf", "2112bbf's study, table and layer rows"),
                            ("bfff1d7", "bfff1d7's study, table and layer rows"),
                            ("c1821fe", "measured on 4x H200"), ("a3860b5", "measured again on 4x H200"),
                            ("1968c70", "measured at 1968c70 on a third 4x H200 machine"))),
)
TIMELINES = {
    "first": "results/h200x2/b537586/pair-timelines/pair_mlp-4096-copy_engine_norm.replay.timeline.json",
    "split": "results/h200x2/b537586/profile-pair-70b-tp2-8k/"
             "token_split-8192-align=256-split_offset=0-comm=copy_engine-comm_ctas_attn=32-comm_ctas_mlp=32-4layers"
             ".replay.timeline.json",
    "preceded": "results/h200x2/4ee8794/timelines/copy_engine_norm/pair_mlp-4096.replay.timeline.json",
}


@functools.cache
def _gemm_after_the_call(name: str) -> dict:
    """In a rank-0 timeline: how long after the copy-engine call's first kernel (its opening
    barrier) the next GEMM started (us), and how many of the call's add + norm kernels started
    before that GEMM."""
    timeline = json.loads(f.path(TIMELINES[name]).read_text())
    kernels = sorted((k["start"], timeline["names"][k["name"]]) for k in timeline["kernels"])
    barrier = next(start for start, kernel in kernels if "barrier_kernel" in kernel)
    gemm = next(start for start, kernel in kernels if start > barrier and kernel.startswith("nvjet"))
    return {"gap": gemm - barrier, "norms": sum(barrier <= start < gemm and kernel == "_add_norm_kernel"
                                                for start, kernel in kernels)}


@functools.cache
def _line(study: str) -> dict:
    return f.validation_line(VALIDATION, study)


def _cell(line: dict) -> str:
    return f"{line['median']} / {line['worst']} / {line['picks']}"


def _table_row(label: str, study: str) -> dict:
    return {"label": label, "cells": " | ".join(_cell(_line(study + v)) for v in VARIANTS)}


@functools.cache
def _where_they_stand() -> dict:
    tp4 = {label: _line(study) for label, study in STUDIES if "TP=4" in label}
    right = lambda model: sum(int(v["picks"].split()[0]) >= 5 for k, v in tp4.items() if k.startswith(model + " "))
    return {"t2_70": _line(STUDIES[0][1]), "t2_8": _line(STUDIES[2][1]),
            "tp4_70_picks": right("llama3-70b"), "tp4_8_picks": right("llama3-8b"),
            "tp4_med": bounds(float(v["median"]) for v in tp4.values()),
            "tp4_worst": bounds(float(v["worst"]) for v in tp4.values())}


@functools.cache
def _in_brief() -> dict:
    """predict.md's summary of the lines with the pair rows: TP=2 (the 60ae8af studies, both
    models) and TP=4 (every study)."""
    tp2 = [_line(study) for label, study in STUDIES if "TP=2" in label and "60ae8af" in label]
    tp4 = [_line(study) for label, study in STUDIES if "TP=4" in label]
    (picks,) = {line["picks"] for line in tp2}
    return {"picks": picks, "m2": bounds(float(v["median"]) for v in tp2), "w2": bounds(float(v["worst"]) for v in tp2),
            "right": sum(int(v["picks"].split()[0]) >= 5 for v in tp4), "n": len(tp4),
            "m4": bounds(float(v["median"]) for v in tp4), "w4": bounds(float(v["worst"]) for v in tp4)}


CHUNKS = "llama3-8b TP=2, the copy-engine split over 2 and 4 chunks at 1f96d65, one machine's pieces and study"
CHUNKS_70B = "llama3-70b TP=2, the copy-engine split over 2 and 4 chunks at b087538, one machine's pieces and study"
PAIR_ROWS = {2: "results/h200x2/1f96d65/comm-beside-layer-llama3-8b.jsonl",
             4: "results/h200x4/cc4fbeb/comm-beside-layer-llama3-8b.jsonl"}


def _pair_shares(tp: int, blocks: tuple[str, ...], rows: tuple[int, ...]) -> dict:
    """The copy engine's pair extras on 32 CTAs beside llama3-8b's layer at TP=`tp`, as shares
    of their block (half the pair graph with the add + norm in the call's place), over `blocks`
    and the row counts `rows`: their bounds in percent."""
    shares = [r[f"pair_{b}_extra_ms"] / (r[f"pair_{b}_norm_ms"] / 2) * 100
              for r in f.rows(PAIR_ROWS[tp]) if r["status"] == "ok" and r["strategy"] == "copy_engine_norm"
              and r["knobs"].get("ctas") == 32 and r["beside_layer"]["tokens"] in rows for b in blocks]
    return bounds(shares)


@functools.cache
def _machines_apart() -> dict:
    """How far apart the five TP=4 studies of each model (five 4x H200 machines) measured the
    points they share: the median and 90th percentile of each point's range, and the widest."""
    out = {}
    for model in ("llama3-70b", "llama3-8b"):
        ranges = f.measured_ranges(VALIDATION, (study for label, study in STUDIES
                                                if label.startswith(f"{model} TP=4")))
        out[model] = {"n": len(ranges), "median": statistics.median(ranges),
                      "p90": statistics.quantiles(ranges, n=10)[-1], "max": max(ranges)}
    return out


@functools.cache
def _chunks() -> dict:
    """The TP=2 chunk studies' lines, and the copy engine's pairs as shares of their block at TP=2 and TP=4."""
    return {"line": _line(CHUNKS), "big": _line(CHUNKS_70B),
            "tp2": _pair_shares(2, ("attention", "mlp"), (512, 1024, 2048, 4096, 8192)),
            "tp4_attention": _pair_shares(4, ("attention",), (512, 1024, 2048)),
            "tp4_mlp": _pair_shares(4, ("mlp",), (512, 1024, 2048))}


LONG = (
    *((f"{m} TP=2, 2112bbf", f"{m} TP=2, long prompts, measured at 2112bbf on GPUs 0 and 1 of a 4x H200, pair rows")
      for m in ("llama3-70b", "llama3-8b")),
    *((f"{m} TP=4, {commit}", f"{m} TP=4, long prompts, {title}, pair rows")
      for m in ("llama3-70b", "llama3-8b")
      for commit, title in (("bfff1d7", "bfff1d7's study, table and layer rows"), ("9ba11d6", "measured at 9ba11d6"),
                            ("1968c70", "measured at 1968c70"))),
)
# the splits over 4 and 8 balanced chunks, as the validation labels them
MANY_CHUNKS = tuple(f"token_split split_ratio=balanced comm=copy_engine comm_ctas_attn=32 comm_ctas_mlp=32 chunks={n}"
                    for n in (4, 8))


@functools.cache
def _long() -> dict:
    """The long-prompt lines: every default line's picks, llama3-70b TP=4's medians with and
    without the in-layer term, and llama3-8b TP=4's errors of the many-chunk splits at 16K."""
    lines = {label: _line(study) for label, study in LONG}
    tp4_70 = [study for label, study in LONG if label.startswith("llama3-70b TP=4")]
    tp4_8 = [study for label, study in LONG if label.startswith("llama3-8b TP=4")]
    chunked = [-float(f.validation_errors(VALIDATION, study, what)[16384]) for study in tp4_8 for what in MANY_CHUNKS]
    neither = [_line(s + VARIANTS[3]) for s in tp4_8]
    return {"picks": ", ".join(sorted({v["picks"] for v in lines.values()})),
            "w8": bounds(float(_line(s)["worst"]) for s in tp4_8), "w8_neither": bounds(float(v["worst"]) for v in neither),
            "p8_neither": bounds(int(v["picks"].split()[0]) for v in neither),
            "with": bounds(float(_line(s)["median"]) for s in tp4_70),
            "without": bounds(float(_line(s + VARIANTS[1])["median"]) for s in tp4_70),
            "slow": bounds(chunked)}


DOC = "docs/predict.md"
CLAIMS = [
    *[Claim(DOC, "| {label} | {cells} |", lambda label=label, study=study: _table_row(label, study))
      for label, study in LONG],
    Claim(DOC, "The picks are right at {picks} token counts on every line with the defaults", _long),
    Claim(DOC, "At TP=4 llama3-70b's medians are {with[lo]:.3f}-{with[hi]:.3f} with the in-layer term and "
               "{without[lo]:.3f}-{without[hi]:.3f} without it", _long),
    Claim(DOC, "the balanced splits over 4 and 8 chunks at 16K, {slow[lo]:.2f}-{slow[hi]:.2f} too slow", _long),
    Claim(DOC, "There the defaults' worst is larger than with neither term ({w8[lo]:.3f}-{w8[hi]:.3f} against "
               "{w8_neither[lo]:.3f}-{w8_neither[hi]:.3f}), their picks right at {picks} against "
               "{p8_neither[lo]:.0f}-{p8_neither[hi]:.0f} of 3", _long),
    Claim(DOC, "the five studies of each model measured the {a[llama3-70b][n]} and {a[llama3-8b][n]} points they "
               "share {a[llama3-70b][median]:.3f} and {a[llama3-8b][median]:.3f} apart at the median, "
               "{a[llama3-70b][p90]:.3f} and {a[llama3-8b][p90]:.3f} at the 90th percentile, at most "
               "{a[llama3-70b][max]:.3f} and {a[llama3-8b][max]:.3f}", lambda: {"a": _machines_apart()}),
    Claim(DOC, "predicted with median {line[median]}, worst {line[worst]}, picks within 0.01 at {line[picks]} token "
               "counts", _chunks),
    Claim(DOC, "llama3-70b's (b087538, 4K and 16K, with cc4fbeb's pair rows) with median {big[median]}, worst "
               "{big[worst]}, picks within 0.01 at {big[picks]}", _chunks),
    Claim(DOC, "are {tp2[lo]:+.0f}% to {tp2[hi]:+.0f}% of the block at 512-8192 rows", _chunks),
    Claim(DOC, "{tp4_attention[lo]:+.0f}% to {tp4_attention[hi]:+.0f}% of the attention block and up to "
               "{tp4_mlp[hi]:+.0f}% of the MLP at 512-2048 rows", _chunks),
    Claim(DOC, "at TP=2 on H200 the predicted pick is within 0.01 of the measured best at {picks} token counts, medians "
               "{m2[lo]:.3f}-{m2[hi]:.3f}, worst {w2[lo]:.3f}-{w2[hi]:.3f}: the targets met at both models. At TP=4 (4x "
               "H200, five studies per model) the picks are right at 5-6 of 6 on {right} of {n} studies, medians "
               "{m4[lo]:.3f}-{m4[hi]:.3f}, worst {w4[lo]:.3f}-{w4[hi]:.3f}", _in_brief),
    Claim(DOC, "With the pair rows, the TP=2 targets are met and the TP=4 picks at {right} of {n} studies", _in_brief),
    Claim(DOC, "the MLP block's first GEMM started {first[gap]:.0f} us after the call's first kernel, after "
               "{first[norms]} of its add + norm kernels",
          lambda: {"first": _gemm_after_the_call("first")}),
    Claim(DOC, "the next block's first GEMM started {split[gap]:.0f} us after the reduction's opening barrier, with "
               "{split[norms]} of its add + norm kernels before it", lambda: {"split": _gemm_after_the_call("split")}),
    Claim(DOC, "then shows the split's order ({preceded[gap]:.0f} us, {preceded[norms]} add + norm kernels before the GEMM",
          lambda: {"preceded": _gemm_after_the_call("preceded")}),
    *[Claim(DOC, "| {label} | {cells} |", lambda label=label, study=study: _table_row(label, study))
      for label, study in STUDIES],
    Claim(DOC, "TP=2 (the 60ae8af studies): llama3-70b {t2_70[picks]}, median {t2_70[median]}, worst {t2_70[worst]}; "
               "llama3-8b {t2_8[picks]}, median {t2_8[median]}, worst {t2_8[worst]}", _where_they_stand),
    Claim(DOC, "picks right at 5-6 of 6 on {tp4_70_picks} of 5 llama3-70b studies and {tp4_8_picks} of 5 llama3-8b ones, "
               "medians {tp4_med[lo]:.3f}-{tp4_med[hi]:.3f}, worst {tp4_worst[lo]:.3f}-{tp4_worst[hi]:.3f}",
          _where_they_stand),
]

test_each_published_figure_follows_from_its_rows = claims_test(CLAIMS)
