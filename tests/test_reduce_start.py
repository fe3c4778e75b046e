"""The `reduce_start` knob of token_split and iso: with `after_next_gemm` each chunk's reduction
is issued after the next chunk's compute and waits for that compute's first GEMM
(schedule.behind_next_compute, schedule.gated_by, split.Lanes).

On CPU both lanes run inline and no event is recorded; what is checked is the schedule (each
lane's order and every data dependency kept, every reduction but the stack's last gated by the
compute that follows it in TokenWeave's order), that the real forward issues exactly those tasks
and asks each gating compute for its first GEMM (and no other), that the output is the same bits
as without the knob, the knob's rules, and that `predict` skips its points saying why."""

from __future__ import annotations

import random

import pytest
import torch

from overlapbench import strategies
from overlapbench.errors import UserError
from overlapbench.model.chunks import rope_positions
from overlapbench.model.layer import reference_forward
from overlapbench.model.models import PRESETS
from overlapbench.model.schedule import COMPUTE, MAIN, REDUCE, SIDE, behind_next_compute, gated_by, previous_of_chunk, split
from tests import distributed

SHAPE = PRESETS["tiny"]
LAYERS = 2


@pytest.mark.parametrize("seed", range(6))
def test_the_reordered_schedule_keeps_every_lane_and_dependency_and_gates_each_reduction(seed):
    rng = random.Random(seed)
    tasks = split(rng.randrange(1, 5), rng.randrange(2, 6))
    moved = behind_next_compute(tasks)
    assert sorted(moved, key=tasks.index) == tasks  # the same tasks
    for lane in (MAIN, SIDE):
        assert [t for t in moved if t.lane == lane] == [t for t in tasks if t.lane == lane]
    waits = lambda ts: {(ts[j], ts[i]) for j, i in enumerate(previous_of_chunk(ts)) if i is not None}
    assert waits(moved) == waits(tasks)  # each task waits for the same task of its chunk
    gates = gated_by(moved)
    assert gated_by(tasks) == [None] * len(tasks)  # TokenWeave's order gates nothing
    for j, task in enumerate(moved):
        if task.work == COMPUTE or j == len(moved) - 1:
            assert gates[j] is None, (j, task)
            continue
        # every reduction but the stack's last waits for the compute listed after it in TokenWeave's order
        after = tasks[tasks.index(task) + 1]
        assert gates[j] is not None and moved[gates[j]] == after and after.work == COMPUTE and after.chunk != task.chunk
        assert gates[j] < j  # issued before it, so its event exists when the reduction is issued
    assert moved[-1] == tasks[-1] and moved[-1].work == REDUCE


@pytest.mark.parametrize("name", ["token_split", "iso"])
def test_the_knob_is_sparse_and_has_two_values(name):
    cls = strategies.get(name)
    assert "reduce_start" not in cls.check_knobs({}, name)  # the points of earlier runs keep their keys
    assert "reduce_start" not in cls.check_knobs({"reduce_start": "ready"}, name)
    assert cls.check_knobs({"reduce_start": "after_next_gemm"}, name)["reduce_start"] == "after_next_gemm"
    for bad in ("later", 1, True):
        with pytest.raises(UserError, match="reduce_start"):
            cls.check_knobs({"reduce_start": bad}, name)


def _rank_forward(rank, world, name, knobs, seq_lens):
    from overlapbench.distributed import runtime
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.overlap import split as split_mod
    from overlapbench.timing.step import BuildContext

    issued, asked = [], []  # the tasks as the forward issues them; the compute indices asked for their first GEMM
    compute, reduce, gate = split_mod.SplitForward._compute, split_mod.SplitForward._reduce, split_mod.Lanes.first_gemm_done
    split_mod.SplitForward._compute = lambda self, t, *g: issued.append(t) or compute(self, t, *g)
    split_mod.SplitForward._reduce = lambda self, t, p: issued.append(t) or reduce(self, t, p)
    split_mod.Lanes.first_gemm_done = lambda self, j: asked.append(j) if j in self.gating else gate(self, j)
    rt = runtime.init(timeout_s=60)
    stack = build_stack(SHAPE, LAYERS, world, rank, torch.float32, rt.device, 0)
    tokens = sum(seq_lens)
    ctx = BuildContext(rt, stack, seq_lens, RopeTable(SHAPE, rope_positions(seq_lens, None), rt.device), tokens, None)
    cls = strategies.get(name)
    x = random_input(tokens, SHAPE.hidden, 0, torch.float32, rt.device)  # the reference's input
    outs = {}
    for start in ("ready", "after_next_gemm"):
        issued.clear()
        asked.clear()
        step = cls.build(ctx, cls.check_knobs(knobs | {"reduce_start": start}, name))
        outs[start] = (step.to_full(step.forward(x)).clone(), list(issued), list(asked))
    return outs


@pytest.mark.slow
@pytest.mark.parametrize("name, knobs, seq_lens", [
    ("token_split", {"chunks": 3, "align": 1, "comm": "nccl"}, (37,)),  # NCCL's path: gloo's all-reduce on CPU
    ("token_split", {"align": 1, "comm": "nccl"}, (23, 18)),
    ("iso", {"align": 1, "comm": "nccl"}, (29, 14)),
])
def test_the_forward_issues_the_reordered_tasks_and_gives_the_same_bits(name, knobs, seq_lens):
    from overlapbench.model.schedule import Batch

    ref = reference_forward(SHAPE, LAYERS, 2, seq_lens, seed=0)
    cls = strategies.get(name)
    chunks = len(cls.plan(cls.check_knobs(knobs, name), Batch(seq_lens, (0, 0), SHAPE, 2)).chunks)
    tasks = split(LAYERS, chunks)
    moved = behind_next_compute(tasks)
    for outs in distributed.run(_rank_forward, name, knobs, seq_lens, world=2):
        (plain, plain_issued, plain_asked), (late, late_issued, late_asked) = outs["ready"], outs["after_next_gemm"]
        assert plain_issued == tasks and late_issued == moved
        assert plain_asked == [] and late_asked == sorted(g for g in gated_by(moved) if g is not None)
        assert torch.equal(plain, late), f"{name} {knobs}: reduce_start changed the output"
        err = distributed.rel_err(late, ref)
        assert err < 1e-5, f"{name} {knobs}: rel err {err:.2e}"


def test_predict_skips_its_points_saying_why():
    from overlapbench.model.schedule import Batch
    from overlapbench.predict.estimate import Skip, estimate

    knobs = strategies.get("token_split").check_knobs({"comm": "fused", "reduce_start": "after_next_gemm"}, "token_split")
    found = estimate("token_split", knobs, Batch((2048,), (0, 0), SHAPE, 2), 4, "bf16", inputs=None)
    assert isinstance(found, Skip) and "reduce_start=after_next_gemm is not predicted" in found.reason
