"""Knobs: a tunable parameter's name, type, domain and help, and the knobs several strategies
share, defined once. The `comm` knob's values are the layer's communication methods
(overlap/comm_methods.py): its choices and help are theirs.

Free of torch: spec validation, `overlapbench strategies`, tune and report, and the strategies'
declarations all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from overlapbench.distributed import DEFAULT  # a knob value meaning "leave it to the library"
from overlapbench.errors import UserError, shown
from overlapbench.overlap import comm_methods


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
    summary: str = ""  # what it sets, in a few words, for notes that name it (an export's)

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
COMM = Knob("comm", str, "nccl", comm_methods.help_text(comm_methods.NAMES), choices=comm_methods.NAMES)
NO_TRANSFER = comm_methods.NONE  # COMM's value that reduces nothing: a split's bound
FUSED_COMM = Knob("comm", str, "fused", comm_methods.help_text(comm_methods.FUSED_CHOICES),
                  choices=comm_methods.FUSED_CHOICES)
ALIGN = Knob("align", int, 256, "round the cut to a multiple of this many tokens", bounds=(1, 4096))


def comm_ctas(name: str, what: str) -> Knob:
    return Knob(name, int, 8, f"CTA budget of the fused all-reduce+norm kernel, of the copy-engine path's "
                f"add+norm kernel, or of NCCL's symmetric all-reduce (exactly that many), {what}",
                bounds=(1, MAX_COMM_CTAS))


# How many chunks a split cuts the batch into. Sparse: at 2, TokenWeave's schedule, a setting's
# point key is the one it has without the knob.
CHUNKS = Knob(
    "chunks", int, 2,
    "chunks the batch is cut into: 2 = TokenWeave's two halves; more: each chunk's reduction hides under "
    "the next chunk's compute, and the exposed tail (the last chunk's MLP reduction) shrinks to 1/chunks",
    bounds=(2, 16), sparse=True,
)

# How many pieces the copy-engine path cuts each call's rows into (kernels/copy_engine_norm.py).
# Sparse: at auto (the kernel's count by size) a setting's point key is the one it has without
# the knob. The `comm` methods it applies to are their records' (comm_methods.CHUNKED).
CE_CHUNKS = Knob(
    comm_methods.CE_CHUNKS, int, comm_methods.AUTO,
    f"comm={comm_methods.listed(comm_methods.CHUNKED)} only: pieces each reduction's rows are cut into, one "
    "add + norm kernel each beside the copy engines' pulls (1: the serial schedule, no side streams); auto: by "
    "size (the kernel's own count, as `comm --ce-chunks auto`). Each piece's kernel waits for "
    "SMs held by the layer's GEMMs and attention, so fewer pieces queue fewer times beside the layer",
    choices=(comm_methods.AUTO,), bounds=(1, 16), sparse=True, summary="the copy-engine path's pieces per reduction",
)

# Who writes the rank's own rows of the copy-engine path's output (kernels/copy_engine_norm.py,
# `sm_out`). Sparse: at copy (the path as it always ran) a setting's point key is the one it has
# without the knob. The `comm` methods it applies to are ce_chunks' (comm_methods.CHUNKED).
CE_OUT = Knob(
    comm_methods.CE_OUT, str, comm_methods.COPY,
    f"comm={comm_methods.listed(comm_methods.CHUNKED)} only: who writes the rank's own rows of each "
    f"reduction's output: {comm_methods.COPY}, a same-device copy of the published rows on the gather copy "
    f"stream before each piece's barrier (a copy that waits for SMs beside compute like a kernel); "
    f"{comm_methods.KERNEL}, the add + norm kernel itself (one more write of the own rows in it; the barrier "
    "follows the kernel at once)",
    choices=(comm_methods.COPY, comm_methods.KERNEL), sparse=True, summary="who writes the rank's own rows of its output",
)
# The copy-engine path's knobs, which every strategy whose `comm` can be that path takes, and
# which are reset to their defaults with another `comm` (base.reset_copy_engine_knobs).
COPY_ENGINE_KNOBS = (CE_CHUNKS, CE_OUT)

# When a split's reduction starts against the compute beside it. Sparse: at ready a setting's
# point key is the one it has without the knob.
READY, AFTER_NEXT_GEMM = "ready", "after_next_gemm"
REDUCE_START = Knob(
    "reduce_start", str, READY,
    f"when each chunk's reduction starts on the communication lane: {READY}, as soon as its partial sum "
    f"is (TokenWeave's order: its kernels are launched before the next chunk's first GEMM and take SMs the "
    f"GEMM then waits for); {AFTER_NEXT_GEMM}, once the next chunk's first GEMM (QKV, gate/up) has ended, "
    "so the transfer runs mostly beside the attention and smaller kernels after it, not the GEMMs: it pays "
    "for SM-based paths where that compute can hide it (nccl_symm from 4K tokens of llama3-70b), and "
    "only delays the copy engine, whose transfers take no SMs from a GEMM (docs/long-prompts.md)",
    choices=(READY, AFTER_NEXT_GEMM), sparse=True, summary="when a chunk's reduction starts",
)

# SMs the main lane's GEMMs leave to the communication lane. Sparse: at 0 a setting's point key is
# the one it has without the knob.
GEMM_CARVEOUT = Knob(
    "gemm_carveout", int, 0,
    "SMs that the main lane's GEMMs leave free for the communication lane's kernels (cuBLAS's SM count "
    "target: the device's SMs minus this, through torch's experimental SM carveout); 0: every SM. A "
    "persistent GEMM holds its SMs to its end, so a reduction kernel queued beside it waits for the next "
    "kernel boundary unless SMs are left free",
    bounds=(0, 64), sparse=True,
)
