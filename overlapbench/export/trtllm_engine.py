"""TensorRT-LLM as an export sees it: its one global `allreduce_strategy`, and what its code runs
at a token count under each value (trtllm_facts.FACTS, each with the commit and function it was
read in).

By default (AUTO, the autotuner on) it times its candidates at warm-up, per power-of-two bucket of
token counts up to 8192, and runs the fastest: NCCL's symmetric kernels and NCCL always; ONESHOT
and TWOSHOT (fused with the residual add + RMSNorm where the layer asks) where the message fits its
64 MiB workspace, TWOSHOT from TP tokens. So AUTO is at least as fast as the fastest stand-in of
its candidates, and a strategy forced in its place can at best tie it. Above 8192 tokens what AUTO
runs was not traced. A forced strategy whose message does not fit the workspace runs NCCL.
"""

from __future__ import annotations

from dataclasses import dataclass

from overlapbench.export import trtllm_facts as facts
from overlapbench.export.facts import value
from overlapbench.export.picks import MIB, EngineModel
from overlapbench.export.stand_ins import Path

F = facts.FACTS
STRATEGIES = ("AUTO", "NCCL", "TWOSHOT", "ONESHOT")  # the ones judged; the default first


@dataclass(frozen=True)
class Setting:
    strategy: str = "AUTO"


class Model(EngineModel):
    """TensorRT-LLM (its source at the commits read), for one tuned config."""

    engine = "trtllm"
    setting = Setting  # no step_cap_tokens: its max_num_tokens default was not read, so step_cap() is None

    def known(self) -> bool:
        return self.cap is not None

    def candidates(self, counts: list[int]) -> list[Setting]:
        return [Setting(s) for s in STRATEGIES] if self.known() else [Setting()]

    def runs(self, s: Setting, tokens: int, multicast: bool) -> Path:
        if not self.known():
            return Path("?", (), f"no facts for {self.config.device}")
        size = tokens * self.row_bytes
        mib = f"{size / MIB:g} MiB"
        fits = size <= value(F, "WORKSPACE_DEFAULT")
        if s.strategy == "AUTO":
            if tokens > value(F, "AUTOTUNE_MAX_TOKENS"):
                return Path(f"AUTO above its autotuner's buckets ({mib})", (),
                            "the autotuner tunes token counts up to 8192; what it runs above was not traced")
            kinds = ("nccl_symm", "nccl", "fused_norm") if fits and tokens >= self.tp else ("nccl_symm", "nccl")
            names = "NCCL_SYMMETRIC, NCCL" + (", ONESHOT, TWOSHOT" if fits else "")
            return Path(f"AUTO: the fastest of {names} at warm-up ({mib})", kinds,
                        "ONESHOT has no stand-in: AUTO is at most as slow as the fastest stand-in" if fits else "")
        if s.strategy == "NCCL" or not fits:
            return Path(f"NCCL ({mib})", ("nccl",))
        if s.strategy == "ONESHOT" or tokens < self.tp:
            return Path(f"ONESHOT ({mib})", (), "its one-shot kernel fused with the norm: no row of ours runs it")
        return Path(f"TWOSHOT, fused with add + RMSNorm ({mib})", ("fused_norm",))
