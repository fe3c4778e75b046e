"""nccl_symm in the layer, on CPU: the knobs' rules, and every strategy that takes it against the
single-process reference on 2 gloo processes, its collectives run on views of stand-in windows
(plain tensors: tests/test_nccl_symm_gpu.py registers real ones on 2 GPUs). Each collective's
tensors are checked to lie inside a window: that is what makes NCCL pick its symmetric kernels."""

from __future__ import annotations

import pytest
import torch

from overlapbench import strategies
from overlapbench.model.layer import reference_forward
from overlapbench.model.models import PRESETS, ModelShape
from overlapbench.strategies.knobs import DEFAULT
from tests import distributed

SHAPE = PRESETS["tiny"]
MOE = ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8, experts=4, top_k=2, expert_ffn=32)
LAYERS = 2


def test_nccl_symm_is_left_out_of_a_setting_until_it_is_on():
    """Sparse: baseline's default setting (the reference's) and the points of earlier runs keep their keys."""
    baseline = strategies.get("baseline")
    assert baseline.check_knobs({}, "s") == {"nccl_max_ctas": DEFAULT}
    assert baseline.check_knobs({"nccl_symm": False}, "s") == {"nccl_max_ctas": DEFAULT}
    assert baseline.check_knobs({"nccl_symm": True, "nccl_max_ctas": 8}, "s") == {"nccl_max_ctas": 8, "nccl_symm": True}
    assert baseline.uses_nccl_windows(baseline.check_knobs({"nccl_symm": True}, "s"))
    assert not baseline.uses_nccl_windows(baseline.check_knobs({}, "s"))
    sp = strategies.get("sp_baseline")
    assert sp.check_knobs({}, "s") == {"nccl_max_ctas": DEFAULT}
    with pytest.raises(Exception, match=r"s\.nccl_symm: 'yes' is not a bool"):
        baseline.check_knobs({"nccl_symm": "yes"}, "s")


def test_comm_nccl_symm_takes_the_comm_ctas_budgets():
    split = strategies.get("token_split")
    knobs = split.check_knobs({"comm": "nccl_symm", "comm_ctas_attn": 8, "comm_ctas_mlp": 16, "nccl_max_ctas": 8}, "s")
    assert (knobs["comm_ctas_attn"], knobs["comm_ctas_mlp"], knobs["nccl_max_ctas"]) == (8, 16, DEFAULT)
    assert split.uses_nccl_windows(knobs)
    plain = split.check_knobs({"comm": "nccl", "comm_ctas_attn": 8}, "s")
    assert plain["comm_ctas_attn"] is None and not split.uses_nccl_windows(plain)
    iso = strategies.get("iso")
    assert iso.check_knobs({"comm": "nccl_symm", "comm_ctas": 4}, "s")["comm_ctas"] == 4


@pytest.mark.parametrize("strategy, knobs", [
    ("baseline", {"nccl_symm": True}), ("sp_baseline", {"nccl_symm": True}),
    ("token_split", {"comm": "nccl_symm"}), ("iso", {"comm": "nccl_symm"})])
def test_windows_need_nccl_on_gpus(strategy, knobs):
    cls = strategies.get(strategy)
    reason = cls.skip_reason(cls.check_knobs(knobs, "s"), cuda=False)
    assert "needs NCCL on CUDA GPUs (registered symmetric windows)" in reason
    assert cls.skip_reason(cls.check_knobs(knobs, "s"), cuda=True) is None  # then the runtime decides


