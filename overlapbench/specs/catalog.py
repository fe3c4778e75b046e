"""What a spec may name, as `overlapbench strategies` and `overlapbench models` list it: the
strategies with their knobs, the model presets, and the shape read from a config.json."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from overlapbench import printing


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


def show_models(console: Console) -> None:
    """The presets and their shapes (the attention details and MoE fields below the table)."""
    from overlapbench.model.models import PRESETS

    columns = ("hidden", "ffn", "heads", "kv_heads", "head_dim", "eps", "rope_theta")
    table = printing.table("preset", *columns, keep=("preset",), **printing.COMPACT)
    notes = []
    for name, s in PRESETS.items():
        table.add_row(name, *(printing.plain_number(getattr(s, c)) for c in columns))
        extras = [text for on, text in ((s.qkv_bias, "qkv_bias"), (s.qk_norm, "qk_norm")) if on]
        if s.moe:
            extras.append(f"experts {s.experts}, top_k {s.top_k}, expert_ffn {s.expert_ffn}")
        if extras:
            notes.append(f"  {name}: {'; '.join(extras)}")
    printing.print_table(console, table)
    if notes:  # beside the table they would take it past 80 columns
        console.print(printing.styled(("attention details and experts (the others: none):", "dim")))
        for note in notes:
            console.print(note, soft_wrap=False)


def show_config(console: Console, path: Path) -> None:
    """The shape read from a Hugging Face config.json: each field and where it came from."""
    from overlapbench.model import hf_config

    read = hf_config.read(path)
    console.print(printing.styled((read.name, "bold"), f" (model name in rows; from {path})"), soft_wrap=True)
    table = printing.table("field", "value", "read from", keep=("field",))
    for name, value in read.shape.as_dict().items():
        table.add_row(name, str(value), read.sources.get(name, "default"))
    printing.print_table(console, table)
    for note in read.notes:
        console.print(printing.styled(("note:", "yellow"), f" {note}"), soft_wrap=True)
