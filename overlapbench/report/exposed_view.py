"""`report --profile DIR`'s second part: per profiled point, why its communication stays exposed.

After the kernel tables (profile.py), each profiled point whose timeline lies beside its table
(timing/timeline.py) gets a totals line, where its group holds a `no_comm` point the split of its
extra wall time into compute, exposed transfers and idle time, and a table of its longest
exposed intervals, as report/exposed.py defines them; a point profiled before timelines were
kept, or on CPU (no device kernels), gets a line saying so, as does one whose profile failed in the
sweep after its table was written (its row's `profile_error`).

Which timeline: where the point was timed as a CUDA-graph replay and the sweep kept one replay's
timeline (`<point>.replay.timeline.json`), that one, the step that was timed (`--timeline eager`:
the eager forward's always); else the eager forward's (`<point>.timeline.json`). Where any point
reads a replay, every line names its source ("graph replay", "eager forward") and a replay's
kernels that could not be linked to their ops are listed; where none does, the output is the
eager-only report's, word for word.

Where the point's other ranks wrote their timelines of that kind beside rank 0's (every rank
does, timing/timeline.py), the lines under its line add each rank's totals and a second table
names rank 0's longest barrier waits: the rank that arrived last and what it ran just before
(ranks_view.py); json/csv records add `across_ranks`. Folders without rank files print as before.

Where a point's `comm: none` twin (the same split, no transfer; profile.twin_row) was profiled
too and its timeline is of the same kind, lines under the point's say what its transfers cost its
compute against the twin's (report/twins.py: the compute stretch by kind, what ran beside its
GEMMs, which transfers took SMs before the GEMM beside them); records add `against_twin`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.text import Text

from overlapbench.errors import UserError
from overlapbench.report import exposed, ranks_view, twins
from overlapbench.report.cells import Grid, number_cell, short, text_cell
from overlapbench.report.profile import Account
from overlapbench.report.render import print_grid, to_markdown
from overlapbench.timing import timeline as timeline_files

LONGEST = 8  # exposed intervals shown per point
HEADER = ["start ms", "length ms", "exposed ms", "transfer (stream)", "bytes", "after (stream)", "GFLOP", "then (stream)"]
TITLE = ("Exposed communication: one eager forward per point (rank 0), from its device kernels; "
         "ms from the forward's first kernel")
TITLE_REPLAY = ("Exposed communication: per point (rank 0) one CUDA-graph replay of the timed step (or the replays "
                "back to back its line names), else one eager forward, from its device kernels; ms from its first kernel")
REPLAY, EAGER = "graph replay", "eager forward"  # what a point's timeline recorded
TIMELINES = ("replay", "eager")  # --timeline: a replay's where kept (the default), or the eager forward's always
UNLINKED_SHOWN = 4  # names of a replay's unlinked kernels shown on its line
NOTE = ("exposed interval: no compute kernel runs on any stream and a transfer does · length: the whole stretch, "
        "exposed: the part a transfer runs · after: the compute kernel whose end opened it, the transfer "
        "'behind' it (started after it ended) or 'beside' it (started while it ran); GFLOP: its op's · "
        "then: the compute kernel that closed it · hidden: transfer time with some compute kernel running")


@dataclass(frozen=True)
class Section:
    """One point's part: its line, and its intervals' table where it has any; `tagged`: the line
    names its timeline's source (some point of the report reads a graph replay); `waits`: where
    its other ranks' timelines lie beside it, rank 0's longest barrier waits (ranks_view.py)."""

    line: str
    grid: Grid | None
    tagged: bool = False
    waits: Grid | None = None


@dataclass(frozen=True)
class Read:
    """A point's timeline as its section uses it: the file's name, its source (REPLAY, EAGER; None
    where no timeline lies beside the table), the timeline and its analysis (None without device
    kernels), and why a graph replay's timeline that lies there was not used."""

    file: str | None = None
    source: str | None = None
    timeline: exposed.Timeline | None = None
    result: exposed.Exposure | None = None
    note: str | None = None


def size(n: int | None) -> str:
    if n is None:
        return "-"
    if n >= 2**20:
        return f"{n / 2**20:.2f} MiB"
    return f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n} B"


