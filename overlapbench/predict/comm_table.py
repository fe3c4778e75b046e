"""The all-reduce times a prediction charges for each transfer: a table per (path, CTA budget,
hidden) of measured (bytes, ms), read from `overlapbench comm` rows or nccl-tests' text output,
looked up at any size.

A user brings their cluster's numbers in either format; where the table lacks a point the lookup
still answers, from the nearest thing measured, and says so in a note (docs/predict.md).
"""

from __future__ import annotations

import bisect
import json
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from overlapbench.comm.sizes import bus_factor, format_bytes
from overlapbench.errors import UserError, shown, unreadable
from overlapbench.overlap.comm_methods import PER_ROW_PATHS
from overlapbench.predict.notes import ASSUMED, EXTRAPOLATED, FLAGGED, INTERPOLATED, RESCALED, SUBSTITUTED, Note, joined
from overlapbench.tuning.results import read_rows

Ctas = str | int | None  # "default" (NCCL's own choice), a number of CTAs, or None (a path without a budget)
Key = tuple[str, Ctas, int | None]  # (path, ctas, hidden); hidden only for per-row paths (comm_methods.PER_ROW_PATHS)


GAP = 1.5  # sizes further apart than this many times the table's usual step leave a gap


@dataclass(frozen=True)
class Lookup:
    ms: float
    notes: tuple[Note, ...] = ()  # what was assumed, where the table lacks the point asked for

    @property
    def note(self) -> str | None:
        return joined(self.notes)


