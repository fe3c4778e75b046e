"""The log of a relaunched command: where torchrun's and the workers' diagnostics go, and the
events the launcher reads back to say in one paragraph what ended the run.

The launcher names the file (`create`: beside the results, a name of its own, never a file that
exists; `LOG` in the environment) and removes it after a clean end, so it is there only when
something failed, and the failure's paragraph names it. torchrun's own messages, the workers'
tracebacks and the watchdog's stack dumps are appended to it instead of reaching the terminal,
and a few events (the point being run and its phase, a time limit, an unexpected error, the end
of the work, how each process ended) are appended as `EVENT {json}` lines. Every writer appends:
lines of several processes interleave, but each stays whole. No torch: the torchrun process
writes here before importing it.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

LOG = "OVERLAPBENCH_LAUNCH_LOG"  # the log's path, set by the launcher for torchrun and its workers
EVENT = "overlapbench-event "  # the prefix of an event line
INTERRUPTED = 130  # the shell's code for a command ended by Ctrl-C; a worker's, stopped by SIGINT or torchrun's SIGTERM


def create(output: Path) -> Path:
    """A new, empty launch log beside a results file, named for it and for this moment:
    `results/x.jsonl` -> `results/x.jsonl.launch-20260101-120304.log` (`...-2.log` where that name
    is taken). Created exclusively: no file already there is ever written over."""
    output.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in itertools.count(1):
        path = output.with_name(f"{output.name}.launch-{stamp}{'' if n == 1 else f'-{n}'}.log")
        try:
            with open(path, "x"):
                return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def current() -> Path | None:
    """This process's launch log, or None when it was not started by `launch.relaunch`."""
    path = os.environ.get(LOG)
    return Path(path) if path else None


def write(text: str) -> bool:
    """Append `text` to the launch log; False (nothing written) outside a relaunched command."""
    path = current()
    if path is None:
        return False
    try:
        with open(path, "a") as f:
            f.write(text if text.endswith("\n") else text + "\n")
    except OSError:
        return False
    return True


def event(kind: str, **fields) -> None:
    """One event for the launcher (nothing outside a relaunched command)."""
    write(EVENT + json.dumps({"event": kind, **fields}, default=str))


def events(path: Path) -> list[dict]:
    """The events in a log, in order; lines that are not whole events are passed over."""
    found = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        if line.startswith(EVENT):
            try:
                found.append(json.loads(line[len(EVENT):]))
            except json.JSONDecodeError:
                pass
    return found


def oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has ended so far (this cgroup's count
    where the kernel keeps one, else the machine's); None where no count is kept."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control", "/proc/vmstat"):
        try:
            for line in Path(path).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill" and value.strip().isdigit():
                    return int(value)
        except OSError:
            continue
    return None


def explain(log: Path, oom_before: int | None, memory: str | None = None, code: int | None = None) -> str | None:
    """What ended a relaunched run, from its log, in one paragraph: what happened (a time limit, a
    signal, memory, an error), while doing what, and what to change; None when a worker already
    said it (a one-line error: bad input). `oom_before`: oom_kills() before the launch; `memory`:
    the run's estimated memory, in words, for the out-of-memory case; `code`: torchrun's exit code."""
    found = events(log)
    ended = [e for e in found if e["event"] == "ended"]
    if not ended and code is not None and code > 128:  # torchrun itself was ended: it could not say how its workers did
        return (f"torchrun (between this command and its workers) was ended by {_signal_name(code - 128)}"
                f"{moment(found)}, and its workers with it; what they printed is in {log}.")
    if ended and all(e.get("exitcode") == 2 for e in ended):  # UserError: the worker printed it
        return None
    timeout = next((e for e in found if e["event"] == "timeout"), None)
    if timeout is not None:
        return (f"rank {timeout['rank']}: {timeout['what']} ran longer than {timeout['limit_s']:g} s "
                f"(measure.timeout_s), so the run was stopped. A peer that died or hung leaves the others "
                f"waiting; a point that is only slow needs a larger measure.timeout_s. Every thread's "
                f"stack is in {log}.")
    # torchrun stops the other ranks with SIGTERM once one fails: the first other signal is the cause
    signals = [e for e in ended if e.get("exitcode", 0) < 0]
    signalled = next((e for e in signals if e["exitcode"] != -15), None)
    if signalled is None and signals and len(signals) == len(ended):
        signalled = signals[0]  # a SIGTERM from outside
    if signalled is not None:
        rank, name = signalled["rank"], _signal_name(-signalled["exitcode"])
        where = moment(found, rank)
        need = f" ({memory})" if memory else ""
        smaller = ("Make the study smaller (model, layers, tokens; a cpu: section for CPU runs) or run fewer "
                   "processes")
        oom_after = oom_kills()
        if oom_before is not None and oom_after is not None and oom_after > oom_before:
            return (f"host memory ran out{where}: the kernel's out-of-memory killer ended rank {rank}{need}. "
                    f"{smaller}; details are in {log}.")
        if name == "SIGKILL":
            return (f"rank {rank} was killed (SIGKILL){where}, by the out-of-memory killer if memory ran out{need} "
                    f"or by another process. If it was memory: {smaller[0].lower()}{smaller[1:]}; details are in {log}.")
        return (f"rank {rank} died of {name}{where}: a crash in native code or a signal from outside; "
                f"what it printed is in {log}.")
    errors = [e for e in found if e["event"] == "error"]
    # a rank torchrun stopped after another failed exits as interrupted (130): the other is the cause
    abrupt = [e for e in ended if e["rank"] not in {x["rank"] for x in errors}]
    cause = next((e for e in abrupt if e.get("exitcode") != INTERRUPTED), abrupt[0] if abrupt else None)
    if cause is not None:
        return (f"rank {cause['rank']} exited with code {cause['exitcode']}{moment(found, cause['rank'])}, without a "
                f"Python error (native code or os._exit); what it printed is in {log}.")
    if errors:
        first = errors[0]
        return (f"rank {first['rank']} stopped on an unexpected error{moment(found, first['rank'])}: {first['error']}. "
                f"This is a bug of overlapbench or of its environment; the traceback is in {log}.")
    return f"the launched processes ended abnormally{moment(found)}; what they printed is in {log}."


def moment(found: list[dict], rank=None) -> str:
    """When `rank` (else any rank) stopped, from its last events: ` while running POINT (PHASE)`,
    or ` at exit, after all rows were written` when its work had ended (a `finished` event: a
    crash in teardown, not in any point); empty when nothing was logged."""
    mine = [e for e in found if e["event"] in ("running", "phase", "finished") and rank in (None, e.get("rank"))]
    if not mine and rank is not None:
        return moment(found)
    if not mine:
        return ""
    if mine[-1]["event"] == "finished":
        return " at exit, after all rows were written"
    running = [i for i, e in enumerate(mine) if e["event"] == "running"]
    if not running:
        return ""
    what = mine[running[-1]]["what"]
    phases = [e["phase"] for e in mine[running[-1] + 1:] if e["event"] == "phase"]
    return f" while {'running ' if what.startswith('point ') else ''}{what}" + (f" ({phases[-1]})" if phases else "")


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
