"""SGLang as an export sees it: its switches for the TP all-reduce, and what its code runs at a token
count under each (sglang_facts.FACTS, with the lines they came from).

With FlashInfer's fusion asked for, batches of at most 2048 tokens (a constant) run the fused
all-reduce + residual + RMSNorm. Otherwise the all-reduce runs NCCL's symmetric kernels where
`--enable-symm-mem` and custom AR does not take the message; else the first of: SGLang's custom
all-reduce (on CUDA the V2 class: messages of at most 16 MiB at TP 2, 4 and 8 on SM90), PyTorch
symmetric memory (when asked: under 64 MiB at TP 2 and 4, 128 MiB at 8; two-shot at TP 2, multimem
from 4; off on a host without NVLink multicast), NCCL.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from overlapbench.errors import UserError
from overlapbench.export import sglang_facts as facts
from overlapbench.export.facts import value
from overlapbench.export.picks import MIB, EngineModel
from overlapbench.export.stand_ins import Path

F = facts.FACTS


@dataclass(frozen=True)
class Setting:
    """SGLang's switches; the defaults are its own."""

    fusion: bool = False  # --flashinfer-allreduce-fusion-backend auto
    custom_ar: bool = True  # off: --disable-custom-all-reduce
    torch_symm: bool = False  # --enable-torch-symm-mem
    nccl_symm: bool = False  # --enable-symm-mem


def check_release(version: str | None) -> str:
    version = version or facts.KNOWN_VERSIONS[-1]
    if version not in facts.KNOWN_VERSIONS or version not in facts.DEFAULTS_READ:
        raise UserError(f"--engine-version: sglang {version!r} is not one whose flags and defaults were read; "
                        f"known: {', '.join(facts.KNOWN_VERSIONS)}")
    return version


class Model(EngineModel):
    """SGLang of one release, for one tuned config."""

    engine = "sglang"
    setting = Setting
    step_cap_tokens = value(F, "STEP_CAP_H100")
    step_cap_devices = facts.STEP_CAP_DEVICES

    def known(self) -> bool:
        return value(F, "CUSTOM_AR_V2_TABLE", self.cap, self.tp) is not None

    def candidates(self, counts: list[int]) -> list[Setting]:
        if not self.known():
            return [Setting()]
        return [Setting(*values) for values in itertools.product((False, True), (True, False), (False, True),
                                                                  (False, True))]

    def custom_ar_max(self) -> int:
        """The largest message SGLang's custom all-reduce takes (the V2 buffers' cap, or its table's)."""
        return min(value(F, "CUSTOM_AR_V2_MAX"), value(F, "CUSTOM_AR_V2_TABLE", self.cap, self.tp))

    def runs(self, s: Setting, tokens: int, multicast: bool) -> Path:
        if not self.known():
            return Path("?", (), f"SGLang's tables hold no {self.config.device} at TP={self.tp}")
        if s.fusion and tokens <= value(F, "FUSION_MAX_TOKENS"):
            return Path("FlashInfer all-reduce + RMSNorm fusion", ("fused_norm",))
        size = tokens * self.row_bytes
        mib = f"{size / MIB:g} MiB"
        # V2 needs all-to-all NVLink (can_use_custom_all_reduce_v2): a host without NVSwitch has it at TP 2 only
        custom = s.custom_ar and (self.tp == 2 or multicast) and size <= self.custom_ar_max()
        if s.nccl_symm and not custom:
            return Path(f"NCCL symmetric kernels ({mib})", ("nccl_symm",))
        if custom:
            return Path(f"custom all-reduce ({mib})", ("symm",))
        symm_max = value(F, "TORCH_SYMM_MAX", self.cap, self.tp)
        if s.torch_symm and multicast and symm_max is not None and size < symm_max:
            if self.tp in (value(F, "TORCH_SYMM_MULTIMEM", self.cap) or ()):
                return Path(f"PyTorch symmetric-memory all-reduce, multimem ({mib})", (),
                            "torch.ops.symm_mem.multimem_all_reduce_ (NVLink multicast): no row of ours runs it",
                            needs_multicast=True)
            return Path(f"PyTorch symmetric-memory all-reduce, two-shot ({mib})", ("two_shot",), needs_multicast=True)
        return Path(f"NCCL all-reduce ({mib})", ("nccl",))
