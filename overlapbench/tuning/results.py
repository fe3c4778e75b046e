"""Result rows and their JSONL store: one object per line, appended and flushed per point.

A crash loses at most the point in flight; `--resume` skips the points already in the file. A
lock file keeps two sweeps from interleaving lines in one store, and says who holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from overlapbench.errors import UserError, shown, unreadable
from overlapbench.tuning import row_schema

SCHEMA = "overlapbench/result-v1"
STATUSES = ("ok", "failed", "skipped")
HELD_FOR = "OVERLAPBENCH_HELD_LOCK"  # a lock file the launching process holds for its workers (held_for_launch)

# Stable columns every consumer may rely on (docs/design.md, "Result rows"); renaming one bumps SCHEMA.
# Timing keys of layer and micro rows (not in COLUMNS: `comm` rows lack them): `timing` is
# "interleaved" (a batch's candidates in rounds, interleave.py) or "sequential". Interleaved,
# `samples_ms` holds one value per round (ms per layer in that round, the slowest rank's),
# `round_ids` which rounds of the batch's timing those are, `pairing` that timing's id (rows of one
# pairing compare round by round), `speedup` the trimmed geometric mean over rounds of t_reference / t in the same
# round, `speedup_ci` its 95% interval over rounds [lo, hi] (intervals.paired_interval) (the reference itself: 1.0,
# [1.0, 1.0]), `span_ms` the time per candidate per round, `settle_ms` the untimed run before each span
# (absent from rows made before it, which settled none), `iters` the iterations timed in all, and
# `rank_ms` each rank's own median ms per layer over the same rounds, in rank order (the ranks need not
# compute at one speed; samples_ms is the slowest's; rows made before it lack it). Sequential rows carry
# `rank_ms` too, each rank's median over the timed iterations (older sequential rows hold null).
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
    from overlapbench.model.models import completed

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


def latest(results_dir: str | Path = "results", workloads: tuple[str, ...] = ()) -> Path:
    """The most recently written store under `results_dir` (a folder given where a results file
    is expected means this); with `workloads`, the newest holding rows of one of them (a `comm`
    file is no input for `tune`)."""
    stores = sorted(Path(results_dir).rglob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True)
    if not stores:
        raise UserError(f"{results_dir}/: no results yet (given no file, this reads the newest .jsonl under {results_dir}/ "
                        f"of the current folder; a spec's `output:` is a path from the folder the sweep ran in); "
                        f"name the results file, or run `overlapbench sweep` first")
    for store in stores:
        if not workloads or workloads_in(store) & set(workloads):
            return store
    newest = "/".join(sorted(workloads_in(stores[0]))) or "no"
    raise UserError(f"{results_dir}/: no results file holds {'/'.join(workloads)} rows (the newest, {stores[0]}, holds "
                    f"{newest} rows); run `overlapbench sweep` first, or name a file")


def given_or_newest(path: Path | None, workloads: tuple[str, ...], say: Callable[[str], None],
                    fallback: bool = False) -> Path:
    """A results file as given; for a folder (None: results/) the newest one in it holding rows
    of `workloads` (with `fallback`, else the newest of any kind), told through `say`: a command
    given no file says which it read."""
    if path is not None and not path.is_dir():
        return path
    folder, kind = path or Path("results"), "results file with a sweep's rows"
    try:
        found = latest(folder, workloads=workloads)
    except UserError:
        if not fallback:
            raise
        found, kind = latest(folder), "results file"
    say(f"reading {found} (the newest {kind} in {folder}/; name one to choose)")
    return found


def workloads_in(path: str | Path) -> set[str]:
    """The workloads of a store's rows (`layer`, `gemm_ag`, `gemm_rs`, `comm`), read leniently:
    lines that are not rows are passed over (read_rows says what is wrong with them)."""
    found = set()
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("workload"), str):
            found.add(row["workload"])
    return found


def kept(path: str | Path, go_on: str = "") -> str:
    """What a stopped run left, truly: `N finished rows are in PATH; GO_ON`, or `no rows were
    written to PATH` (and no promise that a resume continues from something)."""
    try:
        count = sum(1 for line in Path(path).read_text(errors="replace").splitlines() if line.strip())
    except OSError:
        count = 0
    if not count:
        return f"no rows were written to {path}"
    return f"{count} finished row{'s are' if count != 1 else ' is'} in {path}" + (f"; {go_on}" if go_on else "")


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
    """The append-only JSONL file of one sweep, held under an exclusive lock while it runs.

    The lock is `NAME.jsonl.lock` beside it, removed when the store is closed: a process that
    locked the file just before its removal finds its lock no longer at that path and tries again.
    It holds one line on its holder (pid, command, start), which a refused second run names."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._lock = None

    def open(self, resume: bool, study: str | None = None) -> set[str]:
        """Lock the store and return the keys of points already done (when resuming). `study`:
        the spec's name (`comm` for `overlapbench comm`); resuming a store that holds another
        study's rows is refused (None: not checked)."""
        if self.path.is_dir():
            raise UserError(f"output: {self.path} is a folder; give a results file, e.g. --output {self.path / 'NAME.jsonl'}")
        # a path not named .jsonl holding no rows (a spec, notes) is refused untouched; a .jsonl: read_rows says
        not_ours = None if self.path.suffix == ".jsonl" else _not_a_store(self.path)
        if not_ours:
            kept = " (it is left as it is)" if self.path.exists() else ""
            raise UserError(f"output: {self.path} {not_ours}, not a results file{kept}; results go to a .jsonl "
                            f"file, e.g. --output {self.path.with_suffix('.jsonl')}")
        self._lock = self._acquire()
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
            if study is not None:
                _same_study(self.path, rows, study)
        except UserError:
            self.close()
            raise
        return {row["key"] for row in rows if "key" in row and row["status"] in ("ok", "skipped")}

    def _acquire(self):
        """The lock, held; None in a worker (under torchrun) whose launcher holds it for the run."""
        if "RANK" in os.environ and os.environ.get(HELD_FOR) == str(self.lock_path.resolve()):
            return None
        while True:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                lock = open(self.lock_path, "a")  # held until close
            except OSError as e:
                raise UserError(f"output: cannot write to {self.path} ({e.strerror}); choose another --output") from None
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                raise UserError(f"output: {self.path} is being written by another run{_holder(self.lock_path)}; "
                                f"wait for it to end, or choose another --output") from None
            try:
                if os.stat(self.lock_path).st_ino == os.fstat(lock.fileno()).st_ino:
                    lock.truncate(0)
                    lock.write(json.dumps({"pid": os.getpid(), "command": _command(), "started": time.time()}) + "\n")
                    lock.flush()
                    return lock
            except FileNotFoundError:  # its holder removed it as we locked it
                pass
            lock.close()

    def append(self, row: dict) -> None:
        line = json.dumps(row, sort_keys=False, default=str) + "\n"
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        """Release the lock and remove its file (nothing is left beside the results)."""
        if self._lock is not None:
            self.lock_path.unlink(missing_ok=True)
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None


