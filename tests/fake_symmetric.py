"""Symmetric memory on CPU threads, for the copy-engine kernels' protocol tests: threads play the
ranks (`run_ranks`) over a fake symmetric memory (`FakeHandle`: views of one process's tensors,
synchronous copies, one threading barrier per channel), `SimStreams` stands in for a kernel's
streams, and `patch_engines` hands the strategies' reducers one stand-in kernel per rank in
place of the run's symmetric buffers (`RecordingKernel`: one that only records its calls). Used by
tests/test_copy_engine_norm.py, tests/test_copy_engine_pull.py, tests/test_sequence_parallel.py
(flash_agrs's transport), tests/test_ce_chunks.py and tests/test_ce_out.py."""

from __future__ import annotations

import math
import random
import threading
import time

import torch

EPS = 1e-5


class FakeHandle:
    """Views of every rank's buffer, one threading barrier per channel, and each rank's barrier
    channels in the order it entered them (`log`, by the rank that run_ranks gave the thread)."""

    local = threading.local()

    def __init__(self, bufs, world):
        self.bufs = bufs
        self._barriers = {channel: threading.Barrier(world) for channel in range(4)}
        self.log = [[] for _ in range(world)]

    def get_buffer(self, rank, shape, dtype, storage_offset=0):
        return self.bufs[rank][storage_offset : storage_offset + math.prod(shape)].view(shape)

    def barrier(self, channel=0):
        self.log[self.local.rank].append(channel)
        self._barriers[channel].wait(timeout=30)

    def abort(self):
        for b in self._barriers.values():
            b.abort()


class _Event:
    done = False


class SimStreams:
    """CopyEngineNorm's streams on a CPU thread: ops queue per stream and run at join, each
    step the head of a random stream that is ready (a wait is ready once its event was
    recorded), with now and then a short sleep so the ranks' threads interleave differently."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.queues: dict[int, list] = {0: [], 1: [], 2: []}

    def fork(self) -> None:
        event = self.record(0)
        self.wait(1, event)
        self.wait(2, event)

    def run(self, stream, fn) -> None:
        self.queues[stream].append(("run", fn))

    def record(self, stream):
        event = _Event()
        self.queues[stream].append(("record", event))
        return event

    def wait(self, stream, event) -> None:
        self.queues[stream].append(("wait", event))

    def join(self) -> None:
        while any(self.queues.values()):
            ready = [s for s, q in self.queues.items() if q and (q[0][0] != "wait" or q[0][1].done)]
            if not ready:
                raise RuntimeError(f"streams wait on events never recorded: {self.queues}")
            kind, arg = self.queues[self.rng.choice(ready)].pop(0)
            if kind == "run":
                arg()
            elif kind == "record":
                arg.done = True
            if self.rng.random() < 0.05:
                time.sleep(0.0002)


def reference(partials, residual, weight):
    """(new residual, rmsnorm(new residual) * weight) of the summed partials, in float64 then fp32."""
    total = sum(p.double() for p in partials)
    new = (total + residual.double()).float()
    y = new * torch.rsqrt(new.pow(2).mean(-1, keepdim=True) + EPS) * weight
    return new, y


def run_ranks(world: int, fn) -> list:
    """fn(rank) on `world` threads, each rank's result; a failing rank aborts fn.handle's barriers,
    so the others fail too instead of hanging."""
    results, errors = [None] * world, []

    def main(rank):
        FakeHandle.local.rank = rank
        try:
            results[rank] = fn(rank)
        except BaseException as e:
            errors.append(f"rank {rank}: {e!r}")
            fn.handle.abort()

    threads = [threading.Thread(target=main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


def layer_context(rank: int, world: int, shape, layers: int, seq_lens: tuple[int, ...]):
    """One rank's BuildContext on CPU (the tests' reducers stand in for the collectives) over a
    seeded stack, and the batch's input, as reference_forward builds them (seed 0)."""
    from overlapbench.distributed.runtime import Runtime
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.timing.step import BuildContext

    rt = Runtime(rank, world, rank, torch.device("cpu"), "gloo")
    tokens = sum(seq_lens)
    stack = build_stack(shape, layers, world, rank, torch.float32, rt.device, 0)
    ctx = BuildContext(rt, stack, seq_lens, RopeTable(shape, max(seq_lens), rt.device), tokens)
    return ctx, random_input(tokens, shape.hidden, 0, torch.float32, rt.device)


def layer_outputs(world: int, handle, shape, layers: int, seq_lens: tuple[int, ...], settings,
                  observe=None) -> list[list]:
    """Each rank's whole output (rank order) of each (strategy, knobs) setting, built and run
    one after another on the rank's layer_context, every rank on a thread of run_ranks (a failing
    rank aborts `handle`'s barriers). `observe(rank, run)`, where given, runs each setting in its
    place (`run()` gives the output) and returns what is kept of it: what the fakes logged
    during that setting beside its output, say."""
    from overlapbench import strategies

    def rank_main(rank):
        ctx, x = layer_context(rank, world, shape, layers, seq_lens)
        outs = []
        for name, knobs in settings:
            cls = strategies.get(name)
            step = cls.build(ctx, cls.check_knobs(knobs, name))

            def run(step=step):
                return step.to_full(step.forward(x)).clone()

            outs.append(run() if observe is None else observe(rank, run))
        return outs

    rank_main.handle = handle
    return run_ranks(world, rank_main)


class RecordingKernel:
    """Stands in for the run's symmetric kernel (reducers._engine's) where only what the reducers
    pass matters: records each call's rows, CTA budget and the keywords it was given (absent: the
    kernel's own), and returns `out` untouched."""

    returns_view = False

    def __init__(self):
        self.calls = []

    def partial(self, begin, end):
        return None

    def __call__(self, row_start, row_end, residual, weight, eps, out, num_ctas, **kwargs):
        self.calls.append((row_start, row_end, num_ctas, kwargs))
        return out


def patch_engines(monkeypatch, kernels: dict[str, list]) -> None:
    """The run's symmetric kernel of each `comm` method named (reducers._engine's) replaced by
    kernels[comm][rank]: one stand-in per rank, shared by every reducer of that method."""
    from overlapbench.overlap import reducers

    monkeypatch.setattr(reducers, "_engine", lambda ctx, comm, make_kernel: kernels[comm][ctx.runtime.rank])
