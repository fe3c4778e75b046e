"""The strategy registry: every overlap strategy, by name."""

from __future__ import annotations

from overlapbench.errors import UserError, did_you_mean, shown
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
            f"{where}: unknown strategy {shown(name)}{did_you_mean(name, _REGISTRY)}; "
            f"known: {', '.join(cls.name for cls in all_strategies())}"
        ) from None


def find(name: str) -> type[Strategy] | None:
    """The registered strategy of that name, or None."""
    return _REGISTRY.get(name)


def all_strategies() -> list[type[Strategy]]:
    """Every registered strategy in the one order listings and messages give: simplest first (each
    `simplicity`, as tune prefers them; the bound `no_comm` beside the baseline it bounds), which
    is also the README's and docs/workload.md's order. Plugins (ranked 100) come last."""
    return sorted(_REGISTRY.values(), key=lambda cls: (cls.simplicity, cls.name))


from overlapbench.strategies import async_tp, baseline, flash_agrs, fused_norm, iso, no_comm, sp_baseline, token_split  # noqa: E402,F401


def load_plugins(names: str | None = None) -> None:
    """Import the modules named in OVERLAPBENCH_PLUGINS (comma-separated): custom strategies
    register themselves like the built-in ones."""
    import importlib
    import os

    for name in filter(None, (names or os.environ.get("OVERLAPBENCH_PLUGINS", "")).split(",")):
        try:
            importlib.import_module(name.strip())
        except ImportError as e:
            raise UserError(f"OVERLAPBENCH_PLUGINS: cannot import '{name}' ({e}); check the module name and PYTHONPATH") from None


__all__ = ["DEFAULT", "Knob", "Needs", "Step", "Strategy", "all_strategies", "find", "get", "register"]
