"""The CLI's help: what users read first."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from overlapbench.cli import app

COMMANDS = [c.name or c.callback.__name__ for c in app.registered_commands]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_keeps_every_placeholder(command):
    """The help renders as markdown, which drops anything that looks like an HTML tag:
    'results/<name>.jsonl' would print as 'results/.jsonl'."""
    click_command = typer.main.get_command(app).commands[command]
    for param in click_command.params:
        text = getattr(param, "help", None) or ""
        assert not re.search(r"<[A-Za-z/]", text), f"{command} {param.name}: {text!r}"
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0 and "Usage" in result.output
