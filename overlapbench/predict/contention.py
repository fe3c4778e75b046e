"""What a transfer and the compute beside it cost each other, and what a blocking all-reduce costs
inside the layer, from `overlapbench comm` rows timed beside compute.

Two kinds of rows give the pair (the compute's loss while the transfer runs; the transfer's
stretch, its time beside the compute over its time alone):

- `comm --beside-layer MODEL` rows: beside one rank's own layer kernels (attention, then MLP, on
  the rows the all-reduce carries): the compute's loss (`compute_loss_paired`, the pass alone and
  beside in the same rounds; rows made before it: `compute_loss`, against the pass timed alone by
  another harness: comm/paired_loss.py), `beside_ms / ms`; and the all-reduce's extra
  cost in line with the layer (`in_layer_extra_ms`, the in-layer term of a serial plan, timed in
  interleaved rounds beside the pass: comm/in_layer.py). Rows made before that measurement hold
  `inline_extra_ms` instead, the in-line pass less the pass timed by another harness, which read
  the pass's two timings rather than the all-reduce (from 4K tokens at llama3-70b TP=2): their loss
  and stretch are used, their in-layer term is not (a flagged note names the rows, said where the
  term is asked for: `predict --in-layer measured`); and what one call of the path takes from the
  layer's pass beside it (`compute_one_call_extra_ms`, ms: the pass beside one call issued just
  before it less the pass alone, in the same rounds: comm/paired_loss.py; rows made before that
  window lack it); and what one call and one block of the layer (attention or MLP, the call's
  rows) released at once, as a split releases a reduction and the next chunk's block, take beyond
  the same pair with the residual add + RMSNorm in the call's place (`pair_attention_extra_ms`,
  `pair_mlp_extra_ms`: comm/pair.py; rows made before that window lack them);
- `comm --beside-gemm` rows: beside a stream of persistent GEMMs: `gemm_loss_paired` (else
  `gemm_loss`), `beside_ms / ms`.

Where a path has rows of both, the layer's are used: they are the kernels a split runs its
transfers beside. How a prediction charges these numbers, and whether it charges the in-layer term
at all, is the simulator's choice (predict/estimate.py); this module only looks them up, and says
in notes what it used and what it assumed where the rows lack a point.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from overlapbench.comm.in_layer import BEFORE as IN_LAYER_BEFORE
from overlapbench.comm.in_layer import TERM as IN_LAYER_TERM
from overlapbench.comm.pair import BLOCKS as PAIR_BLOCKS
from overlapbench.comm.pair import extra_field as pair_extra_field
from overlapbench.comm.paired_loss import GEMM as GEMM_STREAM
from overlapbench.comm.paired_loss import LAYER as LAYER_STREAM
from overlapbench.comm.paired_loss import loss_of, one_call_fields
from overlapbench.errors import UserError
from overlapbench.predict.comm_table import (
    Ctas,
    is_beside,
    nearest_budget,
    one_world_size,
    point_key,
    set_piece_counts,
)
from overlapbench.predict.notes import ASSUMED, FLAGGED, MEASURED, SUBSTITUTED, Note, joined
from overlapbench.tuning.results import read_rows

BudgetKey = tuple[str, Ctas]  # (path, ctas)
LAYER, GEMM, NONE = "layer", "gemm", "assumed"  # what a lookup's numbers were measured beside
Points = list[tuple[int, float, float]]  # (bytes, loss, stretch), sorted by bytes
BySize = list[tuple[int, float]]  # (bytes, ms), sorted by bytes: the median of the rows at each size
ONE_CALL_EXTRA, ONE_CALL_OP = (one_call_fields(LAYER_STREAM)[i] for i in (0, 3))  # compute_one_call_{extra,op}_ms
PAIR_EXTRA = {block: pair_extra_field(block) for block in PAIR_BLOCKS}  # pair_{attention,mlp}_extra_ms


@dataclass(frozen=True)
class ContentionLookup:
    gemm_loss: float  # the compute's loss while the transfer runs: 1 - its speed beside / alone
    transfer_stretch: float  # the transfer's time beside the compute / alone
    beside: str = GEMM  # LAYER, GEMM or NONE (an assumption)
    notes: tuple[Note, ...] = ()  # what was used or assumed, where the rows lack the point asked for

    @property
    def note(self) -> str | None:
        return joined(self.notes)


@dataclass
class Contention:
    """Measured pairs per (path, ctas): beside the GEMMs (`entries`) and beside the layer
    (`layer`); the layer's in-line extra per all-reduce (`inline`) and its pass's extra beside one
    call (`one_call_extras`) and that call's stretch there (`one_call_stretches`: its time beside
    the pass over its time alone); per block, what one call released with that block takes beyond
    the same pair with the add + norm in the call's place (`pair_extras`). Rows of several `hidden`
    (per-row paths) at one size are pooled."""

    entries: dict[BudgetKey, Points]
    world_size: int
    source: str = ""
    layer: dict[BudgetKey, Points] = field(default_factory=dict)
    inline: dict[BudgetKey, BySize] = field(default_factory=dict)
    layer_of: tuple[str, int] | None = None  # (model, tp) of the layer the `layer` rows ran beside
    notes: list[Note] = field(default_factory=list)  # what choosing the rows assumed
    stale: int = 0  # the layer's rows whose in-layer term was measured before the paired rounds: not used
    in_layer_notes: list[Note] = field(default_factory=list)  # what reading the in-layer term flagged (those rows)
    one_call_extras: dict[BudgetKey, BySize] = field(default_factory=dict)
    one_call_stretches: dict[BudgetKey, BySize] = field(default_factory=dict)
    pair_extras: dict[str, dict[BudgetKey, BySize]] = field(default_factory=dict)  # block -> its pairs' extras

    @classmethod
    def read(cls, paths: Iterable[str | Path], model: str | None = None, tp: int | None = None) -> Contention:
        """The beside-GEMM and beside-layer rows of `comm` result stores."""
        names = [str(p) for p in paths]
        return cls.from_rows([row for name in names for row in read_rows(name)], ", ".join(names), model, tp)

    @classmethod
    def from_rows(cls, rows: list[dict], source: str = "comm rows", model: str | None = None,
                  tp: int | None = None) -> Contention:
        """`model` and `tp`: the layer predicted, whose own beside-layer rows are chosen where the
        rows hold several layers' (another's are used where they do not, with a note). Rows timed
        at a set piece count are left out, as the comm table leaves them (`set_piece_counts`)."""
        gemm: dict[BudgetKey, dict[int, list]] = defaultdict(lambda: defaultdict(list))
        layers: dict[tuple[str, int], list[dict]] = defaultdict(list)
        worlds, layer_worlds = set(), set()
        rows, left_out = set_piece_counts([row for row in rows if _beside_layer(row) or _beside_gemm(row)], source)
        for row in rows:
            if _beside_layer(row):
                layers[(row["beside_layer"]["model"], row["beside_layer"]["tp"])].append(row)
            elif _beside_gemm(row):
                path, ctas, _ = point_key(row)
                gemm[(path, ctas)][row["bytes"]].append((loss_of(row, GEMM_STREAM), row["beside_ms"] / row["ms"]))
                worlds.add(row.get("world_size"))
        if not gemm and not layers:
            raise UserError(f"{source}: no ok all_reduce rows timed beside compute; run `overlapbench comm "
                            f"--beside-layer MODEL` (or --beside-gemm) for them")
        layer_of, notes = _chosen_layer(sorted(layers), model, tp)
        chosen, settled_over = _settled_first(layers.get(layer_of, []))
        notes = left_out + notes + settled_over
        pairs, inline, one_call, one_call_stretch = (defaultdict(lambda: defaultdict(list)) for _ in range(4))
        paired_blocks = {block: defaultdict(lambda: defaultdict(list)) for block in PAIR_BLOCKS}
        stale = []
        for row in chosen:
            path, ctas, _ = point_key(row)
            pairs[(path, ctas)][row["bytes"]].append((loss_of(row, LAYER_STREAM), row["beside_ms"] / row["ms"]))
            if row.get(IN_LAYER_TERM) is not None:
                inline[(path, ctas)][row["bytes"]].append(row[IN_LAYER_TERM])
            elif row.get(IN_LAYER_BEFORE) is not None:
                stale.append(row)
            if row.get(ONE_CALL_EXTRA) is not None:
                one_call[(path, ctas)][row["bytes"]].append(row[ONE_CALL_EXTRA])
            if row.get(ONE_CALL_OP) is not None:
                one_call_stretch[(path, ctas)][row["bytes"]].append(row[ONE_CALL_OP] / row["ms"])
            for block, extras in paired_blocks.items():
                if row.get(pair_extra_field(block)) is not None:
                    extras[(path, ctas)][row["bytes"]].append(row[pair_extra_field(block)])
            layer_worlds.add(row.get("world_size"))
        if gemm:
            world = one_world_size(worlds, f"{source}: beside-GEMM rows", "give one world size")
        if layer_of:
            world = one_world_size(layer_worlds, f"{source}: beside-layer rows", "give one world size")
        if tp is not None and world != tp:
            notes.append(Note(SUBSTITUTED, f"contention measured on {world} ranks, predicting {tp}: used as it is"))
        return cls(_medians(gemm), world, source, _medians(pairs), _size_medians(inline), layer_of, notes, len(stale),
                   [stale_note(stale, layer_of)] if stale else [], one_call_extras=_size_medians(one_call),
                   one_call_stretches=_size_medians(one_call_stretch),
                   pair_extras={block: _size_medians(extras) for block, extras in paired_blocks.items() if extras})

    def described(self) -> str:
        """Which paths' contention was measured beside what, in one line."""
        parts = []
        if self.layer:
            parts.append(f"beside {self.layer_of[0]} TP={self.layer_of[1]}'s layer for {_said(self.layer)}")
        gemm_only = [k for k in self.entries if k[0] not in {p for p, _ in self.layer}]
        if gemm_only:
            parts.append(f"beside the GEMM stream for {_said(gemm_only)}")
        return "; ".join(parts)

    def pairs_described(self) -> str | None:
        """Which paths' pairs the rows hold, in one phrase (where they are charged), or None."""
        held = {key for extras in self.pair_extras.values() for key in extras}
        return f"{self.layer_of[0]} TP={self.layer_of[1]}'s layer for {_said(held)}" if held else None

    def in_layer_described(self) -> str:
        """Which paths' in-layer term the rows hold, in one line (where it is charged)."""
        if self.inline:
            return (f"measured beside {self.layer_of[0]} TP={self.layer_of[1]}'s layer for {_said(self.inline)}, "
                    f"charged to their blocking all-reduces")
        if self.stale:
            return (f"none (the {self.stale} beside-layer rows' was measured before the paired rounds, not used): "
                    f"blocking all-reduces cost their time in the table")
        return "none (no --beside-layer rows): blocking all-reduces cost their time in the table"

    def mean_loss(self) -> float:
        """The mean loss over every measured point (the layer's where there are any): the default
        assumption for a path not measured."""
        table = self.layer or self.entries
        return statistics.fmean(loss for points in table.values() for _, loss, _ in points)

    def at(self, path: str, ctas: Ctas, nbytes: int, assumed_loss: float | None = None,
           assumed_stretch: float = 1.0) -> ContentionLookup:
        """Both numbers for one transfer: the layer's rows where the path has them, else the GEMMs';
        interpolated in log(bytes) between measured sizes, the nearest measured size's outside
        them. A budget not measured: the path's nearest; a path not measured: the assumption given
        (by default the mean loss of the rows, no stretch)."""
        if nbytes < 1:
            raise ValueError(f"a transfer of {nbytes} bytes")
        for table, beside in ((self.layer, LAYER), (self.entries, GEMM)):
            budgets = [c for p, c in table if p == path]
            if budgets:
                used, said = nearest_budget(ctas, budgets, path)
                loss, stretch = _interpolated(table[(path, used)], nbytes)
                notes = [Note(SUBSTITUTED, said)] if said else []
                if beside == LAYER:
                    budget = "" if used is None else f" {used} CTAs"
                    notes.append(Note(MEASURED, f"{path}{budget}: measured beside {self.layer_of[0]} TP={self.layer_of[1]}'s "
                                                f"layer: compute loss {loss:.1%}, transfer stretch {stretch:.2f}"))
                if beside == GEMM and self.layer:
                    notes.append(Note(SUBSTITUTED, f"{path}: no rows beside the layer, the beside-GEMM rows used"))
                return ContentionLookup(loss, stretch, beside, tuple(notes))
        loss = self.mean_loss() if assumed_loss is None else assumed_loss
        why = "the mean of all measured rows" if assumed_loss is None else "as given"
        what = "the layer" if self.layer else "GEMMs"
        said = (f"{path} not measured beside {what}: {'compute' if self.layer else 'GEMM'} loss {loss:.1%} ({why}), "
                f"transfer stretch {assumed_stretch:g} assumed")
        return ContentionLookup(loss, assumed_stretch, NONE, (Note(ASSUMED, said),))

    def in_layer(self, path: str, ctas: Ctas, nbytes: int) -> tuple[float, tuple[Note, ...]] | None:
        """What one blocking all-reduce of `nbytes` on `path` costs in line with the layer beyond
        its time alone (ms), linear in log(bytes), held at the nearest measured size outside them;
        None where the path has no such rows."""
        return _by_size(self.inline, path, ctas, nbytes, lambda extra: f"{extra * 1e3:+.1f} us per blocking all-reduce "
                        f"in line with {self.layer_of[0]} TP={self.layer_of[1]}'s layer")

    def one_call(self, path: str, ctas: Ctas, nbytes: int) -> tuple[float, tuple[Note, ...]] | None:
        """What one call of `nbytes` on `path`, issued just before the layer's pass, takes from that
        pass (ms: the pass beside it less the pass alone), as `in_layer` looks its term up; None
        where the path has no rows holding it."""
        return _by_size(self.one_call_extras, path, ctas, nbytes, lambda extra: f"{extra * 1e3:+.1f} us taken from "
                        f"{self.layer_of[0]} TP={self.layer_of[1]}'s layer pass beside one call")

    def one_call_stretch(self, path: str, ctas: Ctas, nbytes: int) -> tuple[float, tuple[Note, ...]] | None:
        """How much slower one call of `nbytes` on `path` runs beside the layer's pass it was issued
        just before than alone (its time there over the row's time alone), looked up as `one_call`;
        None where the path has no rows holding it."""
        return _by_size(self.one_call_stretches, path, ctas, nbytes, lambda stretch: f"one call stretched {stretch:.2f}x "
                        f"beside {self.layer_of[0]} TP={self.layer_of[1]}'s layer pass")

    def pair(self, path: str, ctas: Ctas, nbytes: int, block: str) -> tuple[float, tuple[Note, ...]] | None:
        """What one call of `nbytes` on `path` and one `block` of the layer (the call's rows),
        released at once, take beyond the same pair with the add + norm in the call's place (ms),
        looked up as `in_layer`; None where the path has no rows holding it."""
        return _by_size(self.pair_extras.get(block, {}), path, ctas, nbytes, lambda extra: f"{extra * 1e3:+.1f} us "
                        f"beyond {self.layer_of[0]} TP={self.layer_of[1]}'s {block} block released with one call")


