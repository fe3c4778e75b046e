"""What SGLang lets a user set for the TP all-reduce: switches only, no thresholds. Read from the
installed sglang 0.5.23 (PyPI, 2026-11): `sglang/srt/arg_groups/fields/exec_.py` (the options and
their help), `sglang/srt/server_args.py` (a deprecated alias), `sglang/srt/arg_groups/overrides.py`
(when fusion turns on by itself), `sglang/srt/layers/layer_boundary/residual/add_norm.py` (the
fusion's token cap) and `sglang/srt/distributed/device_communicators/custom_all_reduce.py`."""

from __future__ import annotations

SOURCE = "sglang 0.5.23 (PyPI wheel, 2026-11)"
KNOWN_VERSIONS = ("0.5.23",)
LAUNCH = "python -m sglang.launch_server --model-path \"$MODEL\""
# FlashInfer all-reduce + residual + RMSNorm; `--enable-flashinfer-allreduce-fusion` is its deprecated alias.
FUSION_FLAG = "--flashinfer-allreduce-fusion-backend auto"
FUSION_MAX_TOKENS = 2048  # FUSE_ALLREDUCE_MAX_BATCH_SIZE: a constant, not an option (fuses batch_size <= it)
TORCH_SYMM_MEM_FLAG = "--enable-torch-symm-mem"  # PyTorch symmetric-memory all-reduce, falls back to NCCL
TORCH_SYMM_MEM_WORLD_SIZES = {90: (4, 6, 8), 100: (6, 8)}  # its help: SM90 world size 4, 6, 8; SM100 6, 8
NCCL_SYMM_FLAG = "--enable-symm-mem"  # "Enable NCCL symmetric memory for fast collectives."
# Fusion turns on by itself only for some architectures (_FLASHINFER_ALLREDUCE_FUSION_ARCHS: DeepSeek,
# GPT-OSS, GLM MoE, Mistral Large 3, Qwen3 MoE/Next, ...); a dense Llama is not one.
FUSION_DEFAULT_FOR_DENSE_LLAMA = False
# Without a flag, the TP all-reduce runs SGLang's custom all-reduce for messages of at most this many
# bytes (CustomAllreduce._MAX_CAR_SIZE on CUDA; should_custom_ar: inp_size <= max_size), NCCL above.
CUSTOM_AR_MAX_BYTES = 8192 * 1024
