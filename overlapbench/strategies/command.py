"""`overlapbench strategies`: every registered strategy (plugins included), where it runs, and its
knobs with their domains, defaults and help."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console

from overlapbench import printing


@dataclass(kw_only=True)
class Options:
    """List the strategies, where they run, and their knobs with domains and help."""


def main(options: Options) -> int:
    show_strategies(printing.console())
    return 0


def show_strategies(console: Console) -> None:
    from overlapbench.strategies import all_strategies, load_plugins
    from overlapbench.strategies.knobs import show_value

    load_plugins()
    for cls in all_strategies():
        needs = cls.needs
        where = "CUDA" if needs.cuda else "CPU (gloo) and CUDA"
        if needs.symmetric_memory:
            where += ", symmetric memory"
        if needs.min_world_size > 1:
            where += f", >= {needs.min_world_size} ranks"
        # prose: wrapped at words to the width (a pipe: 80 columns)
        console.print(printing.styled((cls.name, "bold"), f": {cls.summary}"), soft_wrap=False)
        console.print(printing.styled((f"runs on {where}; workloads: {', '.join(needs.workloads)}", "dim")), soft_wrap=False)
        table = printing.table("knob", "domain", "default", "what it does", keep=("knob",), show_edge=False)
        for knob in cls.knobs:
            table.add_row(knob.name, knob.domain(), show_value(knob.default), knob.help)
        if not cls.knobs:
            table.add_row("-", "-", "-", "no knobs")
        console.print(table)  # long help wraps at the width (a pipe: 80 columns), never cut
        console.print()
