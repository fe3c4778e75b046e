"""What a strategy is: a name, its knobs with their domains, where it can run, and a builder.

This module is imported by spec validation and `overlapbench strategies`, so it stays free of
torch: builders import what they need when a step is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from overlapbench.errors import UserError, did_you_mean, field_name

if TYPE_CHECKING:
    import torch

    from overlapbench.runtime import BuildContext


DEFAULT = "default"  # a knob value meaning "leave it to the library"


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

    def domain(self) -> str:
        parts = []
        if self.choices is not None:
            parts.append(" | ".join(map(str, self.choices)))
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
            raise UserError(f"{where}: {value!r} is not one of {self.domain()}")
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, self.type) or (self.type is int and isinstance(value, bool)):
            raise UserError(f"{where}: {value!r} is not a {self.domain()}")
        if self.bounds is not None and not self.bounds[0] <= value <= self.bounds[1]:
            raise UserError(f"{where}: {value!r} is outside {self.domain()}")
        return value


@dataclass(frozen=True)
class Needs:
    """Where a strategy can run; the sweep skips it elsewhere with the reason."""

    cuda: bool = False
    symmetric_memory: bool = False
    min_world_size: int = 1
    workloads: tuple[str, ...] = ("layer",)


@dataclass
class Step:
    """What a strategy builds for one point.

    `forward(x)` runs the whole stack on the full, replicated input x ([tokens, hidden]) and is
    what gets timed (and captured in a CUDA graph where `graphable`). `to_full(y)` turns its
    output into the full replicated [tokens, hidden] result, for the correctness check only.
    """

    forward: Callable[["torch.Tensor"], "torch.Tensor"]
    to_full: Callable[["torch.Tensor"], "torch.Tensor"] = field(default=lambda y: y)
    graphable: bool = True


class Strategy:
    """Base class: subclasses set the class variables and implement `build`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    knobs: ClassVar[tuple[Knob, ...]] = ()
    needs: ClassVar[Needs] = Needs()
    # False for strategies whose output is not meant to be right (no_comm, the ideal bound).
    checked: ClassVar[bool] = True

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
    def build(cls, ctx: "BuildContext", knobs: dict) -> Step:
        raise NotImplementedError
