"""What TokenWeave reads and does, as read from its source: microsoft/tokenweave at f483d1c
(2026-01-29), files named per fact. One table; the export and the defaults read it from here."""

from __future__ import annotations

SOURCE = "microsoft/tokenweave @ f483d1c431f5 (2026-01-29)"
# The families with a model file that loads a config, and the file each reads:
# vllm/model_executor/models/{llama,qwen2,mixtral}.py: load_config(f"tokenweave_configs/{family}_config_{world_size}.json").
FAMILIES = ("llama", "qwen2", "mixtral")
CONFIG_DIR = "vllm/tokenweave_configs"  # inside the installed package; no flag or env var moves it
# Files it ships (vllm/tokenweave_configs/): family -> TP sizes.
SHIPPED = {"llama": (4, 8), "qwen2": (4, 8), "mixtral": (8,)}
# The split turns on from this many tokens, in code, not in the file (llama.py:512, qwen2.py:494: >= 1024;
# mixtral.py:457: >= 2048). Below it runs "fuse only": the fused all-reduce + add + RMSNorm, no split.
SPLIT_FROM = {"llama": 1024, "qwen2": 1024, "mixtral": 2048}
# The model files' CTA budgets before any config entry is read (llama.py:448-449), and so what the
# fuse-only path runs until a step of SPLIT_FROM tokens or more has read an entry.
BUILTIN_CTAS = 16
SPLIT_ALIGN = 256  # the cut: ((n + 255) & ~255) // 2 + split_offset (llama.py:521)
ENTRY_KEYS = ("attention_ctas", "mlp_ctas", "split_offset")
# The runner (vllm/v1/worker/gpu_model_runner.py:299-304) reads the same file only when the model
# path holds one of these; otherwise its attention split takes TOKENWEAVE_SPLIT_OFFSET (default 0).
RUNNER_MODEL_NAMES = {"llama": "Llama-3.3-70B", "qwen2": "Qwen2.5-72B", "mixtral": "Mixtral-8x22B"}
SPLIT_OFFSET_ENV = "TOKENWEAVE_SPLIT_OFFSET"


def split_point(tokens: int, offset: int) -> int:
    """Rows of TokenWeave's first half for a batch of `tokens`."""
    return (tokens + SPLIT_ALIGN - 1) // SPLIT_ALIGN * SPLIT_ALIGN // 2 + offset


def nearest_key(keys, tokens: int) -> int:
    """The entry a step of `tokens` reads: the key nearest by absolute distance, the first in file
    order on a tie (Python's min over the loaded dict, llama.py:516)."""
    return min(keys, key=lambda k: abs(k - tokens))
