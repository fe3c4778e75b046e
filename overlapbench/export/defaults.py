"""The engine's default against the tuned choice: at each measured batch, what the engine's
built-in defaults run on this GPU and TP for this shape, the row of ours that stands for it, and
what it costs against the tuned pick (engine ms / tuned ms, with tune's interval).

A stand-in is one of our settings: `fused_norm` (the setting tune settles on there) for a fused
all-reduce + RMSNorm, the reference `baseline` (NCCL, default knobs) for an NCCL all-reduce, the
faster `baseline allreduce=one_shot|two_shot` row for a symmetric-memory all-reduce. Where the rows
hold no stand-in, or the engine's choice cannot be told from its tables, the table says so
instead of a number.
"""

from __future__ import annotations

from dataclasses import dataclass

from overlapbench.errors import UserError
from overlapbench.export import sglang_facts, tokenweave_facts, trtllm_facts, vllm_facts
from overlapbench.export.picks import MIB, capability, dtype_bytes, hidden
from overlapbench.export.tokenweave import family_of
from overlapbench.tuned import TunedConfig
from overlapbench.tuning import analysis, batches, origin, tune
from overlapbench.tuning.analysis import Measured

SYMM = ("one_shot", "two_shot")


@dataclass(frozen=True)
class Default:
    """What an engine's defaults run at one batch size: in its words, and the kind of our row
    that stands for it (None, with `why`, where none can)."""

    text: str
    kind: str | None
    why: str | None = None


def vllm(config: TunedConfig, tokens: int) -> Default:
    cap, size = capability(config.device), tokens * hidden(config) * dtype_bytes(config)
    mb = vllm_facts.FUSION_MAX_MB.get(cap or 0, {}).get(config.tp)
    if mb is None:
        return Default("?", None, f"no built-in fusion bound recorded for {config.device} at TP={config.tp}")
    bound = int(mb * MIB) // (hidden(config) * dtype_bytes(config))
    if tokens <= bound:
        return Default(f"FlashInfer all-reduce + RMSNorm fusion (to {bound} tokens)", "fused_norm")
    if size <= mb * MIB:  # FlashInfer's standalone all-reduce takes messages up to the same bound
        return Default(f"FlashInfer all-reduce, unfused ({size / MIB:g} MiB)", "symm")
    return Default(f"pynccl all-reduce ({size / MIB:g} MiB)", "nccl")


def sglang(config: TunedConfig, tokens: int) -> Default:
    size = tokens * hidden(config) * dtype_bytes(config)
    if size <= sglang_facts.CUSTOM_AR_MAX_BYTES:  # fusion is off by default for a dense model
        return Default(f"custom all-reduce, unfused ({size / MIB:g} MiB)", "symm")
    return Default(f"NCCL all-reduce, unfused ({size / MIB:g} MiB)", "nccl")


def tokenweave(config: TunedConfig, tokens: int) -> Default:
    family = family_of(config)
    if config.tp not in tokenweave_facts.SHIPPED[family]:
        return Default("-", None, f"TokenWeave ships no {family}_config_{config.tp}.json; its model file needs one")
    if tokens < tokenweave_facts.SPLIT_FROM[family]:
        return Default(f"fuse-only, {tokenweave_facts.BUILTIN_CTAS} CTAs", f"fused_norm@{tokenweave_facts.BUILTIN_CTAS}")
    return Default("its shipped config's split", None, "its shipped entries are not recorded here")


def trtllm(config: TunedConfig, tokens: int) -> Default:
    return Default(f"{trtllm_facts.DEFAULT_STRATEGY} (autotuned at warm-up)", None,
                   "the autotuner times its candidates on the machine: not predictable from rows")


ENGINES = {"vllm": vllm, "sglang": sglang, "tokenweave": tokenweave, "trtllm": trtllm}
SOURCES = {"vllm": vllm_facts.FUSION_DEFAULT_SOURCE, "sglang": sglang_facts.SOURCE, "tokenweave": tokenweave_facts.SOURCE,
           "trtllm": trtllm_facts.SOURCE}


def stand_in(kind: str, rows: list[Measured]) -> Measured | None:
    """Our row for an engine's choice at one batch (see the module docstring)."""
    if kind == "nccl":
        ref = analysis.reference(rows)
        return ref if ref is not None and ref.strategy == "baseline" and analysis.default_knobs(ref.knobs) else None
    if kind == "symm":
        symm = [m for m in rows if m.strategy == "baseline" and m.knobs.get("allreduce") in SYMM and m.checked]
        return min(symm, key=lambda m: m.ms) if symm else None
    if kind.startswith("fused_norm@"):
        ctas = int(kind.partition("@")[2])
        return next((m for m in rows if m.strategy == "fused_norm" and m.checked and m.knobs.get("comm_ctas") == ctas
                     and m.knobs.get("comm", "fused") == "fused"), None)
    if kind == "fused_norm":
        fused = [m for m in rows if m.strategy == "fused_norm" and m.knobs.get("comm", "fused") == "fused"]
        return tune.settled_per_strategy(fused).get("fused_norm")
    raise ValueError(f"unknown stand-in kind {kind!r}")


