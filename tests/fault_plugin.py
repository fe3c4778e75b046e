"""A strategy that misbehaves on purpose, loaded through OVERLAPBENCH_PLUGINS by the robustness
tests: it computes like baseline, except at one token count on one rank (EVERY_RANK's modes: on
every rank)."""

from __future__ import annotations

import os
import time

from overlapbench.strategies import register
from overlapbench.strategies.base import Knob, Strategy

_STRUCK: set[int] = set()  # token counts where oom_once struck already
EVERY_RANK = ("oom_in_warmup", "raise_in_profile", "oom_in_profile")  # modes that strike on every rank, not on_rank's


@register
class Fault(Strategy):
    name = "fault"
    summary = "baseline, but `mode` strikes at `at_tokens` on `on_rank` (tests only)"
    knobs = (
        Knob("mode", str, "raise", "what goes wrong: at build (raise, crash, hang, oom; oom_once: the first time it is "
             "built only), or in its forwards after the check's (stuck_later; oom_in_warmup: on every rank), or inside "
             "a CUDA-graph capture (oom_in_capture: more memory than the GPU has free; invalid_capture: a synchronize, "
             "which CUDA forbids there and answers by invalidating the capture), or while its output is checked "
             "(oom_in_check; wrong: its output 5% off), or in --profile's forwards (raise_in_profile, oom_in_profile: "
             "on every rank, before the first profiled forward's collectives; raise_in_timeline: after the eager "
             "timeline's forward)",
             choices=("raise", "crash", "hang", "oom", "oom_once", "stuck_later", "oom_in_warmup", "oom_in_capture",
                      "invalid_capture", "oom_in_check", "wrong", "raise_in_profile", "oom_in_profile", "raise_in_timeline")),
        Knob("at_tokens", int, 1, "the token count where it strikes", bounds=(1, 1 << 30)),
        Knob("on_rank", int, 1, "the rank it strikes on", bounds=(0, 1024)),
    )

    @classmethod
    def build(cls, ctx, knobs):
        import torch

        from overlapbench.strategies.baseline import Baseline

        step = Baseline.build(ctx, Baseline.check_knobs({}, "baseline"))
        mode = knobs["mode"]
        if ctx.tokens != knobs["at_tokens"] or (ctx.runtime.rank != knobs["on_rank"] and mode not in EVERY_RANK):
            return step
        if mode in PROFILE_FAULTS:
            return _in_profile(step, mode)
        if mode in FORWARD_FAULTS:
            return _wrapped(step, FORWARD_FAULTS[mode])
        if mode == "oom_in_check":
            to_full = step.to_full
            step.to_full = lambda out: to_full(out).as_subclass(_out_of_memory_when_read())
            return step
        if mode == "wrong":
            to_full = step.to_full
            step.to_full = lambda out: to_full(out) * 1.05
            return step
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


def _wrapped(step, strike):
    """The step, its forward preceded by `strike(call, x)` (call: 1 for the check's forward)."""
    forward, calls = step.forward, 0

    def run(x):
        nonlocal calls
        calls += 1
        strike(calls, x)
        return forward(x)

    step.forward = run
    return step


PROFILE_FAULTS = ("raise_in_profile", "oom_in_profile", "raise_in_timeline")
TIMELINE_FORWARD = 4  # measure.profile_parts: three forwards for the kernel table, then the eager timeline's


def _in_profile(step, mode: str):
    """The step, its forwards under torch.profiler failing: at the first one's start (raise_in_profile,
    oom_in_profile), or after the eager timeline's forward, its collectives done (raise_in_timeline)."""
    import torch

    forward, profiled = step.forward, 0

    def run(x):
        nonlocal profiled
        if not torch._C._autograd._profiler_enabled():
            return forward(x)
        profiled += 1
        if mode == "oom_in_profile":
            raise torch.OutOfMemoryError("CUDA out of memory (injected in a profiled forward by the fault plugin)")
        if mode == "raise_in_profile":
            raise RuntimeError("injected in a profiled forward by the fault plugin [profile]")
        out = forward(x)
        if profiled == TIMELINE_FORWARD:
            raise RuntimeError("injected after the eager timeline's forward by the fault plugin")
        return out

    step.forward = run
    return step


def _out_of_memory_when_read():
    import torch

    class OutOfMemoryWhenRead(torch.Tensor):
        """An output whose check runs out of memory, as the fp32 copies of a 64K-token output can."""

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func in (torch.Tensor.reshape, torch.Tensor.float, torch.Tensor.sub, torch.Tensor.__sub__):
                raise torch.OutOfMemoryError("CUDA out of memory (injected in the check by the fault plugin)")
            return super().__torch_function__(func, types, args, kwargs or {})

    return OutOfMemoryWhenRead


def _stuck_later(call: int, x) -> None:
    if call > 1:
        _stuck()


def _oom_in_warmup(call: int, x) -> None:
    import torch

    if call > 1:  # every rank at the same call, as a batch whose timed iterations need more than its check did
        raise torch.OutOfMemoryError("CUDA out of memory (injected in warm-up by the fault plugin)")


def _in_capture(fault: str):
    too_much = []  # more bytes than the GPU has, learnt outside the capture (where queries are allowed)

    def strike(call: int, x) -> None:
        import torch

        if not x.is_cuda:
            return
        if not too_much:
            too_much.append(torch.cuda.get_device_properties(x.device).total_memory + 2**30)
        if not torch.cuda.is_current_stream_capturing():
            return
        if fault == "invalid":
            torch.cuda.synchronize()  # forbidden while capturing: raises, and CUDA invalidates the capture
        torch.empty(too_much[0], dtype=torch.uint8, device=x.device)  # a real out-of-memory error, inside the capture

    return strike


FORWARD_FAULTS = {"stuck_later": _stuck_later, "oom_in_warmup": _oom_in_warmup,
                  "oom_in_capture": _in_capture("oom"), "invalid_capture": _in_capture("invalid")}


def _stuck() -> None:
    """Sleep in libc holding the GIL, SIGINT and SIGTERM ignored: no Python handler or thread of
    this process runs again, as in a rank whose main thread spins in a CUDA synchronize or an
    NCCL collective. Only SIGKILL (or SIGHUP's default action) ends it."""
    import ctypes
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL
    while True:
        libc.sleep(3600)
