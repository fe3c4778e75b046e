"""What vLLM reads and does, by release: its `PassConfig` key names (pydantic, unknown keys
refused, so a wrong name is an error, not a no-op), and for the releases whose code was read,
what it runs for the TP all-reduce by default, each fact with the file and line of the wheel it
came from (`FACTS`, checked against the wheels by tests/checks/engine_facts.py). The key names
of each release listed were read from its wheel (`python tests/checks/engine_exports.py
--scan-wheels V...` prints them); a release not listed is refused rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from overlapbench.export.facts import Fact, releases_read, with_lines
from overlapbench.export.picks import MIB


@dataclass(frozen=True)
class Keys:
    """The PassConfig fields one family of releases names the passes by."""

    fusion: str  # all-reduce + RMSNorm fusion (FlashInfer) on/off
    fusion_bound: str  # its upper bound
    bound_unit: str  # "MiB" (float, of the communicated tensor) or "tokens" (int)
    sp: str | None  # sequence parallelism on/off
    async_tp: str | None  # async TP (fused GEMM + collective) on/off; implies sp
    sp_min: str | None  # sequence parallelism's lower bound in tokens


OLD = Keys("enable_fi_allreduce_fusion", "fi_allreduce_fusion_max_token_num", "tokens",
           "enable_sequence_parallelism", "enable_async_tp", None)
OLD_MB = Keys("enable_fi_allreduce_fusion", "fi_allreduce_fusion_max_size_mb", "MiB",
              "enable_sequence_parallelism", "enable_async_tp", None)
RENAMED = Keys("fuse_allreduce_rms", "fi_allreduce_fusion_max_size_mb", "MiB", "enable_sp", "fuse_gemm_comms", None)
SP_BOUND = Keys("fuse_allreduce_rms", "fi_allreduce_fusion_max_size_mb", "MiB", "enable_sp", "fuse_gemm_comms",
                "sp_min_token_num")
NO_SP = Keys("fuse_allreduce_rms", "fi_allreduce_fusion_max_size_mb", "MiB", None, None, None)

# Version -> key names, each read from that version's wheel (0.12.0 also accepts the old names).
VERSIONS: dict[str, Keys] = {
    **dict.fromkeys(("0.10.1.1", "0.10.2", "0.11.0"), OLD),
    **dict.fromkeys(("0.11.1", "0.11.2"), OLD_MB),
    **dict.fromkeys(("0.12.0", "0.13.0", "0.14.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0"), RENAMED),
    **dict.fromkeys(("0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2",
                     "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0",
                     "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0"), SP_BOUND),
    **dict.fromkeys(("0.32.0", "0.33.0"), NO_SP),
}
DEFAULT_VERSION = "0.33.0"  # the newest on PyPI when this was written (2026-11)


def known_versions() -> list[str]:
    return sorted(VERSIONS, key=lambda v: tuple(int(x) for x in v.split(".")))


FUSION = "vllm/compilation/passes/fusion/allreduce_rms_fusion.py"
COMPILATION = "vllm/config/compilation.py"
CONFIG = "vllm/config/vllm.py"
COMMUNICATOR = "vllm/distributed/device_communicators/cuda_communicator.py"
UTILS = "vllm/distributed/device_communicators/all_reduce_utils.py"
SYMM_MEM = "vllm/distributed/device_communicators/symm_mem.py"
CUSTOM_AR = "vllm/distributed/device_communicators/custom_all_reduce.py"
FLASHINFER_AR = "vllm/distributed/device_communicators/flashinfer_all_reduce.py"
ENVS = "vllm/envs.py"
ARGS = "vllm/engine/arg_utils.py"

# What vLLM runs for the TP all-reduce of a dense model (bf16) on SM90 (H100/H200), by default.
# Capability keys are vLLM's own: 90 for SM90 (its "9.0" string keys are written 90 here).
_FACTS = {
    # The all-reduce + RMSNorm fusion: on by default at -O2 (the default level) on SM90 with TP > 1
    # and FlashInfer installed (a dependency of the wheel).
    "FUSION_DEFAULT_ON": Fact(True, CONFIG, '"fuse_allreduce_rms": enable_allreduce_rms_fusion,'),
    "FUSION_ON_SM90": Fact(True, CONFIG, "or current_platform.is_device_capability(90)"),
    "DEFAULT_LEVEL_O2": Fact("O2", CONFIG, "optimization_level: OptimizationLevel = OptimizationLevel.O2"),
    # Its bound, MiB of the communicated tensor, when fi_allreduce_fusion_max_size_mb is unset.
    "FUSION_MAX_MB": {90: {2: Fact(64, FUSION, "2: 64,  # 64MB"), 4: Fact(2, FUSION, "4: 2,  # 2MB"),
                           8: Fact(0.5, FUSION, "8: 0.5,  # 0.5MB")}},
    "FUSION_WORLD_SIZES": Fact((2, 4, 8, 16), COMPILATION, "FI_SUPPORTED_WORLD_SIZES = [2, 4, 8, 16]"),
    "FUSION_BYTES": Fact("int(MiB * 2**20)", COMPILATION, "return int(max_size_mb * MiB) if max_size_mb is not None"),
    "FUSION_TOKENS": Fact("bytes // (hidden * dtype bytes)", FUSION,
                          "self.max_token_num = max_size // (self.workspace_hidden_dim * element_size)"),
    "FUSION_STEP_CAP": Fact("min(bound, max_num_batched_tokens)", FUSION,
                            "self.max_token_num, config.scheduler_config.max_num_batched_tokens"),
    "FUSION_RANGE": Fact("a compiled range is fused when its end <= the bound", FUSION,
                         "return bool(compile_range.end <= self.max_token_num)"),
    # One-shot or two-shot inside the fused kernel: one-shot up to these MiB with FlashInfer's trtllm
    # backend; its mnnvl backend (the default on one node, needing NVLink multicast) leaves it to FlashInfer.
    "ONE_SHOT_MAX_MB": {90: {2: Fact(32, FUSION, "2: 32,  # 32MB"), 4: Fact(2, FUSION, "4: 2,  # 2MB"),
                             8: Fact(0.5, FUSION, "8: 0.5,  # 0.5MB")}},
    "ONE_SHOT_RULE": Fact("size <= MiB", FUSION,
                          "return max_one_shot_size is None or current_tensor_size <= max_one_shot_size * MiB"),
    "MNNVL_CHOOSES": Fact("FlashInfer's own choice", FUSION, 'if workspace_backend == "mnnvl":'),
    "BACKEND_MNNVL_FIRST": Fact("mnnvl", FLASHINFER_AR, 'backend = "mnnvl"'),
    # The plain all-reduce (above the fusion's bound, or with it off): CudaCommunicator.all_reduce
    # runs the first that takes the message, in this order.
    "ORDER_FLASHINFER": Fact(1, COMMUNICATOR, "and fi_ar_comm.should_use_fi_ar(input_)"),
    "ORDER_NCCL_SYMM": Fact(2, COMMUNICATOR, "and should_nccl_symm_mem_allreduce(self.pynccl_comm.world_size, input_)"),
    "ORDER_CUSTOM": Fact(3, COMMUNICATOR, "and ca_comm.should_custom_ar(input_)"),
    "ORDER_SYMM_MEM": Fact(4, COMMUNICATOR,
                           "if symm_mem_comm is not None and symm_mem_comm.should_use_symm_mem(input_):"),
    "ORDER_PYNCCL": Fact(5, COMMUNICATOR, "out = pynccl_comm.all_reduce(input_)"),
    # FlashInfer's standalone all-reduce: messages up to the built-in fusion table's bytes (not the
    # user's bound), in the one workspace it shares with the fusion (sized by whichever made it first).
    "FLASHINFER_AR_ON": Fact(True, ENVS, 'int(os.getenv("VLLM_ALLREDUCE_USE_FLASHINFER", "1"))'),
    "FLASHINFER_AR_MAX": Fact("the built-in fusion bound", FLASHINFER_AR,
                              "default_max_size_mb = PassConfig.default_fi_allreduce_fusion_max_size_mb().get("),
    "FLASHINFER_AR_RULE": Fact("nbytes <= max", FLASHINFER_AR, "if input_tensor.nbytes > self.max_workspace_size:"),
    "FLASHINFER_SHARED_WORKSPACE": Fact(True, FLASHINFER_AR,
                                        "if _fi_ar_workspace is not None or _fi_ar_workspace_failed:"),
    # NCCL's symmetric kernels: off by default; from world size 4, outside custom AR's preferred sizes.
    "NCCL_SYMM_ON": Fact(False, ENVS, 'int(os.getenv("VLLM_USE_NCCL_SYMM_MEM", "0"))'),
    "NCCL_SYMM_MIN_WORLD": Fact(4, UTILS, '"min_world_size": 4,'),
    "NCCL_SYMM_CUSTOM_RANGE": {4: Fact((16 << 10, 512 << 10), UTILS, "4: (16 * KiB, 512 * KiB),"),
                               8: Fact((16 << 10, 128 << 10), UTILS, "8: (16 * KiB, 128 * KiB),")},
    # vLLM's custom all-reduce: on unless --disable-custom-all-reduce; messages under 8 MiB, or under
    # this table's size where PyTorch symmetric memory is up; at world size 2, or all-to-all NVLink.
    "CUSTOM_AR_MAX": Fact(8 * MIB, CUSTOM_AR, "max_size=8192 * 1024,"),
    "CUSTOM_AR_MAX_WITH_SYMM": {90: {2: Fact(64 * MIB, UTILS, "2: 64 * MiB,  # 64 MB"),
                                     4: Fact(32 * MIB, UTILS, "4: 32 * MiB,  # 32 MB"),
                                     8: Fact(MIB // 4, UTILS, "8: MiB // 4,  # 256 KB")}},
    "CUSTOM_AR_TABLE_WITH_SYMM": Fact(True, CUSTOM_AR, "and symm_mem_enabled"),
    "CUSTOM_AR_RULE": Fact("size < max", CUSTOM_AR, "inp_size < self.max_size"),
    "CUSTOM_AR_TOPOLOGY": Fact("world size 2 or fully connected", CUSTOM_AR,
                               "if self.world_size == 2 or self.fully_connected:"),
    # PyTorch symmetric memory: on by default; turned off where the handle has no multicast pointer
    # (no NVLink multicast: NVSwitch); multimem at world sizes 4, 6, 8 on SM90, two-shot otherwise.
    "SYMM_MEM_ON": Fact(True, ENVS, 'int(os.getenv("VLLM_ALLREDUCE_USE_SYMM_MEM", "1"))'),
    "SYMM_MEM_MAX": {90: {2: Fact(64 * MIB, UTILS, "2: 64 * MiB,  # 64 MB"),
                          4: Fact(32 * MIB, UTILS, "4: 32 * MiB,  # 32 MB"),
                          8: Fact(64 * MIB, UTILS, "8: 64 * MiB,  # 64 MB")}},
    "SYMM_MEM_RULE": Fact("size <= max", SYMM_MEM, "return inp_size <= self.max_size"),
    "SYMM_MEM_NEEDS_MULTICAST": Fact(True, SYMM_MEM, "if handle.multicast_ptr == 0:"),
    "SYMM_MEM_MULTIMEM": {90: Fact((4, 6, 8), SYMM_MEM, '"9.0": [4, 6, 8],')},
    "SYMM_MEM_TWO_SHOT": Fact("two_shot_all_reduce_", SYMM_MEM, "torch.ops.symm_mem.two_shot_all_reduce_("),
    # The step-size cap: `vllm serve` on GPUs of 70 GiB or more (not A100; H100, H200) runs at most
    # 8192 tokens a step unless --max-num-batched-tokens says otherwise.
    "STEP_CAP_SERVE": Fact(8192, ARGS, "UsageContext.OPENAI_API_SERVER: 8192,"),
    "STEP_CAP_MEMORY": Fact(70, ARGS, "device_memory >= 70 * GiB_bytes"),
}

# Each fact's line, per release read (`python tests/checks/engine_facts.py --wheel W` prints a
# release's lines; these are checked against the wheels).
_LINES = {
    "0.33.0": {
        "FUSION_DEFAULT_ON": 302, "FUSION_ON_SM90": 201, "DEFAULT_LEVEL_O2": 435,
        "FUSION_MAX_MB[90][2]": 106, "FUSION_MAX_MB[90][4]": 107, "FUSION_MAX_MB[90][8]": 108,
        "FUSION_WORLD_SIZES": 188, "FUSION_BYTES": 195, "FUSION_TOKENS": 1023, "FUSION_STEP_CAP": 1027,
        "FUSION_RANGE": 1132, "ONE_SHOT_MAX_MB[90][2]": 134, "ONE_SHOT_MAX_MB[90][4]": 135,
        "ONE_SHOT_MAX_MB[90][8]": 136, "ONE_SHOT_RULE": 176, "MNNVL_CHOOSES": 164, "BACKEND_MNNVL_FIRST": 162,
        "ORDER_FLASHINFER": 367, "ORDER_NCCL_SYMM": 375, "ORDER_CUSTOM": 411, "ORDER_SYMM_MEM": 428,
        "ORDER_PYNCCL": 438, "FLASHINFER_AR_ON": 1962, "FLASHINFER_AR_MAX": 420, "FLASHINFER_AR_RULE": 488,
        "FLASHINFER_SHARED_WORKSPACE": 195, "NCCL_SYMM_ON": 2091, "NCCL_SYMM_MIN_WORLD": 112,
        "NCCL_SYMM_CUSTOM_RANGE[4]": 116, "NCCL_SYMM_CUSTOM_RANGE[8]": 117, "CUSTOM_AR_MAX": 138,
        "CUSTOM_AR_MAX_WITH_SYMM[90][2]": 33, "CUSTOM_AR_MAX_WITH_SYMM[90][4]": 34,
        "CUSTOM_AR_MAX_WITH_SYMM[90][8]": 36, "CUSTOM_AR_TABLE_WITH_SYMM": 240, "CUSTOM_AR_RULE": 510,
        "CUSTOM_AR_TOPOLOGY": 509, "SYMM_MEM_ON": 1958, "SYMM_MEM_MAX[90][2]": 60, "SYMM_MEM_MAX[90][4]": 61,
        "SYMM_MEM_MAX[90][8]": 63, "SYMM_MEM_RULE": 125, "SYMM_MEM_NEEDS_MULTICAST": 106,
        "SYMM_MEM_MULTIMEM[90]": 27, "SYMM_MEM_TWO_SHOT": 152, "STEP_CAP_SERVE": 2991, "STEP_CAP_MEMORY": 2984,
    },
    "0.31.0": {
        "FUSION_DEFAULT_ON": 305, "FUSION_ON_SM90": 200, "DEFAULT_LEVEL_O2": 442,
        "FUSION_MAX_MB[90][2]": 106, "FUSION_MAX_MB[90][4]": 107, "FUSION_MAX_MB[90][8]": 108,
        "FUSION_WORLD_SIZES": 200, "FUSION_BYTES": 207, "FUSION_TOKENS": 1023, "FUSION_STEP_CAP": 1027,
        "FUSION_RANGE": 1132, "ONE_SHOT_MAX_MB[90][2]": 134, "ONE_SHOT_MAX_MB[90][4]": 135,
        "ONE_SHOT_MAX_MB[90][8]": 136, "ONE_SHOT_RULE": 176, "MNNVL_CHOOSES": 164, "BACKEND_MNNVL_FIRST": 165,
        "ORDER_FLASHINFER": 340, "ORDER_NCCL_SYMM": 348, "ORDER_CUSTOM": 384, "ORDER_SYMM_MEM": 390,
        "ORDER_PYNCCL": 400, "FLASHINFER_AR_ON": 1916, "FLASHINFER_AR_MAX": 390, "FLASHINFER_AR_RULE": 452,
        "FLASHINFER_SHARED_WORKSPACE": 187, "NCCL_SYMM_ON": 2041, "NCCL_SYMM_MIN_WORLD": 110,
        "NCCL_SYMM_CUSTOM_RANGE[4]": 114, "NCCL_SYMM_CUSTOM_RANGE[8]": 115, "CUSTOM_AR_MAX": 140,
        "CUSTOM_AR_MAX_WITH_SYMM[90][2]": 33, "CUSTOM_AR_MAX_WITH_SYMM[90][4]": 34,
        "CUSTOM_AR_MAX_WITH_SYMM[90][8]": 36, "CUSTOM_AR_TABLE_WITH_SYMM": 237, "CUSTOM_AR_RULE": 507,
        "CUSTOM_AR_TOPOLOGY": 506, "SYMM_MEM_ON": 1912, "SYMM_MEM_MAX[90][2]": 60, "SYMM_MEM_MAX[90][4]": 61,
        "SYMM_MEM_MAX[90][8]": 63, "SYMM_MEM_RULE": 125, "SYMM_MEM_NEEDS_MULTICAST": 106,
        "SYMM_MEM_MULTIMEM[90]": 27, "SYMM_MEM_TWO_SHOT": 152, "STEP_CAP_SERVE": 2872, "STEP_CAP_MEMORY": 2868,
    },
}
FACTS = with_lines(_FACTS, _LINES)
DEFAULTS_READ = releases_read(FACTS)  # the releases whose defaults an export may be made for

# Releases with sequence parallelism (enable_sp): it is off by default, and turning it on makes vLLM
# compile the whole graph (splitting_ops []) and capture full CUDA graphs only, at every size.
_SP_FACTS = {
    "SP_DEFAULT_OFF": Fact(False, CONFIG, "IS_DENSE = False"),
    "SP_WHOLE_GRAPH": Fact("splitting_ops: [], cudagraph_mode FULL", COMPILATION,
                           "Sequence parallelism requires full-graph compilation when"),
}
SP_FACTS = with_lines(_SP_FACTS, {"0.31.0": {"SP_DEFAULT_OFF": 147, "SP_WHOLE_GRAPH": 1224}})

ENV_FLASHINFER_AR = "VLLM_ALLREDUCE_USE_FLASHINFER"
ENV_SYMM_MEM = "VLLM_ALLREDUCE_USE_SYMM_MEM"
ENV_NCCL_SYMM = "VLLM_USE_NCCL_SYMM_MEM"
DISABLE_CUSTOM_AR = "--disable-custom-all-reduce"
# GPUs vLLM gives the 8192-token serve cap (70 GiB or more, not A100, under 160 GiB), by the name rows carry.
STEP_CAP_DEVICES = ("H100", "H200", "H800", "H20")

