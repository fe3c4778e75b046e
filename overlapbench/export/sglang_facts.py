"""What SGLang lets a user set for the TP all-reduce (switches only, no thresholds), and what it
runs by default, read from its wheel (PyPI, 2026-11): each fact with the file and line of the
wheel it came from (`FACTS`; tests/checks/engine_facts.py reads them back)."""

from __future__ import annotations

from overlapbench.export.facts import Fact, releases_read, with_lines
from overlapbench.export.picks import MIB

SOURCE = "sglang 0.5.23 (PyPI wheel, 2026-11)"
KNOWN_VERSIONS = ("0.5.23",)
LAUNCH = "python -m sglang.launch_server --model-path \"$MODEL\""
# FlashInfer all-reduce + residual + RMSNorm; `--enable-flashinfer-allreduce-fusion` is its deprecated alias.
FUSION_FLAG = "--flashinfer-allreduce-fusion-backend auto"
TORCH_SYMM_MEM_FLAG = "--enable-torch-symm-mem"  # PyTorch symmetric-memory all-reduce, falls back to NCCL
NCCL_SYMM_FLAG = "--enable-symm-mem"  # "Enable NCCL symmetric memory for fast collectives."
DISABLE_CUSTOM_AR = "--disable-custom-all-reduce"

ENVIRON = "sglang/srt/environ.py"
PARALLEL = "sglang/srt/distributed/parallel_state.py"
CUSTOM_AR = "sglang/srt/distributed/device_communicators/custom_all_reduce.py"
CUSTOM_AR_V2 = "sglang/srt/distributed/device_communicators/custom_all_reduce_v2.py"
CUSTOM_AR_V2_CONFIG = "sglang/srt/distributed/device_communicators/configs/custom_all_reduce_v2.py"
TORCH_SYMM = "sglang/srt/distributed/device_communicators/torch_symm_mem.py"
TORCH_SYMM_SIZES = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"
ADD_NORM = "sglang/srt/layers/layer_boundary/residual/add_norm.py"
OPTIONS = "sglang/srt/arg_groups/fields/exec_.py"
OVERRIDES = "sglang/srt/arg_groups/overrides.py"
MEMORY = "sglang/srt/arg_groups/memory_hook.py"

