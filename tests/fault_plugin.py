"""A strategy that misbehaves on purpose, loaded through OVERLAPBENCH_PLUGINS by the robustness
tests: it computes like baseline, except at one token count on one rank."""

from __future__ import annotations

import os
import time

from overlapbench.strategies import register
from overlapbench.strategies.base import Knob, Strategy

_STRUCK: set[int] = set()  # token counts where oom_once struck already


@register
class Fault(Strategy):
    name = "fault"
    summary = "baseline, but `mode` strikes at `at_tokens` on `on_rank` (tests only)"
    knobs = (
        Knob("mode", str, "raise", "what goes wrong (oom_once: out of memory the first time it is built only)",
             choices=("raise", "crash", "hang", "oom", "oom_once")),
        Knob("at_tokens", int, 1, "the token count where it strikes", bounds=(1, 1 << 30)),
        Knob("on_rank", int, 1, "the rank it strikes on", bounds=(0, 1024)),
    )

    @classmethod
    def build(cls, ctx, knobs):
        import torch

        from overlapbench.strategies.baseline import Baseline

        step = Baseline.build(ctx, Baseline.check_knobs({}, "baseline"))
        if ctx.tokens != knobs["at_tokens"] or ctx.runtime.rank != knobs["on_rank"]:
            return step
        mode = knobs["mode"]
        if mode == "oom_once":
            if ctx.tokens in _STRUCK:
                return step
            _STRUCK.add(ctx.tokens)
            raise torch.OutOfMemoryError("CUDA out of memory (injected once by the fault plugin)")
        if mode == "crash":
            os._exit(9)
        if mode == "hang":
            time.sleep(3600)
        if mode == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory (injected by the fault plugin)")
        raise RuntimeError("injected kernel error")
