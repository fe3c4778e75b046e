"""The header lines every judged export shares (vLLM, SGLang, TensorRT-LLM): what it runs at each
measured batch against the engine's default, what the tuned picks it does not follow would add,
the step sizes the engine does not reach by default, what a host without NVLink multicast runs,
and whether the rows can stand for a GPU engine at all."""

from __future__ import annotations

from overlapbench.export.choice import Choice, Line
from overlapbench.export.picks import Engine, capability, picks
from overlapbench.export.stand_ins import missing
from overlapbench.tuned import TunedConfig
from overlapbench.tuning import origin, tune
from overlapbench.tuning.analysis import Measured


def gain_text(g: tune.Gain | None, row: Measured | None = None) -> str:
    """A speedup as a percentage with tune's interval and how it was had: '+4.0% [+3.5, +4.5]
    (paired)' for rows timed interleaved; '(predicted, ±6.0%)' for `overlapbench predict`'s rows,
    whose interval is the model's assumed error (`row`: one of them, which recorded it)."""
    if g is None:
        return "?"
    if g.method == "same row":
        return "+0.0% (the same row)"
    if not g.decided:
        return f"{(g.speedup - 1) * 100:+.1f}% (too few samples for an interval)"
    how = g.method
    if g.method == origin.PREDICTED and row is not None and row.model_error is not None:
        how = f"{origin.PREDICTED}, ±{row.model_error * 100:.1f}%"
    return f"{(g.speedup - 1) * 100:+.1f}% [{(g.lo - 1) * 100:+.1f}, {(g.hi - 1) * 100:+.1f}] ({how})"


def rows_warnings(config: TunedConfig, engine: str) -> list[str]:
    """Rows that cannot stand for a GPU engine, said so."""
    if capability(config.device) is None:
        return [f"the rows are of {config.device!r}, not a GPU {engine} serves on with the facts read here (SM90): "
                f"their timings do not stand for its kernels, so every default is kept"]
    return []


def measured(choice: Choice, engine: str) -> list[str]:
    """A line per measured batch: what the export runs there and the default, and what it gains."""
    out = []
    for line in choice.lines:
        where = f"{line.label} tokens" + (" (above the default step cap)" if line.above_cap else "")
        if line.chosen == line.default:
            out.append(f"{where}: {line.chosen.text}, {engine}'s default ({_ms(line.default, line.default_row)})")
        else:
            out.append(f"{where}: {line.chosen.text} ({_ms(line.chosen, line.chosen_row)}) instead of the default "
                       f"{line.default.text} ({_ms(line.default, line.default_row)}): {gain_text(line.cost, line.default_row)}")
    return out


def _ms(path, row) -> str:
    return f"{row.describe()}: {row.ms:.4g} ms" if row is not None else f"no stand-in: {missing(path)}"


def not_followed(config: TunedConfig, choice: Choice, engine: Engine, version: str | None) -> list[str]:
    """A warning per tuned range whose pick the export does not run where it measured faster: why
    (`engine.why_not`: the engine has no such thing; else no setting that runs it stays no slower
    than the default everywhere), and what it would add at each measured count of the range."""
    out = []
    for p in picks(config):
        inside = [line for line in choice.lines if p.lo <= line.tokens <= p.hi and _faster(line)]
        if not inside:
            continue
        why = engine.why_not(p, version) or (f"{engine.title} can run it, but no setting that does stays no slower "
                                             f"than {engine.title}'s default at every measured count")
        adds = "; ".join(f"{line.label}: {gain_text(line.beyond, line.tuned_row)}" for line in inside)
        out.append(f"{p.text()}: {why}; it would be faster than what the export runs by {adds}")
    return out


def _faster(line: Line) -> bool:
    return (line.tuned_row is not None and line.chosen_row is not None and line.tuned_row is not line.chosen_row
            and line.tuned_row.ms < line.chosen_row.ms)


def step_cap(choice: Choice, cap: int | None, engine: str, how: str) -> list[str]:
    """The measured counts above the engine's default step size: it reaches them only when told."""
    above = [line.tokens for line in choice.lines if line.above_cap]
    if cap is None:
        return [f"{engine}'s default step cap on this GPU is not recorded here: every measured count is taken as reachable"]
    if not above:
        return [f"{engine} runs at most {cap} tokens a step by default on this GPU ({how}); every measured count is below"]
    counts = sorted(set(above))
    which = f"the measured count {counts[0]} is" if len(counts) == 1 else \
        f"the measured counts {', '.join(map(str, counts))} are"
    return [f"{engine} runs at most {cap} tokens a step by default on this GPU ({how}): {which} reached only with a "
            f"larger cap (this export does not raise it; its settings hold there too)"]


def multicast(choice: Choice) -> list[str]:
    """What a host without NVLink multicast (no NVSwitch) runs where the default or the export
    relies on it."""
    if not choice.without_multicast:
        return ["host: no path here needs NVLink multicast (none turns itself off on a host without NVSwitch)"]
    parts = []
    for tokens, default, ours in choice.without_multicast:
        parts.append(f"{tokens}: {ours.text}" + ("" if ours == default else f" (the default: {default.text})"))
    return ["on a host without NVLink multicast (no NVSwitch) the symmetric-memory paths turn themselves off; there it "
            "runs " + "; ".join(parts) + " (judged there too: still no slower than the default)"]
