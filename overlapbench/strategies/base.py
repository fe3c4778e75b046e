"""What a strategy is: a name, its knobs with their domains, where it can run, and a builder.

This module is imported by spec validation and `overlapbench strategies`, so it stays free of
torch: builders import what they need when a step is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from overlapbench.errors import UserError, did_you_mean, field_name
from overlapbench.overlap import comm_methods
from overlapbench.strategies.knobs import COPY_ENGINE_KNOBS, DEFAULT, Knob
from overlapbench.timing.step import Step

if TYPE_CHECKING:

    from overlapbench.model.schedule import Batch, LayerPlan
    from overlapbench.timing.step import BuildContext


@dataclass(frozen=True)
class Needs:
    """Where a strategy can run; the sweep skips it elsewhere with the reason."""

    cuda: bool = False
    symmetric_memory: bool = False
    min_world_size: int = 1
    workloads: tuple[str, ...] = ("layer",)


class Strategy:
    """Base class: subclasses set the class variables and implement `build`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    knobs: ClassVar[tuple[Knob, ...]] = ()
    needs: ClassVar[Needs] = Needs()
    # False for strategies whose output is not meant to be right (no_comm, the ideal bound).
    checked: ClassVar[bool] = True
    # tune's tie-break: of two strategies the data cannot tell apart, the lower rank wins (the one
    # with fewer moving parts an engine has to carry). Plugins rank after the built-ins by default.
    simplicity: ClassVar[int] = 100

    @classmethod
    def knob(cls, name: str) -> Knob:
        return next(k for k in cls.knobs if k.name == name)

    @classmethod
    def check_knobs(cls, values: dict, where: str) -> dict:
        """Validated knob values with defaults filled in."""
        names = [k.name for k in cls.knobs]
        for name in values:
            if name not in names:
                known = ", ".join(names) if names else "none"
                raise UserError(
                    f"{where}.{field_name(name)}: unknown knob for '{cls.name}'"
                    f"{did_you_mean(name, names)}; its knobs are: {known}"
                )
        checked = {k.name: k.check(values.get(k.name, k.default), f"{where}.{k.name}") for k in cls.knobs}
        cls.check_combination(checked, where)
        for k in cls.knobs:  # a sparse knob at its default is left out (knobs.Knob.sparse)
            if k.sparse and checked[k.name] == k.default:
                del checked[k.name]
        return checked

    @classmethod
    def check_combination(cls, knobs: dict, where: str) -> None:
        """Cross-knob rules (alternatives, dependencies): raise UserError, or reset in place
        knobs that the others make irrelevant."""

    @classmethod
    def is_checked(cls, knobs: dict) -> bool:
        """Whether this setting's output is meant to equal baseline's (and so is checked)."""
        return cls.checked

    @classmethod
    def skip_reason(cls, knobs: dict, cuda: bool) -> str | None:
        """Why this knob setting cannot run here (beyond `needs`), or None."""
        return None

    @classmethod
    def uses_nccl_windows(cls, knobs: dict) -> bool:
        """Whether this setting runs NCCL on registered symmetric windows (runtime.Runtime.window):
        the sweep skips it, with the reason, where those cannot be made."""
        return False

    @classmethod
    def plan(cls, knobs: dict, batch: Batch) -> LayerPlan | None:
        """The layer's schedule at this batch (model/schedule.py): what `build` runs and
        `predict` simulates; None where the strategy has none to give (predict skips it)."""
        return None

    @classmethod
    def build(cls, ctx: BuildContext, knobs: dict) -> Step:
        raise NotImplementedError


class NcclStrategy(Strategy):
    """What baseline and sp_baseline share: NCCL collectives under an SM budget (nccl_max_ctas),
    on plain buffers or on registered symmetric windows (nccl_symm)."""

    @classmethod
    def uses_nccl_windows(cls, knobs):
        return bool(knobs.get("nccl_symm"))

    @classmethod
    def skip_reason(cls, knobs, cuda):
        if knobs.get("nccl_symm") and not cuda:
            return "nccl_symm needs NCCL on CUDA GPUs (registered symmetric windows)"
        return None


def reset_copy_engine_knobs(knobs: dict) -> None:
    """The copy-engine path's knobs (`ce_chunks`, `ce_out`) back to their defaults (and so out of
    the point key) where the `comm` method is not that path (its record's `chunked`): a grid over
    comm methods does not measure the same setting twice."""
    if not comm_methods.get(knobs["comm"]).chunked:
        for knob in COPY_ENGINE_KNOBS:
            if knob.name in knobs:
                knobs[knob.name] = knob.default


class SplitStrategy(Strategy):
    """What token_split and iso share beyond the schedule: the `comm` knob's rules, each its
    method's (overlap/comm_methods.py)."""

    cta_knobs: tuple[str, ...] = ()  # the CTA budgets that only the comm_ctas methods use

    @classmethod
    def check_combination(cls, knobs, where):
        """Knobs that do not apply to the chosen `comm` are reset, so a grid over both comm
        paths does not measure the same setting twice."""
        method = comm_methods.get(knobs["comm"])
        if method.budget != comm_methods.COMM_CTAS:
            for name in cls.cta_knobs:
                knobs[name] = None
        if method.budget != comm_methods.NCCL_MAX_CTAS:
            knobs["nccl_max_ctas"] = DEFAULT
        reset_copy_engine_knobs(knobs)

    @classmethod
    def is_checked(cls, knobs):
        return comm_methods.get(knobs["comm"]).checked  # comm=none is a bound, not a correct result

    @classmethod
    def uses_nccl_windows(cls, knobs):
        return comm_methods.get(knobs["comm"]).windows

    @classmethod
    def skip_reason(cls, knobs, cuda):
        method = comm_methods.get(knobs["comm"])
        if method.symmetric and not cuda:
            return f"comm={method.name} needs CUDA GPUs with symmetric memory"
        if method.windows and not cuda:
            return f"comm={method.name} needs NCCL on CUDA GPUs (registered symmetric windows)"
        return None

    @classmethod
    def transfers(cls, knobs: dict, attention_ctas, mlp_ctas) -> tuple:
        """What the reductions after attention and after the MLP send (model/schedule.Transfer)."""
        method = comm_methods.get(knobs["comm"])
        out = comm_methods.own_rows_writer(knobs)
        return tuple(method.transfer(ctas, knobs["nccl_max_ctas"], out) for ctas in (attention_ctas, mlp_ctas))
