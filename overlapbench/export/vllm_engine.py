"""vLLM as an export sees it: the settings a user can give it for the TP all-reduce, and what its
code runs at a token count under each (vllm_facts.FACTS, with the lines they came from).

Of a dense model's all-reduces, each is followed by the residual add + RMSNorm, so where the
fusion pass applies (compiled ranges ending at or below its bound) every one is fused. Elsewhere
CudaCommunicator.all_reduce runs the first of: FlashInfer's standalone all-reduce (up to the
built-in fusion table's bytes; it shares one workspace with the fusion, made by the fusion pass
when the fusion is on, so with the fusion on it takes no message above the fusion's bound), NCCL's
symmetric kernels (when asked, from world size 4), vLLM's custom all-reduce (under 8 MiB; under
its SM90 table's size, if smaller, where PyTorch symmetric memory is up; at world size 2 or on an
all-to-all NVLink host), PyTorch symmetric memory (up to its table's size, where the host has NVLink
multicast: two-shot at world size 2, multimem at 4, 6, 8 on SM90), pynccl. A host without NVLink
multicast (no NVSwitch) is taken to have no all-to-all NVLink above world size 2 either.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from overlapbench.errors import UserError
from overlapbench.export import vllm_facts as facts
from overlapbench.export.facts import value
from overlapbench.export.picks import MIB, EngineModel
from overlapbench.export.stand_ins import Path
from overlapbench.tuning import tune

F = facts.FACTS
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8, 16)  # CustomAllreduce._SUPPORTED_WORLD_SIZES


@dataclass(frozen=True)
class Setting:
    """What the export can set: the fusion (on/off, its bound in tokens; None: vLLM's built-in
    one) and the plain all-reduce's switches. The defaults are vLLM's."""

    fusion: bool = True
    fusion_tokens: int | None = None
    flashinfer_ar: bool = True  # VLLM_ALLREDUCE_USE_FLASHINFER
    custom_ar: bool = True  # off: --disable-custom-all-reduce
    symm_mem: bool = True  # VLLM_ALLREDUCE_USE_SYMM_MEM
    nccl_symm: bool = False  # VLLM_USE_NCCL_SYMM_MEM


def check_release(version: str | None) -> str:
    """The release whose defaults the export is judged against; one whose code was not read is refused."""
    version = version or facts.DEFAULT_VERSION
    if version not in facts.VERSIONS:
        raise UserError(f"--engine-version: vllm {version!r} is not one whose key names were read; "
                        f"known: {', '.join(facts.known_versions())}")
    if version not in facts.DEFAULTS_READ:
        raise UserError(f"--engine-version: vllm {version}'s defaults were not read (its key names were), and an "
                        f"export must know them to stay no slower; read: {', '.join(facts.DEFAULTS_READ)} "
                        f"(add a release: python tests/checks/engine_facts.py --lines WHEEL)")
    return version


class Model(EngineModel):
    """vLLM of one release, for one tuned config (its GPU, TP, hidden size and dtype)."""

    engine = "vllm"
    setting = Setting
    step_cap_tokens = value(F, "STEP_CAP_SERVE")
    step_cap_devices = facts.STEP_CAP_DEVICES

    def known(self) -> bool:
        """Whether vLLM's tables were read for this GPU and TP."""
        return value(F, "FUSION_MAX_MB", self.cap, self.tp) is not None

    def builtin_fusion_tokens(self) -> int | None:
        mb = value(F, "FUSION_MAX_MB", self.cap, self.tp)
        return None if mb is None else int(mb * MIB) // self.row_bytes

    def fusion_tokens(self, s: Setting) -> int | None:
        """The last token count the fusion takes under `s` (None: off)."""
        if not s.fusion or not self.known():
            return None
        return s.fusion_tokens if s.fusion_tokens is not None else self.builtin_fusion_tokens()

    def candidates(self, counts: list[int]) -> list[Setting]:
        if not self.known() or not counts:
            return [Setting()]
        bounds = [counts[0] - 1] if counts[0] > 1 else []
        bounds += [tune.boundary(a, b) for a, b in zip(counts, counts[1:])]
        bounds.append(max(counts[-1], self.config.max_tokens))
        fusion = [(True, None), (False, None), *((True, b) for b in bounds)]
        nccl_symm = (False, True) if self.tp >= value(F, "NCCL_SYMM_MIN_WORLD") else (False,)
        return [Setting(f, t, fi, ca, sm, ns) for (f, t), fi, ca, sm, ns
                in itertools.product(fusion, (True, False), (True, False), (True, False), nccl_symm)]

    def runs(self, s: Setting, tokens: int, multicast: bool) -> Path:
        if not self.known():
            return Path("?", (), f"vLLM's tables hold no {self.config.device} at TP={self.tp}")
        size = tokens * self.row_bytes
        bound = self.fusion_tokens(s)
        if bound is not None and tokens <= bound:
            return Path("FlashInfer all-reduce + RMSNorm fusion", ("fused_norm",))
        return self._plain(s, size, multicast, fusion_on=bound is not None)

    def _plain(self, s: Setting, size: int, multicast: bool, fusion_on: bool) -> Path:
        mib = f"{size / MIB:g} MiB"
        fi_max = value(F, "FUSION_MAX_MB", self.cap, self.tp) * MIB
        flashinfer = s.flashinfer_ar and not fusion_on and size <= fi_max
        if s.nccl_symm and not flashinfer and self._nccl_symm_takes(size):
            return Path(f"NCCL symmetric kernels ({mib})", ("nccl_symm",))
        if flashinfer:
            return Path(f"FlashInfer all-reduce, unfused ({mib})", ("symm",))
        symm_max = value(F, "SYMM_MEM_MAX", self.cap, self.tp)
        symm_up = s.symm_mem and multicast and symm_max is not None
        if s.custom_ar and self.tp in CUSTOM_AR_WORLD_SIZES and (self.tp == 2 or multicast):
            ca_max = value(F, "CUSTOM_AR_MAX")
            with_symm = value(F, "CUSTOM_AR_MAX_WITH_SYMM", self.cap, self.tp)
            if symm_up and with_symm is not None:
                ca_max = min(ca_max, with_symm)
            if size < ca_max:
                return Path(f"vLLM custom all-reduce ({mib})", ("symm",))
        if symm_up and size <= symm_max:
            if self.tp in (value(F, "SYMM_MEM_MULTIMEM", self.cap) or ()):
                return Path(f"PyTorch symmetric-memory all-reduce, multimem ({mib})", (),
                            "torch.ops.symm_mem.multimem_all_reduce_ (NVLink multicast): no row of ours runs it",
                            needs_multicast=True)
            return Path(f"PyTorch symmetric-memory all-reduce, two-shot ({mib})", ("two_shot",), needs_multicast=True)
        return Path(f"pynccl all-reduce ({mib})", ("nccl",))

    def _nccl_symm_takes(self, size: int) -> bool:
        if self.tp < value(F, "NCCL_SYMM_MIN_WORLD"):
            return False
        preferred = value(F, "NCCL_SYMM_CUSTOM_RANGE", self.tp)
        if preferred is None:
            return self.tp > 8
        lower, upper = preferred
        return size <= lower or size >= upper
