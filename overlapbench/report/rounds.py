"""`report RUN --rounds`: how noisy a run's paired rounds were, batch by batch.

Interleaved timing (interleave.py) times a batch's candidates round after round and compares each
with the reference in the same round. What sets a speedup's interval is the spread of those
per-round log ratios: +-0.5% at 95% takes about (1.96 sd / 0.5%)^2 rounds. Per batch: the rounds,
the median over candidates of that sd, and the widest interval the rows report.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from overlapbench.errors import UserError
from overlapbench.report.cells import Grid, text_cell
from overlapbench.tuning import analysis
from overlapbench.tuning.analysis import Group


def paired_batches(rows: list[dict]) -> dict[str, list[dict]]:
    """The ok rows timed interleaved, by pairing (one batch's timing), reference first."""
    found: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if row.get("status") == "ok" and row.get("round_ids") and row.get("pairing"):
            found[row["pairing"]].append(row)
    if not found:
        raise UserError("--rounds: no rows timed interleaved (rows with round_ids) in the results")
    return {p: sorted(r, key=lambda row: not _is_reference(row)) for p, r in sorted(found.items(), key=_batch_order)}


def _is_reference(row: dict) -> bool:
    return row["strategy"] == analysis.REFERENCES.get(analysis.workload_of(row)) and analysis.default_knobs(row["knobs"])


def _batch_order(item: tuple[str, list[dict]]) -> tuple:
    rows = item[1]
    return (rows[0]["tokens"], item[0])


def log_ratio_sd(reference: dict, row: dict) -> float:
    """The sd of log(t_reference / t) over the rounds both ran: NaN with fewer than 3."""
    by_round = dict(zip(reference["round_ids"], reference["samples_ms"]))
    logs = [math.log(by_round[r] / t) for r, t in zip(row["round_ids"], row["samples_ms"]) if r in by_round]
    return statistics.pstdev(logs) if len(logs) > 2 else float("nan")


def half_width(row: dict) -> float | None:
    """A row's 95% speedup interval as a share of its speedup (+-)."""
    ci = row.get("speedup_ci")
    return None if not ci or not row.get("speedup") else (ci[1] - ci[0]) / 2 / row["speedup"]


def rounds_view(rows: list[dict]) -> tuple[list[Grid], list[dict], str]:
    """A table per group (model, TP, device, dtype: its heading), a line per batch."""
    grids: dict[Group, list] = {}
    records = []
    for pairing, members in paired_batches(rows).items():
        if not _is_reference(members[0]):
            continue  # a batch whose reference failed: nothing was paired
        reference, others = members[0], members[1:]
        sds = [sd for sd in (log_ratio_sd(reference, r) for r in others) if not math.isnan(sd)]
        widths = [w for w in map(half_width, others) if w is not None]
        group = Group.of(reference)
        record = group.fields() | {
            "pairing": pairing, "tokens": reference["tokens"], "batch": reference.get("batch"),
            "candidates": len(others), "rounds": len(reference["round_ids"]),
            "median_sd": statistics.median(sds) if sds else None, "widest_ci": max(widths, default=None)}
        records.append(record)
        grids.setdefault(group, []).append([
            text_cell(str(record["tokens"])), text_cell(pairing), text_cell(str(record["candidates"])),
            text_cell(str(record["rounds"])), text_cell(_pct(record["median_sd"])), text_cell(_pct(record["widest_ci"], "±"))])
    header = ["tokens", "pairing", "candidates", "rounds", "median sd", "widest 95% ci"]
    note = ("median sd: over candidates, of their per-round log ratio to the reference · "
            "+-0.5% at 95% takes about (1.96 sd / 0.5%)^2 rounds")
    ordered = sorted(grids.items(), key=lambda item: item[0].label())
    return [Grid(f"{group.label()}: rounds of the paired timing, per batch", header, lines)
            for group, lines in ordered], records, note


def _pct(value: float | None, sign: str = "") -> str:
    return "-" if value is None else f"{sign}{value:.2%}"
