"""SGLang: the `launch_server` flags for the tuned choice. SGLang has switches only: the fusion
runs up to a constant 2048 tokens, the all-reduce backends have no size to set."""

from __future__ import annotations

from overlapbench.errors import UserError
from overlapbench.export import sglang_facts as facts
from overlapbench.export.picks import Export, capability, comment, leading_end, picks, provenance
from overlapbench.tuned import TunedConfig

ENGINE = "sglang"
STANDS_FOR = [
    "our fused_norm (one all-reduce + add + RMSNorm kernel on PyTorch symmetric memory) stands for FlashInfer's "
    "all-reduce fusion: a different kernel, an approximation",
    "our baseline (NCCL) stands for SGLang's NCCL all-reduce; allreduce=one_shot/two_shot for --enable-torch-symm-mem; "
    "nccl_symm for --enable-symm-mem; SGLang's custom all-reduce and mscclpp have no stand-in in our rows",
]


def check_version(version: str | None) -> str:
    version = version or facts.KNOWN_VERSIONS[-1]
    if version not in facts.KNOWN_VERSIONS:
        raise UserError(f"--engine-version: sglang {version!r} is not one whose flags were read; "
                        f"known: {', '.join(facts.KNOWN_VERSIONS)}")
    return version


def flags(config: TunedConfig, warnings: list[str]) -> list[str]:
    ps = picks(config)
    out = []
    fused_end = leading_end(ps, ("fused_norm",))
    if fused_end is not None:
        out.append(facts.FUSION_FLAG)
        if fused_end != facts.FUSION_MAX_TOKENS:
            warnings.append(f"fused_norm wins to {fused_end} tokens; SGLang fuses up to {facts.FUSION_MAX_TOKENS} tokens "
                            f"(a constant)")
    kinds = {p.kind for p in ps}
    if kinds & {"one_shot", "two_shot"}:
        out.append(facts.TORCH_SYMM_MEM_FLAG)
        sizes = facts.TORCH_SYMM_MEM_WORLD_SIZES.get(capability(config.device) or 0, ())
        if config.tp not in sizes:
            warnings.append(f"symmetric-memory all-reduce picked; SGLang's runs at world sizes {sizes} on this GPU, "
                            f"not TP={config.tp}: it falls back to NCCL")
    if "nccl_symm" in kinds:
        out.append(facts.NCCL_SYMM_FLAG)
    for p in ps:
        if p.kind in ("fused_norm", "fused_norm_copy_engine") and (fused_end is None or p.lo > fused_end):
            warnings.append(f"{p.text()}: SGLang's fusion runs from 1 token; this range is not fused")
        if p.kind in ("token_split", "iso", "sp_baseline", "async_tp", "flash_agrs"):
            warnings.append(f"{p.text()}: SGLang has no switch for this overlap")
    return out


def export(config: TunedConfig, source: str, version: str | None) -> Export:
    version = check_version(version)
    result = Export(ENGINE, version, source)
    chosen = flags(config, result.warnings)
    result.header = [
        *provenance(config, source, ENGINE, version),
        f"flags of {facts.SOURCE}",
        f"cannot express: any bound (the fusion's {facts.FUSION_MAX_TOKENS}-token cap is a constant); per-range "
        "backends (each flag is on for every size)",
        *STANDS_FOR,
    ]
    if not chosen:
        result.header.append("no flag: no pick of the tuned choice has an SGLang switch "
                              "(baseline picks leave SGLang's all-reduce as it is)")
    line = " ".join([facts.LAUNCH, f"--tp {config.tp}", *chosen])
    result.files["launch.sh"] = "#!/bin/sh\n" + comment(result.notes()) + line + "\n"
    return result