MISSING = {"symm": "rows hold no symmetric-memory all-reduce (baseline allreduce=one_shot/two_shot)",
           "nccl": "rows hold no baseline at default knobs", "fused_norm": "rows hold no fused_norm"}


@dataclass(frozen=True)
class Line:
    """One batch: the engine's default, its stand-in row, the tuned pick's row, the cost."""

    label: str
    default: Default
    engine_row: Measured | None
    tuned_row: Measured | None
    cost: tune.Gain | None  # engine ms / tuned ms
    note: str


def lines(engine: str, config: TunedConfig, rows: list[Measured]) -> list[Line]:
    """A line per measured batch of the config's group, smallest first."""
    out = []
    for tokens, at in sorted(_by_tokens(rows).items()):
        for composed in batches.by_batch(at).values():
            out.append(_line(engine, config, tokens, composed))
    return out


def _by_tokens(rows: list[Measured]) -> dict[int, list[Measured]]:
    out: dict[int, list[Measured]] = {}
    for m in rows:
        out.setdefault(m.tokens, []).append(m)
    return out


def _line(engine: str, config: TunedConfig, tokens: int, rows: list[Measured]) -> Line:
    default = ENGINES[engine](config, tokens)
    choice = config.choose(tokens)
    tuned_row = next((m for m in rows if m.strategy == choice.strategy and m.knobs == choice.knobs), None)
    engine_row = stand_in(default.kind, rows) if default.kind else None
    note = default.why or ("" if engine_row is not None else MISSING.get(default.kind, "no stand-in row"))
    if tuned_row is None:
        note = "; ".join(filter(None, [note, "the tuned pick's row is not among these rows"]))
    cost = tune.gain(tuned_row, engine_row) if engine_row is not None and tuned_row is not None else None
    if engine_row is not None and engine_row is tuned_row:
        cost = tune.Gain(1.0, 1.0, 1.0, "same row")
    return Line(batches.batch_label(rows[0]), default, engine_row, tuned_row, cost, note)


def markdown(engine: str, config: TunedConfig, rows: list[Measured], source: str) -> str:
    """The table for one tuned config, with the rows it came from named."""
    head = (f"### {engine} defaults vs tuned: {config.model} TP={config.tp} {config.device} {config.dtype}\n\n"
            f"Tuned config: {source}; rows: {', '.join(sorted({m.source for m in rows}))}; "
            f"the engine's defaults: {SOURCES[engine]}.\n\n"
            "| tokens | engine default | our stand-in | ms | tuned pick | ms | default costs |\n"
            "|---|---|---|---|---|---|---|\n")
    body = "".join(_row(line) for line in lines(engine, config, rows))
    return head + body


def _row(line: Line) -> str:
    stand = line.engine_row.describe() if line.engine_row else "-"
    tuned = line.tuned_row.describe() if line.tuned_row else "-"
    cost = _cost(line.cost, line.tuned_row) if line.cost else line.note
    return (f"| {line.label} | {line.default.text} | {stand} | {_ms(line.engine_row)} | {tuned} | {_ms(line.tuned_row)} "
            f"| {cost} |\n")


def _ms(m: Measured | None) -> str:
    return f"{m.ms:.4g}" if m is not None else "-"


def _cost(g: tune.Gain, tuned_row: Measured) -> str:
    """The cost in percent with its interval and how it was had: `(paired)` a measurement timed
    interleaved; `(predicted, ±E%)` a prediction, E its model's assumed error in the same percent."""
    if g.method == "same row":
        return "0 (the same setting)"
    how = g.method
    if g.method == origin.PREDICTED and tuned_row.model_error is not None:
        how = f"{origin.PREDICTED}, ±{tuned_row.model_error * 100:.1f}%"
    return f"{(g.speedup - 1) * 100:+.1f}% [{(g.lo - 1) * 100:+.1f}, {(g.hi - 1) * 100:+.1f}] ({how})"


def check_engine_version(engine: str, version: str | None) -> None:
    """Defaults are recorded for one release per engine; another is refused, not guessed."""
    if engine == "vllm" and version not in (None, vllm_facts.DEFAULT_VERSION):
        raise UserError(f"--engine-version: vllm's defaults are recorded for {vllm_facts.DEFAULT_VERSION} only; "
                        f"drop --engine-version with --defaults")
