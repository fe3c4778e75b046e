"""On a GPU: the grouped-GEMM MoE MLP equals the per-expert loop (the oracle) in bf16 and fp32,
for token counts from 1 up, on the expert widths a rank holds at TP=2 and TP=4 (the grouped
GEMM's shape is what the TP degree changes; one GPU runs either), and under CUDA-graph capture
and replay, where a replay on new inputs must route them anew (no routing baked in at capture,
no host sync inside)."""

from __future__ import annotations

import pytest
import torch

from overlapbench.model.models import ModelShape
from overlapbench.model.moe import moe_partial, reference_moe
from overlapbench.model.weights import build_stack
from overlapbench.timing.cuda_graph import capture
from tests import distributed

pytestmark = [pytest.mark.gpu, pytest.mark.one_gpu]

SHAPES = {
    "8x2": ModelShape(hidden=512, ffn=1024, heads=8, kv_heads=8, head_dim=64, experts=8, top_k=2, expert_ffn=512),
    "128x8": ModelShape(hidden=256, ffn=1024, heads=8, kv_heads=8, head_dim=32, experts=128, top_k=8, expert_ffn=192),
}
TOLERANCE = {torch.bfloat16: 1e-2, torch.float32: 1e-5}


def _layer(shape: ModelShape, dtype, tp: int = 2):
    """Rank 0's shard of a tp=`tp` layer: the widths a rank sees."""
    return build_stack(shape, 1, tp, 0, dtype, torch.device("cuda")).layers[0]


def _rel_err(out, ref) -> float:
    return (torch.linalg.vector_norm(out.float() - ref.float()) / torch.linalg.vector_norm(ref.float())).item()


def _x(tokens: int, hidden: int, dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed + tokens)
    return torch.randn(tokens, hidden, generator=g, device="cuda").to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("tokens", [1, 7, 33, 1000, 4099])
@pytest.mark.parametrize("tp", distributed.WORLD_SIZES, ids=lambda tp: f"tp{tp}")
def test_grouped_gemm_equals_the_per_expert_loop(tp, shape, dtype, tokens):
    s = SHAPES[shape]
    w = _layer(s, dtype, tp)
    x = _x(tokens, s.hidden, dtype)
    ref = reference_moe(x, w.router, w.w_gate_up, w.w_down, s.top_k)
    out = moe_partial(x, w.router, w.w_gate_up, w.w_down, s.top_k)
    assert out.dtype == dtype and out.shape == (tokens, s.hidden)
    assert _rel_err(out, ref) < TOLERANCE[dtype], f"{shape} tp={tp} {dtype} {tokens} tokens"


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("tokens", [1, 33, 4099])
def test_graph_replay_routes_new_inputs(shape, tokens):
    s = SHAPES[shape]
    w = _layer(s, torch.bfloat16)
    x = _x(tokens, s.hidden, torch.bfloat16)
    out = torch.empty(tokens, s.hidden, dtype=torch.bfloat16, device="cuda")
    graph = capture(lambda: moe_partial(x, w.router, w.w_gate_up, w.w_down, s.top_k, out=out))
    for seed in (1, 2):  # new tokens: new routing, new group sizes
        x.copy_(_x(tokens, s.hidden, torch.bfloat16, seed=100 * seed))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference_moe(x, w.router, w.w_gate_up, w.w_down, s.top_k)
        assert _rel_err(out, ref) < TOLERANCE[torch.bfloat16], f"{shape} {tokens} tokens, replay {seed}"
    del graph
