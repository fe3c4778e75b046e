"""A worker whose run left kernels queued on its GPU (runtime.abandoned: Runtime.close after an
interrupt or an error) ends through os._exit with the command's exit code, so no destructor
unmaps symmetric memory under those kernels (a stopped llama3-70b TP=2 run aborted both ranks
so at exit: `terminate called ... an illegal memory access`). Elsewhere the process exits as
ever, through Python's teardown.

Each case is a process of its own (os._exit is real): a command wrapped as the CLI wraps every
command, under torchrun's environment or not, that marks the runtime abandoned or not, then
ends as drawn (Ctrl-C, bad input, a bug). Python's teardown is seen by an atexit handler.

A worker on its way out ignores stop signals: torchrun's SIGTERM arriving during the exit raised
KeyboardInterrupt inside an atexit callback, and Python printed a traceback to the terminal."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import pytest

from tests.distributed import REPO

ENDINGS = {  # how the command ends -> (what it raises, the exit code)
    "interrupt": ("KeyboardInterrupt()", 130),
    "user error": ("UserError('--tokens: must be positive')", 2),
    "bug": ("RuntimeError('a bug')", 1),
}


def ends(ending: str, abandoned: bool, under_torchrun: bool) -> subprocess.CompletedProcess:
    marker = f"teardown-{random.randrange(1 << 30)}"
    script = textwrap.dedent(f"""
        import atexit
        import sys
        import typer
        from overlapbench import cli
        from overlapbench.distributed import runtime
        from overlapbench.errors import UserError

        atexit.register(print, {marker!r}, flush=True)

        def command():
            runtime._abandoned = {abandoned}
            raise {ENDINGS[ending][0]}

        try:
            cli.user_errors(command)()
        except typer.Exit as e:  # as typer's command runner turns it into the exit code
            sys.exit(e.exit_code)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    if under_torchrun:
        env |= {"RANK": "0", "WORLD_SIZE": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env | {"PYTHONPATH": str(REPO)}, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    done.marker = marker
    return done


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_an_abandoned_worker_ends_at_once_with_the_command_s_code(ending):
    done = ends(ending, abandoned=True, under_torchrun=True)
    assert done.returncode == ENDINGS[ending][1], done.stderr
    assert done.marker not in done.stdout, "Python's teardown ran: its destructors would unmap symmetric memory"
    if ending == "bug":  # the traceback is still printed, once
        assert done.stderr.count("Traceback") == 1 and "RuntimeError: a bug" in done.stderr, done.stderr


@pytest.mark.parametrize("ending", sorted(ENDINGS))
@pytest.mark.parametrize("abandoned, under_torchrun", [(False, True), (True, False)],
                         ids=["not abandoned", "not a worker"])
def test_otherwise_the_process_exits_through_python_s_teardown(ending, abandoned, under_torchrun):
    done = ends(ending, abandoned, under_torchrun)
    assert done.returncode == ENDINGS[ending][1], done.stderr
    assert done.marker in done.stdout
    if ending == "bug":
        assert done.stderr.count("Traceback") == 1, done.stderr


@pytest.mark.parametrize("ending", [None, "interrupt"], ids=["finished", "interrupted"])
def test_a_stop_signal_while_a_worker_exits_prints_nothing(ending):
    """SIGTERM during the interpreter's exit, as torchrun sends it a second time, turned into
    KeyboardInterrupt by the sweep's handler: the worker ends with its command's code, quietly."""
    script = textwrap.dedent(f"""
        import atexit, os, signal, sys, time
        import typer
        from overlapbench import cli
        from overlapbench.launch.watchdog import interrupt_on_sigterm

        def during_exit():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs here, if any

        atexit.register(during_exit)

        def command():
            interrupt_on_sigterm()
            if {ending!r} == "interrupt":
                raise KeyboardInterrupt()

        try:
            cli.user_errors(command)()
        except typer.Exit as e:
            sys.exit(e.exit_code)
    """)
    env = os.environ | {"RANK": "1", "WORLD_SIZE": "2", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == (130 if ending else 0) and done.stderr == "", (done.returncode, done.stderr)
