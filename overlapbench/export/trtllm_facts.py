"""What TensorRT-LLM lets a user set for the TP all-reduce and what it runs by default. Its package
does not install from PyPI alone (the PyPI release is a stub that downloads the wheel from
NVIDIA's own index), and its repository is larger than can be checked out here, so these were read
from the NVIDIA/TensorRT-LLM source through a code index, file by file at the commit named, in the
function named (no line numbers: the index gives a file's text, not its lines)."""

from __future__ import annotations

from overlapbench.export.facts import Fact

SOURCE = "NVIDIA/TensorRT-LLM source (llm_args.py @ fcd3f3168280; _torch/distributed/ops.py @ 0071496dc625; " \
         "_torch/custom_ops/torch_custom_ops.py @ a371b9f40797; _torch/distributed/allreduce_helper.py @ 4fb601b9e5bc); " \
         "not an installed release"
KNOWN_VERSIONS: tuple[str, ...] = ()  # no release was installed and read
OPTION = "allreduce_strategy"  # TorchLlmArgs: one global value
STRATEGIES = ("AUTO", "NCCL", "UB", "MINLATENCY", "ONESHOT", "TWOSHOT", "LOWPRECISION", "MNNVL")
# The YAML a user passes as `trtllm-serve MODEL --extra_llm_api_options FILE` (or to trtllm-bench).
SERVE = "trtllm-serve \"$MODEL\" --tp_size {tp} --extra_llm_api_options \"$(dirname \"$0\")/extra_llm_api_options.yaml\""
WORKSPACE_ENV = "TRTLLM_ALLREDUCE_FUSION_WORKSPACE_SIZE"
AUTOTUNE_OFF_ENV = "TLLM_DISABLE_ALLREDUCE_AUTOTUNE"

LLM_ARGS = "tensorrt_llm/llmapi/llm_args.py"
OPS = "tensorrt_llm/_torch/distributed/ops.py"
CUSTOM_OPS = "tensorrt_llm/_torch/custom_ops/torch_custom_ops.py"
HELPER = "tensorrt_llm/_torch/distributed/allreduce_helper.py"
ALLREDUCE_OP = "cpp/tensorrt_llm/thop/allreduceOp.cpp"

FACTS = {
    "DEFAULT_STRATEGY": Fact("AUTO", LLM_ARGS, "default='AUTO'", where="fcd3f3168280, TorchLlmArgs.allreduce_strategy"),
    # AUTO with the autotuner on (the default: TLLM_DISABLE_ALLREDUCE_AUTOTUNE unset) runs
    # trtllm::tunable_allreduce: at warm-up it times its candidates per token-count bucket and runs
    # the fastest.
    "AUTO_AUTOTUNED": Fact(True, OPS, 'os.environ.get("TLLM_DISABLE_ALLREDUCE_AUTOTUNE", "0") == "1"',
                           where="0071496dc625, AllReduce.forward"),
    "AUTOTUNE_CANDIDATES": Fact(("NCCL_SYMMETRIC", "NCCL", "ONESHOT", "TWOSHOT"), CUSTOM_OPS,
                                "valid_strategies = [", where="a371b9f40797, AllReduceRunner.get_valid_tactics"),
    # ONESHOT and TWOSHOT only where the message fits the workspace; TWOSHOT only from tp tokens.
    "AUTOTUNE_WORKSPACE": Fact("message <= max_workspace_size_auto", CUSTOM_OPS, "if workspace_size > max_workspace_size:",
                               where="a371b9f40797, AllReduceRunner.get_valid_tactics"),
    "AUTOTUNE_TWOSHOT": Fact("tokens >= tp", CUSTOM_OPS, "if inputs[0].shape[0] >= self.tp_size:",
                             where="a371b9f40797, AllReduceRunner.get_valid_tactics"),
    # The token-count buckets it tunes: powers of two up to 8192; what runs above is not traced here.
    "AUTOTUNE_MAX_TOKENS": Fact(8192, CUSTOM_OPS, "get_last_power_of_2_num_tokens_buckets(8192)",
                                where="a371b9f40797, AllReduceRunner.tuning_config"),
    # A strategy other than AUTO, given a message larger than the workspace (or no P2P/NVLink), runs NCCL.
    "FORCED_FALLBACK": Fact("NCCL above the workspace", ALLREDUCE_OP, "message_size_bytes > max_workspace_size",
                            where="4bb1ef88800b, AllreduceOp::ifFallbackToNCCL"),
    # The workspace: 64 MiB unless TRTLLM_ALLREDUCE_FUSION_WORKSPACE_SIZE says otherwise.
    "WORKSPACE_DEFAULT": Fact(64 << 20, HELPER, "default_size = 67_108_864",
                              where="4fb601b9e5bc, CustomAllReduceHelper.max_workspace_size_auto"),
}
