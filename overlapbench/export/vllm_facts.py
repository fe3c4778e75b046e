"""What vLLM reads and does, by release: its `PassConfig` key names (pydantic, unknown keys
refused, so a wrong name is an error, not a no-op), its built-in thresholds and its all-reduce
environment switches. Each version listed here had its wheel from PyPI read (the key names: the
fields of `vllm/config/compilation.py`'s `PassConfig`: `python tests/checks/engine_exports.py
--scan-wheels V...` prints them); a version not listed is refused rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass


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


# Built-in fusion bound when fi_allreduce_fusion_max_size_mb is unset: MiB of the communicated
# tensor, by compute capability and TP (vllm 0.33.0, vllm/compilation/passes/fusion/allreduce_rms_fusion.py).
# The pass fuses a compiled range whose end is <= int(MiB * 2**20) // (hidden * dtype bytes) tokens.
FUSION_MAX_MB = {90: {2: 64, 4: 2, 8: 0.5}, 100: {2: 64, 4: 32, 8: 1}}
FUSION_DEFAULT_SOURCE = ("vllm 0.33.0 wheel: FI_ALLREDUCE_FUSION_MAX_SIZE_MB; fusion on by default at -O2 on SM90/SM100 "
                         "with TP > 1")
# (flashinfer-python is a dependency of the vllm 0.33.0 wheel, so the pass has its kernel.) The pass's
# bound is also capped at max_num_batched_tokens, the most tokens one step holds.
# Releases with the old keys bound the fusion in tokens (fi_allreduce_fusion_max_token_num, default 16384).
FUSION_MAX_TOKENS_DEFAULT = 16384
# Sequence parallelism is off by default at every optimization level in the releases that have it
# (vllm/config/vllm.py: "enable_sp": IS_DENSE with IS_DENSE = False).

# The plain all-reduce (no fusion) runs, in vllm 0.33.0's CudaCommunicator.all_reduce, the first of:
# FlashInfer's all-reduce (messages up to FUSION_MAX_MB's bytes, the same table), NCCL symmetric memory
# (world size >= 4 only), vLLM's custom all-reduce, PyTorch symmetric memory, pynccl. The switches:
ENV_FLASHINFER_AR = "VLLM_ALLREDUCE_USE_FLASHINFER"  # default on
ENV_SYMM_MEM = "VLLM_ALLREDUCE_USE_SYMM_MEM"  # default on: PyTorch symmetric-memory all-reduce
ENV_NCCL_SYMM = "VLLM_USE_NCCL_SYMM_MEM"  # default off: NCCL symmetric kernels on registered memory
NCCL_SYMM_MIN_WORLD = 4  # should_nccl_symm_mem_allreduce: False below world size 4
DISABLE_CUSTOM_AR = "--disable-custom-all-reduce"
# PyTorch symmetric-memory all-reduce serves messages below this many MiB, by capability and TP
# (vllm/distributed/device_communicators/all_reduce_utils.py SYMM_MEM_ALL_REDUCE_MAX_SIZES, "9.0").
SYMM_MEM_MAX_MB = {90: {2: 64, 4: 32, 6: 64, 8: 64}}
CUSTOM_AR_MAX_MB = {90: {2: 64, 4: 32, 6: 0.5, 8: 0.25}}  # CUSTOM_ALL_REDUCE_MAX_SIZES "9.0" (with symmetric memory)
