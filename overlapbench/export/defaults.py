"""`export --defaults`: at each measured batch of the rows behind a tuned config, what the engine's
built-in defaults run (as its code has them, *_facts.py), what the export runs, each with the row
of ours that stands for it (stand_ins.py), what the default costs against the export (default ms /
export ms, tune's interval), and the tuned pick with what it would add over the export where the
engine does not run it. The same choice as the export's (choice.py): row by row the export's time
is never above the default's.

TokenWeave's default cannot be priced (it ships no TP=2 file; its shipped entries are not priced
here): its table shows the default against the tuned pick only.
"""

from __future__ import annotations

from overlapbench.export.choice import Choice, Line, choose
from overlapbench.export.notes import gain_text
from overlapbench.export.picks import Engine
from overlapbench.export.stand_ins import missing
from overlapbench.tuned import TunedConfig
from overlapbench.tuning.analysis import Measured


def choice(engine: Engine, config: TunedConfig, rows: list[Measured], version: str | None) -> Choice:
    return choose(engine.model(config, version), config, rows)


def markdown(engine: Engine, config: TunedConfig, rows: list[Measured], source: str, version: str | None = None) -> str:
    """The table for one tuned config, with the rows it came from named; an engine whose export
    is not judged (TokenWeave) against its default only."""
    engine_model = engine.model(config, version)
    chosen = choose(engine_model, config, rows)
    release = f" {engine_model.version}" if engine_model.version else ""
    versus = "defaults vs export vs tuned" if engine.judged else "defaults vs tuned"
    head = (f"### {engine.name}{release} {versus}: {config.model} TP={config.tp} {config.device} {config.dtype}\n\n"
            f"Tuned config: {source}; rows: {', '.join(sorted({m.source for m in rows}))}; the engine's defaults: "
            f"overlapbench/export/{engine.name}_facts.py.")
    cap = engine_model.step_cap()
    if cap is not None:
        head += f" Counts above {cap} (its default step cap on this GPU) run only with a larger cap."
    if not engine.judged:
        return head + (" Its default cannot be priced, so its export is not judged against it.\n\n"
                       "| tokens | engine default | our stand-in | ms | tuned pick | ms | default costs |\n"
                       "|---|---|---|---|---|---|---|\n") + "".join(_tokenweave_row(line) for line in chosen.lines)
    return head + ("\n\n| tokens | engine default | ms | export | ms | default costs | tuned pick | ms | "
                   "the pick over the export |\n|---|---|---|---|---|---|---|---|---|\n"
                   + "".join(_row(line) for line in chosen.lines))


def _tokens(line: Line) -> str:
    return line.label + (" (above the cap)" if line.above_cap else "")


def _row(line: Line) -> str:
    same = line.chosen == line.default
    export = "the default" if same else line.chosen.text
    if same:
        cost = "0 (the same setting)"
    else:
        cost = gain_text(line.cost, line.default_row) if line.cost else "?"
    beyond = ("-" if line.tuned_row is None or line.tuned_row is line.chosen_row or line.beyond is None
              else gain_text(line.beyond, line.tuned_row))
    return (f"| {_tokens(line)} | {line.default.text} | {_stand(line.default, line.default_row)} | {export} | "
            f"{_stand(line.chosen, line.chosen_row)} | {cost} | {_describe(line.tuned_row)} | {_ms(line.tuned_row)} "
            f"| {beyond} |\n")


def _tokenweave_row(line: Line) -> str:
    cost = gain_text(line.beyond, line.tuned_row) if line.default_row is not None and line.tuned_row is not None else (
        missing(line.default) if line.default_row is None else "the tuned pick's row is not among these rows")
    return (f"| {_tokens(line)} | {line.default.text} | {_describe(line.default_row)} | {_ms(line.default_row)} | "
            f"{_describe(line.tuned_row)} | {_ms(line.tuned_row)} | {cost} |\n")


def _stand(path, row: Measured | None) -> str:
    return f"{row.describe()}: {row.ms:.4g}" if row is not None else f"- ({missing(path)})"


def _describe(m: Measured | None) -> str:
    return m.describe() if m is not None else "-"


def _ms(m: Measured | None) -> str:
    return f"{m.ms:.4g}" if m is not None else "-"
