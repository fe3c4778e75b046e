"""The engines `overlapbench export` writes for, one `Engine` record each (picks.Engine), declared
by the engine's own module. The command's registry, `--defaults` and `--engine`'s choices are
these records: a new engine is its module and one line here."""

from __future__ import annotations

from overlapbench.errors import UserError
from overlapbench.export import sglang, tokenweave, trtllm, vllm
from overlapbench.export.picks import Engine

ENGINES = (tokenweave.ENGINE, vllm.ENGINE, sglang.ENGINE, trtllm.ENGINE)  # in the order --help lists them
BY_NAME = {engine.name: engine for engine in ENGINES}
CHOICES = " | ".join(BY_NAME)


def get(engine: str) -> Engine:
    """The engine `--engine` names, in any case (`VLLM` is vllm)."""
    name = engine.strip().lower()
    if name not in BY_NAME:
        raise UserError(f"--engine: {engine!r} is not one of {CHOICES}")
    return BY_NAME[name]
