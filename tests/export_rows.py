"""Tuned configs and the rows behind them, built for the export tests: each setting's median per
token count given, the rounds timed interleaved (one pairing per count) so that tune's paired
intervals decide, with fresh seeded noise on every row (never zeros)."""

from __future__ import annotations

import random
from pathlib import Path

from overlapbench import tuned
from overlapbench.tuning import analysis
from tests import synthetic

SHAPE_8B = {"hidden": 4096, "ffn": 14336, "heads": 32, "kv_heads": 8, "head_dim": 128}
BASE = {"nccl_max_ctas": "default"}
SPLIT = {"align": 256, "split_offset": 0, "split_ratio": None, "comm": "copy_engine", "comm_ctas_attn": 32,
         "comm_ctas_mlp": 32, "nccl_max_ctas": "default"}
# Our settings by the name the tests give them: (strategy, knobs).
SETTINGS = {
    "nccl": ("baseline", BASE),
    "one_shot": ("baseline", BASE | {"allreduce": "one_shot"}),
    "two_shot": ("baseline", BASE | {"allreduce": "two_shot"}),
    "nccl_symm": ("baseline", BASE | {"nccl_symm": True}),
    "fused": ("fused_norm", {"comm": "fused", "comm_ctas": 64}),
    "split": ("token_split", SPLIT),
    "async_tp": ("async_tp", {}),
}


def config(rules: list[tuple[int, int, str, dict]], *, model: str = "llama3-8b", hidden: int = 4096, tp: int = 2,
           device: str = "NVIDIA H200") -> tuned.TunedConfig:
    """A tuned config built directly (knobs not checked against the registry)."""
    return tuned.TunedConfig(device, tp, tp, model, SHAPE_8B | {"hidden": hidden}, "bf16",
                             tuple(tuned.Rule(lo, hi, s, k) for lo, hi, s, k in rules))


def rule(lo: int, hi: int, name: str) -> tuple[int, int, str, dict]:
    strategy, knobs = SETTINGS[name]
    return lo, hi, strategy, dict(knobs)


def measured(tmp_path: Path, medians: dict[int, dict[str, float]], seed: int = 0, spread: float = 0.002,
             device: str = synthetic.DEVICE) -> list[analysis.Measured]:
    """Rows with these medians (token count -> setting name -> ms), timed interleaved per count."""
    rng = random.Random(seed)
    rows = []
    for tokens, by_name in medians.items():
        rounds = [1 + rng.gauss(0, spread) for _ in range(30)]  # what a round's clock does to every row in it
        for name, ms in by_name.items():
            strategy, knobs = SETTINGS[name]
            samples = [ms * r * (1 + rng.gauss(0, spread)) for r in rounds]
            rows.append(synthetic.row(strategy, tokens, knobs, samples=samples, pairing=f"p{tokens}", device=device))
    path = tmp_path / f"rows-{seed}-{rng.random():.6f}.jsonl"
    return analysis.read([synthetic.write(path, rows)]).measured
