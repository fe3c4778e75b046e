"""vLLM: the `--compilation-config` JSON (its `pass_config`), the `vllm serve` line and the
environment lines for the all-reduce backend, with the key names of the release asked for.

The setting is chosen from the rows (choice.py, against vllm_engine's model of vLLM's code): the
fastest vLLM can express, never slower than its defaults; only what differs from the defaults is
written. A pick vLLM cannot run (token_split, iso, one_shot, a copy-engine fused_norm) is a
warning with what it would add; sequence parallelism (releases 0.12-0.31) is never turned on: it
changes how vLLM compiles and captures every size, which the rows do not measure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from overlapbench.export import notes, vllm_engine
from overlapbench.export import vllm_facts as facts
from overlapbench.export.choice import Choice, choose
from overlapbench.export.facts import find
from overlapbench.export.picks import MIB, SP_FAMILY, Engine, Export, Pick, comment, provenance
from overlapbench.tuned import TunedConfig
from overlapbench.tuning.analysis import Measured

NAME = "vllm"
RUNS = ("nccl", "nccl_symm", "two_shot", "fused_norm")  # the pick kinds vLLM has a counterpart of
STANDS_FOR = [
    "stand-ins: our fused_norm (one all-reduce + add + RMSNorm kernel on PyTorch symmetric memory, peer loads, "
    "two-shot shaped) for FlashInfer's all-reduce fusion; baseline (NCCL, then add + RMSNorm) for pynccl; "
    "baseline allreduce=two_shot for PyTorch's two-shot symmetric-memory all-reduce (the same op); the faster of "
    "allreduce=one_shot/two_shot for FlashInfer's standalone and vLLM's custom all-reduce (other kernels: an "
    "approximation); baseline nccl_symm=true for NCCL's symmetric kernels; none for PyTorch's multimem all-reduce",
]
CANNOT = {
    "token_split": "vLLM has no token-split overlap (TokenWeave, a vLLM fork, has: export --engine tokenweave)",
    "iso": "vLLM has no ISO split",
    "one_shot": "vLLM's PyTorch symmetric-memory path runs two-shot (multimem from world size 4), never one-shot",
    "fused_norm_copy_engine": "vLLM's fusion is FlashInfer's kernel, not a copy-engine reduction",
}


def cannot(p: Pick, keys: facts.Keys) -> str | None:
    if p.kind in SP_FAMILY:
        if keys.sp is None:
            return "vLLM at these key names has no sequence-parallel or async-TP pass"
        return ("vLLM's sequence parallelism (enable_sp, fuse_gemm_comms) is left off: turning it on compiles the whole "
                f"graph with full CUDA graphs only, at every size ({facts.SP_FACTS['SP_WHOLE_GRAPH'].cite('0.31.0')}), "
                "which the rows do not measure")
    return CANNOT.get(p.kind)


@dataclass(frozen=True)
class Switch:
    """One of the plain all-reduce's switches (a boolean field of vllm_engine.Setting) as the export
    writes it where it differs from vLLM's default: the line that sets it (an environment line, or a
    `vllm serve` flag) and what it changes. A new switch of vLLM's is one record here."""

    field: str  # the Setting field
    line: str  # the environment line or the serve flag that sets the non-default value
    env: bool  # whether `line` is an environment line (else a serve flag)
    says: str  # what setting it changes, in vLLM's words

    def differs(self, setting: vllm_engine.Setting) -> bool:
        return getattr(setting, self.field) != getattr(vllm_engine.Setting(), self.field)


SWITCHES = (
    Switch("flashinfer_ar", f"{facts.ENV_FLASHINFER_AR}=0", True, "turns FlashInfer's standalone all-reduce off"),
    Switch("custom_ar", facts.DISABLE_CUSTOM_AR, False, "turns vLLM's custom all-reduce off"),
    Switch("symm_mem", f"{facts.ENV_SYMM_MEM}=0", True, "turns PyTorch's symmetric-memory all-reduce off"),
    Switch("nccl_symm", f"{facts.ENV_NCCL_SYMM}=1", True, "turns NCCL's symmetric kernels on"),
)


def switched(setting: vllm_engine.Setting) -> list[Switch]:
    """The switches `setting` sets away from vLLM's defaults, in SWITCHES' order."""
    return [switch for switch in SWITCHES if switch.differs(setting)]


def fusion(model: vllm_engine.Model, setting: vllm_engine.Setting, keys: facts.Keys) -> tuple[dict, list[str]]:
    """The fusion's pass_config entries that differ from vLLM's defaults, and what they change, in
    vLLM's words (with what a bound above the built-in one costs)."""
    release = model.version
    if not setting.fusion:
        return {keys.fusion: False}, [f"turns the all-reduce + RMSNorm fusion off ({keys.fusion}: false; on by default: "
                                      f"{find(facts.FACTS, 'FUSION_DEFAULT_ON').cite(release)})"]
    if setting.fusion_tokens is None:
        return {}, []
    size = setting.fusion_tokens * model.row_bytes
    entries = {keys.fusion: True,
               keys.fusion_bound: size / MIB if keys.bound_unit == "MiB" else setting.fusion_tokens}
    builtin = model.builtin_fusion_tokens()
    says = [f"moves the fusion's bound from {builtin} to {setting.fusion_tokens} tokens ({keys.fusion_bound}: the "
            f"last fused count x hidden x dtype bytes; vLLM fuses a compiled range ending at or below "
            f"int(MiB * 2**20) // (hidden x dtype bytes) tokens: "
            f"{find(facts.FACTS, 'FUSION_RANGE').cite(release)})"]
    if builtin is not None and setting.fusion_tokens > builtin:
        says.append(_workspace(model, setting.fusion_tokens, builtin))
    return entries, says