class NotInTable(UserError):
    """A path the table holds no rows of: `predict` skips the points that send it."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


@dataclass
class CommTable:
    """Measured all-reduce times of one world size: entries[(path, ctas, hidden)] = [(bytes, ms)]
    sorted by bytes."""

    entries: dict[Key, list[tuple[int, float]]]
    world_size: int
    device: str | None = None
    source: str = ""  # where the numbers came from (files, or how they were scaled), for predictions to say
    notes: list[Note] = field(default_factory=list)  # what building it assumed or found (a scaling, a cut-off file)

    @classmethod
    def read(cls, paths: Iterable[str | Path], world_size: int | None = None) -> CommTable:
        """One table from `comm` result stores (.jsonl) and nccl-tests outputs (text), mixed freely;
        all of one world size. `world_size`: for nccl-tests text that does not list its ranks."""
        tables = []
        for path in map(Path, paths):
            if path.suffix == ".jsonl":
                table = cls.from_rows(read_rows(path), source=str(path))
            else:
                try:
                    text = path.read_text()
                except (OSError, UnicodeDecodeError) as e:
                    raise UserError(f"{path}: cannot read: {unreadable(e)}") from None
                table = cls.from_nccl_tests(text, world_size=world_size, source=str(path))
            table.notes += table.gaps()
            tables.append(table)
        if not tables:
            raise UserError("--comm: no table given; name `overlapbench comm` rows (.jsonl) or nccl-tests output")
        return cls.merged(tables)

    @classmethod
    def merged(cls, tables: list[CommTable]) -> CommTable:
        """Tables of one world size as one (a size measured in several, at the median); a one-line
        error naming each table's world size where they differ."""
        sizes = {t.world_size for t in tables}
        if len(sizes) > 1:
            held = ", ".join(f"{t.source} ({t.world_size} ranks)" for t in tables)
            raise UserError(f"--comm: the tables are of different world sizes: {held}; give the files of one world size")
        if len(tables) == 1:
            return tables[0]
        points: dict[Key, list[tuple[int, float]]] = defaultdict(list)
        for table in tables:
            for key, measured in table.entries.items():
                points[key] += measured
        devices = {t.device for t in tables} - {None}
        return cls(_medians(points), tables[0].world_size, " and ".join(sorted(devices)) or None,
                   ", ".join(t.source for t in tables), [n for t in tables for n in t.notes])

    @classmethod
    def from_rows(cls, rows: list[dict], source: str = "comm rows") -> CommTable:
        """The ok all-reduce rows of `overlapbench comm` (those timed beside a GEMM are not a path's
        own time: contention.py reads them), less those timed at a set piece count (left out and
        said: `set_piece_counts`)."""
        points: dict[Key, list[tuple[int, float]]] = defaultdict(list)
        worlds, devices = set(), set()
        rows, notes = set_piece_counts([row for row in rows if _alone_all_reduce(row)], source)
        for row in rows:
            path, ctas, hidden = point_key(row)
            points[(path, ctas, hidden)].append((row["bytes"], row["ms"]))
            worlds.add(row.get("world_size"))
            devices.add(row.get("device"))
        if not points:
            why = "every one timed at a set piece count (--ce-chunks)" if notes else "beside-GEMM rows do not count"
            raise UserError(f"{source}: no ok all_reduce rows of `overlapbench comm` ({why}); "
                            f"run `overlapbench comm --ops all_reduce` for a table")
        world = one_world_size(worlds, f"{source}: rows", "a comm table is of one world size")
        return cls(_medians(points), world, " and ".join(sorted(devices - {None})) or None, source, notes)

    @classmethod
    def from_nccl_tests(cls, text: str, path: str = "nccl", world_size: int | None = None,
                        source: str = "nccl-tests output", ctas: Ctas = "default") -> CommTable:
        """nccl-tests' `all_reduce_perf` output: one line per size (size, count, type, redop, root,
        then out-of-place time in us, algbw, busbw, #wrong, then the same in place), comments and
        the device list (`#  Rank  0 Group ...`) on lines starting with '#'. The out-of-place time
        is taken. Other lines (NCCL INFO logs, MPI banners) are passed over."""
        test = re.search(r"^# Collective test starting: (\S+)", text, re.MULTILINE)
        if test and not test[1].startswith("all_reduce"):
            raise UserError(f"{source}: output of {test[1]}, not all_reduce_perf; a comm table holds all-reduce times")
        ranks = re.findall(r"^#\s+Rank\s+(\d+)\b.*\]\s*(.*?)\s*$", text, re.MULTILINE)
        points = []
        for line in text.splitlines():
            cells = line.split()
            if len(cells) >= 9 and not line.lstrip().startswith("#") and cells[0].isdigit() and cells[1].isdigit():
                try:
                    us = float(cells[5])
                except ValueError:
                    continue
                if us > 0 and math.isfinite(us):
                    points.append((int(cells[0]), us / 1e3))
        if not points:
            raise UserError(f"{source}: no result lines of nccl-tests (size count type redop root time algbw busbw "
                            f"#wrong ...); give the text all_reduce_perf prints, or `overlapbench comm` rows as .jsonl")
        world = len({rank for rank, _ in ranks}) or world_size
        if world is None:
            raise UserError(f"{source}: the output lists no ranks ('#  Rank  0 Group ...' lines); give the world size")
        notes = [] if ranks else [Note(ASSUMED, f"{source}: lists no ranks ('#  Rank  0 Group ...' lines): taken as "
                                                f"{world} ranks")]
        device = " and ".join(sorted({name for _, name in ranks if name})) or None
        return cls(_medians({(path, ctas, None): points}), world, device, source, notes + _cut_off(text, points, source))

    def time_ms(self, path: str, ctas: Ctas, nbytes: int, hidden: int | None = None) -> Lookup:
        """One all-reduce of `nbytes` on `path`: log(time) linear in log(bytes) between measured
        sizes; above the largest, that size's bus bandwidth; below the smallest, its time (the
        latency floor). A budget or hidden not measured: the nearest one, said in the note."""
        if nbytes < 1:
            raise ValueError(f"an all-reduce of {nbytes} bytes")
        budgets = [c for p, c, _ in self.entries if p == path]
        if not budgets:
            raise NotInTable(f"comm table ({self.source}): no '{path}' rows; it holds {', '.join(self.paths())}; "
                             f"measure it with `overlapbench comm --paths {path}`", path)
        used, budget = nearest_budget(ctas, budgets, path)
        sizes = [h for p, c, h in self.entries if p == path and c == used]
        width, wide = _nearest_hidden(hidden, sizes, path)
        ms, where = _interpolated(self.entries[(path, used, width)], nbytes, path)
        notes = [Note(SUBSTITUTED, n) for n in (budget, wide) if n] + ([where] if where else [])
        return Lookup(ms, tuple(notes))

    def paths(self) -> list[str]:
        """The paths the table holds, sorted."""
        return sorted({p for p, _, _ in self.entries})

    def gaps(self) -> list[Note]:
        """Where a path's measured sizes are further apart than its usual step (a lookup between
        them is interpolated across the gap), one note per gap."""
        out = []
        for (path, ctas, _), points in self.entries.items():
            sizes = [b for b, _ in points]
            step = _step(sizes)
            for lo, hi in zip(sizes, sizes[1:]):
                if hi / lo > GAP * step:
                    budget = "" if ctas is None else f" at {ctas} CTAs"
                    out.append(Note(FLAGGED, f"{self.source}: {path}{budget} has no sizes between {format_bytes(lo)} "
                                             f"and {format_bytes(hi)} (its step elsewhere: x{step:g}); interpolated across"))
        return out

    def scaled(self, world_size: int, busbw_at: float, reference_bytes: int = 1 << 30,
               source: str = "scaled", reference: tuple[str, Ctas] = ("nccl", "default")) -> CommTable:
        """This table's shape at another world size: every time multiplied by one factor, chosen so
        that the `reference` path's bus bandwidth at `reference_bytes` becomes `busbw_at` GB/s at
        `world_size` ranks (busbw = bytes/time x 2(k-1)/k). Assumed: every path keeps its size
        dependence and its time relative to the reference (the latency floor scales too), which
        a one-shot path, moving k-1 copies, does not truly do. `source` says where `busbw_at`
        came from; it is kept on the table with this one's."""
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 2:
            raise UserError(f"comm table: world size {shown(world_size)} to scale to is not a whole number >= 2")
        if not isinstance(busbw_at, (int, float)) or not 0 < busbw_at < math.inf:
            raise UserError(f"comm table: bus bandwidth {shown(busbw_at)} GB/s to scale to is not a positive number")
        path, ctas = reference
        now = self.time_ms(path, ctas, reference_bytes)
        wanted_ms = reference_bytes * bus_factor("all_reduce", world_size) / (busbw_at * 1e9) * 1e3
        factor = wanted_ms / now.ms
        said = (f"{source}: {self.source} ({self.world_size} ranks) scaled to {world_size} ranks at "
                f"{busbw_at:g} GB/s bus bandwidth for {path} at {format_bytes(reference_bytes)}")
        return self.times(factor, world_size, said, list(now.notes))

    def times(self, factor: float, world_size: int, said: str, notes: list[Note] | None = None) -> CommTable:
        """Every time multiplied by `factor`, as a table of `world_size` ranks; `said`: how, its
        source and a RESCALED note."""
        entries = {key: [(b, ms * factor) for b, ms in points] for key, points in self.entries.items()}
        return CommTable(entries, world_size, self.device, said, self.notes + (notes or []) + [Note(RESCALED, said)])


