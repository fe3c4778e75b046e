"""vLLM: the `--compilation-config` JSON (its `pass_config`), the `vllm serve` line and the
environment lines for the all-reduce backend, with the key names of the version asked for.

vLLM has one threshold per pass: the all-reduce + RMSNorm fusion runs up to an upper bound (from
1 token), sequence parallelism from a lower bound (to the largest batch). So the export takes the
run of `fused_norm` picks that starts at 1 token for the fusion, and the run of sequence-parallel
picks that reaches the largest range for SP; every other pick of those kinds is a warning.
"""

from __future__ import annotations

import json

from overlapbench.errors import UserError
from overlapbench.export import vllm_facts as facts
from overlapbench.export.picks import (
    MIB,
    SP_FAMILY,
    Export,
    Pick,
    capability,
    comment,
    dtype_bytes,
    hidden,
    leading_end,
    picks,
    provenance,
    trailing_start,
)
from overlapbench.tuned import TunedConfig

ENGINE = "vllm"
STANDS_FOR = [
    "our fused_norm (one all-reduce + add + RMSNorm kernel on PyTorch symmetric memory, peer loads, two-shot shaped) "
    "stands for FlashInfer's all-reduce fusion (fuse_allreduce_rms): a different kernel, so the bound is an approximation",
    "our baseline (NCCL all-reduce, then add + RMSNorm) stands for vLLM's plain all-reduce when it runs pynccl; "
    "allreduce=one_shot/two_shot (PyTorch symmetric memory) for vLLM's symmetric-memory path; nccl_symm for "
    f"{facts.ENV_NCCL_SYMM}",
    "our async_tp (torch.ops.symm_mem fused all-gather + matmul / matmul + reduce-scatter) is what vLLM's async TP "
    "pass runs; flash_agrs (rank-ordered P2P pieces) and sp_baseline (blocking collectives) stand for it and for "
    "plain sequence parallelism",
]


def keys_for(version: str | None) -> tuple[str, facts.Keys]:
    version = version or facts.DEFAULT_VERSION
    if version not in facts.VERSIONS:
        raise UserError(f"--engine-version: vllm {version!r} is not one whose key names were read; "
                        f"known: {', '.join(facts.known_versions())}")
    return version, facts.VERSIONS[version]


def pass_config(config: TunedConfig, keys: facts.Keys, warnings: list[str]) -> dict:
    """The pass_config entries, and a warning for each pick the one-bound passes cannot follow."""
    ps = picks(config)
    out: dict = {}
    fused_end = leading_end(ps, ("fused_norm",))
    out[keys.fusion] = fused_end is not None
    if fused_end is not None:
        size = fused_end * hidden(config) * dtype_bytes(config)
        out[keys.fusion_bound] = size / MIB if keys.bound_unit == "MiB" else fused_end
    for p in ps:
        if p.kind in ("fused_norm", "fused_norm_copy_engine") and (fused_end is None or p.lo > fused_end):
            warnings.append(f"{p.text()}: vLLM's fusion runs from 1 token up to one bound; this range is not fused")
    if keys.sp is None:
        warnings += [f"{p.text()}: vLLM at these key names has no sequence-parallel or async-TP pass" for p in ps
                     if p.kind in SP_FAMILY]
    else:
        out.update(_sequence_parallel(ps, keys, warnings))
    warnings += [f"{p.text()}: vLLM has no token-split overlap (TokenWeave, a vLLM fork, has: export --engine tokenweave)"
                 for p in ps if p.kind in ("token_split", "iso")]
    return out


def _sequence_parallel(ps: list[Pick], keys: facts.Keys, warnings: list[str]) -> dict:
    start = trailing_start(ps, SP_FAMILY)
    if start is not None and start > 1 and keys.sp_min is None:
        warnings.append(f"sequence parallelism wins from {start} tokens, but these key names have no lower bound "
                        f"(sp_min_token_num came later): left off")
        start = None
    run = [p for p in ps if start is not None and p.lo >= start]
    for p in ps:
        if p.kind in SP_FAMILY and p not in run:
            warnings.append(f"{p.text()}: vLLM's sequence parallelism runs from one lower bound to the largest batch; "
                            f"this range is not")
    fused = any(p.kind in ("async_tp", "flash_agrs") for p in run)
    warnings += [f"{p.text()}: async TP is one switch for the whole SP range; it is on there" for p in run
                 if fused and p.kind == "sp_baseline"]
    out = {keys.sp: bool(run), keys.async_tp: fused}
    if keys.sp_min is not None and run:
        out[keys.sp_min] = start
    return out


