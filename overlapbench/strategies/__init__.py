"""The strategy registry: every overlap strategy, by name."""

from __future__ import annotations

from overlapbench.errors import UserError, did_you_mean
from overlapbench.strategies.base import DEFAULT, Knob, Needs, Step, Strategy

_REGISTRY: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    if cls.name in _REGISTRY:
        raise ValueError(f"strategy {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def get(name: str, where: str = "strategies") -> type[Strategy]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UserError(
            f"{where}: unknown strategy '{name}'{did_you_mean(name, _REGISTRY)}; "
            f"known: {', '.join(_REGISTRY)}"
        ) from None


def all_strategies() -> list[type[Strategy]]:
    return list(_REGISTRY.values())


# Registration order is the order `overlapbench strategies` and reports list them in.
from overlapbench.strategies import baseline, fused_norm, iso, token_split  # noqa: E402,F401

__all__ = ["DEFAULT", "Knob", "Needs", "Step", "Strategy", "all_strategies", "get", "register"]