def _said(keys) -> str:
    """(path, ctas) keys in one phrase: "nccl default, nccl_symm 16"."""
    return ", ".join(f"{p}" + ("" if c is None else f" {c}") for p, c in sorted(keys, key=str))


def stale_note(rows: list[dict], layer: tuple[str, int]) -> Note:
    """Which beside-layer rows' in-layer term is not used, and why (flagged: an input to make again)."""
    runs = ", ".join(sorted({str(r.get("run_id")) for r in rows}))
    gits = ", ".join(sorted({str(r.get("git")) for r in rows}))
    return Note(FLAGGED, f"the in-layer term of {len(rows)} beside-layer rows of {layer[0]} TP={layer[1]} (runs {runs}, "
                         f"git {gits}) not used: their `{IN_LAYER_BEFORE}` is the in-line pass less the pass timed by "
                         f"another harness, which measured the pass's two timings, not the all-reduce, from 4K tokens "
                         f"at llama3-70b TP=2 (docs/predict.md); `overlapbench comm --beside-layer {layer[0]}` "
                         f"measures it again in paired rounds (`{IN_LAYER_TERM}`)")


def _chosen_layer(held: list[tuple[str, int]], model: str | None, tp: int | None) -> tuple[tuple[str, int] | None, list[Note]]:
    """The layer whose beside-layer rows to use: the one predicted, else the same model at the
    nearest TP, else the first held (said in a note)."""
    if not held:
        return None, []
    if (model, tp) in held:
        return (model, tp), []
    same = [h for h in held if h[0] == model]
    used = min(same, key=lambda h: (abs(h[1] - (tp or 0)), h[1])) if same else held[0]
    if model is None:
        return used, []
    said = f"contention measured beside {used[0]} TP={used[1]}'s layer, not {model} TP={tp}'s: used as it is"
    return used, [Note(SUBSTITUTED, said)]


