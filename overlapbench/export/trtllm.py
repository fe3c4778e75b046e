"""TensorRT-LLM: the `--extra_llm_api_options` YAML (its one global `allreduce_strategy`) and the
env line that moves its NCCL fallback.

One strategy for every size; but a message larger than the fusion workspace falls back to NCCL,
so "our fused kernel up to N tokens, NCCL above" is expressible: the fused strategy, and the
workspace set to N tokens' bytes.
"""

from __future__ import annotations

from overlapbench.errors import UserError
from overlapbench.export import trtllm_facts as facts
from overlapbench.export.picks import Export, Pick, comment, leading_end, message_bytes, picks, provenance
from overlapbench.tuned import TunedConfig

ENGINE = "trtllm"
# Our mechanism -> the strategy that runs it in TensorRT-LLM (its ONESHOT/TWOSHOT fuse the residual
# add + RMSNorm into the all-reduce where the model asks, as Llama's decoder layer does).
STRATEGY = {"fused_norm": "TWOSHOT", "two_shot": "TWOSHOT", "one_shot": "ONESHOT", "nccl": "NCCL"}
STANDS_FOR = [
    "our fused_norm (reduce own rows, add + RMSNorm, gather: two-shot shaped) stands for TWOSHOT with the "
    "RESIDUAL_RMS_NORM fusion; allreduce=one_shot/two_shot (PyTorch symmetric memory) for ONESHOT/TWOSHOT; "
    "baseline (NCCL) for NCCL: different kernels, an approximation",
]


def check_version(version: str | None) -> None:
    if version is not None:
        raise UserError(f"--engine-version: no TensorRT-LLM release was read ({facts.SOURCE}); omit --engine-version")


def choose(config: TunedConfig, warnings: list[str]) -> tuple[str, dict[str, int]]:
    """The global strategy (the first range's) and the env entries; a warning for each pick they
    do not follow."""
    ps = picks(config)
    strategy = STRATEGY.get(ps[0].kind)
    if strategy is None:
        warnings.append(f"{ps[0].text()}: no TensorRT-LLM strategy runs this ({ps[0].kind}); NCCL exported")
        strategy = "NCCL"
    if strategy == "NCCL":
        warnings += _unfollowed([p for p in ps if p.kind != "nccl"], strategy)
        return strategy, {}
    end = leading_end(ps, (ps[0].kind,))
    rest = [p for p in ps if p.lo > end]
    if any(p.kind != "nccl" for p in rest):
        warnings += _unfollowed([p for p in rest if p.kind != "nccl"], strategy)
        return strategy, {}
    if rest or message_bytes(config, end) > facts.WORKSPACE_DEFAULT:  # NCCL above `end`, or keep the largest off NCCL
        return strategy, {facts.WORKSPACE_ENV: message_bytes(config, end)}
    return strategy, {}


def _unfollowed(ps: list[Pick], strategy: str) -> list[str]:
    return [f"{p.text()}: TensorRT-LLM runs one strategy ({strategy}) for every size here" for p in ps]


def export(config: TunedConfig, source: str, version: str | None) -> Export:
    check_version(version)
    result = Export(ENGINE, None, source)
    strategy, env = choose(config, result.warnings)
    result.header = [
        *provenance(config, source, ENGINE, None),
        f"facts from {facts.SOURCE}",
        f"cannot express: more than one strategy ({facts.OPTION} is global); the one bound is the fusion workspace "
        f"({facts.WORKSPACE_ENV}, bytes): larger messages fall back to NCCL",
        *STANDS_FOR,
        f"run: export the env line, then {facts.SERVE.format(tp=config.tp)}",
    ]
    for name, size in env.items():
        result.header.append(f"{name}={size}: {size / (1 << 20):g} MiB, the last token count of {strategy} x hidden x "
                             f"dtype bytes")
    head = comment(result.notes())
    result.files["extra_llm_api_options.yaml"] = head + f"{facts.OPTION}: {strategy}\n"
    result.files["env.sh"] = head + "".join(f"export {name}={size}\n" for name, size in env.items())
    return result
