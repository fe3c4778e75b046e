"""SGLang: the `launch_server` flags for the TP all-reduce. SGLang has switches only (the fusion runs
up to a constant 2048 tokens, the all-reduce backends have no size to set); the export turns on or
off those that measure faster than SGLang's defaults and are slower nowhere (choice.py, against
sglang_engine's model of its code), and writes only what differs from the defaults."""

from __future__ import annotations

from dataclasses import dataclass

from overlapbench.export import notes, sglang_engine
from overlapbench.export import sglang_facts as facts
from overlapbench.export.choice import Choice, choose
from overlapbench.export.facts import find
from overlapbench.export.picks import SP_FAMILY, Engine, Export, Pick, comment, provenance
from overlapbench.tuned import TunedConfig
from overlapbench.tuning.analysis import Measured

NAME = "sglang"
RUNS = ("nccl", "nccl_symm", "two_shot", "fused_norm")  # the pick kinds SGLang has a counterpart of
STANDS_FOR = [
    "stand-ins: our fused_norm (one all-reduce + add + RMSNorm kernel on PyTorch symmetric memory) for FlashInfer's "
    "all-reduce fusion; baseline (NCCL) for NCCL; baseline allreduce=two_shot for --enable-torch-symm-mem at TP 2 "
    "(the same op); the faster of allreduce=one_shot/two_shot for SGLang's custom all-reduce (another kernel: an "
    "approximation); baseline nccl_symm=true for --enable-symm-mem; none for PyTorch's multimem all-reduce or mscclpp",
]
CANNOT = {
    "token_split": "SGLang has no switch for a token-split overlap",
    "iso": "SGLang has no switch for an ISO split",
    "one_shot": "SGLang's PyTorch symmetric-memory path runs two-shot at TP 2 (multimem from 4), never one-shot",
    "fused_norm_copy_engine": "SGLang's fusion is FlashInfer's kernel, not a copy-engine reduction",
}


def cannot(p: Pick) -> str | None:
    if p.kind in SP_FAMILY:
        return "SGLang has no switch for sequence parallelism of a dense model's layer"
    return CANNOT.get(p.kind)


@dataclass(frozen=True)
class Switch:
    """One of SGLang's all-reduce switches (a boolean field of sglang_engine.Setting) as the export
    writes it where it differs from SGLang's default: the launch_server flag that sets it and what it
    changes, in SGLang's words, with the line of SGLang's code behind it where one is cited. A new
    switch of SGLang's is one record here."""

    field: str  # the Setting field
    flag: str  # the launch_server flag that sets the non-default value
    says: str  # what setting it changes
    why: str = ""  # the reason, followed by the citation of `fact`
    fact: str = ""  # the sglang_facts key `why` rests on

    def differs(self, setting: sglang_engine.Setting) -> bool:
        return getattr(setting, self.field) != getattr(sglang_engine.Setting(), self.field)

    def change(self, release: str) -> str:
        """What turning it away from its default changes, with the fact's file and line in `release`."""
        if not self.fact:
            return self.says
        return f"{self.says} ({self.why}: {find(facts.FACTS, self.fact).cite(release)})"


SWITCHES = (
    Switch("fusion", facts.FUSION_FLAG, "turns FlashInfer's all-reduce + RMSNorm fusion on",
           "off for a dense model by default; it fuses batches of at most 2048 tokens, a constant", "FUSION_RULE"),
    Switch("custom_ar", facts.DISABLE_CUSTOM_AR, "turns SGLang's custom all-reduce off"),
    Switch("torch_symm", facts.TORCH_SYMM_MEM_FLAG, "turns PyTorch's symmetric-memory all-reduce on",
           "it runs at TP 2 too, two-shot", "TORCH_SYMM_TWO_SHOT"),
    Switch("nccl_symm", facts.NCCL_SYMM_FLAG, "turns NCCL's symmetric kernels on"),
)


def switched(setting: sglang_engine.Setting) -> list[Switch]:
    """The switches `setting` sets away from SGLang's defaults, in SWITCHES' order."""
    return [switch for switch in SWITCHES if switch.differs(setting)]


def flags(setting: sglang_engine.Setting) -> list[str]:
    """The flags for what differs from SGLang's defaults."""
    return [switch.flag for switch in switched(setting)]


def changes(choice: Choice, release: str) -> list[str]:
    """What the export changes from SGLang's defaults, in SGLang's words."""
    if choice.setting == choice.default:
        return ["keeps every SGLang default (no flag): no switch measured faster than its defaults at the measured "
                "counts without being slower at another"]
    return [switch.change(release) for switch in switched(choice.setting)]


def export(config: TunedConfig, rows: list[Measured], source: str, version: str | None) -> Export:
    version = sglang_engine.check_release(version)
    model = sglang_engine.Model(config, version)
    choice = choose(model, config, rows)
    result = Export(NAME, version, source)
    result.warnings += notes.rows_warnings(config, "SGLang")
    result.warnings += notes.not_followed(config, choice, ENGINE, version)
    cap = find(facts.FACTS, "STEP_CAP_H100")
    result.header = [
        *provenance(config, source, NAME, version),
        f"judged against sglang {version}'s defaults as its code has them (overlapbench/export/sglang_facts.py: file "
        f"and line of each), from the rows behind the tuned config; never slower than them at any measured count",
        *changes(choice, version),
        *notes.measured(choice, "SGLang"),
        *notes.step_cap(choice, model.step_cap(), "SGLang", f"--chunked-prefill-size, {cap.cite(version)}"),
        *notes.multicast(choice),
        "run launch.sh with MODEL set",
        *STANDS_FOR,
    ]
    line = " ".join([facts.LAUNCH, f"--tp {config.tp}", *flags(choice.setting)])
    result.files["launch.sh"] = "#!/bin/sh\n" + comment(result.notes()) + line + "\n"
    result.choice = choice
    return result


def model(config: TunedConfig, version: str | None) -> sglang_engine.Model:
    return sglang_engine.Model(config, sglang_engine.check_release(version))


ENGINE = Engine(NAME, "SGLang", export, model, RUNS, lambda p, version: cannot(p))
