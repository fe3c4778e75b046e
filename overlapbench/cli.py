"""The command line: the table of commands.

Each command is one folder's `command.py`: an `Options` dataclass (each option declared once, with
its help, as typer reads it; its docstring is the command's help) and `main(options)`, which
returns the exit code. This module turns each into a typer command, ends user errors and Ctrl-C
in one line, and tidies the help. The command modules import no torch, so `--help` is fast.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import os
import typing

import typer

from overlapbench import printing
from overlapbench.errors import UserError

# (command, the module that holds its Options and main), in the order `--help` lists them.
COMMANDS = (
    ("sweep", "overlapbench.run.command"),
    ("comm", "overlapbench.comm.command"),
    ("predict", "overlapbench.predict.command"),
    ("tune", "overlapbench.tuning.command"),
    ("export", "overlapbench.export.command"),
    ("report", "overlapbench.report.command"),
    ("strategies", "overlapbench.strategies.command"),
    ("models", "overlapbench.model.command"),
    ("env", "overlapbench.launch.command"),
)

app = typer.Typer(
    help="Benchmark and autotune compute/communication overlap for tensor-parallel LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # docstrings wrap as paragraphs
)
console = printing.console()
err_console = printing.console(stderr=True)


def user_errors(fn):
    """Bad input ends the command with one line on stderr and exit code 2, no traceback;
    Ctrl-C with one line (what was kept, how to go on) and exit code 130. A worker whose run
    left kernels queued on its GPU ends there and then (launch.end_worker); any other ignores
    stop signals from then on, while it exits (launch.ignore_stops_while_exiting)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from overlapbench.launch import launch, launch_log

        try:
            return fn(*args, **kwargs)
        except UserError as e:
            if os.environ.get("RANK", "0") == "0":  # under torchrun, say it once
                err_console.print(printing.styled(("error:", "bold red"), f" {e}"), soft_wrap=True)
            launch.end_worker(UserError.exit_code)
            raise typer.Exit(UserError.exit_code) from None
        except (launch.Interrupted, KeyboardInterrupt) as e:
            if os.environ.get("RANK", "0") == "0" and not launch.relaunched():  # the parent speaks for its workers
                try:
                    err_console.print(str(e) if isinstance(e, launch.Interrupted) and str(e) else "interrupted", soft_wrap=True)
                except OSError:  # the terminal is gone (a hang-up): nobody to tell
                    pass
            launch.end_worker(launch_log.INTERRUPTED)
            raise typer.Exit(launch_log.INTERRUPTED) from None
        except Exception:  # a bug: its traceback as Python prints it (a relaunched worker's: to the launch log)
            launch.end_worker(1, uncaught=True)
            raise
        finally:
            launch.ignore_stops_while_exiting()

    return wrapper


def typer_command(name: str, options: type, main: typing.Callable[[typing.Any], int | None]):
    """A function typer reads as the command: its parameters are the fields of `options` (their
    annotations carry the typer declarations), its help is the dataclass's docstring; it builds
    the Options and exits with `main`'s code."""
    hints = typing.get_type_hints(options, include_extras=True)
    empty = inspect.Parameter.empty
    parameters = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[f.name],
                                    default=empty if f.default is dataclasses.MISSING else f.default)
                  for f in dataclasses.fields(options)]

    def command(**values) -> None:
        code = main(options(**values))
        if code:
            raise typer.Exit(code)

    command.__name__ = command.__qualname__ = name
    command.__doc__ = options.__doc__
    command.__signature__ = inspect.Signature(parameters)
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    return command


for _name, _module in COMMANDS:
    _loaded = importlib.import_module(_module)
    app.command(_name)(user_errors(typer_command(_name, _loaded.Options, _loaded.main)))


def _version(value: bool) -> None:
    if value:
        from overlapbench import __version__

        console.print(f"overlapbench {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Benchmark and autotune compute/communication overlap for tensor-parallel LLM inference."""


def command():
    """The command behind `app`, its help tidied: a flag takes no value, so it shows no
    `<bool>` placeholder (typer prints one beside every flag, --help included); an argument's
    name (SPEC.yaml, RESULTS.jsonl) says what it takes, without a `<list[Path]>` type beside it.

    Through typer's own API only: typer 0.29 carries its own copy of click and does not install
    the `click` package, so nothing here may import it."""
    root = typer.main.get_command(app)
    for cmd in [root, *getattr(root, "commands", {}).values()]:
        for param in cmd.get_params(typer.Context(cmd)):
            if getattr(param, "is_flag", False):
                param.metavar = ""
            elif param.param_type_name == "argument":
                param.display_type_rich = lambda ctx: None
    return root


def main() -> None:
    command()(prog_name="overlapbench")


if __name__ == "__main__":
    main()
