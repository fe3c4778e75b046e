"""Figures the documents publish, computed again from the committed files they cite.

Each function reads committed output (rows through the package's own analysis, test logs, walls
files, compiled-kernel listings) and returns plain numbers; tests/test_published_numbers.py puts
them into the sentences the documents print and checks the sentences are there. Paths are
relative to the repository root.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
import statistics
from collections.abc import Iterable, Iterator
from pathlib import Path

from overlapbench.report import exposed
from overlapbench.tuning import analysis, batches, results, tune
from tests.checks import predict_validation as validation

ROOT = Path(__file__).resolve().parents[1]


# The TP=4 studies on 4x H200, and again on the code of a3860b5 (another machine), at these token counts.
TP4 = "results/h200x4/c1821fe/"
AGAIN_TP4 = "results/h200x4/a3860b5/"
CE_OUT_TP4 = "results/h200x4/1968c70/"  # the TP=4 studies with `ce_out: kernel` in the grid
TP4_STUDIES = {model: (TP4 + f"{model}-tp4.jsonl",) for model in ("llama3-70b", "llama3-8b")}
TOKENS = (1024, 2048, 4096, 8192, 16384, 32768)


def tp4_runs_by_setting(model: str) -> tuple[dict, dict]:
    """The c1821fe and a3860b5 TP=4 studies' timed rows of `model`, each keyed by its setting
    (strategy, tokens, knobs)."""
    def by_setting(store: str) -> dict:
        return {(r["strategy"], r["tokens"], json.dumps(r["knobs"], sort_keys=True)): r
                for r in rows(store) if r["status"] == "ok" and r.get("speedup") is not None}

    return by_setting(TP4 + f"{model}-tp4.jsonl"), by_setting(AGAIN_TP4 + f"{model}-tp4.jsonl")


def path(relative: str) -> Path:
    return ROOT / relative


def rows(store: str) -> list[dict]:
    return results.read_rows(path(store))


def row_count(store: str) -> int:
    return len(rows(store))


def run_ids(store: str) -> list[str]:
    """The run ids of a store, in the order they first appear."""
    return list(dict.fromkeys(r["run_id"] for r in rows(store)))


def layer_points(*stores: str) -> dict[analysis.Group, dict[int, list[analysis.Measured]]]:
    """The layer rows of the stores by group and token count, as tune and report see them."""
    store = analysis.read([path(s) for s in stores])
    return analysis.by_point(m for m in store.measured if m.group.workload == analysis.LAYER)


def batches_of(*stores: str):
    """(store, batch composition, its layer rows) for every batch of the stores: the unit every
    comparison is made in."""
    for store in stores:
        for points in layer_points(store).values():
            for rows_at in points.values():
                for composition, batch_rows in batches.by_batch(rows_at).items():
                    yield store, composition, batch_rows


def speedups(store: str) -> dict[tuple, tuple[float, tuple[float, float] | None]]:
    """(setting, batch) -> (speedup over the batch's reference, its paired interval or None), for
    every layer row but the reference: the numbers report prints."""
    out = {}
    for _, _, batch_rows in batches_of(store):
        ref = analysis.reference(batch_rows)
        for m in batch_rows:
            if ref is not None and m is not ref:
                out[(m.setting, m.batch)] = (analysis.speedup(m, ref), analysis.speedup_ci(m, ref))
    return out


def half_widths(store: str, min_tokens: int) -> list[float]:
    """Each paired interval's half width relative to its speedup, at `min_tokens` and above."""
    return [(ci[1] - ci[0]) / 2 / s for (_, batch), (s, ci) in speedups(store).items() if ci and sum(batch) >= min_tokens]


def picks(store: str, min_gain: float = tune.MIN_GAIN) -> dict[tuple[str, int], str]:
    """(group, token count) -> what tune picks there (with `min_gain`), described."""
    out = {}
    for group, points in layer_points(store).items():
        for tokens, rows_at in points.items():
            chosen = tune.pick(rows_at, min_gain)
            if chosen is not None:
                out[(group.label(), tokens)] = chosen.chosen.describe()
    return out


def agreement(a: str, b: str, min_tokens: int = 4096) -> dict[str, int]:
    """How two runs of one spec agree: points in common, those whose speedups differ by at most 1%
    and 0.5%, paired intervals at `min_tokens` and above and those within +-0.5%, token counts
    and those where tune picks the same (the acceptance of paired timing)."""
    sa, sb = speedups(a), speedups(b)
    common = set(sa) & set(sb)
    diffs = [abs(sa[k][0] / sb[k][0] - 1) for k in common]
    widths = half_widths(a, min_tokens) + half_widths(b, min_tokens)
    pa, pb = picks(a), picks(b)
    return {
        "points": len(common),
        "within_1": sum(d <= 0.01 for d in diffs),
        "within_05": sum(d <= 0.005 for d in diffs),
        "intervals": len(widths),
        "narrow": sum(w <= 0.005 for w in widths),
        "counts": len(pa),
        "same_picks": sum(pa[k] == pb.get(k) for k in pa),
    }


def best_speedups(stores: tuple[str, ...], strategy: str, **knobs) -> dict[tuple, float]:
    """(store, batch) -> the speedup over the batch's reference of `strategy`'s fastest setting
    (among those with the given knob values), as report prints it: paired where timed together."""
    out = {}
    for store, composition, batch_rows in batches_of(*stores):
        ref = analysis.reference(batch_rows)
        own = [m for m in batch_rows if m.strategy == strategy and all(m.knobs.get(k) == v for k, v in knobs.items())]
        best = analysis.best_per_strategy(own).get(strategy)
        if best is not None and ref is not None:
            out[(store, composition)] = analysis.speedup(best, ref)
    return out


def relative(a: dict, b: dict) -> list[float]:
    """a / b where both have a value: one strategy's speedup over another's, each over the reference."""
    return [a[k] / b[k] for k in a if k in b]


def comm_shares(*stores: str) -> list[float]:
    """Per batch, the share of the reference's median time that communication takes:
    1 - no_comm's median / the reference's (medians: the two are not one strategy's settings)."""
    out = []
    for _, _, batch_rows in batches_of(*stores):
        ref, free = analysis.reference(batch_rows), analysis.bound(batch_rows)
        if ref is not None and free is not None:
            out.append(1 - free.ms / ref.ms)
    return out


def communicating(batch_rows: list[analysis.Measured]) -> list[analysis.Measured]:
    """A batch's choices that communicate: the bound `no_comm` and the split's `comm: none` left out."""
    return [m for m in batch_rows if m.strategy != analysis.BOUND and m.knobs.get("comm") != "none"]


def fastest_by_tokens(*stores: str) -> dict[int, dict]:
    """Per token count (one batch each): the fastest correct choice that communicates (the bound
    `no_comm` and the split's `comm: none` left out), its strategy, the share of the exposed
    communication it hides (%), its time over no_comm's, and the exposed share of the reference (%)."""
    out = {}
    for _, composition, batch_rows in batches_of(*stores):
        ref, free = analysis.reference(batch_rows), analysis.bound(batch_rows)
        best = min(communicating(batch_rows), key=lambda m: m.ms)
        out[sum(composition[0])] = {"strategy": best.strategy, "how": _how(best.knobs),
                                    "speedup": analysis.speedup(best, ref),
                                    "hidden": analysis.hidden(best, ref, free) * 100, "over_free": best.ms / free.ms,
                                    "exposed": (1 - free.ms / ref.ms) * 100}
    return out


def reference_ms(store: str) -> dict[tuple, float]:
    """Batch composition -> the reference row's median ms."""
    return {composition: ref.ms for _, composition, batch_rows in batches_of(store)
            if (ref := analysis.reference(batch_rows)) is not None}


def rows_wall_s(store: str) -> float:
    """Seconds from a store's first row to its last."""
    times = [dt.datetime.fromisoformat(r["time"]) for r in rows(store)]
    return (max(times) - min(times)).total_seconds()


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\s*(.*)$")


def walls(walls_txt: str) -> dict[str, float]:
    """A device call's walls file: seconds from each stamped line to the next, by the line's text
    (`<time> start NAME ...` by NAME alone; a bare `<time>` by '')."""
    stamps = []
    for line in path(walls_txt).read_text().splitlines():
        if m := _STAMP.match(line.strip()):
            words = m[2].split()
            name = words[1] if len(words) > 1 and words[0] == "start" else m[2]
            stamps.append((dt.datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%SZ"), name))
    return {name: (end - start).total_seconds() for (start, name), (end, _) in zip(stamps, stamps[1:])}


_SUMMARY = re.compile(r"^=*\s*(\d+ \w+(?:, \d+ \w+)*) in ([0-9.]+)s", re.M)


def pytest_summary(log: str) -> dict[str, float]:
    """The last pytest summary line of a log: {'passed': 221, 'skipped': ..., 'seconds': 166.06}."""
    found = _SUMMARY.findall(path(log).read_text())
    if not found:
        raise AssertionError(f"{log}: no pytest summary line")
    counts, seconds = found[-1]
    out: dict[str, float] = {"seconds": float(seconds)}
    for number, what in re.findall(r"(\d+) (\w+)", counts):
        out[what] = int(number)
    return out


def registers(ptx_txt: str) -> dict[str, int]:
    """Kernel variant -> registers per thread, from kernels/inspect_ptx.py's listing."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\S.*?): REG:(\d+)", path(ptx_txt).read_text(), re.M)}


def _round_spread_section(round_spread_txt: str, run: str) -> str:
    """The part of kernels/round_spread.py's output about one run (its heading names the run)."""
    text = path(round_spread_txt).read_text()
    return text.split(f"{run} --predecessors", 1)[1].split("\n## ", 1)[0]


def median_round_sd(round_spread_txt: str, run: str, tokens: range) -> list[float]:
    """From kernels/round_spread.py's table: the median sd (%) of the candidates' per-round
    ratios to the reference, per token count in `tokens`."""
    found = re.findall(r"^\s*(\d+)\s+\d+\s+([0-9.]+)%\s+[0-9.]+%$", _round_spread_section(round_spread_txt, run), re.M)
    return [float(v) for t, v in found if int(t) in tokens]


def after_candidate(round_spread_txt: str, run: str, candidate: str, tokens: range) -> list[float]:
    """From kernels/round_spread.py's --predecessors lines: the mean deviation (%) of the
    candidate run just after `candidate` (as the script names it, `no_comm#1`), per token count."""
    found = re.findall(rf"^\s*(\d+) \(warm-up.*?after {re.escape(candidate)} ([+-][0-9.]+)%",
                       _round_spread_section(round_spread_txt, run), re.M)
    return [float(v) for t, v in found if int(t) in tokens]


def sweep_rows(folder: str) -> list[dict]:
    """Every row of the overlapbench stores (sweep and comm) under a folder; the scripts' own
    JSON lines, which are not stores, left out."""
    from overlapbench.errors import UserError

    out = []
    for store in sorted(path(folder).rglob("*.jsonl")):
        try:
            out.extend(results.read_rows(store))
        except UserError:
            continue
    return out


def the_one(values: list, what: str):
    """The single value all of `values` share; an AssertionError naming `what` where they differ."""
    distinct = {json.dumps(v, sort_keys=True): v for v in values}
    if len(distinct) != 1:
        raise AssertionError(f"{what}: {len(distinct)} different values, not one: {sorted(distinct)[:4]}")
    return next(iter(distinct.values()))


def found_in(text_file: str, pattern: str) -> list[str]:
    """Every match of a regex's first group in a committed text file."""
    return re.findall(pattern, path(text_file).read_text(), re.M)


def the_row(rows: list[dict], strategy: str, **knobs) -> dict:
    """The one row of `rows` of `strategy` whose knobs hold `knobs` (None: the knob unset)."""
    return the_one([r for r in rows if r["strategy"] == strategy and all(r["knobs"].get(k) == v for k, v in knobs.items())],
                   f"{strategy} {knobs}")


def measured_choice(batch_rows: list[analysis.Measured], strategy: str, **knobs) -> analysis.Measured:
    """The one choice of a batch of `strategy` whose knobs hold `knobs` (None: the knob unset)."""
    (choice,) = [m for m in batch_rows if m.strategy == strategy and all(m.knobs.get(k) == v for k, v in knobs.items())]
    return choice


def batch_at(store: str, tokens: int) -> list[analysis.Measured]:
    """The layer rows of a store's one batch of `tokens` tokens (batches_of)."""
    (batch,) = [at for _, composition, at in batches_of(store) if sum(composition[0]) == tokens]
    return batch


def paired_gain(store: str, tokens: int, a: tuple[str, dict], b: tuple[str, dict]) -> tune.Gain:
    """Choice `a` over choice `b` (each a strategy and the knobs it holds) at one token count of a
    store, paired round by round (tune.gain: speedup and 95% interval)."""
    batch = batch_at(store, tokens)
    return tune.gain(measured_choice(batch, a[0], **a[1]), measured_choice(batch, b[0], **b[1]))


def ce_split_ms(store: str, ce_out: str | None) -> dict[int, float]:
    """The copy-engine split 32/32 (whole-half cut, 2 chunks) by token count: its ms per layer with
    the own rows' writer `ce_out` (None: the knob unset, `copy`)."""
    ok = [r for r in rows(store) if r["status"] == "ok"]
    return {t: the_row([r for r in ok if r["tokens"] == t], "token_split", comm="copy_engine", comm_ctas_attn=32,
                       split_ratio=None, chunks=None, ce_out=ce_out)["ms"]
            for t in sorted({r["tokens"] for r in ok})}


def token_span(tokens: Iterable[int]) -> str:
    """Consecutive token counts of TOKENS as the docs name them: '4K' or '2K-32K'."""
    at = sorted(TOKENS.index(t) for t in tokens)
    assert at and at == list(range(at[0], at[-1] + 1)), f"not one run of token counts: {sorted(tokens)}"
    lo, hi = TOKENS[at[0]] // 1024, TOKENS[at[-1]] // 1024
    return f"{lo}K" if lo == hi else f"{lo}K-{hi}K"


def against_no_comm(store: str) -> dict[int, tuple[analysis.Measured, analysis.Measured, tune.Gain]]:
    """Per token count of a store (one batch each): its fastest correct choice that communicates,
    `no_comm`, and the choice's paired gain over it (tune.gain: speedup and 95% interval)."""
    out = {}
    for _, composition, at in batches_of(store):
        free = analysis.bound(at)
        best = min((m for m in communicating(at) if m.checked), key=lambda m: m.ms)
        out[sum(composition[0])] = (best, free, tune.gain(best, free))
    return out


def _pieces(ce_chunks) -> str:
    """A set piece count per copy-engine reduction, as the tables name it (`auto` and unset: nothing)."""
    if not isinstance(ce_chunks, int):
        return ""
    return f"{ce_chunks} piece{'s' if ce_chunks > 1 else ''} per reduction"


def _how(knobs: dict) -> str:
    """A pick's knobs as the README's tables name them: its path (`comm`, or an SP strategy's
    `transport`), the CTA budgets, and the split's or the exchange's shape where it is not the default
    (`balanced`, `4 chunks`, `2 chunks/rank`), the copy engine's own rows written by the kernel
    (`ce_out kernel`), its pieces per reduction where set (`1 piece per reduction`), and the
    reductions' order where not `ready` (`after the next GEMM`)."""
    ctas = [str(v) for k, v in knobs.items() if "ctas" in k and k != "nccl_max_ctas" and v not in (None, analysis.DEFAULT)]
    shape = [knobs["split_ratio"] if knobs.get("split_ratio") == "balanced" else "",
             f"{knobs['chunks']} chunks" if (knobs.get("chunks") or 2) > 2 else "",
             f"{knobs['chunks_per_rank']} chunks/rank" if (knobs.get("chunks_per_rank") or 1) > 1 else "",
             "ce_out kernel" if knobs.get("ce_out") == "kernel" else "",
             _pieces(knobs.get("ce_chunks")),
             "after the next GEMM" if knobs.get("reduce_start") == "after_next_gemm" else ""]
    path = str(knobs.get("comm") or knobs.get("transport") or "")
    return ", ".join(filter(None, [path, f"{'/'.join(ctas)} CTAs" if ctas else "", *shape]))


def picks_by_tokens(*stores: str) -> dict[int, dict]:
    """Per token count of the stores' one layer group: tune's pick there, as the README's table
    prints it: the reference's and no_comm's ms, the pick's strategy and its comm/CTA knobs (a
    baseline's, as `knob_text` writes them), its
    speedup over the reference with the paired interval's half width, and the share of the
    exposed communication it hides (analysis.hidden, the figure report prints); the reference's
    fastest setting there (`best_*`) and the pick's speedup over it (`vs_best`)."""
    (points,) = layer_points(*stores).values()
    out = {}
    for tokens, rows_at in sorted(points.items()):
        chosen = tune.pick(rows_at)
        ref, free, m = analysis.reference(rows_at), analysis.bound(rows_at), chosen.chosen
        ci = analysis.speedup_ci(m, ref)
        speedup = analysis.speedup(m, ref)
        how = _how(m.knobs) or (f"`{m.knob_text()}`" if m.knob_text() else "")  # a baseline picked: its knobs
        best = analysis.best_reference(rows_at)
        out[tokens] = {"ref_ms": ref.ms, "free_ms": free.ms, "strategy": m.strategy, "how": how, "speedup": speedup,
                       "pm": 0.0 if ci is None else (ci[1] - ci[0]) / 2 / speedup * 100,
                       "hidden": analysis.hidden(m, ref, free) * 100,
                       "best_ms": best.ms, "best_how": best.knob_text() or "default",
                       "vs_best": chosen.speedup_vs_best}
    return out


# the summary table's columns a claim names, by the table's header
VALIDATION_COLUMNS = {"points": "points", "median": "median", "p90": "90th pct", "worst": "worst",
                      "picks": "picks within 0.01", "compute": "compute vs pieces"}


def validation_line(validation_md: str, study: str) -> dict[str, str]:
    """A study's line of a predict validation's summary table (tests/checks/predict_validate.py),
    by its first cell, its cells named as VALIDATION_COLUMNS maps the header: points, median, p90,
    worst, picks ("5 of 6"), compute (the compute against the pieces, "+22% ⚠ (other code?)")."""
    header: list[str] = []
    for line in path(validation_md).read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "study":
            header = cells
        elif header and cells[0] == study:
            missing = [name for name in VALIDATION_COLUMNS.values() if name not in header]
            if missing:
                raise AssertionError(f"{validation_md}: the summary table has no column {missing}")
            by_name = dict(zip(header, cells))
            return {key: by_name[name] for key, name in VALIDATION_COLUMNS.items()}
    raise AssertionError(f"{validation_md}: no summary line for {study!r}")


def _section_cells(validation_md: str, section: str) -> Iterator[list[str]]:
    """The cells of every table line (headers too) in the validation's sections whose heading
    starts with `section`."""
    inside = False
    for line in path(validation_md).read_text().splitlines():
        if line.startswith("## "):
            inside = line[3:].startswith(section + " (")
        elif inside and line.startswith("| "):
            yield [c.strip() for c in line.strip().strip("|").split("|")]


def validation_predictions(validation_md: str, section: str) -> list[tuple[int, str, float]]:
    """(token count, prediction label, signed error) of every prediction in the validation's section
    whose heading starts with `section`."""
    return [(int(c[0]), c[1], float(c[4])) for c in _section_cells(validation_md, section)
            if len(c) == 5 and c[0].isdigit()]


def validation_compute(validation_md: str, section: str) -> dict[int, float]:
    """Token count -> the measured `no_comm` over the pieces' chain (%), as the validation's section
    whose heading starts with `section` prints it ("Compute against the pieces")."""
    text = path(validation_md).read_text()
    after = text[text.index(f"## {section} ("):]
    line = next(x for x in after.splitlines() if x.startswith("Compute against the pieces"))
    return {int(t): float(v) for v, t in re.findall(r"([+-]?\d+)% at (\d+)", line.split("chain): ")[1].split(";")[0])}


def validation_points(validation_md: str, section: str, what: str) -> dict[int, tuple[float, float, str]]:
    """Token count -> (measured, predicted, signed error as printed, "+0.010") of one prediction
    (its label, e.g. "no_comm") in the validation's section whose heading starts with `section`."""
    found = {int(c[0]): (float(c[2]), float(c[3]), c[4]) for c in _section_cells(validation_md, section)
             if len(c) == 5 and c[1] == what}
    if not found:
        raise AssertionError(f"{validation_md}: no {what!r} in a section starting {section!r}")
    return found


def validation_picks(validation_md: str, section: str) -> dict[int, tuple[str, float, str, float]]:
    """Token count -> (the measured pick, its speedup, the predicted pick, that pick's measured
    speedup) of the pick table in the validation's section whose heading starts with `section`."""
    found = {int(c[0]): (c[1], float(c[2]), c[3], float(c[4])) for c in _section_cells(validation_md, section)
             if len(c) == 6 and c[0] != "tokens"}
    if not found:
        raise AssertionError(f"{validation_md}: no pick table in a section starting {section!r}")
    return found


def measured_ranges(validation_md: str, sections: Iterable[str]) -> list[float]:
    """For each point every one of the validation's `sections` compares (by token count and
    label; the reference baseline left out), how far apart its measured speedups are: max - min
    over the sections (studies of one grid on several machines)."""
    sections = list(sections)
    measured: dict[tuple[str, str], list[float]] = {}
    for section in sections:
        for c in _section_cells(validation_md, section):
            if len(c) == 5 and c[0] != "tokens" and c[1] != "baseline":
                measured.setdefault((c[0], c[1]), []).append(float(c[2]))
    return [max(v) - min(v) for v in measured.values() if len(v) == len(sections)]


def validation_errors(validation_md: str, section: str, what: str) -> dict[int, str]:
    """Token count -> the signed error ("+0.010") of one prediction in a validation's section
    (validation_points)."""
    return {t: error for t, (_, _, error) in validation_points(validation_md, section, what).items()}


# -- the in-layer term against the studies (docs/predict.md) -------------------------------------


def no_comm_over_chain(pieces: str, *studies: str, layers: int | None = None) -> dict[int, float]:
    """Token count -> how much longer the studies' `no_comm` took per layer than the pieces' serial
    chain (the same stack with no communication, on one GPU: `sweep --pieces`), as a fraction;
    `layers`: the studies' depth where they hold several. The validation's compute check
    (tests/checks/predict_validation.py) is the same figure against predict's `no_comm`."""
    measured = [r for s in studies for r in rows(s)]
    return validation.over(validation.layer_ms(measured, "no_comm", {}, layers), validation.chain_ms(rows(pieces)))


def _table_ms(table: str) -> dict[tuple[str, str, int], float]:
    """(path, CTA budget, bytes) -> the comm table's median ms of its ok rows timed alone."""
    found: dict[tuple[str, str, int], list[float]] = {}
    for r in rows(table):
        alone = r.get("beside_layer") is None and not r.get("beside_gemm")
        if r["status"] == "ok" and alone:
            found.setdefault((r["strategy"], str(r["knobs"].get("ctas")), r["bytes"]), []).append(r["ms"])
    return {key: statistics.median(v) for key, v in found.items()}


def in_line_excess_us(table: str, *studies: str, layers: int | None = None) -> dict[int, float]:
    """Token count -> what each blocking all-reduce of the studies' default baseline (NCCL, its own
    CTAs) cost in line beyond the table's time of its size (us): (baseline - no_comm) / 2 per
    layer, less the table's nccl default time."""
    measured = [r for s in studies for r in rows(s)]
    times = _table_ms(table)
    base = validation.layer_ms(measured, "baseline", {"nccl_max_ctas": "default"}, layers)
    no_comm = validation.layer_ms(measured, "no_comm", {}, layers)
    out = {}
    for tokens in sorted(set(base) & set(no_comm)):
        nbytes = tokens * measured[0]["shape"]["hidden"] * 2  # bf16 rows
        if ("nccl", "default", nbytes) in times:
            out[tokens] = ((base[tokens] - no_comm[tokens]) / 2 - times["nccl", "default", nbytes]) * 1e3
    return out


def in_layer_terms_us(beside: str, path_: str = "nccl", ctas: str = "default") -> dict[int, float]:
    """Token count (the layer's rows) -> the beside-layer rows' in-layer term of one path (us)."""
    return {r["beside_layer"]["tokens"]: r["in_layer_extra_ms"] * 1e3 for r in rows(beside)
            if r["status"] == "ok" and r["strategy"] == path_ and str(r["knobs"].get("ctas")) == ctas}


def ops_over_table(beside: str, table: str) -> list[float]:
    """Each beside-layer row's two all-reduces alone (`in_layer_ops_ms` / 2, per call) over the
    comm table's time of the same path, budget and size."""
    times = _table_ms(table)
    keyed = ((r, (r["strategy"], str(r["knobs"].get("ctas")), r["bytes"])) for r in rows(beside) if r["status"] == "ok")
    return [r["in_layer_ops_ms"] / 2 / times[key] for r, key in keyed if key in times]


_PROFILE_POINT = re.compile(r"(\S+) \(\d+ graph replays?\): wall (.*?)(?=\S+ \(\d+ graph replays?\)|$)")
_TABLE_LINE = ("│", "┃", "┏", "┡", "└", "━")


@functools.cache
def profile_summaries(report_txt: str) -> dict[str, str]:
    """Each point's summary in a committed `report --profile` text (what follows '(N graph
    replays): wall'), its wrapped lines joined: point name -> summary, flattened. A line the
    terminal wrapped (80 columns, not a table's) runs on into the next without a space. Read once
    per file: the figures of one report all come from it."""
    text = ""
    for line in path(report_txt).read_text().split("\n"):
        text += line if len(line) >= 80 and not line.startswith(_TABLE_LINE) else line + " "
    return {m.group(1): m.group(2) for m in _PROFILE_POINT.finditer(" ".join(text.split()))}


def profile_figure(report_txt: str, point: str, pattern: str) -> float:
    """One number of a point's `report --profile` summary: the first group of `pattern`."""
    found = re.search(pattern, profile_summaries(report_txt)[point])
    if found is None:
        raise AssertionError(f"{report_txt}: no '{pattern}' under {point}")
    return float(found.group(1))


# -- the baselines' compute against no_comm's, in the studies' own replays (docs/predict.md) ----------


@functools.cache
def timeline(timeline_json: str) -> exposed.Timeline:
    """A committed `sweep --profile` (or pair-window) timeline as report/exposed.py reads it: its
    kernels in start order, each with its kind (report/profile.py's); each file read once."""
    return exposed.read(path(timeline_json))


def kind_ms(timeline_json: str, kinds: tuple[str, ...]) -> float:
    """The summed duration (ms) of a committed timeline's kernels of `kinds`."""
    return sum(k.end - k.start for k in timeline(timeline_json).kernels if k.kind in kinds) / 1e3


def baseline_over_no_comm(profile_dir: str, tokens: int, kinds: tuple[str, ...], layers: int = 4) -> list[float]:
    """For each rank's graph replay in a committed `sweep --profile` folder: the default
    baseline's kernels of `kinds` over no_comm's at `tokens`, less 1 (-0.04: they ran 4% shorter
    in the baseline). One list entry per rank whose replays both points hold."""
    out = []
    for rank in ("", *(f".rank{r}" for r in range(1, 8))):
        baseline, no_comm = (f"{profile_dir}/{name}-{tokens}-{layers}layers{rank}.replay.timeline.json"
                             for name in ("baseline", "no_comm"))
        if path(baseline).exists() and path(no_comm).exists():
            out.append(kind_ms(baseline, kinds) / kind_ms(no_comm, kinds) - 1)
    if not out:
        raise AssertionError(f"{profile_dir}: no baseline and no_comm replays at {tokens} tokens")
    return out


def pair_share_differences(a: str, b: str) -> list[float]:
    """Two beside-layer row files' pair extras, each as a share of its block (half the pair graph
    with the add + norm in the call's place), at every (path, budget, rows, block) both hold:
    |a - b| in points of the block (0.02: two percent of it)."""
    def shares(store: str) -> dict[tuple, float]:
        return {(r["strategy"], str(r["knobs"].get("ctas")), r["bytes"], block):
                r[f"pair_{block}_extra_ms"] / (r[f"pair_{block}_norm_ms"] / 2)
                for r in rows(store) if r["status"] == "ok" and r.get("pair_attention_extra_ms") is not None
                for block in ("attention", "mlp")}
    first, second = shares(a), shares(b)
    return [abs(first[key] - second[key]) for key in first.keys() & second.keys()]


def stream_spans_us(timeline_json: str, gap_us: float = 10.0, compute_only: bool = False) -> dict[int, list[float]]:
    """A committed timeline's kernels per stream, cut into runs wherever a stream idles more than
    `gap_us`: stream -> each run's span (first start to last end, us), in order. `compute_only`:
    only the streams that ran no communication or norm kernel (report/profile.py's kinds)."""
    kernels = timeline(timeline_json).kernels
    busy = {k.stream for k in kernels if k.kind in ("comm", "norm")}
    spans: dict[int, list[float]] = {}
    for stream in sorted({k.stream for k in kernels} - (busy if compute_only else set())):
        on_it = [k for k in kernels if k.stream == stream]
        runs = [[on_it[0]]]
        for k in on_it[1:]:
            if k.start - runs[-1][-1].end > gap_us:
                runs.append([])
            runs[-1].append(k)
        spans[stream] = [run[-1].end - run[0].start for run in runs]
    return spans


def call_spans_us(timeline_json: str) -> list[float]:
    """In a committed timeline of comm/pair.py's graphs (replays back to back), each copy-engine
    call's span (us) on its own stream: from its opening barrier to the end of its last kernel
    before the next call's opening barrier or the stream's next compute kernel; the first call,
    which waits for the other ranks, left out."""
    kernels = timeline(timeline_json).kernels
    stream = next(k.stream for k in kernels if "barrier_kernel" in k.name)
    spans, opened, last_end, barrier_count = [], None, None, 0
    for k in (k for k in kernels if k.stream == stream):
        opening = "barrier_kernel" in k.name and barrier_count % 2 == 0  # each call: two barriers
        compute = k.kind not in ("comm", "norm", "copy")
        if (opening or compute) and opened is not None:
            spans.append(last_end - opened)
            opened = None
        if opening:
            opened = k.start
        if "barrier_kernel" in k.name:
            barrier_count += 1
        last_end = k.end
    if opened is not None:
        spans.append(last_end - opened)
    return spans[1:]