def backend(config: TunedConfig, warnings: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Environment lines, extra CLI flags and header notes for the plain all-reduce."""
    ps = [p for p in picks(config) if p.kind in ("nccl", "nccl_symm", "one_shot", "two_shot")]
    kinds = {p.kind for p in ps}
    env, flags, notes = [], [], []
    if kinds & {"one_shot", "two_shot"}:
        env += [f"{facts.ENV_SYMM_MEM}=1", f"{facts.ENV_FLASHINFER_AR}=0"]
        flags.append(facts.DISABLE_CUSTOM_AR)
        cap = facts.SYMM_MEM_MAX_MB.get(capability(config.device) or 0, {}).get(config.tp)
        notes.append("symmetric-memory all-reduce picked: FlashInfer's and vLLM's custom all-reduce are turned off so "
                     "that vLLM's PyTorch symmetric-memory path serves it; vLLM picks one-shot or two-shot itself"
                     + (f", for messages under {cap:g} MiB (larger go to pynccl)" if cap else ""))
        if cap:
            below = [p for p in ps if p.kind == "nccl" and p.lo * hidden(config) * dtype_bytes(config) < cap * MIB]
            warnings += [f"{p.text()}: NCCL picked, but vLLM's symmetric-memory all-reduce takes messages under "
                         f"{cap:g} MiB" for p in below]
    if "nccl_symm" in kinds:
        env.append(f"{facts.ENV_NCCL_SYMM}=1")
        if config.tp < facts.NCCL_SYMM_MIN_WORLD:
            warnings.append(f"nccl_symm picked, but vLLM uses NCCL symmetric memory only from world size "
                            f"{facts.NCCL_SYMM_MIN_WORLD} (TP={config.tp} here)")
    if kinds <= {"nccl"}:
        notes.append("baseline (NCCL) picks leave vLLM's all-reduce backend at its defaults: these rows do not "
                     "compare NCCL with vLLM's FlashInfer, custom or symmetric-memory all-reduce")
    return env, flags, notes


def cli_line(config: TunedConfig, compilation: dict, flags: list[str]) -> str:
    text = json.dumps(compilation, separators=(", ", ": "))
    return " ".join(["vllm serve \"$MODEL\"", f"--tensor-parallel-size {config.tp}",
                     f"--compilation-config '{text}'", *flags])


def export(config: TunedConfig, source: str, version: str | None) -> Export:
    version, keys = keys_for(version)
    result = Export(ENGINE, version, source)
    compilation = {"pass_config": pass_config(config, keys, result.warnings)}
    env, flags, notes = backend(config, result.warnings)
    bound = compilation["pass_config"].get(keys.fusion_bound)
    result.header = [
        *provenance(config, source, ENGINE, version),
        f"key names of vllm {version} (read from its wheel); `vllm serve --compilation-config` takes the JSON, "
        f"or -cc.pass_config.<key>=<value> each",
        f"cannot express: one bound per pass (fusion: up to {keys.fusion_bound} from 1 token; "
        + (f"sequence parallelism: from {keys.sp_min} to the largest batch" if keys.sp_min else
           "sequence parallelism: on or off for every size" if keys.sp else "no sequence-parallel pass in this version")
        + "); vLLM's one-shot/two-shot choice and its all-reduce size tables",
        *([f"fusion bound: {bound!r} {keys.bound_unit} = the last fused_norm token count x hidden x dtype bytes"]
          if bound is not None else []),
        *STANDS_FOR, *notes,
    ]
    head = comment(result.notes())
    result.files["compilation-config.json"] = json.dumps(compilation, indent=2) + "\n"
    exports = "".join(f"export {line}\n" for line in env)
    result.files["serve.sh"] = "#!/bin/sh\n" + head + exports + cli_line(config, compilation, flags) + "\n"
    return result
