"""How tune and report read result stores, written once so that both read them the same way.

Which rows count (the last row per point: its key, device, world size, and whether it was
measured or predicted; status ok, workload `layer` or a micro GEMM), how they group (workload and
GEMM, device, world size, measured or predicted, tp, model shape, dtype; within a group, rows are
compared only within one batch composition and stack depth), the best knob setting
per strategy at a token count, and the two references every number is measured against: the
workload's reference strategy with default knobs (`REFERENCES`), and `no_comm`, the bound (layer
only). No torch and no pandas here: `tune` and `report` must start fast.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from overlapbench.errors import UserError
from overlapbench.strategies.knobs import DEFAULT, show_value
from overlapbench.timing.intervals import paired_ci, paired_estimate
from overlapbench.tuning import origin, results
from overlapbench.tuning.batches import decode_of

NOISY_CV = 0.02  # a point whose per-iteration CV exceeds this is flagged as noisy
BOUND = "no_comm"  # the ideal, not a correct result: a bound to compare with, never a choice
LAYER = "layer"  # the default workload: rows written before micro workloads existed lack the field
# Per workload, the strategy every other one is checked and timed against: the layer's blocking
# all-reduce (how engines run TP today), a micro GEMM's blocking all-gather / reduce-scatter.
# Workloads not listed (`comm` microbenchmarks) are not compared here.
REFERENCES = {LAYER: "baseline", "gemm_ag": "sp_baseline", "gemm_rs": "sp_baseline"}
COMPARED_TEXT = "/".join(REFERENCES)  # for messages: "layer/gemm_ag/gemm_rs"
_REQUIRED = ("strategy", "knobs", "tokens", "ms", "device", "world_size", "tp", "shape", "dtype")


@dataclass(frozen=True)
class Group:
    """Rows comparable with each other: one workload (a micro one: one GEMM) of one model shape
    and dtype on one machine setup, measured or predicted. A layer group is what one tuned config
    covers."""

    device: str
    world_size: int
    tp: int
    shape: tuple  # the shape's (field, value) pairs, sorted: hashable
    dtype: str
    model: str = field(default="custom", compare=False)  # a name for people; the shape decides
    workload: str = LAYER
    gemm: tuple[int, int] | None = None  # a micro workload's (N, K)
    predicted: bool = False  # rows `overlapbench predict` made, not measured

    @classmethod
    def of(cls, row: dict) -> Group:
        shape = tuple(sorted(row["shape"].items()))
        return cls(row["device"], row["world_size"], row["tp"], shape, row["dtype"], row.get("model") or "custom",
                   workload_of(row), _gemm(row), origin.kind_of(row) == origin.PREDICTED)

    @property
    def device_label(self) -> str:
        """The device, saying `(predicted)` for predicted rows."""
        return origin.device_label(self.device, self.predicted)

    @property
    def setup(self) -> tuple[str, int]:
        """Where the rows come from: the device (marked when predicted) and the world size."""
        return self.device_label, self.world_size

    @property
    def shape_dict(self) -> dict:
        return dict(self.shape)

    @property
    def reference_strategy(self) -> str:
        return REFERENCES[self.workload]

    @property
    def unit(self) -> str:
        """What one timing covers: a layer, or a micro workload's one GEMM."""
        return "layer" if self.workload == LAYER else "GEMM"

    def what(self) -> str:
        """The model, and for a micro workload which one and its GEMM: `llama3-8b gemm_rs n=4096 k=7168`."""
        if self.workload == LAYER:
            return self.model
        gemm = f" n={self.gemm[0]} k={self.gemm[1]}" if self.gemm else ""
        return f"{self.model} {self.workload}{gemm}"

    def label(self) -> str:
        ranks = "" if self.world_size == self.tp else f" (world {self.world_size})"
        return f"{self.what()} tp{self.tp}{ranks} {self.device_label} {self.dtype}"

    def fields(self) -> dict:
        """The group as record fields (report's machine formats)."""
        gemm = {"n": self.gemm[0], "k": self.gemm[1]} if self.gemm else None
        return {"model": self.model, "workload": self.workload, "gemm": gemm, "shape": self.shape_dict,
                "device": self.device, "world_size": self.world_size, "tp": self.tp, "dtype": self.dtype}


