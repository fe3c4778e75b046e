"""What TensorRT-LLM lets a user set for the TP all-reduce. Its package does not install from PyPI
alone (the PyPI release is a stub that downloads the wheel from NVIDIA's own index), so these were
read from its source: NVIDIA/TensorRT-LLM `tensorrt_llm/llmapi/llm_args.py` at fcd3f3168280 (the
option and its values), `cpp/tensorrt_llm/common/customAllReduceUtils.h` and
`tensorrt_llm/_torch/distributed/allreduce_helper.py` (the workspace, its env override)."""

from __future__ import annotations

SOURCE = "NVIDIA/TensorRT-LLM source (llm_args.py @ fcd3f3168280; customAllReduceUtils.h); not an installed release"
KNOWN_VERSIONS: tuple[str, ...] = ()  # no release was installed and read
OPTION = "allreduce_strategy"  # TorchLlmArgs: one global value, default AUTO
STRATEGIES = ("AUTO", "NCCL", "UB", "MINLATENCY", "ONESHOT", "TWOSHOT", "LOWPRECISION", "MNNVL")
DEFAULT_STRATEGY = "AUTO"
# The YAML a user passes as `trtllm-serve MODEL --extra_llm_api_options FILE` (or to trtllm-bench).
SERVE = "trtllm-serve \"$MODEL\" --tp_size {tp} --extra_llm_api_options extra_llm_api_options.yaml"
# Messages of more bytes than the workspace fall back to NCCL; the workspace is this env var's bytes,
# else 64 MiB (allreduce_helper.py max_workspace_size_auto).
WORKSPACE_ENV = "TRTLLM_ALLREDUCE_FUSION_WORKSPACE_SIZE"
WORKSPACE_DEFAULT = 64 << 20
# AUTO runs an autotuner that times the candidates (NCCL, NCCL_SYMMETRIC, ONESHOT, TWOSHOT) per shape
# at warm-up unless this is "1" (then a compiled table by GPU, TP, fusion, hidden and tokens decides).
AUTOTUNE_OFF_ENV = "TLLM_DISABLE_ALLREDUCE_AUTOTUNE"
