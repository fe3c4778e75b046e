"""The FLOP count of a layer row (overlapbench/model/flops.py) against counts made another way: torch's
FLOP counter over the real layer's GEMMs, a brute-force count of the causal mask, a figure
derived by hand, and the chunks of a split adding up to the whole."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from overlapbench.model import flops  # noqa: E402
from overlapbench.model.chunks import build_decode_cache, token_range, whole_batch  # noqa: E402
from overlapbench.model.layer import LocalReducer, forward_stack  # noqa: E402
from overlapbench.model.models import PRESETS, ModelShape  # noqa: E402
from overlapbench.model.rope import RopeTable  # noqa: E402
from overlapbench.model.weights import build_stack, random_input  # noqa: E402
from overlapbench.timing.peak import Peak  # noqa: E402
from overlapbench.tuning.rows import Decode  # noqa: E402

CPU = torch.device("cpu")


@pytest.mark.parametrize("name,tp", [("tiny", 1), ("tiny", 2), ("tiny-moe", 1), ("tiny-moe", 2)])
def test_gemm_flops_equal_what_torch_counts_in_the_layer(name, tp):
    """The layer's matrix products (mm, addmm: QKV, O, gate/up, down, a MoE's router and its
    routed experts) on rank 0's shard, counted by torch while the real forward runs."""
    shape, tokens = PRESETS[name], 13
    stack = build_stack(shape, 1, tp, 0, torch.float32, CPU)
    x = random_input(tokens, shape.hidden, 0, torch.float32, CPU)
    with FlopCounterMode(display=False) as counter:
        forward_stack(stack, x, whole_batch((tokens,), CPU), RopeTable(shape, tokens, CPU), LocalReducer(shape.eps))
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert counts.get("aten.mm", 0) + counts.get("aten.addmm", 0) == flops.gemm_flops(shape, tp, tokens)


def test_a_qkv_bias_adds_no_gemm_flops():
    shape = ModelShape(hidden=64, ffn=96, heads=4, kv_heads=2, head_dim=16, qkv_bias=True)
    stack = build_stack(shape, 1, 1, 0, torch.float32, CPU)
    x = random_input(9, shape.hidden, 0, torch.float32, CPU)
    with FlopCounterMode(display=False) as counter:
        forward_stack(stack, x, whole_batch((9,), CPU), RopeTable(shape, 9, CPU), LocalReducer(shape.eps))
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert counts["aten.addmm"] + counts["aten.mm"] == flops.gemm_flops(shape, 1, 9)


def test_the_70b_shard_at_2048_tokens_by_hand():
    """llama3-70b at TP=2: 2 x 2048 x 8192 x (5120 + 4096 + 28672 + 14336) in the GEMMs, and
    4 x 128 x 32 heads x 2048 x 2049 / 2 in causal attention."""
    shape = PRESETS["llama3-70b"]
    assert flops.gemm_flops(shape, 2, 2048) == 2 * 2048 * 8192 * (5120 + 4096 + 28672 + 14336)
    assert flops.layer_flops(shape, 2, (2048,)) == 1_752_346_656_768 + 4 * 128 * 32 * 2048 * 2049 // 2


@pytest.mark.parametrize("batch", [(1,), (4,), (7, 3, 12)])
def test_causal_pairs_are_the_unmasked_entries(batch):
    """A brute-force count: the entries of each sequence's causal mask that are computed."""
    mask_entries = sum(int(torch.ones(n, n).tril().sum()) for n in batch)
    assert flops.attention_pairs(batch) == mask_entries


def test_decode_tokens_attend_their_context_and_themselves():
    assert flops.attention_pairs((), (3, 10)) == 3 * 11
    shape = PRESETS["tiny"]
    with_decode = flops.layer_flops(shape, 2, (5,), (3, 10))
    assert with_decode == flops.gemm_flops(shape, 2, 8) + flops.attention_flops(shape, 2, 15 + 33)


def test_moe_counts_top_k_experts_and_the_router():
    moe, dense = PRESETS["tiny-moe"], ModelShape(hidden=64, ffn=64, heads=4, kv_heads=2, head_dim=16)
    tokens = 11
    experts = flops.gemm_flops(moe, 2, tokens) - flops.gemm_flops(dense, 2, tokens)  # same attention, ffn = expert_ffn
    one_expert_mlp = 6 * tokens * 64 * (64 // 2)
    assert experts == (moe.top_k - 1) * one_expert_mlp + 2 * tokens * 64 * moe.experts


@pytest.mark.parametrize("batch,cut", [((64,), 20), ((30, 50), 41), ((30, 50), 30), ((9, 9, 9), 13)])
@pytest.mark.parametrize("decode", [None, (4, 17)])
def test_a_split_computes_the_whole_batch_pairs(batch, cut, decode):
    """The two chunks of a cut (as token_split makes them, decode rows first) attend exactly
    the whole batch's (query, key) pairs."""
    cache = None if decode is None else build_decode_cache(PRESETS["tiny"], 1, 1, None, *decode, torch.float32, CPU)
    tokens = sum(batch) + (0 if decode is None else decode[0])
    chunks = [token_range(batch, 0, cut, CPU, cache), token_range(batch, cut, tokens, CPU, cache)]

    def pairs(chunk) -> int:
        own = sum(flops.segment_pairs(s.start, s.length) for s in chunk.segments)
        return own + (0 if chunk.decode is None else chunk.decode.length * (chunk.decode.context + 1))

    assert sum(pairs(c) for c in chunks) == flops.attention_pairs(batch, decode)


def test_row_fields():
    shape, peak = PRESETS["llama3-8b"], Peak(800.0, "table", 780.0, 700.0)
    fields = flops.row_fields(shape, 2, (2048,), None, 1.0, peak)
    assert fields["flops"] == flops.layer_flops(shape, 2, (2048,))
    assert fields["tflops"] == pytest.approx(fields["flops"] / 1e-3 / 1e12)
    assert fields["peak_frac"] == pytest.approx(fields["tflops"] / 800.0, abs=1e-4)
    assert fields["peak_tflops"] == 800.0 and fields["peak_source"] == "table"
    assert fields["burst_tflops"] == 780.0 and fields["sustained_tflops"] == 700.0
    cpu = flops.row_fields(shape, 2, (2048,), None, 1.0, None)
    assert cpu["peak_frac"] is None and cpu["peak_tflops"] is None
    failed = flops.row_fields(shape, 2, (2048,), None, None, peak)
    assert failed["tflops"] is None and failed["peak_frac"] is None and failed["flops"] > 0
    mixed = flops.row_fields(shape, 2, (2048,), Decode(64, 4096), 1.0, peak)
    assert mixed["flops"] == flops.layer_flops(shape, 2, (2048,), (64, 4096))
