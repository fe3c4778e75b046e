"""Result rows and their JSONL store: one object per line, appended and flushed per point.

A crash loses at most the point in flight; `--resume` skips the points already in the file. A
lock file keeps two sweeps from interleaving lines in one store.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from overlapbench import row_schema
from overlapbench.errors import UserError, shown, unreadable

SCHEMA = "overlapbench/result-v1"
STATUSES = ("ok", "failed", "skipped")

# Stable columns every consumer may rely on (docs/design.md, "Result rows"); renaming one bumps SCHEMA.
# Timing keys of layer and micro rows (not in COLUMNS: `comm` rows lack them): `timing` is
# "interleaved" (a batch's candidates in rounds, interleave.py) or "sequential". Interleaved,
# `samples_ms` holds one value per round (ms per layer in that round, the slowest rank's),
# `round_ids` which rounds of the batch's timing those are, `pairing` that timing's id (rows of one
# pairing compare round by round), `speedup` the trimmed geometric mean over rounds of t_reference / t in the same
# round, `speedup_ci` its 95% interval over rounds [lo, hi] (intervals.paired_interval) (the reference itself: 1.0,
# [1.0, 1.0]), `span_ms` the time per candidate per round and `iters` the iterations timed in all;
# sequential rows hold null there.
COLUMNS = (
    "schema", "run_id", "time", "spec", "status", "error", "workload", "strategy", "knobs",
    "model", "shape", "layers", "dtype", "batch", "tokens", "tp", "world_size", "device",
    "backend", "versions", "git", "ms", "p10_ms", "p90_ms", "cv", "iters", "graphs", "rel_err",
)


def read_rows(path: str | Path, required: Callable[[dict], tuple[str, ...]] = lambda row: ()) -> list[dict]:
    """Every row of a store; a one-line UserError for anything that is not one of ours, or a
    value a reader cannot compute with (row_schema.FIELDS; `required`: the fields a row must
    have for the caller, e.g. an ok row's timing)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: a folder; name a results file in it (.jsonl), or the folder itself to `report`/`tune`")
    try:
        lines = path.read_text().splitlines(keepends=True)
    except FileNotFoundError:
        raise UserError(f"{path}: no such results file; run `overlapbench sweep` first") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read: {unreadable(e)}") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not line.endswith("\n"):
            raise UserError(
                f"{path}:{n}: the last line is truncated (a crash mid-write); "
                f"delete that line and run `overlapbench sweep --resume` to redo its point"
            )
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise UserError(f"{path}:{n}: not a JSON line; this is not an overlapbench results file") from None
        if not isinstance(row, dict) or "schema" not in row:
            raise UserError(f"{path}:{n}: no 'schema' field; this is not an overlapbench results file")
        if row["schema"] != SCHEMA:
            raise UserError(
                f"{path}:{n}: schema is {shown(row['schema'])}, this overlapbench reads {shown(SCHEMA)}; "
                f"re-run the sweep with this version"
            )
        wrong = row_schema.problem(row, required(row))
        if wrong is not None:
            raise UserError(
                f"{path}:{n}: {wrong}; the store is damaged: correct or delete that line "
                f"(`overlapbench sweep --resume` re-runs a deleted point)"
            )
        rows.append(upgraded(row))
    return rows


def upgraded(row: dict) -> dict:
    """A row written before ModelShape gained a field, with that field's default filled in its
    `shape` and in the shape inside its point `key`: old and new rows of one shape then group
    (report, tune) and match (`--compare`, `--resume`) as one. Other rows are left as they are."""
    from overlapbench.models import completed

    shape = row.get("shape")
    if isinstance(shape, dict):
        row["shape"] = completed(shape)
    key = row.get("key")
    if isinstance(key, str) and '"shape"' in key:
        try:
            parsed = json.loads(key)
        except json.JSONDecodeError:
            return row
        old = parsed.get("shape") if isinstance(parsed, dict) else None
        if isinstance(old, dict) and completed(old) != old:
            row["key"] = json.dumps(parsed | {"shape": completed(parsed["shape"])}, sort_keys=True)
    return row


def latest(results_dir: str | Path = "results") -> Path:
    """The most recently written store under `results_dir` (a folder given where a results file
    is expected means this)."""
    stores = sorted(Path(results_dir).rglob("*.jsonl"), key=lambda p: p.stat().st_mtime)
    if not stores:
        raise UserError(f"{results_dir}/: no results yet; run `overlapbench sweep` first, or name a file")
    return stores[-1]


def load(paths: Iterable[str | Path] | str | Path):
    """Rows of one or more stores as a pandas DataFrame with the stable columns (for notebooks)."""
    import pandas as pd

    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows = [row for p in paths for row in read_rows(p)]
    frame = pd.DataFrame(rows)
    for column in COLUMNS:
        if column not in frame:
            frame[column] = None
    return frame


class ResultStore:
    """The append-only JSONL file of one sweep, held under an exclusive lock while it runs."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = None

    def open(self, resume: bool) -> set[str]:
        """Lock the store and return the keys of points already done (when resuming)."""
        if self.path.is_dir():
            raise UserError(f"output: {self.path} is a folder; give a results file, e.g. --output {self.path / 'NAME.jsonl'}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(self.path.with_name(self.path.name + ".lock"), "w")
        except OSError as e:
            raise UserError(f"output: cannot write to {self.path} ({e.strerror}); choose another --output") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise UserError(
                f"output: another sweep is writing to {self.path}; wait for it or choose another --output"
            ) from None
        self._lock = lock
        exists = self.path.exists() and self.path.stat().st_size > 0
        if exists and not resume:
            self.close()
            raise UserError(
                f"output: {self.path} already holds results; pass --resume to continue that sweep, "
                f"or --output NEW.jsonl to start another"
            )
        if not exists:
            return set()
        try:
            rows = read_rows(self.path)
        except UserError:
            self.close()
            raise
        return {row["key"] for row in rows if "key" in row and row["status"] in ("ok", "skipped")}

    def append(self, row: dict) -> None:
        line = json.dumps(row, sort_keys=False, default=str) + "\n"
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None


def check_writable(output: str | Path, resume: bool) -> None:
    """Refuse a busy or already-written store (per `resume`) before any process is launched."""
    store = ResultStore(output)
    store.open(resume)
    store.close()


def open_on_ranks(output: str | Path, resume: bool, rank: int) -> tuple[ResultStore | None, set[str], str]:
    """Rank 0 locks the store; every rank learns the keys already done and the run id (a
    collective: all ranks call it). A refusal is the same UserError on every rank."""
    import torch.distributed as dist

    store = ResultStore(output) if rank == 0 else None
    opened: list = [None, new_run_id()]
    if store is not None:
        try:
            opened[0] = sorted(store.open(resume))
        except UserError as e:
            opened[0] = str(e)
    dist.broadcast_object_list(opened, src=0)
    if isinstance(opened[0], str):
        raise UserError(opened[0])
    return store, set(opened[0]), opened[1]


def profile_name(strategy: str, tokens: int, knobs: dict, decode: dict | None = None) -> str:
    """The file name (less `.txt`) of a point's kernel table in a `sweep --profile` folder; what
    `report --profile` finds a row's table by. Knobs left unset or at default are not in it."""
    settings = "-".join(f"{k}={v}" for k, v in knobs.items() if v not in (None, "default"))
    at = f"-decode{decode['tokens']}x{decode['context']}" if decode else ""
    return f"{strategy}-{tokens}{at}" + (f"-{settings}" if settings else "")


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


class RunLog:
    """A script's rows (benchmarks, probes) as JSON lines: appended and flushed one by one, each
    stamped with its run's id and the code's commit, as sweep rows are; nothing already in the
    file is touched."""

    def __init__(self, path: str | Path, git: str | None) -> None:
        self.path = Path(path)
        self.stamp = {"run_id": new_run_id(), "git": git}
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, row: dict) -> dict:
        row = row | self.stamp
        with self.path.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        return row