_FACTS = {
    # Custom all-reduce: on unless --disable-custom-all-reduce; on CUDA the V2 class, whose buffers
    # hold at most 16 MiB; its SM90 table's largest algorithm reaches past that at TP 2, 4 and 8
    # (eager, prefill), so it takes every message of 16 MiB or less there.
    "CUSTOM_AR_ON": Fact(False, OPTIONS, "disable_custom_all_reduce: A["),
    "CUSTOM_AR_V2": Fact(True, ENVIRON, "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2 = EnvBool(True)"),
    "CUSTOM_AR_V2_DISPATCH": Fact(True, CUSTOM_AR, "if _is_cuda and envs.SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2.get():"),
    "CUSTOM_AR_V2_MAX": Fact(16 * MIB, ENVIRON, "SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB = EnvInt(16 * 1024)"),
    "CUSTOM_AR_V2_CLIP": Fact("min(table, max)", CUSTOM_AR_V2, "max_pull_size = min(base_config.max_pull_bytes, max_size)"),
    "CUSTOM_AR_V2_RULE": Fact("size <= threshold", CUSTOM_AR_V2, "if nbytes <= heuristic.two_shot_pull_threshold:"),
    "CUSTOM_AR_V2_EAGER": Fact("eager (prefill) thresholds", CUSTOM_AR_V2,
                               "return self._eager_plan(inp_size, inp.dtype) is not None"),
    "CUSTOM_AR_V2_SM90": Fact(90, CUSTOM_AR_V2_CONFIG, "if cuda_major == 9:"),
    # (1-shot push, 1-shot pull, 2-shot pull) bytes, eager, per TP on SM90: the last bounds custom AR.
    "CUSTOM_AR_V2_TABLE": {90: {2: Fact(128 * MIB, CUSTOM_AR_V2_CONFIG, "eager=(32.00 * MB, 128.0 * MB, 128.0 * MB),"),
                                4: Fact(32 * MIB, CUSTOM_AR_V2_CONFIG,
                                        "eager=(896.0 * KB, 896.0 * KB, 32.00 * MB, Range(0, 32 * MB)),"),
                                8: Fact(128 * MIB, CUSTOM_AR_V2_CONFIG,
                                        "eager=(128.0 * KB, 128.0 * KB, 128.0 * MB, Range(0, 128 * MB)),")}},
    # The order: NCCL's symmetric kernels where --enable-symm-mem and custom AR does not take the
    # message; else custom AR, then PyTorch symmetric memory, then NCCL.
    "ORDER_NCCL_SYMM": Fact(1, PARALLEL, "and self.is_symmetric_memory_enabled()"),
    "ORDER_CUSTOM": Fact(2, PARALLEL, 'return "ca"'),
    "ORDER_TORCH_SYMM": Fact(3, PARALLEL, 'return "torch_symm_mem"'),
    "NCCL_SYMM_ON": Fact(False, OPTIONS, "enable_symm_mem: A["),
    # PyTorch symmetric memory: off unless --enable-torch-symm-mem; it runs at TP 2 too (two-shot),
    # multimem at 4, 6, 8; messages under these sizes; off where the handle has no multicast pointer.
    "TORCH_SYMM_ON": Fact(False, OPTIONS, "enable_torch_symm_mem: A["),
    "TORCH_SYMM_MAX": {90: {2: Fact(64 * MIB, TORCH_SYMM_SIZES, "2: 64 * MiB,  # 64 MB"),
                            4: Fact(64 * MIB, TORCH_SYMM_SIZES, "4: 64 * MiB,  # 64 MB"),
                            8: Fact(128 * MIB, TORCH_SYMM_SIZES, "8: 128 * MiB,  # 128 MB")}},
    "TORCH_SYMM_RULE": Fact("size < max", TORCH_SYMM, "return inp_size < self.max_size"),
    "TORCH_SYMM_MULTIMEM": {90: Fact((4, 6, 8), TORCH_SYMM, "9: [4, 6, 8],")},
    "TORCH_SYMM_TWO_SHOT": Fact("two_shot_all_reduce_", TORCH_SYMM, "torch.ops.symm_mem.two_shot_all_reduce_("),
    "TORCH_SYMM_NEEDS_MULTICAST": Fact(True, TORCH_SYMM, "if handle.multicast_ptr == 0:"),
    # FlashInfer's all-reduce + residual + RMSNorm: off unless asked (on by itself only for the
    # architectures listed; a dense Llama is not one), batches of at most 2048 tokens (a constant);
    # `auto` runs its trtllm backend on one SM90 node.
    "FUSION_OPTION": Fact(None, OPTIONS, "flashinfer_allreduce_fusion_backend: A["),
    "FUSION_AUTO_ARCHS": Fact("MoE architectures", OVERRIDES, "_FLASHINFER_ALLREDUCE_FUSION_ARCHS = frozenset("),
    "FUSION_MAX_TOKENS": Fact(2048, ADD_NORM, "FUSE_ALLREDUCE_MAX_BATCH_SIZE = 2048"),
    "FUSION_RULE": Fact("tokens <= max", ADD_NORM, "and batch_size <= FUSE_ALLREDUCE_MAX_BATCH_SIZE"),
    "FUSION_AUTO_SM90": Fact("trtllm", OPTIONS, "and trtllm on SM90 single-node systems"),
    # The step-size cap: chunked_prefill_size 8192 on GPUs of 60-90 GiB (H100) and 90-160 GiB (H200).
    "STEP_CAP_H100": Fact(8192, MEMORY, "chunked_prefill_size=8192,"),
    "STEP_CAP_H200": Fact(8192, MEMORY, "chunked_prefill_size=8192,"),
}
_LINES = {
    "0.5.23": {
        "CUSTOM_AR_ON": 725, "CUSTOM_AR_V2": 1532, "CUSTOM_AR_V2_DISPATCH": 387, "CUSTOM_AR_V2_MAX": 1535,
        "CUSTOM_AR_V2_CLIP": 148, "CUSTOM_AR_V2_RULE": 397, "CUSTOM_AR_V2_EAGER": 414, "CUSTOM_AR_V2_SM90": 319,
        "CUSTOM_AR_V2_TABLE[90][2]": 280, "CUSTOM_AR_V2_TABLE[90][4]": 290, "CUSTOM_AR_V2_TABLE[90][8]": 310,
        "ORDER_NCCL_SYMM": 756, "ORDER_CUSTOM": 965, "ORDER_TORCH_SYMM": 989, "NCCL_SYMM_ON": 718,
        "TORCH_SYMM_ON": 736, "TORCH_SYMM_MAX[90][2]": 5, "TORCH_SYMM_MAX[90][4]": 6, "TORCH_SYMM_MAX[90][8]": 8,
        "TORCH_SYMM_RULE": 149, "TORCH_SYMM_MULTIMEM[90]": 52, "TORCH_SYMM_TWO_SHOT": 181,
        "TORCH_SYMM_NEEDS_MULTICAST": 116, "FUSION_OPTION": 770, "FUSION_AUTO_ARCHS": 929,
        "FUSION_MAX_TOKENS": 141, "FUSION_RULE": 157, "FUSION_AUTO_SM90": 779, "STEP_CAP_H100": 139,
        "STEP_CAP_H200": 153,
    },
}
FACTS = with_lines(_FACTS, _LINES)
DEFAULTS_READ = releases_read(FACTS)
STEP_CAP_DEVICES = ("H100", "H200", "H800", "H20")