@dataclass(frozen=True, eq=False)
class Measured:
    """One ok row of a compared workload: a strategy with one knob setting at one token count,
    and its timing. A predicted row has no percentiles or cv: `model_error` stands for its noise."""

    group: Group
    strategy: str
    knobs: dict
    tokens: int
    batch: tuple[int, ...]  # sequence lengths: rows are compared only within one batch
    ms: float  # median milliseconds per layer (a micro workload: per GEMM)
    p10_ms: float | None
    p90_ms: float | None
    cv: float | None
    samples: tuple[float, ...]  # per-iteration per-layer ms (max over ranks); may be empty
    checked: bool  # a correct result (checked against the reference, or the reference itself); not a bound
    key: str
    run_id: str | None
    git: str | None
    source: str
    # Interleaved timing: `samples` are per round, `round_ids` name those rounds within the
    # `pairing` (one batch's timing); rows of one pairing compare round by round (paired_ratios).
    pairing: str | None = None
    round_ids: tuple[int, ...] = ()
    speedup: float | None = None  # over the reference timed beside it (whose row may be of an earlier run)
    speedup_ci: tuple[float, float] | None = None
    rank_ms: tuple[float, ...] = ()  # each rank's median ms per layer over the rounds or iterations (older rows: none)
    # A mixed batch's decode tokens (tokens, context) beside its prefill `batch`; None for a
    # prefill-only batch (and rows written before mixed batches existed).
    decode: tuple[int, int] | None = None
    # A layer row's compute rate (overlapbench/model/flops.py): TFLOP/s, and its share of the device's
    # dense bf16 peak; None for rows without them (micro workloads, CPU rows, older rows).
    tflops: float | None = None
    peak_frac: float | None = None
    timing: str | None = None  # interleaved, sequential or predicted (older rows: None)
    model_error: float | None = None  # a predicted row's assumed absolute error of its speedup
    # The stack's depth the row was timed at (its times are per layer: the stack's over `layers`).
    # Depths are part of the composition: the last layer's reduction has nothing to overlap with,
    # so a point at 4 layers and at 8 are different workloads, never pooled or paired.
    layers: int | None = None
    depth_named: bool = False  # its group holds rows of several depths, so tables name each row's (set by `read`)

    @classmethod
    def of(cls, row: dict, source: str) -> Measured:
        group = Group.of(row)
        spread = (lambda name: None) if group.predicted else row.get  # a prediction measured no spread
        return cls(
            group=group, strategy=row["strategy"], knobs=dict(row["knobs"] or {}),
            tokens=int(row["tokens"]), batch=tuple(row.get("batch") or (int(row["tokens"]),)), ms=float(row["ms"]),
            p10_ms=spread("p10_ms"), p90_ms=spread("p90_ms"), cv=spread("cv"), samples=tuple(row.get("samples_ms") or ()),
            checked=is_checked(row), key=origin.row_key(row), run_id=row.get("run_id"), git=row.get("git"), source=source,
            pairing=row.get("pairing"), round_ids=tuple(row.get("round_ids") or ()),
            speedup=row.get("speedup"), speedup_ci=tuple(row["speedup_ci"]) if row.get("speedup_ci") else None,
            rank_ms=tuple(row.get("rank_ms") or ()),
            decode=decode_of(row), tflops=row.get("tflops"), peak_frac=row.get("peak_frac"),
            timing=row.get("timing"), model_error=origin.model_error(row) if group.predicted else None,
            layers=row.get("layers"),
        )

    @property
    def predicted(self) -> bool:
        return self.group.predicted

    @property
    def composition(self) -> tuple[tuple[int, ...], tuple[int, int] | None, int | None]:
        """The batch's make-up: prefill sequence lengths and decode (tokens, context), and the
        stack's depth. Rows are compared only within one composition."""
        return self.batch, self.decode, self.layers

    @property
    def setting(self) -> tuple[str, str]:
        """Strategy and knobs as one comparable value: equal settings merge into one range."""
        return self.strategy, json.dumps(self.knobs, sort_keys=True)

    @property
    def noisy(self) -> bool:
        return self.cv is not None and self.cv > NOISY_CV

    def knob_text(self) -> str:
        return knob_text(self.knobs)

    def describe(self) -> str:
        return f"{self.strategy} {self.knob_text()}".strip()


