"""`report --profile DIR`'s second part: per profiled point, why its communication stays exposed.

After the kernel tables (profile.py), each profiled point whose timeline lies beside its table
(`<point>.timeline.json`, timing/timeline.py) gets a totals line, where its group holds a
`no_comm` point the split of its extra wall time into compute, exposed transfers and idle time,
and a table of its longest exposed intervals, as report/exposed.py defines them; a point profiled before timelines were
kept, or on CPU (no device kernels), gets a line saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.text import Text

from overlapbench.report import exposed
from overlapbench.report.cells import Grid, Shown, text_cell
from overlapbench.report.profile import Account
from overlapbench.report.render import print_grid, to_markdown
from overlapbench.timing.timeline import SUFFIX

LONGEST = 8  # exposed intervals shown per point
NAME_WIDTH = 56  # kernel names cut to this many characters in the table (json keeps them whole)
HEADER = ["start ms", "length ms", "exposed ms", "transfer (stream)", "bytes", "after (stream)", "GFLOP", "then (stream)"]
TITLE = ("Exposed communication: one eager forward per point (rank 0), from its device kernels; "
         "ms from the forward's first kernel")
NOTE = ("exposed interval: no compute kernel runs on any stream and a transfer does · length: the whole stretch, "
        "exposed: the part a transfer runs · after: the compute kernel whose end opened it, the transfer "
        "'behind' it (started after it ended) or 'beside' it (started while it ran); GFLOP: its op's · "
        "then: the compute kernel that closed it · hidden: transfer time with some compute kernel running")


@dataclass(frozen=True)
class Section:
    """One point's part: its line, and its intervals' table where it has any."""

    line: str
    grid: Grid | None


def short(name: str) -> str:
    """A kernel name as the table shows it: no `void `, no argument list, at most NAME_WIDTH characters."""
    name = name.removeprefix("void ")
    if name.endswith(")") and "(" in name:
        name = name[: name.index("(")] or name
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"


def size(n: int | None) -> str:
    if n is None:
        return "-"
    if n >= 2**20:
        return f"{n / 2**20:.2f} MiB"
    return f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n} B"


def _number(text: str) -> Shown:
    return Shown((text,), right=True)


def _named(k: exposed.Kernel | None, relation: str | None = None) -> str:
    if k is None:
        return "-"
    return f"{relation + ' ' if relation else ''}{k.kind}: {short(k.name)} (s{k.stream})"


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
        rows.append([_number(f"{i.start / 1e3:.3f}"), _number(f"{i.length / 1e3:.3f}"), _number(f"{i.exposed / 1e3:.3f}"),
                     text_cell(f"{short(i.transfer.name)} (s{i.transfer.stream}){more}"), _number(size(i.transfer.bytes)),
                     text_cell(_named(i.after, i.relation)), _number(flops), text_cell(_named(i.then))])
    which = f"the {len(shown)} longest of {len(e.intervals)}" if len(e.intervals) > len(shown) else f"all {len(shown)}"
    return Grid(f"{name}: exposed intervals ({which}, longest exposed first)", HEADER, rows)


def sections(found: dict[tuple[str, int], list[Account]], folder: Path) -> tuple[list[Section], dict[str, dict]]:
    """Per profiled point (in the kernel tables' order) its section; and by table name what its
    record (json, csv) adds: `timeline` (the file's name, or null) and `exposure` (the totals in
    ms, the shares, and the LONGEST intervals; null without device kernels)."""
    parts, records = [], {}
    for points in found.values():
        timelines = {a.name: _read(folder, a) for a in points}  # each read and analyzed once
        bound = next((result for name, (_, result) in timelines.items() if _is_bound(name) and result), None)
        for a in points:
            timeline, result = timelines[a.name]
            record = {"timeline": None, "exposure": None}
            if timeline is None:
                parts.append(Section(f"{a.name}: no timeline beside its table (profiled before timelines were kept)", None))
            else:
                record["timeline"] = f"{a.name}{SUFFIX}"
                if result is None:
                    where = f"profiled on {timeline.device}: {timeline.host_ops} host ops"
                    parts.append(Section(f"{a.name}: no device kernels in its timeline ({where})", None))
                else:
                    record["exposure"] = result.as_dict(top=LONGEST)
                    grid = intervals_grid(a.name, result) if result.intervals else None
                    line = totals_line(a.name, result)
                    if bound is not None and not _is_bound(a.name):
                        line += "\n" + against_line(result, bound)
                    parts.append(Section(line, grid))
            records[a.name] = record
    return parts, records


def _is_bound(name: str) -> bool:
    return name.split("-", 1)[0] == BOUND


def _read(folder: Path, a: Account) -> tuple[exposed.Timeline | None, exposed.Exposure | None]:
    """A point's timeline beside its table and its analysis (None without device kernels); (None,
    None) where no timeline lies there."""
    path = folder / f"{a.name}{SUFFIX}"
    if not path.is_file():
        return None, None
    timeline = exposed.read(path)
    return timeline, exposed.analyze(timeline.kernels)


def emit_sections(parts: list[Section], fmt: str, console: Console) -> None:
    """The sections under the kernel tables (table and markdown; csv and json carry the records)."""
    if fmt == "table":
        console.print()
        console.print(Text(TITLE, style="bold"), soft_wrap=False)
        for part in parts:
            console.print(Text(part.line), soft_wrap=False)
            if part.grid is not None:
                print_grid(part.grid, console)
        if any(part.grid is not None for part in parts):
            console.print(Text(NOTE, style="dim"), soft_wrap=False)
    elif fmt == "markdown":
        text = f"\n## {TITLE}\n"
        for part in parts:
            text += f"\n{part.line}\n" + (f"\n{to_markdown(part.grid)}" if part.grid is not None else "")
        console.out(text + (f"\n{NOTE}\n" if any(part.grid is not None for part in parts) else ""), highlight=False)
