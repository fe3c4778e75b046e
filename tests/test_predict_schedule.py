"""The schedules as data (model/schedule.py) and their simulation (predict/timeline.py): the
real run executes the very tasks predict plays, and the timeline's arithmetic holds on random
durations."""

from __future__ import annotations

import random

import pytest

from overlapbench.model.schedule import MAIN, SIDE, previous_of_chunk, serial, split
from overlapbench.predict.timeline import COMPUTE, NORM, TRANSFER, Phase, play


def _durations(tasks, rng, loss=0.0, transfer=(0.05, 0.3)):
    out = []
    for t in tasks:
        if t.work == "compute":
            out.append([Phase(COMPUTE, rng.uniform(0.5, 2.0))])
        else:
            out.append([Phase(TRANSFER, rng.uniform(*transfer), loss), Phase(NORM, rng.uniform(0.01, 0.05))])
    return out


def test_the_split_schedule_is_tokenweaves_order():
    tasks = split(2, 2)
    assert [(t.work[0], t.block[0], t.layer, t.chunk, t.lane) for t in tasks[:8]] == [
        ("c", "a", 0, 0, MAIN), ("r", "a", 0, 0, SIDE), ("c", "a", 0, 1, MAIN), ("r", "a", 0, 1, SIDE),
        ("c", "m", 0, 0, MAIN), ("r", "m", 0, 0, SIDE), ("c", "m", 0, 1, MAIN), ("r", "m", 0, 1, SIDE)]
    assert previous_of_chunk(tasks)[:6] == [None, 0, None, 2, 1, 4]


def test_serial_is_the_sum_of_its_phases():
    rng = random.Random(11)
    tasks = serial(3)
    phases = _durations(tasks, rng, loss=0.3)  # one lane: no overlap, so no contention either
    assert play(tasks, phases).ms == pytest.approx(sum(p.ms for ps in phases for p in ps))


@pytest.mark.parametrize("chunks", [2, 3, 5])
def test_short_reductions_hide_but_the_last(chunks):
    rng = random.Random(chunks)
    tasks = split(4, chunks)
    phases = _durations(tasks, rng)
    played = play(tasks, phases)
    compute = sum(p.ms for ps in phases for p in ps if p.kind == COMPUTE)
    assert played.ms == pytest.approx(compute + sum(p.ms for p in phases[-1]))
    assert played.exposed_ms == pytest.approx(sum(p.ms for p in phases[-1]))


def test_a_transfer_beside_compute_costs_it_the_measured_loss():
    """One compute of c beside one transfer of t < c that takes g of its speed: c + g t."""
    rng = random.Random(5)
    c, t, g = rng.uniform(1, 2), rng.uniform(0.1, 0.5), rng.uniform(0.05, 0.3)
    tasks = split(1, 2)
    phases = [[Phase(COMPUTE, 0.0)], [Phase(TRANSFER, t, g)], [Phase(COMPUTE, c)], [],
              [Phase(COMPUTE, 0.0)], [], [Phase(COMPUTE, 0.0)], []]
    assert play(tasks, phases).ms == pytest.approx(c + g * t)


def test_long_reductions_are_exposed():
    """Transfers longer than the compute beside them: the side lane sets the pace."""
    rng = random.Random(3)
    tasks = split(2, 2)
    phases = _durations(tasks, rng, transfer=(5.0, 6.0))
    played = play(tasks, phases)
    side = sum(p.ms for t, ps in zip(tasks, phases) if t.lane == SIDE for p in ps)
    assert played.ms > side
    assert played.exposed_ms > 0.5 * side


def test_the_real_split_runs_the_tasks_predict_plays(monkeypatch):
    """SplitForward's compute and reduce calls, recorded on CPU, are the plan's tasks in order."""
    import torch

    from overlapbench.distributed import runtime
    from overlapbench.model.chunks import rope_positions
    from overlapbench.model.models import ModelShape
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.schedule import Batch
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.overlap import split as split_mod
    from overlapbench.strategies import get
    from overlapbench.timing.step import BuildContext

    shape = ModelShape(hidden=64, ffn=128, heads=4, kv_heads=2, head_dim=16)
    seen = []
    compute, reduce = split_mod.SplitForward._compute, split_mod.SplitForward._reduce
    monkeypatch.setattr(split_mod.SplitForward, "_compute", lambda self, t, *gate: seen.append(t) or compute(self, t, *gate))
    monkeypatch.setattr(split_mod.SplitForward, "_reduce", lambda self, t, p: seen.append(t) or reduce(self, t, p))
    rt = runtime.Runtime(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    seq_lens = (23, 18)
    stack = build_stack(shape, 2, 1, 0, torch.float32, rt.device, 0)
    ctx = BuildContext(rt, stack, seq_lens, RopeTable(shape, rope_positions(seq_lens, None), rt.device), 41)
    token_split = get("token_split")
    knobs = token_split.check_knobs({"chunks": 3, "align": 1, "comm": "none"}, "token_split")
    step = token_split.build(ctx, knobs)
    step.forward(random_input(41, 64, 0, torch.float32, rt.device))
    assert seen == token_split.plan(knobs, Batch(seq_lens, (0, 0), shape, 1)).tasks(2)
