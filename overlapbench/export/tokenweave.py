"""TokenWeave: the `{family}_config_{TP}.json` its model files load, from the tuned ranges.

TokenWeave looks an entry up by the nearest key, not by range. Writing each range's first and last
token count as keys makes the lookup exact: a count inside a range is nearer to one of its own
ends than to any key outside it (those lie below its start or above its end). The split's on/off
switch (1024 tokens, 2048 for Mixtral) is code, not file, so ranges below it get no key.
"""

from __future__ import annotations

import json

from overlapbench.errors import UserError
from overlapbench.export import tokenweave_facts as facts
from overlapbench.export.picks import Engine, Export, Pick, comment, picks, provenance
from overlapbench.export.stand_ins import Path
from overlapbench.strategies import knobs as strategy_knobs
from overlapbench.tuned import TunedConfig
from overlapbench.tuning.analysis import Measured

NAME = "tokenweave"
RUNS = ("token_split", "fused_norm")  # its split, and its fuse-only path below the switch (entry_for)
STANDS_FOR = [
    "our token_split (comm=fused) stands for TokenWeave's split: the same cut ((n+255)&~255)//2 + split_offset with "
    "align 256, comm_ctas_attn/comm_ctas_mlp for attention_ctas/mlp_ctas; our fused all-reduce + add + RMSNorm kernel "
    "(peer loads, no multicast) is not TokenWeave's multimem kernel (NVLS): the CTA counts are an approximation",
    "our fused_norm stands for TokenWeave's fuse-only path (below the switch); baseline (NCCL) has no TokenWeave "
    "counterpart: TokenWeave always reduces with its fused kernel",
]


def family_of(config: TunedConfig) -> str:
    name = config.model.lower()
    family = next((f for f in facts.FAMILIES if name.startswith(f)), None)
    if family is None:
        raise UserError(f"model {config.model!r}: TokenWeave has model files for {', '.join(facts.FAMILIES)} only "
                        f"({facts.SOURCE}); export another engine for this model")
    return family


def file_name(config: TunedConfig) -> str:
    return f"{family_of(config)}_config_{config.tp}.json"


def entries(config: TunedConfig) -> tuple[dict[int, dict], list[str]]:
    """Key -> entry, ascending, and the warnings for picks TokenWeave cannot follow."""
    family = family_of(config)
    switch = facts.SPLIT_FROM[family]
    out: dict[int, dict] = {}
    warnings: list[str] = []
    for p in picks(config):
        if p.lo < switch:
            warnings += _below_switch(p, switch)
        lo = max(p.lo, switch)
        if lo > p.hi:
            continue
        entry, problem = entry_for(p)
        if problem:
            warnings.append(f"{lo}..{p.hi} tokens: {problem}")
        for key in sorted({lo, p.hi}):
            out[key] = entry
    return out, warnings


def _copy_engine_knobs(knobs: dict) -> str:
    """`; its ce_chunks=2 (...) has no counterpart either` for the copy-engine knobs a pick sets
    (present only where off their defaults: sparse knobs), none of which TokenWeave's fused kernel
    has; ''."""
    named = [f"{k.name}={knobs[k.name]} ({k.summary})" for k in strategy_knobs.COPY_ENGINE_KNOBS if k.name in knobs]
    if not named:
        return ""
    return f"; its {' and '.join(named)} {'has' if len(named) == 1 else 'have'} no counterpart either"


def entry_for(p: Pick) -> tuple[dict, str | None]:
    """The entry for one range, and what TokenWeave runs differently from our pick (None: nothing)."""
    builtin = _entry(facts.BUILTIN_CTAS, facts.BUILTIN_CTAS, 0)
    if p.kind == "token_split":
        if p.knobs.get("comm", "nccl") != "fused":
            return builtin | {"split_offset": p.knobs.get("split_offset", 0)}, (
                f"token_split with comm={p.knobs.get('comm', 'nccl')} picked; TokenWeave reduces with its fused kernel "
                f"only: entry keeps the cut (split_offset) and holds its built-in {facts.BUILTIN_CTAS} CTAs"
                f"{_copy_engine_knobs(p.knobs)}")
        if p.knobs.get("split_ratio") is not None:
            return builtin, "token_split with split_ratio picked; TokenWeave cuts at half plus an offset only: built-in entry"
        if p.knobs.get("chunks", 2) > 2:
            return builtin, (f"token_split with chunks={p.knobs['chunks']} picked; TokenWeave cuts the batch in two: "
                             "built-in entry")
        entry = _entry(p.knobs.get("comm_ctas_attn", 8), p.knobs.get("comm_ctas_mlp", 8), p.knobs.get("split_offset", 0))
        if p.knobs.get("gemm_carveout", 0):
            return entry, (f"token_split with gemm_carveout={p.knobs['gemm_carveout']} picked; TokenWeave's GEMMs use "
                           "every SM: the entry keeps the CTAs and the cut, not the carveout")
        if p.knobs.get("reduce_start", strategy_knobs.READY) != strategy_knobs.READY:
            return entry, (f"token_split with reduce_start={p.knobs['reduce_start']} picked; TokenWeave starts each "
                           "reduction as soon as its partial is ready: the entry keeps the CTAs and the cut, not the "
                           "later start")
        align = p.knobs.get("align", facts.SPLIT_ALIGN)
        if align != facts.SPLIT_ALIGN:
            return entry, f"token_split align={align} picked; TokenWeave rounds the cut to {facts.SPLIT_ALIGN}"
        return entry, None
    if p.kind == "fused_norm":
        ctas = p.knobs.get("comm_ctas", 8)
        return _entry(ctas, ctas, 0), ("fused_norm picked (no split); TokenWeave splits every batch from its switch on: "
                                       f"entry holds fused_norm's {ctas} CTAs, split_offset 0")
    return builtin, (f"{p.strategy} picked; TokenWeave cannot run it: entry holds its built-in "
                     f"{facts.BUILTIN_CTAS} CTAs, split_offset 0")