def _not_a_store(path: Path) -> str | None:
    """What a path not named .jsonl holds, or is named as, that results never go into (a spec,
    another file), in words; None for a results file, an empty file, or a new path not named like
    a spec."""
    try:
        with path.open(errors="replace") as f:
            first = f.readline()
    except OSError:
        first = ""
    yaml = path.suffix.lower() in (".yaml", ".yml")
    if not first.strip():
        return "is named like a spec (YAML)" if yaml else None
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return "is a YAML file (a spec?)" if yaml else "holds something else (its first line is not a JSON row)"
    return None if isinstance(row, dict) and "schema" in row else "holds JSON that is not a result row"


def _command() -> str:
    """This process's command line as the user typed it (`overlapbench sweep ...`)."""
    return shlex.join(["overlapbench", *sys.argv[1:]])


def _holder(lock_path: Path) -> str:
    """` (pid 123: overlapbench sweep a.yaml -o r.jsonl, since 12:03:04)` from the lock's line."""
    try:
        holder = json.loads(lock_path.read_text().splitlines()[0])
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"]))
        return f" (pid {holder['pid']}: {holder['command']}, since {since})"
    except (OSError, IndexError, ValueError, KeyError, TypeError):  # written by an older version, or being written
        return ""


@contextlib.contextmanager
def held_for_launch(output: str | Path, resume: bool, study: str | None = None) -> Iterator[set[str]]:
    """The store locked from a launcher's checks to the end of the run it launches (the keys of
    the points done so far): a second run into the same file is refused at once, not when its
    workers start. Its workers (processes under torchrun) inherit HELD_FOR, which tells them the
    lock is held for them; another command started meanwhile is refused like any other."""
    store = ResultStore(output)
    done = store.open(resume, study)
    os.environ[HELD_FOR] = str(store.lock_path.resolve())
    try:
        yield done
    finally:
        os.environ.pop(HELD_FOR, None)
        store.close()


def _same_study(path: Path, rows: list[dict], study: str) -> None:
    """Refuse to resume into rows of another study: one file, one study."""
    others = sorted({str(row.get("spec")) for row in rows} - {study})
    if others:
        raise UserError(f"--resume: {path} holds the rows of {' and '.join(map(_study, others))}, not of {_study(study)}; "
                        f"give this run its own --output")


def _study(name: str) -> str:
    return "`overlapbench comm`" if name == "comm" else f"spec '{name}'"


def open_on_ranks(output: str | Path, resume: bool, rank: int,
                  study: str | None = None) -> tuple[ResultStore | None, set[str], str]:
    """Rank 0 locks the store; every rank learns the keys already done and the run id (a
    collective: all ranks call it). A refusal is the same UserError on every rank."""
    import torch.distributed as dist

    store = ResultStore(output) if rank == 0 else None
    opened: list = [None, new_run_id()]
    if store is not None:
        try:
            opened[0] = sorted(store.open(resume, study))
        except UserError as e:
            opened[0] = str(e)
    dist.broadcast_object_list(opened, src=0)
    if isinstance(opened[0], str):
        raise UserError(opened[0])
    return store, set(opened[0]), opened[1]


def profile_name(strategy: str, tokens: int, knobs: dict, decode: dict | None = None, layers: int | None = None) -> str:
    """The file name (less `.txt`) of a point's kernel table in a `sweep --profile` folder; what
    `report --profile` finds a row's table by. Knobs left unset or at default are not in it. The
    stack's depth ends it (`-4layers`): a spec of several depths profiles each point at each;
    folders written before it did lack it (`report --profile` reads both)."""
    settings = "-".join(f"{k}={v}" for k, v in knobs.items() if v not in (None, "default"))
    at = f"-decode{decode['tokens']}x{decode['context']}" if decode else ""
    depth = f"-{layers}layers" if layers is not None else ""
    return f"{strategy}-{tokens}{at}" + (f"-{settings}" if settings else "") + depth


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