@dataclass
class Store:
    """Rows of one or more stores, the last row per point key kept."""

    sources: list[Path]
    rows: list[dict]  # every kept row, any status or workload
    measured: list[Measured]  # the ok rows of compared workloads (layer and micro) among them

    def statuses(self) -> Counter:
        return Counter(row.get("status") for row in self.rows)

    def errors(self) -> list[tuple[dict, str]]:
        """(row, error) for each failed or skipped row."""
        return [(r, r.get("error") or "") for r in self.rows if r.get("status") != "ok"]


def is_checked(row: dict) -> bool:
    checked = row.get("checked")
    return row["strategy"] != BOUND if checked is None else bool(checked)


def knob_text(knobs: dict) -> str:
    """Knobs set to something other than the library's choice, as `name=value` (may be empty)."""
    return " ".join(f"{k}={show_value(v)}" for k, v in knobs.items() if v not in (DEFAULT, None))


def workload_of(row: dict) -> str:
    return row.get("workload") or LAYER


def compared(row: dict) -> bool:
    """A row of a workload whose strategies are compared against a reference (REFERENCES);
    not a `comm` microbenchmark's."""
    return workload_of(row) in REFERENCES


def _gemm(row: dict) -> tuple[int, int] | None:
    """A micro row's GEMM (N, K): its `gemm` field, or in rows written before that field
    existed, its point key."""
    if workload_of(row) == LAYER:
        return None
    gemm = row.get("gemm") or json.loads(origin.row_key(row)).get("gemm")
    return (gemm["n"], gemm["k"]) if gemm else None


def _is_measured(row: dict) -> bool:
    return row.get("status") == "ok" and compared(row)


def _required(row: dict) -> tuple[str, ...]:
    """The fields tune and report need of a row (results.read_rows checks them, with the line)."""
    return _REQUIRED if _is_measured(row) else ()


def read(paths: Iterable[str | Path], require_ok: bool = True) -> Store:
    """Read stores in order (a later file's row for a point overrides an earlier one's).

    With `require_ok`, a store with no ok row of a compared workload is a UserError naming it:
    reading it would silently show nothing.
    """
    paths = [Path(p) for p in paths]
    tagged = []
    for path in paths:
        mine = origin.last_per_key((row, str(path)) for row in results.read_rows(path, _required))
        if require_ok and not any(_is_measured(row) for row, _ in mine):
            raise UserError(f"{path}: no ok rows of the {COMPARED_TEXT} workloads; {status_text([row for row, _ in mine])}")
        tagged += mine
    kept = origin.last_per_key(tagged)
    measured = [Measured.of(row, source) for row, source in kept if _is_measured(row)]
    return Store(paths, [row for row, _ in kept], depths_named(measured))


def depths_named(measured: list[Measured]) -> list[Measured]:
    """The rows, those of a group that holds several stack depths marked `depth_named`, so tables
    and tune's reasons name each row's depth; rows of one depth read as they always have."""
    depths: dict[Group, set] = {}
    for m in measured:
        depths.setdefault(m.group, set()).add(m.layers)
    return [replace(m, depth_named=True) if len(depths[m.group]) > 1 else m for m in measured]


def separated(measured: Iterable[Measured], each: str = "a table each") -> str | None:
    """origin.separated over the rows' setups: one line where they came from several, else None."""
    return origin.separated(Counter(m.group.setup for m in measured), each)


def status_text(rows: list[dict]) -> str:
    if not rows:
        return "the file is empty"
    counts = Counter(r.get("status") for r in rows)
    return "it holds " + ", ".join(f"{n} {status}" for status, n in counts.items()) + " rows"


def by_point(measured: Iterable[Measured]) -> dict[Group, dict[int, list[Measured]]]:
    """Rows by group, then by token count (both sorted), the unit every choice is made in."""
    out: dict[Group, dict[int, list[Measured]]] = {}
    for m in measured:
        out.setdefault(m.group, {}).setdefault(m.tokens, []).append(m)
    ordered = sorted(out.items(), key=lambda item: (item[0].label(), item[0].shape))
    return {group: dict(sorted(points.items())) for group, points in ordered}


def best_per_strategy(rows: Iterable[Measured]) -> dict[str, Measured]:
    """Each strategy's fastest knob setting (lowest median) among rows at one point; settings
    that are bounds rather than correct results (a split with comm=none) never count as best,
    while no_comm stands for itself."""
    best: dict[str, Measured] = {}
    for m in rows:
        if not (m.checked or m.strategy == BOUND):
            continue
        if m.strategy not in best or m.ms < best[m.strategy].ms:
            best[m.strategy] = m
    return best


