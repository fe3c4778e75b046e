"""`overlapbench models`: the model presets and their shapes, or the shape read from a Hugging Face
config.json (what `model: FILE.json` in a spec measures)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from overlapbench import printing


@dataclass(kw_only=True)
class Options:
    """List the model presets and their shapes (the attention details and MoE fields beside
    the sizes); with --config, the shape of one Hugging Face config.json."""

    config: Annotated[Path | None, typer.Option("--config", metavar="FILE.json", help="Show the shape read from a Hugging Face config.json (what `model: FILE.json` in a spec measures): each field, the JSON field it came from, and what is not modelled.")] = None


def main(options: Options) -> int:
    console = printing.console()
    if options.config is None:
        show_models(console)
    else:
        show_config(console, options.config)
    return 0


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