def one_world_size(worlds: set, what: str, fix: str) -> int:
    """The one world size a table's rows were measured at; a one-line error where they mix (or
    a row lacks it)."""
    if len(worlds) != 1 or None in worlds:
        raise UserError(f"{what} of world sizes {sorted(map(str, worlds))}; {fix}")
    return next(iter(worlds))


def point_key(row: dict) -> Key:
    """(path, ctas, hidden) of a `comm` row, from its point key (hidden kept for per-row paths only)."""
    key = json.loads(row["key"]) if isinstance(row.get("key"), str) else {}
    ctas = key.get("ctas", (row.get("knobs") or {}).get("ctas"))
    hidden = key.get("hidden") if row["strategy"] in PER_ROW_PATHS else None
    return row["strategy"], ctas, hidden


def piece_count(row: dict) -> int | None:
    """The piece count a copy-engine row was timed at (`comm --ce-chunks`), or None: the
    kernel's own count by size, which is what a split's copy-engine reductions run (`ce_chunks`
    at its default, the only setting predict prices)."""
    return (row.get("knobs") or {}).get("chunks")


def set_piece_counts(rows: list[dict], source: str) -> tuple[list[dict], list[Note]]:
    """`rows` less those timed at a set piece count, and a note saying what was left out: kept,
    they would share a key with the rows of the kernel's own count and move its medians."""
    kept = [row for row in rows if piece_count(row) is None]
    left = [row for row in rows if piece_count(row) is not None]
    if not left:
        return kept, []
    paths = ", ".join(sorted({row["strategy"] for row in left}))
    counts = ", ".join(str(c) for c in sorted({piece_count(row) for row in left}))
    return kept, [Note(FLAGGED, f"{source}: {len(left)} {paths} rows timed at a set piece count (--ce-chunks {counts}) "
                                f"left out: a split's copy-engine reductions run the kernel's own count, the rows "
                                f"timed without --ce-chunks")]


def is_beside(row: dict) -> bool:
    """A row timed beside a GEMM stream (`comm --beside-gemm`)."""
    return row.get("beside_ms") is not None or '"beside_gemm": true' in str(row.get("key"))