def default_knobs(knobs: dict) -> bool:
    """Every knob at its default (or unset): the setting engines run today."""
    return all(value in (DEFAULT, None) for value in knobs.values())


def reference(rows: Iterable[Measured]) -> Measured | None:
    """What speedups are measured against: the group's reference strategy (REFERENCES: baseline
    for the layer) with default knobs, as engines run it today; where none was measured, its
    fastest row."""
    candidates = [m for m in rows if m.strategy == m.group.reference_strategy]
    defaults = [m for m in candidates if default_knobs(m.knobs)]
    pool = defaults or candidates
    return min(pool, key=lambda m: m.ms) if pool else None


def best_reference(rows: Iterable[Measured]) -> Measured | None:
    """The reference strategy's fastest correct setting at one point (any knobs: the baseline's
    all-reduce choice, its CTA budget, ...): the strongest reference there is. A verdict over the
    default reference alone may rest on a weak one."""
    candidates = [m for m in rows if m.strategy == m.group.reference_strategy and m.checked]
    return min(candidates, key=lambda m: m.ms) if candidates else None


def bound(rows: Iterable[Measured]) -> Measured | None:
    """The fastest `no_comm` row: the time with communication free."""
    bounds = [m for m in rows if m.strategy == BOUND]
    return min(bounds, key=lambda m: m.ms) if bounds else None


MIN_PAIRED = 3  # rounds in common before a paired ratio is trusted over the medians


def paired_ratios(a: Measured, b: Measured) -> list[float] | None:
    """t_a / t_b in each round both took part in, where both were timed interleaved in the same
    pairing (one batch's timing); None otherwise. Rounds share the clock's state, so the drift
    that separates two medians cancels in these ratios."""
    if a.pairing is None or a.pairing != b.pairing or len(a.round_ids) != len(a.samples) or len(b.round_ids) != len(b.samples):
        return None
    theirs = dict(zip(b.round_ids, b.samples))
    ratios = [t / theirs[r] for r, t in zip(a.round_ids, a.samples) if r in theirs and theirs[r] > 0]
    return ratios if len(ratios) >= MIN_PAIRED else None


def stored_speedup(m: Measured, ref: Measured) -> tuple[float, tuple[float, float]] | None:
    """The speedup and interval a row holds over the reference timed beside it, where `ref` is
    that reference's row in the same store but of another timing (a resumed sweep re-times the
    reference without writing it again); None otherwise."""
    if (m.speedup is None or m.speedup_ci is None or m is ref or m.source != ref.source
            or m.composition != ref.composition
            or ref.strategy != ref.group.reference_strategy or not default_knobs(ref.knobs)):
        return None
    return m.speedup, m.speedup_ci


def speedup(m: Measured, ref: Measured | None) -> float | None:
    """t_ref / t: paired (paired_estimate of that ratio over rounds) where both were timed
    interleaved together, else the ratio of medians."""
    if ref is None or not m.ms > 0:
        return None
    ratios = paired_ratios(ref, m)
    if ratios is not None:
        return paired_estimate(ratios)
    stored = stored_speedup(m, ref)
    return stored[0] if stored is not None else ref.ms / m.ms


def speedup_ci(m: Measured, ref: Measured | None) -> tuple[float, float] | None:
    """The 95% interval of the paired speedup (None where it is not paired)."""
    if ref is None:
        return None
    ratios = paired_ratios(ref, m)
    if ratios is not None:
        return paired_ci(ratios)
    stored = stored_speedup(m, ref)
    return None if stored is None else stored[1]


def hidden(m: Measured, ref: Measured | None, free: Measured | None) -> float | None:
    """Share of the exposed communication a strategy hides: (t_ref - t) / (t_ref - t_no_comm),
    in speedups (1 - 1/s) / (1 - 1/s_no_comm), so paired speedups are used where there are;
    1.0 hides all of it, above 1 beats the bound. None without both references (micro workloads
    have no bound), or where the bound is not faster than the reference, or not beyond the noise
    of their paired timing (nothing measurably exposed: on one GPU the share would divide by
    noise and read -1300%)."""
    s, s_free = speedup(m, ref), speedup(free, ref) if free is not None else None
    if s is None or s_free is None or s_free <= 1:
        return None
    ratios = paired_ratios(ref, free)
    if ratios is not None and paired_ci(ratios)[0] <= 1:
        return None
    return (1 - 1 / s) / (1 - 1 / s_free)
