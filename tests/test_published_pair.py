"""docs/predict.md, "The pair window, and predict's defaults since": its figures, from the pair
window's timelines and the H200 validation's summary lines (tests/published.py)."""

from __future__ import annotations

import functools
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
    kernels = f.timeline(TIMELINES[name]).kernels
    barrier = next(k.start for k in kernels if "barrier_kernel" in k.name)
    gemm = next(k.start for k in kernels if k.start > barrier and k.name.startswith("nvjet"))
    return {"gap": gemm - barrier, "norms": sum(barrier <= k.start < gemm and k.name == "_add_norm_kernel" for k in kernels)}


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
PAIR_ROWS_FOLDER = "results/h200x4/cc4fbeb"  # the pair rows the studies of other machines are predicted with
PAIR_ROWS = {2: "results/h200x2/1f96d65/comm-beside-layer-llama3-8b.jsonl",
             4: f"{PAIR_ROWS_FOLDER}/comm-beside-layer-llama3-8b.jsonl"}


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


EVERY_INPUT = "results/h200x4/f461a2e"
MODELS = ("llama3-70b", "llama3-8b")
ONE_MACHINE = {m: f"{m} TP=4, f461a2e's study, table, layer and pair rows" for m in MODELS}
ONE_MACHINE_LONG = {m: f"{m} TP=4, long prompts, f461a2e's study, table, layer and pair rows" for m in MODELS}
PAIR_2048 = f"{EVERY_INPUT}/pair-llama3-8b-2048/timelines/copy_engine_norm"
RANKS = ("", ".rank1", ".rank2", ".rank3")


@functools.cache
def _every_input() -> dict:
    """f461a2e's one machine: its pair rows against cc4fbeb's, its four default lines, and its
    pair timelines of llama3-8b at 2048 rows (every rank; each graph's first replay, which waits
    for the other ranks, left out): the blocks' spans beside the call and beside the add + norm,
    the call's alone and beside each block."""
    apart = {m: f.pair_share_differences(f"{PAIR_ROWS_FOLDER}/comm-beside-layer-{m}.jsonl",
                                         f"{EVERY_INPUT}/comm-beside-layer-{m}.jsonl") for m in MODELS}
    graph = lambda name, rank: f"{PAIR_2048}/{name}-2048{rank}.replay.timeline.json"
    block = lambda name: [span for r in RANKS for spans in f.stream_spans_us(graph(name, r), compute_only=True).values()
                          for span in spans[1:]]  # the lane of the block beside the call (or the add + norm)
    calls = lambda name: bounds(x for r in RANKS for x in f.call_spans_us(graph(name, r)))
    return {"n": {m: len(v) for m, v in apart.items()}, "median": {m: statistics.median(v) for m, v in apart.items()},
            "p90": {m: statistics.quantiles(v, n=10)[-1] for m, v in apart.items()},
            "max": {m: max(v) for m, v in apart.items()},
            "grid": {m: _line(s) for m, s in ONE_MACHINE.items()}, "long": {m: _line(s) for m, s in ONE_MACHINE_LONG.items()},
            "call": calls("op"), "call_attention": calls("pair_attention"), "call_mlp": calls("pair_mlp"),
            "attention": bounds(block("pair_attention")), "attention_norm": bounds(block("norm_attention")),
            "mlp": bounds(block("pair_mlp")), "mlp_norm": bounds(block("norm_mlp"))}


CHUNKS_PROFILE = f"{EVERY_INPUT}/report-profile-chunks-8b-tp4-8k.txt"
FOUR_CHUNKS = ("token_split-8192-align=256-split_offset=0-split_ratio=balanced-comm=copy_engine-comm_ctas_attn=32-"
               "comm_ctas_mlp=32-chunks=4-4layers")