def settled(row: dict) -> bool:
    """Whether a beside-layer row's windows (the in-layer term's, the pair window's) ran each graph
    untimed before its span (`comm --settle-ms`), each at its own clock; rows without the field
    settled none."""
    return (row["beside_layer"].get("settle_ms") or 0) > 0


def _settled_first(rows: list[dict]) -> tuple[list[dict], list[Note]]:
    """The rows to use: where one point (path, CTAs, bytes) was timed both at a shared clock and
    with each graph settled, the settled rows alone (at a power cap the shared clock reads the
    in-line pass's extra high: docs/predict.md), said in a note; else every row."""
    by_point: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        by_point[(*point_key(row)[:2], row["bytes"])].append(row)
    kept, replaced = [], 0
    for same in by_point.values():
        own = [r for r in same if settled(r)]
        kept += own or same
        replaced += bool(own) and len(own) < len(same)
    if not replaced:
        return kept, []
    said = (f"{replaced} beside-layer point(s) timed both at a shared clock and with each graph at its own "
            f"(comm --settle-ms): the settled rows used")
    return kept, [Note(SUBSTITUTED, said)]


def _beside_gemm(row: dict) -> bool:
    return (_ok_all_reduce(row) and is_beside(row) and row.get("gemm_loss") is not None)