def _alone_all_reduce(row: dict) -> bool:
    return (row.get("workload") == "comm" and row.get("op") == "all_reduce" and row.get("status") == "ok"
            and row.get("ms") is not None and row.get("bytes") and not is_beside(row))


def nearest_budget(wanted: Ctas, measured: Iterable[Ctas], path: str) -> tuple[Ctas, str | None]:
    """The measured budget to use for `wanted`, and a note when it is not `wanted` itself. Paths
    without a budget (None) ignore it; "default" missing: the largest number measured; a number
    missing: the nearest number (the smaller on a tie), else "default"."""
    measured = set(measured)
    if wanted in measured or measured == {None}:
        return (wanted if wanted in measured else None), None
    numbers = sorted(c for c in measured if isinstance(c, int))
    if wanted == "default" or not isinstance(wanted, int):
        used = numbers[-1] if numbers else "default"
    else:
        used = min(numbers, key=lambda c: (abs(c - wanted), c)) if numbers else "default"
    said = f"{wanted} CTAs" if isinstance(wanted, int) else f"{shown(wanted)} CTAs"
    return used, f"{path} {said} not measured: {used} used"


def _nearest_hidden(wanted: int | None, measured: list[int | None], path: str) -> tuple[int | None, str | None]:
    if wanted in measured or measured == [None]:
        return (wanted if wanted in measured else None), None
    numbers = sorted(h for h in measured if h is not None)
    if wanted is None:
        return numbers[-1], f"{path}: no hidden given, hidden {numbers[-1]} used"
    used = min(numbers, key=lambda h: (abs(h - wanted), h))
    return used, f"{path} hidden {wanted} not measured: {used} used"


def _interpolated(points: list[tuple[int, float]], nbytes: int, path: str) -> tuple[float, Note | None]:
    sizes = [b for b, _ in points]
    if nbytes <= sizes[0]:
        note = None if nbytes == sizes[0] else Note(EXTRAPOLATED, f"{path} below {format_bytes(sizes[0])}: its time "
                                                                  f"used (latency floor)")
        return points[0][1], note
    if nbytes > sizes[-1]:
        big, ms = points[-1]
        return ms * nbytes / big, Note(EXTRAPOLATED, f"{path} above {format_bytes(big)}: extrapolated at its bus bandwidth")
    i = bisect.bisect_left(sizes, nbytes)  # sizes[i - 1] < nbytes <= sizes[i]
    (b0, t0), (b1, t1) = points[i - 1], points[i]
    if nbytes == b1:
        return t1, None  # a measured size: its time, exactly
    w = math.log(nbytes / b0) / math.log(b1 / b0)
    gap = None
    if b1 / b0 > GAP * _step(sizes):
        gap = Note(INTERPOLATED, f"{path} between {format_bytes(b0)} and {format_bytes(b1)}: interpolated across a gap")
    return math.exp((1 - w) * math.log(t0) + w * math.log(t1)), gap


def _step(sizes: list[int]) -> float:
    """The usual ratio between a table's consecutive sizes (the median; inf for one size)."""
    ratios = [hi / lo for lo, hi in zip(sizes, sizes[1:])]
    return statistics.median(ratios) if ratios else math.inf


def _cut_off(text: str, points: list[tuple[int, float]], source: str) -> list[Note]:
    """Signs that nccl-tests' output was cut short: no closing '# Avg bus bandwidth' line, or
    sizes that stop a step or more below the `maxBytes` its header asked for."""
    notes = []
    if not re.search(r"^#\s*Avg bus bandwidth", text, re.MULTILINE):
        notes.append(Note(FLAGGED, f"{source}: no closing '# Avg bus bandwidth' line: the output may be cut off"))
    header = re.search(r"maxBytes\s+(\d+)\s+step:\s*(\d+)\(factor\)", text)
    largest = max(b for b, _ in points)
    if header and largest * int(header[2]) <= int(header[1]):
        notes.append(Note(FLAGGED, f"{source}: its sizes stop at {format_bytes(largest)}, where its header asked for "
                                   f"up to {format_bytes(int(header[1]))}: the output may be cut off"))
    return notes


def _medians(points: dict[Key, list[tuple[int, float]]]) -> dict[Key, list[tuple[int, float]]]:
    """Each key's points sorted by size, one per size (the median where files repeat a size)."""
    out = {}
    for key, measured in points.items():
        by_size = defaultdict(list)
        for nbytes, ms in measured:
            by_size[nbytes].append(ms)
        out[key] = [(b, statistics.median(ms)) for b, ms in sorted(by_size.items())]
    return out
