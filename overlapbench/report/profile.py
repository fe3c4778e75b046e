"""`report RESULTS --profile DIR`: where each point's GPU time goes, from `sweep --profile DIR`.

The kernel tables of a profiled sweep (eager forwards under torch.profiler, one table per point,
named by `results.profile_name`) tallied by kind of kernel: GEMM, attention, the log-sum-exp
merge, norms, other elementwise work (RoPE, SwiGLU), copies, communication (NCCL, the fused
kernels, the copy engines' peer copies, the symmetric-memory barriers). Per layer, per token
count, with what each point adds per kind over `no_comm`, and the kernels' sum beside the row's
graph-replayed time: what is left is launch gaps and idle (graphs remove most of it), or overlap
(kernels on side streams make the sum exceed the time). Why communication stays exposed, from
each point's timeline: exposed_view.py. A point whose profile failed in the sweep (its row's
`profile_error`) and left no table is listed with why (`unprofiled`), not left out unsaid.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.text import Text

from overlapbench import strategies
from overlapbench.errors import UserError
from overlapbench.report.cells import Grid, Shown, text_cell
from overlapbench.report.render import stderr_console
from overlapbench.strategies import knobs as strategy_knobs
from overlapbench.tuning import analysis
from overlapbench.tuning.results import profile_name

KINDS = (  # a kernel's kind: the first whose keys its name contains (lower case)
    ("gemm", ("nvjet", "gemm", "cutlass", "xmma")),
    ("attention", ("sdpa", "flash", "fmha", "attention")),
    ("lse_merge", ("lse_merge",)),
    ("comm", ("nccl", "allreduce", "all_reduce", "barrier_kernel", "ptop")),  # PtoP: a copy engine over NVLink
    ("norm", ("rmsnorm", "add_norm")),
    ("copy", ("copy", "cat", "memcpy", "memset")),
    ("elementwise", ("elementwise", "gather", "reduce_kernel")),
)
OTHER = "other"
KIND_NAMES = tuple(k for k, _ in KINDS) + (OTHER,)
HOST_ROWS = ("aten::", "cuda", "nccl:", "record_param_comms", "Activity Buffer", "---", "Name")
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}
SELF_DEVICE_COLUMN = 6  # torch.profiler's table: Name, Self CPU %, Self CPU, CPU total %, CPU total, CPU avg, Self CUDA


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    return next((kind for kind, keys in KINDS if any(k in name for k in keys)), OTHER)


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(number) * UNITS[unit]


def tally(table: Path, layers: int) -> dict[str, float]:
    """GPU ms per layer and forward by kind of kernel in one table (measure.profile_parts's file:
    "N eager forwards", then torch.profiler's key_averages table). Host rows (aten ops, runtime
    calls) are left out: their device time is their kernels', counted once under the kernel."""
    lines = table.read_text().splitlines()
    try:
        forwards = int(lines[0].split()[0])
    except (IndexError, ValueError):
        raise UserError(f"--profile: {table} is not a table of `sweep --profile` (no 'N eager forwards' line)") from None
    per_kind: dict[str, float] = defaultdict(float)
    for line in lines[4:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) < 11 or cells[0].startswith(HOST_ROWS):
            continue
        per_kind[kind_of(cells[0])] += _ms(cells[SELF_DEVICE_COLUMN]) / forwards / layers
    return dict(per_kind)


@dataclass(frozen=True)
class Account:
    """One profiled point: GPU ms per layer by kind, and its row's graph-replayed ms per layer."""

    name: str  # the table's name: strategy-tokens[-knobs]
    tokens: int
    group: str  # the row's group (model, TP, device, dtype), as headings name it
    per_kind: dict[str, float]
    timed_ms: float | None
    profile_error: str | None = None  # the row's: a later part of its profile failed (its table is whole)
    layers: int = 1  # per forward: a timeline's ms per layer is its total over replays x layers
    twin: str | None = None  # the table name of its `comm: none` twin where one was profiled (twin_row)

    @property
    def kernels_ms(self) -> float:
        return sum(self.per_kind.values())


@dataclass(frozen=True)
class Unprofiled:
    """A point whose profile failed in the sweep (its row's `profile_error`) and left no table."""

    name: str
    tokens: int
    group: str
    error: str

    def line(self) -> str:
        return f"{self.name}: no profile: {self.error}"


UNPROFILED_TITLE = "Points without a profile (profiling failed in the sweep; their rows keep their timing)"


def _table(row: dict, folder: Path) -> tuple[str, Path | None]:
    """A layer row's table name and its table in `folder` (None where none lies there)."""
    names = (profile_name(row["strategy"], row["tokens"], row["knobs"], row.get("decode"), row.get("layers")),
             profile_name(row["strategy"], row["tokens"], row["knobs"], row.get("decode")))  # a folder of before depths
    return next(((n, folder / f"{n}.txt") for n in names if (folder / f"{n}.txt").is_file()), (names[0], None))


def transfer_knobs(strategy: str) -> set[str]:
    """The knobs of `strategy` that choose its transfer path and nothing of its compute: what a
    point and its twin may differ in."""
    path = (strategy_knobs.COMM, strategy_knobs.NCCL_MAX_CTAS, strategy_knobs.REDUCE_START, *strategy_knobs.COPY_ENGINE_KNOBS)
    return {k.name for k in path} | set(strategies.get(strategy).cta_knobs)


