"""Grids as rich tables, markdown, CSV or JSON records; knob settings moved below a table too wide."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace

from rich.console import Console
from rich.table import Table
from rich.text import Text

from overlapbench import printing
from overlapbench.report.cells import NOISY, STAR, Grid, Shown

# -- rendering -----------------------------------------------------------------------------


def to_rich(grid: Grid) -> Table:
    multiline = any(len(c.all_lines()) > 1 for row in grid.rows for c in row)
    lines = printing.COMPACT if grid.compact else {"show_lines": multiline}
    table = Table(title=Text(grid.title, style="bold"), title_justify="left", **lines)
    for i, name in enumerate(grid.header):  # squeezed, a cell wraps (folds), never cuts
        right = i == 0 or all(row[i].right for row in grid.rows if i < len(row))
        table.add_column(name, justify="right" if right else "left", overflow="fold")
    for row in grid.rows:
        table.add_row(*(_rich_cell(c) for c in row))
    return table


def _rich_cell(cell: Shown) -> Text:
    text = Text("\n".join(cell.all_lines()), style="bold" if cell.best else "")
    if cell.best:
        text.append(f" {STAR}", style="bold green")
    if cell.mark:
        text.append(f" {cell.mark}", style="yellow" if cell.mark == NOISY else "bold red")
    return text


def to_markdown(grid: Grid) -> str:
    def cell(c: Shown) -> str:
        body = ", ".join(c.all_lines()).replace("|", "\\|")
        body = f"**{body}** {STAR}" if c.best else body
        return body + (f" {c.mark}" if c.mark else "")

    lines = ["| " + " | ".join(grid.header) + " |", "|" + "|".join(["---:"] + ["---"] * (len(grid.header) - 1)) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in grid.rows]
    return f"### {grid.title}\n\n" + "\n".join(lines) + "\n"


def to_csv(records: list[dict]) -> str:
    import pandas as pd

    flat = [{k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()} for r in records]
    return pd.DataFrame(flat).to_csv(index=False)


def emit(grids: list[Grid], records: list[dict], fmt: str, console: Console,
         legend: str | None = None, notes: Iterable[str] = ()) -> None:
    """Print in the asked format. The legend and notes (row counts, failures) go under tables;
    with csv and json stdout holds the data alone and the notes go to stderr."""
    notes = list(notes)
    if fmt == "table":
        for grid in grids:
            print_grid(grid, console)
        for note in ([legend] if legend else []) + notes:
            console.print(Text(note, style="dim"), soft_wrap=False)  # prose: word-wrapped at the width
    elif fmt == "markdown":
        text = "\n".join(to_markdown(g) for g in grids)
        text += f"\n{legend}\n" if legend else ""
        text += "".join(f"\n- {n.strip()}" for n in notes)
        console.out(text, highlight=False)
    else:
        text = to_csv(records) if fmt == "csv" else json.dumps(records, indent=2, default=str) + "\n"
        console.file.write(text)
        console.file.flush()
        for note in notes:
            stderr_console().print(note, highlight=False)


def print_grid(grid: Grid, console: Console) -> None:
    """The table in full. Where it is wider than the console (a pipe counts as 80 columns), the
    knob settings move under it (a tag in the cell, its meaning below); where that is still too
    wide, the grid's stacked form (a line per cell) takes its place; whatever is still too wide
    wraps, or goes to a pipe unsqueezed."""
    table = to_rich(grid)
    if printing.fits(console, table):
        console.print(table)
        return
    tagged, legend = knobs_below(grid)
    if grid.stacked is not None and not printing.fits(console, to_rich(tagged)):
        print_grid(grid.stacked, console)
        return
    printing.print_table(console, to_rich(tagged))
    if legend:
        console.print(Text("knob settings of the cells:", style="dim"))
    for tag, knobs in legend.items():
        console.print(Text(f"  {tag}: {knobs}"), soft_wrap=False, overflow="fold")


def knobs_below(grid: Grid) -> tuple[Grid, dict[str, str]]:
    """The grid with each cell's knob setting replaced by a short tag (k1, k2, ...), and the tags'
    meanings."""
    tags: dict[str, str] = {}
    for row in grid.rows:
        for cell in row:
            if cell.knobs and cell.knobs not in tags:
                tags[cell.knobs] = f"k{len(tags) + 1}"
    rows = [[replace(c, knobs=tags[c.knobs]) if c.knobs else c for c in row] for row in grid.rows]
    return replace(grid, rows=rows), {tag: knobs for knobs, tag in tags.items()}


def stderr_console() -> Console:
    return printing.console(stderr=True)


