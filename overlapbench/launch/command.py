"""`overlapbench env`: what the tool sees of this machine, the facts every result row carries."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Annotated

import typer

from overlapbench import printing


@dataclass(kw_only=True)
class Options:
    """What the tool sees: devices and their links, versions, symmetric memory, multicast
    settings, world size. The same facts go into every result row."""

    as_json: Annotated[bool, typer.Option("--json", help="Print the facts as JSON.")] = False


def main(options: Options) -> int:
    """The facts as YAML (as specs are written), the topology below; or as JSON."""
    from overlapbench.launch import environment

    console = printing.console()
    facts = environment.local_devices() | {
        "versions": environment.versions(),
        "git": environment.git_commit(),
        "world_size": int(os.environ.get("WORLD_SIZE", 1)),
    }
    if options.as_json:
        console.print_json(json.dumps(facts))
        return 0
    topology = facts.pop("topology", None)
    import yaml

    # YAML, as specs are written: null and true, nested facts indented, long text wrapped at 80
    plain = json.loads(json.dumps(facts, default=str))  # version objects as their text
    console.print(yaml.safe_dump(plain, sort_keys=False, width=78, allow_unicode=True).rstrip(), soft_wrap=True)
    if topology:
        console.print(topology)
    return 0
