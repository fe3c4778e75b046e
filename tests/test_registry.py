"""Every registered strategy, at its default knobs, against the reference: a new strategy is
tested the moment it registers, without anyone writing a test for it. On a dense layer stack and
a mixture-of-experts one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from overlapbench import strategies
from overlapbench.model.layer import reference_forward
from overlapbench.model.models import ModelShape
from tests import distributed

SHAPE = ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8)  # divisible by tp=4
MOE = ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8, experts=4, top_k=2, expert_ffn=32)


def _at(shape: ModelShape, world: int) -> ModelShape:
    """The shape with as many kv heads as ranks where it has fewer (TP=8 on CPU)."""
    return dataclasses.replace(shape, kv_heads=world) if shape.kv_heads % world else shape

LAYERS = 2
SEQ_LENS = (29, 14)  # two sequences, neither a multiple of any alignment


def _runs_on_cpu(cls, knobs: dict, world: int) -> str | None:
    """Why this strategy cannot run on `world` gloo processes, or None."""
    if cls.needs.cuda or cls.needs.symmetric_memory:
        return "needs CUDA GPUs"
    if "layer" not in cls.needs.workloads:
        return "no layer workload"
    if world < cls.needs.min_world_size:
        return f"needs {cls.needs.min_world_size} ranks"
    return cls.skip_reason(knobs, cuda=False)


def _rank_all(rank: int, world: int, names: list[str], shape: ModelShape) -> dict:
    from overlapbench.distributed import runtime
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.timing.step import BuildContext

    rt = runtime.init(timeout_s=60)
    stack = build_stack(shape, LAYERS, world, rank, torch.float32, rt.device, 0)
    ctx = BuildContext(rt, stack, SEQ_LENS, RopeTable(shape, max(SEQ_LENS), rt.device), sum(SEQ_LENS))
    x = random_input(sum(SEQ_LENS), shape.hidden, 0, torch.float32, rt.device)
    outputs = {}
    for name in names:
        cls = strategies.get(name)
        step = cls.build(ctx, cls.check_knobs({}, name))
        outputs[name] = step.to_full(step.forward(x)).clone()
    return outputs


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("shape", [SHAPE, MOE], ids=["dense", "moe"])
def test_every_registered_strategy_matches_the_reference(world, shape):
    shape = _at(shape, world)
    runnable, skipped = [], {}
    for cls in strategies.all_strategies():
        reason = _runs_on_cpu(cls, cls.check_knobs({}, cls.name), world)
        if reason:
            skipped[cls.name] = reason
        else:
            runnable.append(cls.name)
    assert "baseline" in runnable and len(runnable) >= 5, f"too few strategies run on CPU: {runnable}; skipped {skipped}"
    ref = reference_forward(shape, LAYERS, world, SEQ_LENS, seed=0)
    outputs = distributed.run(_rank_all, runnable, shape, world=world, timeout=240)
    for rank_outputs in outputs:
        for name, out in rank_outputs.items():
            err = (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()
            cls = strategies.get(name)
            if cls.is_checked(cls.check_knobs({}, name)):
                assert err < 1e-5, f"{name} at its defaults, world {world}, {shape}: rel err {err:.2e}"
            else:  # a bound (no_comm) is not a correct result: the check must be able to tell
                assert err > 1e-3, f"{name} is a bound but matches the reference (rel err {err:.2e})"