def _four_chunks() -> dict:
    """llama3-8b's balanced 4-chunk split at 8K, TP=4, against its twin with no transfers (its
    `report --profile` summary)."""
    figure = lambda pattern: f.profile_figure(CHUNKS_PROFILE, FOUR_CHUNKS, pattern)
    return {"gemm": figure(r"longer by gemm ([+-][\d.]+)"), "attention": figure(r"attention ([+-][\d.]+)"),
            "other": figure(r"other ([+-][\d.]+) \(GEMM"), "median": figure(r"GEMM median ([+-][\d.]+)%"),
            "wall": figure(r"twin: wall ([+-][\d.]+) ms per layer"), "exposed": figure(r"exposed ([\d.]+) \(")}


def _both_picks() -> tuple[str, str]:
    """f461a2e's picks within 0.01 (the count of the "N of M"), where both models' agree: 1K-32K, then the long prompts."""
    data = _every_input()
    (grid,) = {v["picks"].split()[0] for v in data["grid"].values()}
    (long,) = {v["picks"].split()[0] for v in data["long"].values()}
    return grid, long


# Committed CUDA-graph profiles holding the default baseline and no_comm: (folder, token counts)
TP4_LONG_H200 = (("results/h200x4/2112bbf/profile-order-70b-tp4-16k-32k", (16384, 32768)),
                 ("results/h200x4/bfff1d7/profile-one-piece-70b-tp4-16k-32k", (16384, 32768)),
                 ("results/h200x4/a3860b5/profile-70b-tp4", (32768,)), ("results/h200x4/9ba11d6/profile-70b-tp4", (32768,)),
                 ("results/h200x4/60ae8af/async-tp-32k-tp4", (16384, 32768)))
TP4_LONG_H100 = (("results/h100x4/414380b/profile-order-70b-tp4-16k-32k", (16384, 32768)),
                 ("results/h100x4/414380b/profile-70b-tp4", (32768,)))
TP4_SHORT_H200 = (("results/h200x4/01de86b/profile-order-70b-tp4", (1024, 2048)),
                  ("results/h200x4/f9d2080/profile-tp4-misses-70b", (2048,)),
                  ("results/h200x4/f9d2080/profile-tp4-misses-8b", (4096,)), ("results/h200x4/a3860b5/profile-8b-tp4", (2048,)))
TP2_H200 = (("results/h200x2/eccace6/profile-order-70b-tp2-4k-16k", (4096, 16384)),
            ("results/h200x2/f320f41/profile-tp2-misses-70b", (32768,)),
            ("results/h200x2/b241e4c/profile-tp2-misses-70b-8k-64k", (8192, 65536)))
GEMM, ATTENTION_KINDS = ("gemm",), ("attention", "lse_merge")


def _changes(profiles: tuple, kinds: tuple[str, ...]) -> dict:
    """The baseline's kernels of `kinds` over no_comm's, less 1, in percent: every rank at every
    token count of `profiles`; their median (and as `less`, its negative) and bounds."""
    values = [100 * v for folder, tokens in profiles for t in tokens for v in f.baseline_over_no_comm(folder, t, kinds)]
    return {"median": statistics.median(values), "less": -statistics.median(values), **bounds(values)}


@functools.cache
def _baseline_compute() -> dict:
    no_comm = f.validation_points(VALIDATION, ONE_MACHINE["llama3-70b"], "no_comm")
    no_comm_none = f.validation_points(VALIDATION, ONE_MACHINE["llama3-70b"] + VARIANTS[1], "no_comm")
    return {"gemm": _changes(TP4_LONG_H200, GEMM), "attention": _changes(TP4_LONG_H200, ATTENTION_KINDS),
            "h100_gemm": _changes(TP4_LONG_H100, GEMM), "h100_attention": _changes(TP4_LONG_H100, ATTENTION_KINDS),
            "short_gemm": _changes(TP4_SHORT_H200, GEMM), "tp2_gemm": _changes(TP2_H200, GEMM),
            "comm": bounds(100 * (1 - 1 / no_comm[t][0]) for t in (16384, 32768)),
            "err": {t: no_comm[t][2] for t in (16384, 32768)}, "err_none": {t: no_comm_none[t][2] for t in (16384, 32768)}}


