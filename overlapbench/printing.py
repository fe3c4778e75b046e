"""Where the tool's text goes: consoles that print every string literally.

Messages quote user text (spec keys, paths, error strings) and our own brackets
(`'overlapbench[plot]'`, `{knob: [values]}`); rich would read both as markup. So no console
here interprets markup: our own colours are `Text` styles, given with `styled`.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text


def console(stderr: bool = False, **options) -> Console:
    """A console that prints strings as they are: no markup, no highlighting of numbers or
    paths, and a message longer than the width goes out as one line (a path is never broken);
    tables still fit themselves to the width."""
    return Console(stderr=stderr, markup=False, highlight=False, soft_wrap=True, **options)


def styled(*parts: str | tuple[str, str]) -> Text:
    """A line from plain strings and (text, style) pairs: `styled(("error:", "bold red"), " ", msg)`."""
    return Text.assemble(*parts)


COMPACT = {"box": None, "pad_edge": False}  # no lines: two spaces between columns, where boxes take three


def table(*columns: str, keep: tuple[str, ...] = (), **options) -> Table:
    """A table whose cells wrap (fold) when squeezed instead of being cut with an ellipsis;
    the `keep` columns (names users type, such as presets) never wrap."""
    t = Table(**options)
    for name in columns:
        t.add_column(name, no_wrap=name in keep, overflow="fold")
    return t


def natural_width(console: Console, renderable) -> int:
    """How wide `renderable` is when nothing squeezes it."""
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update_width(1 << 14), renderable).maximum


def fits(console: Console, renderable) -> bool:
    return natural_width(console, renderable) <= console.width


def print_table(console: Console, table) -> None:
    """A table in full: a pipe or a file gets it at its natural width (rich would assume 80
    columns and cut cells); a terminal gets it at the terminal's width."""
    if console.is_terminal:
        console.print(table)
        return
    width = console.width
    console.width = max(width, natural_width(console, table))  # print(width=) only narrows
    try:
        console.print(table)
    finally:
        console.width = width


def plain_number(x: float) -> str:
    """500000.0 as 500000 (as a spec would say it), 1e-05 as itself."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def gib(n: float) -> str:
    """Bytes in words: `12.3 GiB`, `85 MiB`, `<1 MiB`; past a TiB in the largest unit that fits
    (`1.5 TiB`, `406.6 ZiB`), so that an absurd size reads as one."""
    for unit, power in (("YiB", 80), ("ZiB", 70), ("EiB", 60), ("PiB", 50), ("TiB", 40)):
        if n >= 2**power:
            return f"{n / 2**power:,.1f} {unit}"
    if n >= 2**30 / 10:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else "<1 MiB"