def totals_line(name: str, e: exposed.Exposure) -> str:
    """`name: wall W ms · compute busy C · comm busy M: hidden H (x% of comm), exposed E (y% of wall)
    · idle I · K kernels on S streams · N exposed intervals` (ms, one forward)."""
    hidden = "" if e.comm <= 0 else f" ({e.hidden / e.comm:.0%} of comm)"
    share = f" ({e.exposed / e.wall:.1%} of wall)" if e.wall > 0 else ""
    count = len(e.intervals)
    return (f"{name}: wall {e.wall / 1e3:.3f} ms · compute busy {e.compute / 1e3:.3f} · comm busy {e.comm / 1e3:.3f}: "
            f"hidden {e.hidden / 1e3:.3f}{hidden}, exposed {e.exposed / 1e3:.3f}{share} · idle {e.idle / 1e3:.3f} · "
            f"{e.kernels} kernels on {e.streams} streams · {count} exposed interval{'s' if count != 1 else ''}")


BOUND = "no_comm"  # the point whose forward runs the same compute with no communication


def against_line(e: exposed.Exposure, bound: exposed.Exposure) -> str:
    """Where a point's wall time over no_comm's went: wall = compute busy + exposed + idle in each
    forward, so the difference splits exactly into compute busy (the compute's own kernels
    slowed by the transfers beside them, or more of them: a split's smaller GEMMs), exposed
    transfers, and idle time."""
    d = lambda a, b: f"{(a - b) / 1e3:+.3f}"
    return (f"  against {BOUND}: wall {d(e.wall, bound.wall)} ms = compute busy {d(e.compute, bound.compute)} "
            f"(contention, and the compute a strategy adds) + exposed {d(e.exposed, bound.exposed)} "
            f"+ idle {d(e.idle, bound.idle)}")


def intervals_grid(name: str, e: exposed.Exposure) -> Grid:
    shown = e.intervals[:LONGEST]
    rows = []
    for i in shown:
        more = f" +{i.transfers - 1} more" if i.transfers > 1 else ""
        flops = "-" if i.after is None or i.after.flops is None else f"{i.after.flops / 1e9:.4g}"
        rows.append([number_cell(f"{i.start / 1e3:.3f}"), number_cell(f"{i.length / 1e3:.3f}"),
                     number_cell(f"{i.exposed / 1e3:.3f}"), text_cell(f"{short(i.transfer.name)} (s{i.transfer.stream}){more}"),
                     number_cell(size(i.transfer.bytes)),
                     text_cell(exposed.label(i.after, i.relation)), number_cell(flops), text_cell(exposed.label(i.then))])
    which = f"the {len(shown)} longest of {len(e.intervals)}" if len(e.intervals) > len(shown) else f"all {len(shown)}"
    return Grid(f"{name}: exposed intervals ({which}, longest exposed first)", HEADER, rows)


def unlinked_line(t: exposed.Timeline) -> str | None:
    """A replay's kernel names not linked to their ops (timeline.link_replay), with both counts."""
    if not t.unmatched:
        return None
    shown = [f"{short(u['name']).rstrip()} ({u['replay']} replayed, {u['eager']} eager)" for u in t.unmatched[:UNLINKED_SHOWN]]
    more = f", +{len(t.unmatched) - UNLINKED_SHOWN} more" if len(t.unmatched) > UNLINKED_SHOWN else ""
    return (f"  not linked to their ops (no sure pairing with the eager forward's kernels: "
            f"{len(t.unmatched)} name{'s' if len(t.unmatched) != 1 else ''}): {'; '.join(shown)}{more}")