def twin_row(row: dict, rows: list[dict]) -> dict | None:
    """The row of `rows` that is `row`'s twin: the same group, batch, depth, strategy and compute
    knobs, with `comm: none` (the same compute, no transfer: report/twins.py compares their
    timelines); None where `row` transfers nothing, has no `comm` knob, or has no twin."""
    comm, none = strategy_knobs.COMM.name, strategy_knobs.NO_TRANSFER
    if row["knobs"].get(comm, none) == none:
        return None
    path = transfer_knobs(row["strategy"])
    compute = lambda r: {k: v for k, v in r["knobs"].items() if k not in path}
    same = lambda r: (r["strategy"] == row["strategy"] and r["tokens"] == row["tokens"] and r.get("decode") == row.get("decode")
                      and r.get("layers") == row.get("layers") and analysis.Group.of(r) == analysis.Group.of(row))
    return next((r for r in rows if r["knobs"].get(comm) == none and same(r) and compute(r) == compute(row)), None)


def accounts(rows: list[dict], folder: Path) -> tuple[dict[tuple[str, int], list[Account]], list[Unprofiled]]:
    """Per group and token count, the profiled points of `rows` whose table is in `folder`, no_comm
    first; and the points whose profile failed and left no table there."""
    if not folder.is_dir():
        raise UserError(f"--profile: {folder} is not a folder (the one `sweep --profile` wrote)")
    found: dict[tuple[str, int], list[Account]] = defaultdict(list)
    missing = []
    for row in rows:
        if analysis.workload_of(row) != analysis.LAYER:
            continue
        name, table = _table(row, folder)
        if table is not None:
            timed = row["ms"] if row.get("status") == "ok" else None
            group = analysis.Group.of(row).label()
            twin = twin_row(row, rows)
            twin_name = None if twin is None else _table(twin, folder)[0]
            found[group, row["tokens"]].append(Account(name, row["tokens"], group, tally(table, row["layers"]), timed,
                                                       row.get("profile_error"), row["layers"], twin_name))
        elif row.get("profile_error"):
            missing.append(Unprofiled(name, row["tokens"], analysis.Group.of(row).label(), row["profile_error"]))
    if not found and not missing:
        raise UserError(f"--profile: no table in {folder} matches a layer row of the results; "
                        "give the results file of the sweep that wrote the folder")
    bound_first = lambda a: (not a.name.startswith(f"{analysis.BOUND}-"), a.name)
    missing.sort(key=lambda u: (u.group, u.tokens, u.name))
    return {t: sorted(a, key=bound_first) for t, a in sorted(found.items())}, missing


def profile_view(found: dict[tuple[str, int], list[Account]]) -> tuple[list[Grid], list[dict], str]:
    """One grid per group and token count (`accounts`): a line per profiled point, a column per kind of kernel."""
    grids, records = [], []
    failed = any(a.profile_error for points in found.values() for a in points)  # records name it only then
    for (group, tokens), points in found.items():
        bound = next((a for a in points if a.name.startswith(f"{analysis.BOUND}-")), None)
        grid_rows = []
        for a in points:
            cells = []
            for kind in KIND_NAMES:
                value = a.per_kind.get(kind, 0.0)
                added = "" if bound is None or a is bound else f" {value - bound.per_kind.get(kind, 0.0):+.3f}"
                cells.append(text_cell(f"{value:.3f}{added}"))
            timed = "-" if a.timed_ms is None else f"{a.timed_ms:.3f}"
            grid_rows.append([Shown((a.name,)), *cells, text_cell(f"{a.kernels_ms:.3f}"), text_cell(timed)])
            records.append({"tokens": tokens, "table": a.name, **{f"{k}_ms": a.per_kind.get(k, 0.0) for k in KIND_NAMES},
                            "kernels_ms": a.kernels_ms, "timed_ms": a.timed_ms,
                            **({"profile_error": a.profile_error} if failed else {})})
        header = ["point", *KIND_NAMES, "kernels", "timed"]
        grids.append(Grid(f"{group}, {tokens} tokens: GPU ms per layer by kind of kernel (eager profile)", header, grid_rows))
    note = (f"+x: what a point adds over {analysis.BOUND} per kind · kernels: their sum · timed: the row's ms per layer "
            "(graph replays) · kernels on side streams overlap the others: GPU time, not time added")
    return grids, records, note


def emit_unprofiled(missing: list[Unprofiled], fmt: str, console: Console) -> None:
    """The points without a profile, a line each (`name: no profile: why`), under the kernel
    tables; with csv and json on stderr, so stdout holds the records alone."""
    if not missing:
        return
    if fmt == "table":
        console.print()
        console.print(Text(UNPROFILED_TITLE, style="bold"), soft_wrap=False)
        for u in missing:
            console.print(Text(u.line()), soft_wrap=False)
    elif fmt == "markdown":
        console.out(f"\n## {UNPROFILED_TITLE}\n\n" + "".join(f"- {u.line()}\n" for u in missing), highlight=False)
    else:
        errors = stderr_console()
        for u in missing:
            errors.print(Text(u.line()), soft_wrap=True)