def pass_config(model: vllm_engine.Model, setting: vllm_engine.Setting, keys: facts.Keys) -> dict:
    """The pass_config entries that differ from vLLM's defaults."""
    return fusion(model, setting, keys)[0]


def backend(setting: vllm_engine.Setting) -> tuple[list[str], list[str]]:
    """Environment lines and CLI flags for the plain all-reduce's switches that differ from the defaults."""
    on = switched(setting)
    return [switch.line for switch in on if switch.env], [switch.line for switch in on if not switch.env]


def serve_line(config: TunedConfig, flags: list[str]) -> str:
    return " ".join(["vllm serve \"$MODEL\"", f"--tensor-parallel-size {config.tp}",
                     "--compilation-config \"$(cat \"$(dirname \"$0\")/compilation-config.json\")\"", *flags])


def changes(model: vllm_engine.Model, choice: Choice, keys: facts.Keys) -> list[str]:
    """What the export changes from vLLM's defaults, in vLLM's words, and why it is safe."""
    s = choice.setting
    if s == choice.default:
        return ["keeps every vLLM default: no setting vLLM can express measured faster than its defaults at the "
                "measured counts without being slower at another"]
    return [*fusion(model, s, keys)[1], *(f"{switch.says} ({switch.line})" for switch in switched(s))]


def _workspace(model: vllm_engine.Model, bound: int, builtin: int) -> str:
    """What a bound above vLLM's built-in one costs in FlashInfer's workspace (sized for
    min(bound, --max-num-batched-tokens) tokens), and what to look for if it cannot be allocated."""
    cap = model.step_cap()
    mib = lambda tokens: f"{tokens * model.row_bytes / MIB:g} MiB"
    if cap is not None and min(bound, cap) <= builtin:
        return (f"at the default step cap ({cap} tokens) FlashInfer's fusion workspace stays the default's "
                f"({mib(builtin)} of data per buffer); with --max-num-batched-tokens raised it grows to min(bound, cap) "
                f"tokens (up to {mib(bound)}): device memory the rows do not measure")
    return (f"FlashInfer's fusion workspace grows from {mib(builtin)} to {mib(min(bound, cap or bound))} of data per "
            f"buffer (min(bound, --max-num-batched-tokens) tokens; its Lamport buffers hold several times that): device "
            f"memory the rows do not measure. Should FlashInfer fail to allocate it, vLLM logs 'Failed to initialize "
            f"Flashinfer allreduce workspace' and fuses nothing: check the log")


def fusion_kernel(model: vllm_engine.Model) -> list[str]:
    """Which of FlashInfer's kernels the fusion runs: one-shot or two-shot, by backend."""
    one_shot = find(facts.FACTS, "ONE_SHOT_MAX_MB", model.cap, model.tp)
    if one_shot is None:
        return []
    release = model.version
    return [f"FlashInfer's fusion runs its mnnvl backend where the host has NVLink multicast (one-shot or two-shot: "
            f"FlashInfer's choice, {find(facts.FACTS, 'MNNVL_CHOOSES').cite(release)}), else its trtllm backend: "
            f"one-shot up to {one_shot.value:g} MiB at TP={model.tp}, two-shot above ({one_shot.cite(release)}); "
            f"our fused_norm stands for either"]


def export(config: TunedConfig, rows: list[Measured], source: str, version: str | None) -> Export:
    version = vllm_engine.check_release(version)
    keys = facts.VERSIONS[version]
    model = vllm_engine.Model(config, version)
    choice = choose(model, config, rows)
    result = Export(NAME, version, source)
    result.warnings += notes.rows_warnings(config, "vLLM")
    result.warnings += notes.not_followed(config, choice, ENGINE, version)
    env, flags = backend(choice.setting)
    compilation = {"pass_config": pass_config(model, choice.setting, keys)}
    cap_fact = find(facts.FACTS, "STEP_CAP_SERVE")
    result.header = [
        *provenance(config, source, NAME, version),
        f"judged against vllm {version}'s defaults as its code has them (overlapbench/export/vllm_facts.py: file and "
        f"line of each), from the rows behind the tuned config; never slower than them at any measured count",
        *changes(model, choice, keys),
        *notes.measured(choice, "vLLM"),
        *fusion_kernel(model),
        *notes.step_cap(choice, model.step_cap(), "vllm serve",
                        f"--max-num-batched-tokens, {cap_fact.cite(version)}; the fusion's bound is capped by it too"),
        *notes.multicast(choice),
        "pass compilation-config.json as --compilation-config \"$(cat compilation-config.json)\" (the option takes the "
        "JSON text, not a file name; --config takes YAML only), or each key as -cc.pass_config.<key>=<value>; "
        "run serve.sh with MODEL set",
        *STANDS_FOR,
    ]
    head = comment(result.notes())
    result.files["compilation-config.json"] = json.dumps(compilation, indent=2) + "\n"
    exports = "".join(f"export {line}\n" for line in env)
    result.files["serve.sh"] = "#!/bin/sh\n" + head + exports + serve_line(config, flags) + "\n"
    result.choice = choice
    return result


def model(config: TunedConfig, version: str | None) -> vllm_engine.Model:
    return vllm_engine.Model(config, vllm_engine.check_release(version))


def _cannot(p: Pick, version: str | None) -> str | None:
    return cannot(p, facts.VERSIONS[vllm_engine.check_release(version)])


ENGINE = Engine(NAME, "vLLM", export, model, RUNS, _cannot)