def _rank_forward(rank: int, world: int, strategy: str, knobs: dict, seq_lens: tuple, shape: ModelShape):
    from overlapbench.distributed import nccl_windows, runtime
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.overlap import sequence_parallel
    from overlapbench.timing.step import BuildContext

    rt = runtime.init(timeout_s=60)
    windows, calls = [], []

    def register(group, device, numel, dtype, agree):  # a stand-in window, poisoned
        windows.append(nccl_windows.NcclWindow(torch.full((numel,), float("nan"), dtype=dtype), None, group))
        return windows[-1]

    def window_of(t: torch.Tensor) -> int | None:
        starts = [w.tensor.data_ptr() for w in windows]
        return next((i for i, (s, w) in enumerate(zip(starts, windows)) if s <= t.data_ptr() < s + w.numel * 4), None)

    def recorded(name, fn):
        def call(*tensors, **kwargs):
            where = {window_of(t) for t in tensors}
            calls.append((name, where.pop() if len(where) == 1 else None))  # one window holds them all
            return fn(*tensors, **kwargs)
        return call

    nccl_windows.register = register
    torch.distributed.all_reduce = recorded("all_reduce", torch.distributed.all_reduce)
    for name in ("all_gather_single", "reduce_scatter_single"):
        setattr(sequence_parallel, name, recorded(name, getattr(sequence_parallel, name)))
    stack = build_stack(shape, LAYERS, world, rank, torch.float32, rt.device, 0)
    tokens = sum(seq_lens)
    ctx = BuildContext(rt, stack, seq_lens, RopeTable(shape, max(seq_lens), rt.device), tokens + 9)
    cls = strategies.get(strategy)
    step = cls.build(ctx, cls.check_knobs(knobs, strategy))
    x = random_input(tokens, shape.hidden, 0, torch.float32, rt.device)
    outputs = []
    for _ in range(2):  # a step must be re-runnable (graphs replay it)
        calls.clear()
        y = step.forward(x)
        forward_calls = list(calls)
        outputs.append(step.to_full(y).clone())
    return outputs, forward_calls, [w.numel for w in windows]


# (collective, window) -> calls per forward of LAYERS = 2 layers; window 0 is the first one made
SPLIT_ONE = {("all_reduce", 0): 8}  # 2 chunks x (attention, MLP) x 2 layers, one group
PER_BLOCK = {("all_reduce", 0): 4, ("all_reduce", 1): 4}  # attention's group, then the MLP's


@pytest.mark.slow
@pytest.mark.parametrize("strategy, knobs, seq_lens, shape, expected", [
    ("baseline", {"nccl_symm": True, "nccl_max_ctas": 8}, (37,), SHAPE, {("all_reduce", 0): 4}),
    ("baseline", {"nccl_symm": True}, (24, 13, 5), MOE, {("all_reduce", 0): 4}),
    ("token_split", {"comm": "nccl_symm", "align": 8, "comm_ctas_attn": 8, "comm_ctas_mlp": 16}, (61,), SHAPE, PER_BLOCK),
    ("token_split", {"comm": "nccl_symm", "align": 8, "split_offset": -8}, (24, 13, 5), MOE, SPLIT_ONE),
    ("iso", {"comm": "nccl_symm", "comm_ctas": 4}, (24, 13, 5), SHAPE, SPLIT_ONE),
    # 37 rows: the last shard padded; the MoE layer: the experts' gather and scatter too
    ("sp_baseline", {"nccl_symm": True, "nccl_max_ctas": 16}, (37,), SHAPE,
     {("all_gather_single", 0): 4, ("reduce_scatter_single", 0): 4}),
    ("sp_baseline", {"nccl_symm": True}, (24, 13, 5), MOE, {("all_gather_single", 0): 4, ("reduce_scatter_single", 0): 4}),
])
def test_nccl_symm_matches_the_reference_with_every_collective_on_its_window(strategy, knobs, seq_lens, shape, expected):
    from collections import Counter

    ref = reference_forward(shape, LAYERS, 2, seq_lens, seed=0)
    for outputs, calls, sizes in distributed.run(_rank_forward, strategy, knobs, seq_lens, shape):
        for out in outputs:
            err = distributed.rel_err(out, ref)
            assert err < 1e-5, f"{strategy} {knobs} {seq_lens}: rel err {err:.2e}"
        assert Counter(calls) == expected  # every collective's tensors inside the window of its group
        assert len(sizes) == len({w for _, w in expected})
