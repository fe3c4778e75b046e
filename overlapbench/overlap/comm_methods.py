"""The layer's communication methods, one record each: how a chunk's partial sum becomes the next
normed input, as the split and fused strategies' `comm` knob names it.

A record says what builds its reducer (overlap/reducers.py), which `comm` path times its
transfer (comm/paths.py: what `predict` reads from a comm table; or why none does yet), which
CTA budget it runs on, whether it is the copy-engine path whose calls take the `ce_chunks` pieces
and the `ce_out` writer of the rank's own output rows, whether its add +
norm is deferred to the split's main lane (layer.DeferredReducer: then fused_norm, which has no
split, does not offer it), what it needs of the machine (torch symmetric memory, NCCL windows),
and what an engine's export calls it (export/picks.py). The
knobs' choices and help, the strategies' rules, the plans' transfers, `predict`'s per-row paths
and the exports' kinds all derive from these records.

No torch at import (the knobs, spec validation and the exports read the records): a reducer's
builder imports what it runs when it is called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from overlapbench.distributed import DEFAULT
from overlapbench.errors import UserError
from overlapbench.model.schedule import Transfer

if TYPE_CHECKING:
    from overlapbench.model.layer import Reducer
    from overlapbench.timing.step import BuildContext

NCCL_MAX_CTAS, COMM_CTAS = "nccl_max_ctas", "comm_ctas"  # the knobs that hold a method's CTA budget
CE_CHUNKS, AUTO = "ce_chunks", "auto"  # the knob of a chunked method's chunk count; auto: chosen by size
# The knob of who writes a chunked method's own rows of the output: COPY, a same-device copy of the
# published rows on the gather copy stream (before the chunk barrier); KERNEL, the add + norm kernel.
CE_OUT, COPY, KERNEL = "ce_out", "copy", "kernel"
NONE = "none"  # the method that reduces nothing: a split's bound (what the split alone costs)


@dataclass(frozen=True)
class CommMethod:
    """One value of the `comm` knob."""

    name: str
    summary: str  # what it does, in the knob's help
    # (ctx, its CTA budget) -> the chunk's reducer; a chunked method's also takes chunks= (None: by size)
    reducer: Callable[..., Reducer]
    path: str | None  # the comm path (comm/paths.py) that times its transfer; None: it sends nothing
    budget: str | None  # the knob holding its CTA budget: NCCL_MAX_CTAS (NCCL's cap), COMM_CTAS (exactly), None
    engine_kind: str | None  # what an engine's export calls it (export/picks.kind_of); None: no engine runs it
    symmetric: bool = False  # runs on torch symmetric memory (our kernels, the copy engines): CUDA GPUs only
    windows: bool = False  # runs NCCL on registered symmetric windows: NCCL on CUDA GPUs only
    norm_after: bool = True  # a separate residual add + RMSNorm follows the transfer (a fused path norms inside)
    checked: bool = True  # its result is the layer's (none: a bound, not a correct result)
    # the copy-engine path: cuts a call's rows into pieces, one add + norm kernel each, and its own rows
    # of the output are copied or written by that kernel: the ce_chunks and ce_out knobs apply
    chunked: bool = False
    # a chunked method's comm path where the add + norm kernel writes the rank's own rows (`ce_out:
    # kernel`): its transfer is timed as a path of its own (comm/paths.py)
    kernel_out_path: str | None = None
    # its reducer is a layer.DeferredReducer: the transfer on the split's side lane, the add + norm on
    # its main lane before the rows' next compute; a split's method only (fused_norm does not offer it)
    deferred: bool = False
    unpriced: str | None = None  # why `predict` cannot price its reductions yet (its points are skipped rows)

    @property
    def paths(self) -> tuple[str, ...]:
        """The comm paths that time its transfers: its own and, where it has one, its kernel-out path."""
        return tuple(p for p in (self.path, self.kernel_out_path) if p)

    def build(self, ctx: BuildContext, budget: int | str | None, knobs: dict) -> Reducer:
        """Its reducer on `budget` (the value of its budget knob), cutting each call into the
        setting's `ce_chunks` pieces where it is chunked (`auto` or absent: the kernel's count by
        size), its own output rows written as `ce_out` says (absent: copied)."""
        if not self.chunked:
            return self.reducer(ctx, budget)
        chunks = knobs.get(CE_CHUNKS, AUTO)
        return self.reducer(ctx, budget, chunks=None if chunks == AUTO else chunks,
                            sm_out=own_rows_writer(knobs) == KERNEL)

    def transfer(self, ctas: int | str | None, nccl_max_ctas: int | str = DEFAULT, ce_out: str = COPY) -> Transfer:
        """What one reduction sends, in the comm table's terms (model/schedule.Transfer): NCCL's
        ring under its `nccl_max_ctas` cap, the CTA-budgeted paths on `ctas` (a chunked method's
        own rows written by its kernel, `ce_out`: its kernel-out path); nothing for a method that
        sends nothing (the add + norm still runs); a method no comm path prices yet sends nothing
        the comm table knows, and says why (predict skips its points)."""
        if self.unpriced is not None:
            return Transfer(None, norm=False, unpriced=f"comm={self.name}: {self.unpriced}")
        if self.path is None:
            return Transfer(None)
        path = self.kernel_out_path if self.chunked and ce_out == KERNEL else self.path
        return Transfer(path, nccl_max_ctas if self.budget == NCCL_MAX_CTAS else ctas, norm=self.norm_after)


def fused_kernel():
    """The fused all-reduce + norm kernel `comm: fused` runs and the comm path fused_norm times:
    kernel v2's pull variant (kernels/allreduce_norm_pull.py), 5-12% more busbw than its push at
    4-16 CTAs on 2x H200."""
    from kernels.allreduce_norm_pull import AllReduceNormPull

    return AllReduceNormPull


def _nccl(ctx: BuildContext, ctas) -> Reducer:
    from overlapbench.overlap import reducers

    return reducers.collective(ctx, ctas, high_priority=True)


def _nccl_symm(ctx: BuildContext, ctas) -> Reducer:
    from overlapbench.overlap import reducers

    return reducers.collective(ctx, ctas, high_priority=True, symm=True)


def _fused(ctx: BuildContext, ctas) -> Reducer:
    from overlapbench.overlap import reducers

    return reducers.symmetric(ctx, ctas, "fused", fused_kernel())


def _copy_engine(ctx: BuildContext, ctas, chunks: int | None = None, sm_out: bool = False) -> Reducer:
    from kernels.copy_engine_norm import CopyEngineNorm
    from overlapbench.overlap import reducers

    return reducers.symmetric(ctx, ctas, "copy_engine", CopyEngineNorm.allocate, chunks, sm_out)


def _copy_engine_pull(ctx: BuildContext, ctas) -> Reducer:
    from overlapbench.overlap import reducers

    return reducers.copy_engine_pull(ctx)  # no CTA budget: copies and barriers beside compute, the norm at full width


def _none(ctx: BuildContext, ctas) -> Reducer:
    from overlapbench.model.layer import LocalReducer

    return LocalReducer(ctx.eps)


METHODS = (
    CommMethod("nccl", "async NCCL all-reduce + fused add/RMSNorm", _nccl, "nccl", NCCL_MAX_CTAS, "nccl"),
    CommMethod("nccl_symm", "the same on a registered symmetric window (NCCL's symmetric kernel on exactly the "
               "comm_ctas budgets)", _nccl_symm, "nccl_symm", COMM_CTAS, "nccl_symm", windows=True),
    CommMethod("fused", "one symmetric-memory all-reduce+norm kernel", _fused, "fused_norm", COMM_CTAS, "fused_norm",
               symmetric=True, norm_after=False),
    CommMethod("copy_engine", "reduce-scatter and all-gather by the copy engines, add+norm in a local few-CTA kernel",
               _copy_engine, "copy_engine_norm", COMM_CTAS, "fused_norm_copy_engine", symmetric=True, norm_after=False,
               chunked=True, kernel_out_path="copy_engine_norm_kernel"),
    CommMethod("copy_engine_pull", "the copy engines pull every peer's whole partial of the chunk's rows; the add + "
               "norm runs on the main stream just before the rows' next compute (no SM kernel beside compute; "
               "token_split and iso only)", _copy_engine_pull, None, None, None, symmetric=True, norm_after=False,
               deferred=True, unpriced="no comm path times its transfer yet, and its add + norm runs on the main "
               "lane, where a plan's reductions do not put one"),
    CommMethod(NONE, "no reduction (a bound, not a correct result: what the split alone costs)", _none, None, None,
               None, checked=False),
)
BY_NAME = {m.name: m for m in METHODS}
NAMES = tuple(BY_NAME)
# fused_norm's choices: our symmetric-memory methods that reduce in one call (no split, so none deferred)
FUSED_CHOICES = tuple(m.name for m in METHODS if m.symmetric and not m.deferred)
# The methods whose CTA budget is a comm_ctas knob: our kernels' grids first, then NCCL's exact budgets.
CTA_BUDGETED = tuple(m.name for m in sorted(METHODS, key=lambda m: not m.symmetric) if m.budget == COMM_CTAS)
CHUNKED = tuple(m.name for m in METHODS if m.chunked)  # the methods the ce_chunks and ce_out knobs apply to
# a norm inside works on whole rows
PER_ROW_PATHS = tuple(p for m in METHODS if not m.norm_after for p in m.paths)


def own_rows_writer(knobs: dict) -> str:
    """Who writes the rank's own output rows of a copy-engine reduction, as the `ce_out` knob says
    (absent: COPY, the path as it always ran)."""
    return knobs.get(CE_OUT, COPY)


def get(name: str) -> CommMethod:
    """The method a validated `comm` knob names."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise UserError(f"comm: {name!r} is not one of {' | '.join(NAMES)}") from None


def help_text(names: tuple[str, ...]) -> str:
    """`name: summary; ...` of these methods, the knob's help."""
    return "; ".join(f"{name}: {BY_NAME[name].summary}" for name in names)


def listed(names: tuple[str, ...]) -> str:
    """`fused, copy_engine or nccl_symm`."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def for_split(ctx: BuildContext, knobs: dict) -> tuple:
    """The split's (after attention, after MLP) reducers, as its knobs `comm`, `comm_ctas_attn`,
    `comm_ctas_mlp`, `nccl_max_ctas`, `ce_chunks` and `ce_out` ask; NCCL's on the high-priority
    communication lane. A method without a comm_ctas budget reduces both blocks with one reducer."""
    method = get(knobs["comm"])
    if method.budget == COMM_CTAS:
        return tuple(method.build(ctx, knobs[name], knobs) for name in ("comm_ctas_attn", "comm_ctas_mlp"))
    reducer = method.build(ctx, knobs[NCCL_MAX_CTAS], knobs)
    return reducer, reducer
