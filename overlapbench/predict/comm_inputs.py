"""The tables a prediction at TP=k reads, from the files a user has: `overlapbench comm` stores
(their alone rows make the all-reduce table, their beside-compute rows the contention) and
nccl-tests' text, of any world sizes.

- The tables measured at k ranks are used as measured, merged.
- A table of another world size is rescaled to k ranks (comm_table.CommTable.times): so that
  its NCCL ring (`nccl` at its default budget) takes what the k-rank table measured for it at
  the largest size both hold, or, with `--busbw`, so that it reaches that bus bandwidth at 1 GiB.
- Combined, each path comes from one table: the k-rank tables' paths as measured, the other
  paths from the rescaled tables (the largest world size first), each said in a note. So an
  nccl-tests table of 8 GPUs (NCCL's ring only) and our 2-GPU table (every path) predict TP=8
  with NCCL's ring as the 8 GPUs measured it and the other paths in proportion to it.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from overlapbench.comm.sizes import format_bytes
from overlapbench.errors import UserError
from overlapbench.predict.comm_table import CommTable, is_beside
from overlapbench.predict.contention import Contention
from overlapbench.predict.notes import SUBSTITUTED, Note
from overlapbench.tuning import results

REFERENCE = ("nccl", "default")  # the path every table of nccl-tests or ours holds, which rescaling matches
GIB = 1 << 30


def read(comm: list[Path], tp: int, busbw: float | None, model: str | None = None) -> tuple[CommTable, Contention | None]:
    """The all-reduce table at TP=tp and the contention (None where no rows were timed beside
    compute) from the `--comm` files."""
    stores = {path: results.read_rows(path) for path in comm if path.suffix == ".jsonl"}
    beside = [row for rows in stores.values() for row in rows if is_beside(row)]
    only_beside = {path for path, rows in stores.items() if rows and all(is_beside(row) for row in rows)}
    table = table_at(tp, [p for p in comm if p not in only_beside], busbw)
    contention = None
    if beside:
        contention = Contention.from_rows(beside, ", ".join(str(p) for p in comm if p in stores), model, tp)
    return table, contention


def table_at(tp: int, paths: list[Path], busbw: float | None) -> CommTable:
    """One table of TP=tp from files of any world sizes (the module's rules)."""
    if not paths:
        raise UserError("--comm: no all-reduce table given (only rows timed beside compute); add `overlapbench comm` "
                        "rows (.jsonl) or nccl-tests all_reduce_perf output")
    groups: dict[int, list[CommTable]] = defaultdict(list)
    for path in paths:
        one = CommTable.read([path], world_size=tp)
        groups[one.world_size].append(one)
    merged = {world: CommTable.merged(tables) for world, tables in groups.items()}
    here = merged.pop(tp, None)
    if busbw is not None and not merged:
        raise UserError(f"--busbw: every --comm table is of {tp} ranks already, nothing to rescale; drop --busbw")
    if here is None and busbw is None:
        held = ", ".join(f"{t.source} ({w} ranks)" for w, t in sorted(merged.items()))
        raise UserError(f"--comm: no table of {tp} ranks ({held}); give a table of {tp} GPUs (nccl-tests' "
                        f"all_reduce_perf output will do), or --busbw GB/S to rescale these")
    rescaled = [(table.source, _rescaled(table, tp, here, busbw)) for _, table in sorted(merged.items(), reverse=True)]
    return _combined(here, rescaled, tp)


def _rescaled(table: CommTable, tp: int, here: CommTable | None, busbw: float | None) -> CommTable:
    """`table` at tp ranks: by --busbw where given, else matched to `here`'s NCCL ring."""
    if busbw is not None:
        return table.scaled(tp, busbw, source=f"--busbw {busbw:g}")
    path, ctas = REFERENCE
    if path not in here.paths() or path not in table.paths():
        raise UserError(f"--comm: {table.source} is of {table.world_size} ranks, not {tp}, and no 'nccl' rows in both "
                        f"it and the {tp}-rank table to rescale it by; give --busbw GB/S (the all-reduce bus bandwidth "
                        f"of {tp} GPUs at 1 GiB)")
    at = min(GIB, _largest(here), _largest(table))
    factor = here.time_ms(path, ctas, at).ms / table.time_ms(path, ctas, at).ms
    said = (f"{table.source} ({table.world_size} ranks) rescaled to {tp} ranks by x{factor:.3g}: {path}'s time at "
            f"{format_bytes(at)} in {here.source}")
    return table.times(factor, tp, said)


def _largest(table: CommTable) -> int:
    """The largest size measured on the reference path, at any budget."""
    return max(points[-1][0] for key, points in table.entries.items() if key[0] == REFERENCE[0])


def _combined(here: CommTable | None, rescaled: list[tuple[str, CommTable]], tp: int) -> CommTable:
    """Each path from the first table holding it: the tp-rank one, then the rescaled ones
    (`rescaled`: (the file it was, the table rescaled))."""
    tables = ([("", here)] if here is not None else []) + rescaled
    if len(tables) == 1:
        return tables[0][1]
    entries, notes, taken = {}, [], set()
    for was, table in tables:
        paths = [p for p in table.paths() if p not in taken]
        entries |= {key: points for key, points in table.entries.items() if key[0] in paths}
        notes += table.notes
        if paths and was and here is not None:
            notes.append(Note(SUBSTITUTED, f"{', '.join(paths)}: from {was}, rescaled: no table of {tp} ranks holds them"))
        taken |= set(paths)
    devices = {t.device for _, t in tables} - {None}
    return CommTable(entries, tp, " and ".join(sorted(devices)) or None, "; ".join(t.source for _, t in tables), notes)