def sections(found: dict[tuple[str, int], list[Account]], folder: Path,
             prefer: str = "replay") -> tuple[list[Section], dict[str, dict]]:
    """Per profiled point (in the kernel tables' order) its section; and by table name what its
    record (json, csv) adds: `timeline` (the file's name, or null) and `exposure` (the totals in
    ms, the shares, and the LONGEST intervals; null without device kernels); where some point
    reads a graph replay, also `timeline_of` (REPLAY, EAGER, or null), `replays` (how many graph
    replays back to back the timeline holds; null for an eager forward's or none) and `unlinked` (a
    replay's kernel names not linked to their ops). `prefer`: "replay" (a graph replay's timeline where
    one lies there) or "eager"."""
    reads = {a.name: _read(folder, a, prefer) for points in found.values() for a in points}  # each read once
    tagged = any(r.source == REPLAY or r.note is not None for r in reads.values())
    parts, records = [], {}
    for points in found.values():
        bound = next((reads[a.name] for a in points if _is_bound(a.name) and reads[a.name].result), None)
        for a in points:
            got = reads[a.name]
            source = _source_text(got)
            name = f"{a.name} ({source})" if tagged and source is not None else a.name
            record: dict = {"timeline": got.file, "exposure": None}
            if tagged:
                replays = got.timeline.replays if got.source == REPLAY and got.timeline is not None else None
                record |= {"timeline_of": got.source, "replays": replays,
                           "unlinked": [dict(u) for u in got.timeline.unmatched] if got.timeline else []}
            notes = [f"  {got.note}"] if got.note is not None else []
            waits = None
            if a.profile_error is not None and got.timeline is not None:  # a later part failed: no replay's timeline
                notes.append(f"  profile incomplete: {a.profile_error}")
            if got.timeline is None:
                why = "profiled before timelines were kept" if a.profile_error is None else a.profile_error
                line, grid = f"{name}: no timeline beside its table ({why})", None
            elif got.result is None:
                where = f"profiled on {got.timeline.device}: {got.timeline.host_ops} host ops"
                line, grid = f"{name}: no device kernels in its timeline ({where})", None
            else:
                record["exposure"] = got.result.as_dict(top=LONGEST)
                grid = intervals_grid(name, got.result) if got.result.intervals else None
                line = totals_line(name, got.result)
                if bound is not None and not _is_bound(a.name):
                    bound_source = _source_text(bound)
                    notes.append(against_line(got.result, bound.result) if bound_source == source else
                                 f"  against {BOUND}: not shown ({BOUND} read from its {bound_source}, "
                                 f"this point from its {source})")
                notes += [u for u in [unlinked_line(got.timeline)] if u is not None]
                twin = reads.get(a.twin) if a.twin is not None else None
                if twin is not None and twin.result is not None and twin.source == got.source:
                    try:
                        stretch = twins.compare(got.timeline, twin.timeline, a.layers)
                    except UserError as e:
                        notes.append(f"  against its comm: none twin: not shown ({e})")
                    else:
                        notes += twins.lines(stretch)
                        record["against_twin"] = {"twin": a.twin} | stretch.as_dict()
                across = ranks_view.part(folder, a.name, got.source == REPLAY, got.timeline, name)
                if across is not None:
                    notes += across.lines
                    record["across_ranks"] = across.record
                    waits = across.grid
            parts.append(Section("\n".join([line, *notes]), grid, tagged, waits))
            records[a.name] = record
    return parts, records


def _source_text(got: Read) -> str | None:
    """What a point's timeline recorded, as its lines name it: `graph replay`, `eager forward`, or
    `N graph replays` where it holds N back to back (measure.profile_replays)."""
    if got.source == REPLAY and got.timeline is not None and got.timeline.replays > 1:
        return f"{got.timeline.replays} {REPLAY}s"
    return got.source


def _is_bound(name: str) -> bool:
    return name.split("-", 1)[0] == BOUND


def _read(folder: Path, a: Account, prefer: str) -> Read:
    """A point's timeline beside its table and its analysis: its graph replay's where `prefer` is
    "replay" and that one holds device kernels, else its eager forward's; Read() where none lies there."""
    note = None
    if prefer == "replay":
        path = folder / timeline_files.file_name(a.name, replay=True)
        if path.is_file():
            t = exposed.read(path)
            result = exposed.analyze(t.kernels)
            if result is not None:
                return Read(path.name, REPLAY, t, result)
            note = (f"its graph replay's timeline ({path.name}) holds no device kernel ({t.host_ops} host ops): "
                    "the profiler recorded none of the graph's kernels; the eager forward's is read instead")
    path = folder / timeline_files.file_name(a.name)
    if not path.is_file():
        return Read(note=note)
    t = exposed.read(path)
    return Read(path.name, EAGER, t, exposed.analyze(t.kernels), note)


def emit_sections(parts: list[Section], fmt: str, console: Console) -> None:
    """The sections under the kernel tables (table and markdown; csv and json carry the records);
    nothing where no point was profiled."""
    if not parts:
        return
    title = TITLE_REPLAY if any(part.tagged for part in parts) else TITLE
    if fmt == "table":
        console.print()
        console.print(Text(title, style="bold"), soft_wrap=False)
        for part in parts:
            console.print(Text(part.line), soft_wrap=False)
            for grid in (part.grid, part.waits):
                if grid is not None:
                    print_grid(grid, console)
        for note in _notes(parts):
            console.print(Text(note, style="dim"), soft_wrap=False)
    elif fmt == "markdown":
        text = f"\n## {title}\n"
        for part in parts:
            text += f"\n{part.line}\n" + "".join(f"\n{to_markdown(g)}" for g in (part.grid, part.waits) if g is not None)
        console.out(text + "".join(f"\n{note}\n" for note in _notes(parts)), highlight=False)


def _notes(parts: list[Section]) -> list[str]:
    """The legends under the sections: the intervals' where a table of them is shown, the waits' likewise."""
    return ([NOTE] if any(part.grid is not None for part in parts) else []) + (
        [ranks_view.NOTE] if any(part.waits is not None for part in parts) else [])
