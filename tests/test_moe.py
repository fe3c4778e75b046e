"""The mixture-of-experts MLP on CPU: routing, the grouped path against the per-expert oracle,
the TP shards summing to the unsharded layer, the presets, and the SP exchanges' MoE block (the
flash decomposition's knobs and async_tp's exchange) against the reference on gloo processes.
Every strategy at its defaults on a MoE stack: tests/test_registry.py."""

from __future__ import annotations

import pytest
import torch

from overlapbench.errors import UserError
from overlapbench.model.layer import reference_forward
from overlapbench.model.models import PRESETS, ModelShape
from overlapbench.model.moe import moe_partial, reference_moe, route
from overlapbench.model.weights import build_stack
from tests import distributed
from tests.test_sequence_parallel import _rank_forwards

MOE = ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8, experts=4, top_k=2, expert_ffn=32)
WIDE = ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8, experts=16, top_k=5, expert_ffn=48)
LAYERS = 2
CPU = torch.device("cpu")


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(out.float() - ref.float()) / torch.linalg.vector_norm(ref.float())).item()


def _inputs(tokens: int, hidden: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed + tokens))


def test_route_picks_the_top_k_and_renormalizes():
    w = build_stack(WIDE, 1, 1, None, torch.float32, CPU).layers[0]
    x = _inputs(50, WIDE.hidden)
    weights, experts = route(x, w.router, WIDE.top_k)
    probs = (x @ w.router.t()).softmax(-1)
    assert torch.allclose(weights.sum(-1), torch.ones(50))
    picked = torch.zeros_like(probs, dtype=torch.bool).scatter(1, experts, True)
    assert (picked.sum(-1) == WIDE.top_k).all()  # k distinct experts per token
    chosen = probs.gather(1, experts)
    assert (chosen.min(-1).values >= probs.masked_fill(picked, -1).max(-1).values).all()  # the largest
    assert torch.allclose(weights, chosen / chosen.sum(-1, keepdim=True))


@pytest.mark.parametrize("shape", [MOE, WIDE], ids=["4x2", "16x5"])
@pytest.mark.parametrize("tokens", [0, 1, 7, 37, 200])
def test_grouped_path_equals_the_per_expert_oracle(shape, tokens):
    w = build_stack(shape, 1, 1, None, torch.float32, CPU).layers[0]
    x = _inputs(tokens, shape.hidden)
    ref = reference_moe(x, w.router, w.w_gate_up, w.w_down, shape.top_k)
    if tokens == 0:
        assert moe_partial(x, w.router, w.w_gate_up, w.w_down, shape.top_k).shape == (0, shape.hidden)
        return
    assert ref.abs().sum() > 0
    assert _rel_err(moe_partial(x, w.router, w.w_gate_up, w.w_down, shape.top_k), ref) < 1e-6
    out = torch.full((tokens, shape.hidden), float("nan"))
    assert moe_partial(x, w.router, w.w_gate_up, w.w_down, shape.top_k, out=out) is out
    assert _rel_err(out, ref) < 1e-6
    strided = torch.full((tokens, 2 * shape.hidden), float("nan"))[:, ::2]  # a non-contiguous `out`
    moe_partial(x, w.router, w.w_gate_up, w.w_down, shape.top_k, out=strided)
    assert _rel_err(strided, ref) < 1e-6


def test_the_oracle_is_not_vacuous():
    """Another routing (top 1 instead of 2) or another seed's experts give another result."""
    w = build_stack(MOE, 1, 1, None, torch.float32, CPU).layers[0]
    x = _inputs(37, MOE.hidden)
    ref = reference_moe(x, w.router, w.w_gate_up, w.w_down, 2)
    assert _rel_err(reference_moe(x, w.router, w.w_gate_up, w.w_down, 1), ref) > 0.1
    other = build_stack(MOE, 1, 1, None, torch.float32, CPU, seed=1).layers[0]
    assert _rel_err(moe_partial(x, w.router, other.w_gate_up, other.w_down, 2), ref) > 0.1