def _beside_layer(row: dict) -> bool:
    layer = row.get("beside_layer")
    return (_ok_all_reduce(row) and isinstance(layer, dict) and row.get("compute_loss") is not None
            and row.get("beside_ms") and "model" in layer and "tp" in layer)


def _ok_all_reduce(row: dict) -> bool:
    return (row.get("workload") == "comm" and row.get("op") == "all_reduce" and row.get("status") == "ok"
            and bool(row.get("ms")) and bool(row.get("bytes")))


def _medians(measured: dict[BudgetKey, dict[int, list]]) -> dict[BudgetKey, Points]:
    return {key: [(b, statistics.median(v[0] for v in pairs), statistics.median(v[1] for v in pairs))
                  for b, pairs in sorted(by_size.items())] for key, by_size in measured.items()}


def _size_medians(measured: dict[BudgetKey, dict[int, list[float]]]) -> dict[BudgetKey, BySize]:
    return {key: [(b, statistics.median(v)) for b, v in sorted(by_size.items())] for key, by_size in measured.items()}


def _by_size(series: dict[BudgetKey, BySize], path: str, ctas: Ctas, nbytes: int,
             said: Callable[[float], str]) -> tuple[float, tuple[Note, ...]] | None:
    """The value of `series` for `nbytes` on `path`, linear in log(bytes), held at the nearest
    measured size outside them, at the path's nearest budget where `ctas` has none (a note says
    so), with a note of what was used ("{path}[ {ctas} CTAs]: " + `said`(value)); None where the
    path has none."""
    budgets = [c for p, c in series if p == path]
    if not budgets:
        return None
    used, other = nearest_budget(ctas, budgets, path)
    value, _ = _interpolated([(b, ms, 0.0) for b, ms in series[(path, used)]], nbytes)
    budget = "" if used is None else f" {used} CTAs"
    measured = Note(MEASURED, f"{path}{budget}: {said(value)}")
    return value, ((Note(SUBSTITUTED, other),) if other else ()) + (measured,)


def _interpolated(points: Points, nbytes: int) -> tuple[float, float]:
    """Linear in log(bytes), clamped to the measured range."""
    if nbytes <= points[0][0]:
        return points[0][1], points[0][2]
    if nbytes >= points[-1][0]:
        return points[-1][1], points[-1][2]
    i = bisect.bisect_left([b for b, _, _ in points], nbytes)  # points[i - 1] < nbytes <= points[i]
    (b0, l0, s0), (b1, l1, s1) = points[i - 1], points[i]
    w = math.log(nbytes / b0) / math.log(b1 / b0)
    return (1 - w) * l0 + w * l1, (1 - w) * s0 + w * s1
