"""`report --profile`'s part across ranks: where a point's other ranks wrote their timelines
beside rank 0's (timing/timeline.py `file_name`), each rank's totals and, for rank 0's longest
barrier waits, the rank that arrived last and what it ran just before (report/ranks.py).

The ranks' timelines of the kind the point's section reads (its graph replay's, or its eager
forward's) are read; where rank 0's file names no `world` (a folder from before every rank wrote
its own) or a world of one, nothing is added, so such a folder prints as it did. Where some rank's
file is missing, says another rank or world, holds no device kernels or no `origin_ns`, one line
says so and nothing is compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from overlapbench.report import exposed, ranks
from overlapbench.report.cells import Grid, number_cell, text_cell
from overlapbench.timing import timeline as timeline_files

HEADER = ["barrier", "start ms", "wait ms", "exposed ms", "last to arrive", "late ms", "its kernel before (stream)",
          "op", "GFLOP", "idle ms", "each rank's arrival ms"]
NOTE = ("across ranks: every rank's timeline on one clock (the profiler's timestamps, timeline.py) · barrier wait: "
        "time a symmetric-memory barrier runs, exposed: with no compute on that rank · barriers matched by their "
        "order on each rank · last to arrive: the rank whose matching barrier started latest, late: after rank 0's · "
        "its kernel before: the compute kernel that rank ran just before its barrier, idle: from its end to the barrier")


@dataclass(frozen=True)
class RanksPart:
    """What a point's section adds: lines under its line, the waits' table, the json record."""

    lines: tuple[str, ...]
    grid: Grid | None
    record: dict


def _ms(us: float, sign: bool = False) -> str:
    return f"{us / 1e3:+.3f}" if sign else f"{us / 1e3:.3f}"


def _read_others(folder: Path, point: str, replay: bool, zero: exposed.Timeline) -> tuple[list[exposed.Timeline], str | None]:
    """Every rank's timeline of this kind (rank 0's given), or why they cannot be compared."""
    found = [zero]
    for rank in range(1, zero.world):
        path = folder / timeline_files.file_name(point, replay, rank)
        if not path.is_file():
            return found, f"{path.name} is missing"
        t = exposed.read(path)
        if (t.rank, t.world) != (rank, zero.world):
            return found, f"{path.name} says rank {t.rank} of {t.world}, not {rank} of {zero.world}"
        found.append(t)
    for t in found:
        if not t.kernels or t.origin_ns is None:
            return found, f"rank {t.rank}'s timeline has {'no origin_ns' if t.kernels else 'no device kernels'}"
    return found, None


def part(folder: Path, point: str, replay: bool, zero: exposed.Timeline, name: str) -> RanksPart | None:
    """The point's part across ranks (`name`: the point as its section names it); None where
    rank 0's timeline names no world of several ranks."""
    if zero.world is None or zero.world < 2:
        return None
    kind = "graph replays" if replay else "eager forwards"
    timelines, why = _read_others(folder, point, replay, zero)
    if why is not None:
        return RanksPart((f"  across ranks: not compared ({why})",), None, {"world": zero.world, "not_compared": why})
    result = ranks.across(timelines)
    lines = [f"  across ranks ({zero.world} ranks' {kind} on one clock, the profiler's):"]
    for t in result.totals:
        starts = "" if t.rank == 0 else f"starts {_ms(t.shift, sign=True)} ms · "
        lines.append(f"    rank {t.rank}: {starts}wall {_ms(t.wall)} ms · exposed {_ms(t.exposed)} · barrier wait "
                     f"{_ms(t.barrier)}, exposed {_ms(t.barrier_exposed)} ({t.barriers} barriers)")
    if result.unmatched is not None:
        lines.append(f"    barriers not matched ({result.unmatched})")
    if result.impossible:
        lines.append(f"    {result.impossible} of {result.matched} matched barriers end on some rank before another "
                     f"rank's began (by up to {_ms(result.disagreement)} ms): the ranks' clocks, or the matching by "
                     "order, are off by at least that")
    record = {"world": zero.world} | result.as_dict()
    return RanksPart(tuple(lines), waits_grid(name, result) if result.waits else None, record)


def waits_grid(name: str, result: ranks.Across) -> Grid:
    rows = []
    for w in result.waits:
        last = w.last
        before = last.before
        flops = "-" if before is None or before.flops is None else f"{before.flops / 1e9:.4g}"
        arrivals = " ".join(f"r{a.rank} {_ms(a.late, sign=True)}" for a in w.arrivals if a.rank != 0)
        rows.append([
            number_cell(f"#{w.index + 1} of {result.matched}"), number_cell(_ms(w.barrier.start)),
            number_cell(_ms(w.barrier.end - w.barrier.start)), number_cell(_ms(w.exposed)),
            text_cell(f"rank {last.rank}"), number_cell(_ms(last.late, sign=True)), text_cell(exposed.label(before)),
            text_cell("-" if before is None or before.op is None else before.op), number_cell(flops),
            number_cell("-" if last.idle is None else _ms(last.idle)), text_cell(arrivals)])
    return Grid(f"{name}: rank 0's longest barrier waits (longest exposed first), the rank that arrived last",
                HEADER, rows)
