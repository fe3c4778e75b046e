"""Knobs: a tunable parameter's name, type, domain and help, and the knobs several strategies
share, defined once.

A leaf module, free of torch: spec validation, `overlapbench strategies`, the tuned-config loader
and the strategies' declarations all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from overlapbench.errors import UserError, shown

DEFAULT = "default"  # a knob value meaning "leave it to the library"


def show_value(value: Any) -> str:
    """A knob value as a user writes it in a spec (YAML): null, true, false, 8, balanced."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _with_article(phrase: str) -> str:
    """'a float in [0, 1]', 'an int in [1, 64]'."""
    return f"{'an' if phrase[:1].lower() in 'aeiou' else 'a'} {phrase}"


@dataclass(frozen=True)
class Knob:
    """A tunable parameter: its type, its domain and what it does."""

    name: str
    type: type  # int, float, str or bool
    default: Any
    help: str
    choices: tuple | None = None
    bounds: tuple[float, float] | None = None  # closed interval for int/float knobs
    library_default: bool = False  # also accepts "default": the library picks
    optional: bool = False  # None means "not set" (knobs that are alternatives)
    # Left out of a setting's knobs (so of its point key and its rows) while at its default: a
    # knob added to a strategy keeps the points of earlier runs, and the reference's default
    # setting, what they were.
    sparse: bool = False

    def domain(self) -> str:
        parts = []
        if self.choices is not None:
            parts.append(" | ".join(map(show_value, self.choices)))
        if self.bounds is not None:
            parts.append(f"{self.type.__name__} in [{self.bounds[0]}, {self.bounds[1]}]")
        if self.choices is None and self.bounds is None:
            parts.append(self.type.__name__)
        if self.library_default:
            parts.append(DEFAULT)
        if self.optional:
            parts.append("null")
        return " | ".join(parts)

    def check(self, value: Any, where: str) -> Any:
        """The value, normalized; a UserError naming `where` if it is outside the domain."""
        if value is None and self.optional:
            return None
        if value == DEFAULT and self.library_default:
            return DEFAULT
        if self.choices is not None and value in self.choices and not isinstance(value, bool):
            return value
        if self.bounds is None and self.choices is not None:
            raise UserError(f"{where}: {shown(value)} is not one of {self.domain()}")
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, self.type) or (self.type is int and isinstance(value, bool)):
            raise UserError(f"{where}: {shown(value)} is not {_with_article(self.domain())}")
        if self.bounds is not None and not self.bounds[0] <= value <= self.bounds[1]:
            raise UserError(f"{where}: {shown(value)} is outside {self.domain()}")
        return value


# The fused kernel's CTA budget limit; kernels.allreduce_norm checks the same number.
MAX_COMM_CTAS = 64

NCCL_MAX_CTAS = Knob(
    "nccl_max_ctas", int, DEFAULT,
    "SM budget of NCCL: max CTAs of its kernels (a process group created with that max_ctas)",
    bounds=(1, 64), library_default=True,
)
NCCL_SYMM = Knob(
    "nccl_symm", bool, False,
    "true: NCCL's collectives on buffers registered as symmetric windows, so that NCCL (2.27+) runs its "
    "symmetric kernels (peer loads and stores, no multicast) on exactly nccl_max_ctas CTAs (default: its "
    "own choice); false: plain buffers (its ring kernels)",
    sparse=True,
)
ALLREDUCE = Knob(
    "allreduce", str, "nccl",
    "the all-reduce's kernel: nccl (NCCL's, as nccl_max_ctas and nccl_symm say); one_shot or two_shot: "
    "PyTorch's symmetric-memory all-reduce (torch.ops.symm_mem: every rank loads its peers' partials, "
    "no multicast), the peer-memory kernels engines run below their size limits (vLLM's custom and "
    "symmetric-memory all-reduce, TensorRT-LLM's ONESHOT/TWOSHOT)",
    choices=("nccl", "one_shot", "two_shot"), sparse=True,
)
COMM = Knob(
    "comm", str, "nccl",
    "nccl: async NCCL all-reduce + fused add/RMSNorm; nccl_symm: the same on a registered symmetric "
    "window (NCCL's symmetric kernel on exactly the comm_ctas budgets); fused: one "
    "symmetric-memory all-reduce+norm kernel; copy_engine: reduce-scatter and all-gather by the copy "
    "engines, add+norm in a local few-CTA kernel; none: no reduction (a bound, not a correct result: "
    "what the split alone costs)",
    choices=("nccl", "nccl_symm", "fused", "copy_engine", "none"),
)
# The kernel behind comm=fused (strategies) and the comm path fused_norm: "v2pull" (kernel v2's
# pull variant, kernels/allreduce_norm_pull.py: 5-12% more busbw than push at 4-16 CTAs on
# 2x H200, measured there), "v2" (push, kernels/allreduce_norm_v2.py), "v2pullpush", or "v1"
# (kernels/allreduce_norm.py, the residual replicated).
FUSED_KERNEL = "v2pull"
# The comm values that run on torch's symmetric memory (our kernels, the copy engines).
SYMMETRIC_COMM = ("fused", "copy_engine")
# The comm values whose CTA budget is a comm_ctas knob (the kernel's grid, the copy-engine path's
# local add+norm kernel's, or NCCL's symmetric all-reduce's, exact).
CTA_COMM = (*SYMMETRIC_COMM, "nccl_symm")
FUSED_COMM = Knob(
    "comm", str, "fused",
    "fused: one symmetric-memory all-reduce+norm kernel; copy_engine: reduce-scatter and "
    "all-gather by the copy engines, add+norm in a local few-CTA kernel",
    choices=SYMMETRIC_COMM,
)
ALIGN = Knob("align", int, 256, "round the cut to a multiple of this many tokens", bounds=(1, 4096))


def comm_ctas(name: str, what: str) -> Knob:
    return Knob(name, int, 8, f"CTA budget of the fused all-reduce+norm kernel, of the copy-engine path's "
                f"add+norm kernel, or of NCCL's symmetric all-reduce (exactly that many), {what}",
                bounds=(1, MAX_COMM_CTAS))
# issue 36 (long prompts): how many chunks a split cuts the batch into. Sparse: 2, TokenWeave's
# schedule, keeps the point keys of the rows measured before the knob existed.
CHUNKS = Knob(
    "chunks", int, 2,
    "chunks the batch is cut into: 2 = TokenWeave's two halves; more: each chunk's reduction hides under "
    "the next chunk's compute, and the exposed tail (the last chunk's MLP reduction) shrinks to 1/chunks",
    bounds=(2, 16), sparse=True,
)