DOC = "docs/predict.md"
CLAIMS = [
    *[Claim(DOC, "| {label} | {cells} |", lambda label=label, study=study: _table_row(label, study))
      for label, study in LONG],
    Claim(DOC, "over the {n[llama3-70b]} and {n[llama3-8b]} (path, budget, rows, block) both machines' rows hold, their "
               "extras differ by {median[llama3-70b]:.3f} and {median[llama3-8b]:.3f} of the block at the median, "
               "{p90[llama3-70b]:.3f} and {p90[llama3-8b]:.3f} at the 90th percentile, at most {max[llama3-70b]:.3f} and "
               "{max[llama3-8b]:.3f} (llama3-70b and llama3-8b)", _every_input),
    Claim(DOC, "llama3-70b TP=4: median {grid[llama3-70b][median]}, worst {grid[llama3-70b][worst]}, picks within 0.01 at "
               "{grid[llama3-70b][picks]}; llama3-8b TP=4: median {grid[llama3-8b][median]}, worst "
               "{grid[llama3-8b][worst]}, picks within 0.01 at {grid[llama3-8b][picks]}; the long prompts: "
               "{long[llama3-70b][median]} / {long[llama3-70b][worst]} / {long[llama3-70b][picks]} and "
               "{long[llama3-8b][median]} / {long[llama3-8b][worst]} / {long[llama3-8b][picks]}", _every_input),
    Claim(DOC, "gives errors like the others' (its 1K-32K picks right at {p[0]} of 6 for both models, its long prompts' at "
               "{p[1]} of 3)", lambda: {"p": _both_picks()}),
    Claim(DOC, "its compute kernels took {gemm:+.3f} (GEMMs), {attention:+.3f} (attention) and {other:+.3f} (other) ms per "
               "layer more, the GEMMs' median {median:+.1f}%, while its wall grew by {wall:+.3f} ms per layer, {exposed:.3f} "
               "ms of it exposed transfer over the replays", _four_chunks),
    Claim(DOC, "The attention block took {attention[lo]:.0f}-{attention[hi]:.0f} us beside the call and "
               "{attention_norm[lo]:.0f}-{attention_norm[hi]:.0f} us beside the add + norm, the MLP block "
               "{mlp[lo]:.0f}-{mlp[hi]:.0f} us and {mlp_norm[lo]:.0f}-{mlp_norm[hi]:.0f} us; the call took "
               "{call[lo]:.0f}-{call[hi]:.0f} us alone, {call_attention[lo]:.0f}-{call_attention[hi]:.0f} us beside the "
               "attention block and {call_mlp[lo]:.0f}-{call_mlp[hi]:.0f} us beside the MLP block", _every_input),
    Claim(DOC, "baseline's GEMMs took a median {gemm[less]:.1f}% less time than `no_comm`'s ({gemm[lo]:+.1f}% to "
               "{gemm[hi]:+.1f}% over ranks and points) and its attention {attention[less]:.1f}% less "
               "({attention[lo]:+.1f}% to {attention[hi]:+.1f}%); on 4x H100 (`results/h100x4/414380b/`) "
               "{h100_gemm[less]:.1f}% and {h100_attention[less]:.1f}% less. At 1K-4K (four 4x H200 folders) the "
               "baseline's GEMMs took {short_gemm[median]:.1f}% more ({short_gemm[lo]:+.1f}% to {short_gemm[hi]:+.1f}%), "
               "and at TP=2 (three 2x H200 folders, 4K-64K) {tp2_gemm[less]:.1f}% less ({tp2_gemm[lo]:+.1f}% to "
               "{tp2_gemm[hi]:+.1f}%)", _baseline_compute),
    Claim(DOC, "at 16K-32K, {comm[lo]:.0f}-{comm[hi]:.0f}% of its time at f461a2e", _baseline_compute),
    Claim(DOC, "in the studies' TP=4 profiles at 16K-32K the baseline's GEMMs take a median {gemm[less]:.1f}% less time "
               "than there", _baseline_compute),
    Claim(DOC, "`no_comm` at llama3-70b 16K and 32K is predicted {err[16384]} and {err[32768]} (f461a2e; "
               "{err_none[16384]} and {err_none[32768]} with `--in-layer none`)", _baseline_compute),
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