def _entry(attention: int, mlp: int, offset: int) -> dict:
    return {"attention_ctas": attention, "mlp_ctas": mlp, "split_offset": offset}


def _below_switch(p: Pick, switch: int) -> list[str]:
    hi = min(p.hi, switch - 1)
    if p.kind == "fused_norm":
        ctas = p.knobs.get("comm_ctas", 8)
        return [] if ctas == facts.BUILTIN_CTAS else [
            f"{p.lo}..{hi} tokens: fused_norm with {ctas} CTAs picked; below {switch} tokens TokenWeave's fuse-only path "
            f"runs the CTAs of the last entry read ({facts.BUILTIN_CTAS} before any), which the file cannot set"]
    return [f"{p.lo}..{hi} tokens: {p.strategy} picked; below {switch} tokens TokenWeave always runs its fuse-only path "
            f"(the switch is code, not file)"]


def render(table: dict[int, dict]) -> str:
    """The JSON as TokenWeave's own files lay it out: one key per line, ascending."""
    lines = [f"  {json.dumps(str(key))}: {json.dumps(entry)}" for key, entry in table.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


class Model:
    """TokenWeave's default for `--defaults`: below its split switch the fuse-only path on its
    built-in CTAs; above, its shipped file's split (not priced), or no file at a TP it ships none
    for. Its only setting is the file itself, which the export writes."""

    engine = NAME
    version = None

    def __init__(self, config: TunedConfig):
        self.config, self.family = config, family_of(config)

    def default(self) -> str:
        return "shipped"

    def candidates(self, counts: list[int]) -> list[str]:
        return ["shipped"]

    def step_cap(self) -> int | None:
        return None

    def runs(self, setting: str, tokens: int, multicast: bool) -> Path:
        if self.config.tp not in facts.SHIPPED[self.family]:
            return Path("-", (), f"TokenWeave ships no {self.family}_config_{self.config.tp}.json; its model file needs one")
        if tokens < facts.SPLIT_FROM[self.family]:
            return Path(f"fuse-only, {facts.BUILTIN_CTAS} CTAs", (f"fused_norm@{facts.BUILTIN_CTAS}",))
        return Path("its shipped config's split", (), "its shipped entries are not priced here")


def export(config: TunedConfig, rows: list[Measured], source: str, version: str | None = None) -> Export:
    if version is not None:
        raise UserError(f"--engine-version: TokenWeave has no releases; its facts are of {facts.SOURCE}; "
                        f"omit --engine-version")
    family = family_of(config)
    table, warnings = entries(config)
    if not table:  # TokenWeave's nearest-key lookup would fail on an empty file
        raise UserError(f"{source}: tuned up to {config.max_tokens} tokens, below TokenWeave's split switch at "
                        f"{facts.SPLIT_FROM[family]}: nothing for its config file; tune with larger batches")
    name = file_name(config)
    result = Export(NAME, None, source, warnings=warnings)
    offsets = {e["split_offset"] for e in table.values()}
    if offsets - {0} and not config.model.startswith(facts.RUNNER_MODEL_NAMES[family].lower()):
        warnings.append(
            f"the runner reads this file only for a model path containing {facts.RUNNER_MODEL_NAMES[family]!r}; otherwise "
            f"its attention split takes {facts.SPLIT_OFFSET_ENV} (one value) while the model file reads each entry's "
            f"split_offset: the two cuts disagree where the offsets vary ({sorted(offsets)})")
    result.header = [
        *provenance(config, source, NAME, None),
        f"facts from {facts.SOURCE}",
        "not judged against TokenWeave's defaults: it ships no file for TP 2 and its shipped entries are not priced "
        "here; this file is what its split needs to run the tuned ranges",
        f"install: copy {name} into <site-packages>/{facts.CONFIG_DIR}/ of TokenWeave's vllm (no flag or env var names "
        "another path); it holds one file per family and TP, so tuned configs of two llama shapes at one TP replace each other",
        f"cannot express: the split switch at {facts.SPLIT_FROM[family]} tokens (code, not file); the fuse-only path's CTAs "
        f"below it; a range (entries are looked up by the nearest key: each range's first and last count are keys)",
        *STANDS_FOR,
    ]
    if config.tp not in facts.SHIPPED.get(family, ()):
        result.header.append(f"TokenWeave ships no {family} config for TP={config.tp} (it ships TP {facts.SHIPPED[family]})")
    result.files[name] = render(table)
    result.files[name.replace(".json", ".notes.txt")] = comment(result.notes())
    return result


def model(config: TunedConfig, version: str | None) -> Model:
    if version is not None:
        raise UserError("--engine-version: TokenWeave has no releases; omit --engine-version")
    return Model(config)


def _cannot(p: Pick, version: str | None) -> str | None:
    return None if p.kind in RUNS else f"{p.strategy} picked; TokenWeave cannot run it"


# Not judged: it ships no file for TP 2 and its shipped entries are not priced, so its export is
# the file its split needs, written from the tuned picks alone (entry_for).
ENGINE = Engine(NAME, "TokenWeave", export, model, RUNS, _cannot, judged=False)
