"""TensorRT-LLM: the `--extra_llm_api_options` YAML (its one global `allreduce_strategy`) and the
`trtllm-serve` line.

Its default, AUTO, times NCCL, NCCL's symmetric kernels and its own fused one- and two-shot kernels
at warm-up and runs the fastest (trtllm_engine.py): by the rows' stand-ins no single strategy forced
in its place is faster, so the export keeps AUTO (written out, so the file says which strategy runs)
and reports what the tuned picks would add over it.
"""

from __future__ import annotations

from overlapbench.errors import UserError
from overlapbench.export import notes, trtllm_engine
from overlapbench.export import trtllm_facts as facts
from overlapbench.export.choice import choose
from overlapbench.export.picks import SP_FAMILY, Engine, Export, Pick, comment, provenance
from overlapbench.tuned import TunedConfig
from overlapbench.tuning.analysis import Measured

NAME = "trtllm"
RUNS = ("nccl", "nccl_symm", "fused_norm")  # the pick kinds TensorRT-LLM has a counterpart of
STANDS_FOR = [
    "stand-ins: our fused_norm (reduce own rows, add + RMSNorm, gather: two-shot shaped) for TWOSHOT with the "
    "RESIDUAL_RMS_NORM fusion; baseline (NCCL) for NCCL; baseline nccl_symm=true for NCCL_SYMMETRIC; none for "
    "ONESHOT: different kernels, an approximation",
]
CANNOT = {
    "token_split": "TensorRT-LLM has no token-split overlap",
    "iso": "TensorRT-LLM has no ISO split",
    "one_shot": "TensorRT-LLM's ONESHOT is its own kernel fused with the norm, not PyTorch's one-shot all-reduce",
    "two_shot": "TensorRT-LLM's TWOSHOT is its own kernel fused with the norm, not PyTorch's two-shot all-reduce",
    "fused_norm_copy_engine": "TensorRT-LLM has no copy-engine reduction",
}


def check_version(version: str | None) -> None:
    if version is not None:
        raise UserError(f"--engine-version: no TensorRT-LLM release was read ({facts.SOURCE}); omit --engine-version")


def cannot(p: Pick) -> str | None:
    if p.kind in SP_FAMILY:
        return "TensorRT-LLM has no sequence-parallel setting for a dense model's layer here"
    return CANNOT.get(p.kind)


def export(config: TunedConfig, rows: list[Measured], source: str, version: str | None) -> Export:
    check_version(version)
    model = trtllm_engine.Model(config)
    choice = choose(model, config, rows)
    strategy = choice.setting.strategy
    result = Export(NAME, None, source)
    result.warnings += notes.rows_warnings(config, "TensorRT-LLM")
    result.warnings += notes.not_followed(config, choice, ENGINE, version)
    kept = strategy == facts.FACTS["DEFAULT_STRATEGY"].value
    result.header = [
        *provenance(config, source, NAME, None),
        f"judged against TensorRT-LLM's default ({facts.OPTION}: AUTO, the autotuner on) as its source has it "
        f"(overlapbench/export/trtllm_facts.py: {facts.SOURCE}), from the rows behind the tuned config",
        ("keeps AUTO: it times its candidates at warm-up and runs the fastest, so no strategy forced in its place "
         "measures faster" if kept else f"forces {strategy}"),
        *notes.measured(choice, "TensorRT-LLM"),
        *notes.step_cap(choice, model.step_cap(), "TensorRT-LLM", "max_num_tokens"),
        f"the autotuner's fused kernels take messages up to its workspace (64 MiB; {facts.WORKSPACE_ENV} sets it, at the "
        f"cost of device memory); the export does not change it",
        f"run serve.sh with MODEL set: {facts.SERVE.format(tp=config.tp)}",
        *STANDS_FOR,
    ]
    head = comment(result.notes())
    result.files["extra_llm_api_options.yaml"] = head + f"{facts.OPTION}: {strategy}\n"
    result.files["serve.sh"] = "#!/bin/sh\n" + head + facts.SERVE.format(tp=config.tp) + "\n"
    result.choice = choice
    return result


def model(config: TunedConfig, version: str | None) -> trtllm_engine.Model:
    check_version(version)
    return trtllm_engine.Model(config)


ENGINE = Engine(NAME, "TensorRT-LLM", export, model, RUNS, lambda p, version: cannot(p))
