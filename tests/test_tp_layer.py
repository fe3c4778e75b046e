"""The sharded TP stack, under every strategy that runs on CPU, equals the single-process
reference (2 gloo processes, fp32)."""

from __future__ import annotations

import pytest
import torch

from overlapbench.model.layer import reference_forward
from overlapbench.model.models import PRESETS, ModelShape
from tests import distributed

SHAPE = PRESETS["tiny"]
LAYERS = 2


def _rank_forward(rank: int, world: int, strategy: str, knobs: dict, seq_lens: tuple, shape: ModelShape, seed: int):
    from overlapbench import strategies
    from overlapbench.distributed import runtime
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.timing.step import BuildContext

    rt = runtime.init(timeout_s=60)
    stack = build_stack(shape, LAYERS, world, rank, torch.float32, rt.device, seed)
    ctx = BuildContext(rt, stack, seq_lens, RopeTable(shape, max(seq_lens), rt.device), sum(seq_lens))
    cls = strategies.get(strategy)
    step = cls.build(ctx, cls.check_knobs(knobs, strategy))
    x = random_input(sum(seq_lens), shape.hidden, seed, torch.float32, rt.device)
    first = step.to_full(step.forward(x)).clone()
    second = step.to_full(step.forward(x)).clone()  # a step must be re-runnable (graphs replay it)
    return first, second


def _check(strategy: str, knobs: dict, seq_lens: tuple, shape: ModelShape = SHAPE, seed: int = 0, world: int = 2) -> None:
    ref = reference_forward(shape, LAYERS, world, seq_lens, seed=seed)
    for first, second in distributed.run(_rank_forward, strategy, knobs, seq_lens, shape, seed, world=world):
        for out in (first, second):
            err = (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()
            assert err < 1e-5, f"{strategy} {knobs} {seq_lens}: rel err {err:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("seq_lens", [(37,), (24, 13, 5)])
def test_baseline_matches_reference(seq_lens):
    _check("baseline", {}, seq_lens)


@pytest.mark.slow
@pytest.mark.parametrize(
    "knobs, seq_lens",
    [
        ({}, (37,)),  # aligned cut beyond the tokens falls back to an unaligned one
        ({"align": 8}, (61,)),
        ({"align": 8, "split_offset": -8}, (24, 13, 5)),  # the cut lands inside a sequence
        ({"split_ratio": 0.3, "align": 1}, (10, 30)),
    ],
)
def test_token_split_matches_reference(knobs, seq_lens):
    _check("token_split", knobs, seq_lens)


@pytest.mark.slow
@pytest.mark.parametrize(
    "knobs, seq_lens",
    [
        ({}, (61,)),
        ({"split_ratio": 0.3, "align": 8}, (45,)),  # 45 is no multiple of the alignment
        ({"split_ratio": 0.6, "align": 4}, (24, 13, 1, 7)),  # several sequences: permuted layout
        ({"split_ratio": "balanced", "align": 1}, (30, 9)),
    ],
)
def test_iso_matches_reference(knobs, seq_lens):
    _check("iso", knobs, seq_lens)


@pytest.mark.slow
def test_no_comm_is_not_the_reference():
    """The check can fail: dropping the all-reduces changes the result."""
    with pytest.raises(AssertionError, match="rel err"):
        _check("no_comm", {}, (37,))


@pytest.mark.slow
def test_reference_depends_on_the_seed():
    a = reference_forward(SHAPE, LAYERS, 2, (20,), seed=0)
    b = reference_forward(SHAPE, LAYERS, 2, (20,), seed=1)
    assert not torch.allclose(a, b)
    assert torch.equal(a, reference_forward(SHAPE, LAYERS, 2, (20,), seed=0))


WIDE = ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8)  # divisible by tp=4


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, knobs",
    [("baseline", {}), ("token_split", {"align": 8}), ("iso", {"split_ratio": 0.4, "align": 4})],
)
def test_four_ranks_match_the_reference(strategy, knobs):
    """TP=4 on 4 gloo processes: the sharding and the splits hold beyond two ranks."""
    _check(strategy, knobs, (29, 14), shape=WIDE, world=4)


@pytest.mark.parametrize("comm", ["fused", "copy_engine"])
@pytest.mark.parametrize("world", [1, 9])
def test_a_symmetric_reducer_outside_its_world_sizes_is_skipped_with_the_reason(comm, world):
    """One GPU runs the demo at tp 1: its fused points are skipped, saying why, not failed."""
    from types import SimpleNamespace

    from overlapbench.errors import UserError
    from overlapbench.overlap import comm_methods

    ctx = SimpleNamespace(runtime=SimpleNamespace(world_size=world), stack=SimpleNamespace(shape=None), eps=1e-5)
    with pytest.raises(UserError, match=rf"comm={comm} runs its symmetric-memory kernels on 2 to 8 ranks; this run has {world}"):
        comm_methods.get(comm).reducer(ctx, 16)