@pytest.mark.parametrize("tp", [2, 4])
def test_shards_sum_to_the_unsharded_layer(tp):
    """Every rank routes alike (one router) and its expert shards' partial sums add up to the
    unsharded experts' output: what the one all-reduce after the MLP relies on."""
    full = build_stack(WIDE, 2, tp, None, torch.float32, CPU)
    ranks = [build_stack(WIDE, 2, tp, r, torch.float32, CPU) for r in range(tp)]
    x = _inputs(29, WIDE.hidden)
    for layer in range(2):
        f = full.layers[layer]
        assert f.w_gate_up.shape == (16, 2 * 48, 64) and f.w_down.shape == (16, 64, 48)
        assert all(torch.equal(r.layers[layer].router, f.router) for r in ranks)
        assert ranks[0].layers[layer].w_gate_up.shape == (16, 2 * 48 // tp, 64)
        total = sum(moe_partial(x, r.layers[layer].router, r.layers[layer].w_gate_up, r.layers[layer].w_down, 5) for r in ranks)
        assert _rel_err(total, reference_moe(x, f.router, f.w_gate_up, f.w_down, 5)) < 1e-5
    assert not torch.equal(full.layers[0].router, full.layers[1].router)


def test_presets_have_the_real_sizes():
    mixtral, qwen = PRESETS["mixtral-8x7b"], PRESETS["qwen3-30b-a3b"]
    assert (mixtral.hidden, mixtral.experts, mixtral.top_k, mixtral.expert_ffn) == (4096, 8, 2, 14336)
    assert (mixtral.heads, mixtral.kv_heads, mixtral.head_dim, mixtral.rope_theta) == (32, 8, 128, 1e6)
    assert (qwen.hidden, qwen.experts, qwen.top_k, qwen.expert_ffn, qwen.ffn) == (2048, 128, 8, 768, 6144)
    assert (qwen.heads, qwen.kv_heads, qwen.head_dim, qwen.eps, qwen.qk_norm) == (32, 4, 128, 1e-6, True)
    mixtral.check_tp(8)
    qwen.check_tp(4)  # 4 KV heads: tp 8 would need replicated KV heads, which the layer does not do
    with pytest.raises(UserError, match="expert_ffn"):
        ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8, experts=4, top_k=2, expert_ffn=30).check_tp(4)


def test_iso_balances_the_active_experts_flops():
    from overlapbench.overlap.balance import layer_flops

    dense_equivalent = ModelShape(hidden=64, ffn=2 * 32, heads=8, kv_heads=4, head_dim=8)
    gemm, attention = layer_flops(MOE, 2)
    dense_gemm, dense_attention = layer_flops(dense_equivalent, 2)
    assert attention == dense_attention
    assert gemm == dense_gemm + 2 * 64 * MOE.experts  # top_k=2 experts of 32 = one FFN of 64, plus the router


# ---------------------------------------------------------------------------------------------
# The SP strategies' MoE block on gloo, beyond the defaults (test_registry.py runs those)

FLASH = "flash_agrs"
CASES = [
    (FLASH, {"chunks_per_rank": 2}, (37,)),
    (FLASH, {"order": "ring", "attention": "per_piece"}, (24, 13, 5)),
    (FLASH, {"chunks_per_rank": 4}, (3,)),  # fewer rows than pieces: empty MoE pieces
    ("sp_baseline", {}, (1,)),  # a rank of padding only
]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_sp_moe_block_matches_the_reference(world):
    results = distributed.run(_rank_forwards, MOE, CASES, world=world)  # each case run twice: re-runnable
    failures = []
    for i, (name, knobs, seq_lens) in enumerate(CASES):
        ref = reference_forward(MOE, LAYERS, world, seq_lens)
        for rank, outs in enumerate(results):
            for out in outs[i]:
                if not _rel_err(out, ref) < 1e-5:
                    failures.append(f"{name} {knobs} {seq_lens} rank {rank}: rel err {_rel_err(out, ref):.2e}")
    assert not failures, "\n".join(failures)


def _rank_async_tp(rank: int, world: int, seq_lens: tuple):
    """async_tp's exchange with PyTorch's reference versions of the fused ops (attention block)
    and its plain collectives (MoE block)."""
    from types import SimpleNamespace

    import torch.distributed as dist
    from torch.distributed import _symmetric_memory as symm_mem

    from overlapbench.distributed import runtime
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import random_input
    from overlapbench.overlap.sequence_parallel import FusedExchange, sp_layout, sp_step
    from overlapbench.timing.step import BuildContext

    rt = runtime.init(timeout_s=60)
    ops = SimpleNamespace(
        fused_all_gather_matmul=symm_mem._fused_all_gather_matmul_fallback,
        fused_matmul_reduce_scatter=symm_mem._fused_matmul_reduce_scatter_fallback,
    )
    stack = build_stack(MOE, LAYERS, world, rank, torch.float32, rt.device, seed=0)
    ctx = BuildContext(rt, stack, seq_lens, RopeTable(MOE, max(seq_lens), rt.device), 64)
    step = sp_step(ctx, FusedExchange(sp_layout(ctx), dist.group.WORLD.group_name, ops))
    return step.to_full(step.forward(random_input(sum(seq_lens), MOE.hidden, 0, torch.float32, rt.device)))


@pytest.mark.slow
def test_async_tp_moe_block_computes_the_reference():
    from torch.distributed import _symmetric_memory as symm_mem

    if not hasattr(symm_mem, "_fused_all_gather_matmul_fallback"):
        pytest.skip("this torch has no reference versions of the fused symm_mem ops")
    ref = reference_forward(MOE, LAYERS, 2, (24, 13))
    for out in distributed.run(_rank_async_tp, (24, 13)):
        assert _rel_err(out, ref) < 1e-5
