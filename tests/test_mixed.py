"""Mixed prefill + decode batches: every strategy that runs on CPU equals the single-process
reference on a batch of prefill sequences plus decode tokens with a seeded KV cache (gloo, fp32),
and the decode tokens' attention is one batched call over their caches."""

from __future__ import annotations

import pytest
import torch

from overlapbench.model import attention, attention_kernels
from overlapbench.model.chunks import build_decode_cache, token_range, whole_batch
from overlapbench.model.layer import reference_forward
from overlapbench.model.models import PRESETS, ModelShape
from overlapbench.model.rope import RopeTable
from overlapbench.model.weights import build_stack, random_input
from tests import distributed

SHAPE = PRESETS["tiny"]
WIDE = ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8)  # divisible by tp=4
LAYERS = 2


def _rank_forward(rank, world, strategy, knobs, seq_lens, decode, shape, seed):
    from overlapbench import strategies
    from overlapbench.distributed import runtime
    from overlapbench.model.chunks import rope_positions
    from overlapbench.timing.step import BuildContext

    rt = runtime.init(timeout_s=60)
    stack = build_stack(shape, LAYERS, world, rank, torch.float32, rt.device, seed)
    cache = build_decode_cache(shape, LAYERS, world, rank, *decode, torch.float32, rt.device, seed)
    tokens = sum(seq_lens) + decode[0]
    ctx = BuildContext(rt, stack, seq_lens, RopeTable(shape, rope_positions(seq_lens, cache), rt.device),
                               tokens, cache)
    cls = strategies.get(strategy)
    with attention.recording() as ran:
        step = cls.build(ctx, cls.check_knobs(knobs, strategy))
        x = random_input(tokens, shape.hidden, seed, torch.float32, rt.device)
        first = step.to_full(step.forward(x)).clone()
    second = step.to_full(step.forward(x)).clone()  # re-runnable: the new token's slot is rewritten
    return first, second, sorted(ran)


def _check(strategy, knobs, seq_lens, decode, shape=SHAPE, world=2, seed=0):
    ref = reference_forward(shape, LAYERS, world, seq_lens, seed=seed, decode=decode)
    for first, second, ran in distributed.run(_rank_forward, strategy, knobs, seq_lens, decode, shape, seed, world=world):
        assert "math_decode" in ran, ran
        for out in (first, second):
            err = distributed.rel_err(out, ref)
            assert err < 1e-4, f"{strategy} {knobs} {seq_lens} + {decode}: rel err {err:.2e}"


CASES = [
    ("baseline", {}),
    ("no_comm", None),  # not a correct result: checked separately
    ("token_split", {"align": 8}),  # 37 + 11 = 48 rows: cut at 24, inside the prefill sequence
    ("token_split", {"split_ratio": 0.1, "align": 1}),  # cut at 5: among the decode tokens
    ("iso", {"align": 4}),
    ("iso", {"split_ratio": 0.5, "align": 4}),
    ("sp_baseline", {}),
    ("flash_agrs", {}),
    ("flash_agrs", {"attention": "per_piece", "chunks_per_rank": 2}),
]


@pytest.mark.slow
@pytest.mark.parametrize("strategy, knobs", [c for c in CASES if c[1] is not None])
def test_mixed_batch_matches_reference_tp2(strategy, knobs):
    _check(strategy, knobs, (37,), (11, 23))


@pytest.mark.slow
@pytest.mark.parametrize("strategy, knobs", [("token_split", {"align": 8}), ("iso", {"split_ratio": 0.6, "align": 4}),
                                             ("sp_baseline", {})])
def test_mixed_batch_of_several_sequences(strategy, knobs):
    """Several prefill sequences (iso permutes rows) beside the decode tokens."""
    _check(strategy, knobs, (24, 13, 7), (9, 17))


@pytest.mark.slow
@pytest.mark.parametrize("strategy, knobs", [("baseline", {}), ("token_split", {"align": 4}), ("iso", {"align": 4}),
                                             ("flash_agrs", {})])
def test_mixed_batch_four_ranks(strategy, knobs):
    _check(strategy, knobs, (29,), (14, 19), shape=WIDE, world=4)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, knobs", [("token_split", {"align": 8}), ("flash_agrs", {})])
def test_mixed_batch_with_qkv_bias_and_qk_norm(strategy, knobs):
    """The decode rows take the same QKV bias and q/k norms as the prefill rows."""
    shape = ModelShape(hidden=64, ffn=128, heads=4, kv_heads=2, head_dim=16, qkv_bias=True, qk_norm=True)
    _check(strategy, knobs, (37,), (11, 23), shape=shape)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, knobs", [("token_split", {"align": 8}), ("iso", {"align": 4})])
def test_mixed_batch_of_a_moe_stack(strategy, knobs):
    """Decode rows go through the experts like any row (a MoE layer's all-reduce is the same one)."""
    shape = ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8, experts=4, top_k=2, expert_ffn=32)
    _check(strategy, knobs, (37,), (11, 23), shape=shape)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, knobs", [("baseline", {}), ("token_split", {"align": 4}), ("sp_baseline", {})])
def test_decode_only_batch(strategy, knobs):
    _check(strategy, knobs, (), (13, 21))


@pytest.mark.slow
def test_no_comm_is_not_the_mixed_reference():
    with pytest.raises(AssertionError, match="rel err"):
        _check("no_comm", {}, (37,), (11, 23))


def test_the_cache_changes_the_result():
    """The decode rows read their cache: another seed's cache, same weights and input, differs."""
    stack = build_stack(SHAPE, LAYERS, 1, None, torch.float32, torch.device("cpu"), 0)
    rope = RopeTable(SHAPE, 40, "cpu")
    x = random_input(30, SHAPE.hidden, 0, torch.float32, "cpu")
    outs = []
    for seed in (0, 1):
        from overlapbench.model.layer import LocalReducer, forward_stack

        cache = build_decode_cache(SHAPE, LAYERS, 1, None, 10, 30, torch.float32, torch.device("cpu"), seed)
        outs.append(forward_stack(stack, x, whole_batch((20,), "cpu", cache), rope, LocalReducer(SHAPE.eps)))
    assert torch.allclose(outs[0][10:], outs[1][10:])  # the prefill rows do not see the cache
    assert not torch.allclose(outs[0][:10], outs[1][:10])


def test_reference_cache_joins_the_rank_shards():
    full = build_decode_cache(WIDE, 2, 4, None, 3, 5, torch.float32, torch.device("cpu"), 7)
    for rank in range(4):
        mine = build_decode_cache(WIDE, 2, 4, rank, 3, 5, torch.float32, torch.device("cpu"), 7)
        for layer in range(2):
            assert torch.equal(mine.k[layer], full.k[layer][:, :, rank : rank + 1])
            assert torch.equal(mine.v[layer], full.v[layer][:, :, rank : rank + 1])
    assert not torch.equal(full.k[0], full.k[1])


def test_chunks_put_decode_rows_first():
    cache = build_decode_cache(SHAPE, 1, 1, None, 6, 9, torch.float32, torch.device("cpu"))
    a, b = token_range((10,), 0, 4, "cpu", cache), token_range((10,), 4, 16, "cpu", cache)
    assert (a.decode.first, a.decode.length, a.segments) == (0, 4, ())
    assert (b.decode.first, b.decode.length) == (4, 2)
    assert [(s.row, s.length, s.start, s.kv_row) for s in b.segments] == [(2, 10, 0, 6)]
    assert b.positions.tolist() == [9, 9] + list(range(10))
    c = token_range((10,), 8, 16, "cpu", cache)
    assert c.decode is None and [(s.row, s.start, s.kv_row) for s in c.segments] == [(0, 2, 6)]


def test_decode_attention_is_one_call_and_equals_per_token_attention(monkeypatch):
    """All decode rows of a chunk go into one kernel call, which equals each token's own attention
    over its cache with the new key appended."""
    g = torch.Generator().manual_seed(3)
    n, hq, hkv, d, ctx_len = 7, 4, 2, 8, 12
    cache = build_decode_cache(ModelShape(hidden=32, ffn=64, heads=hq, kv_heads=hkv, head_dim=d), 1, 1, None, n,
                               ctx_len, torch.float32, torch.device("cpu"), 5)
    old_k = cache.k[0][:, :ctx_len].clone()
    old_v = cache.v[0][:, :ctx_len].clone()
    q, k, v = (torch.randn(n, h, d, generator=g) for h in (hq, hkv, hkv))
    chunk = whole_batch((), "cpu", cache)
    calls = []
    kernel = attention_kernels.MathKernel()
    real = kernel.decode
    monkeypatch.setattr(attention_kernels.MathKernel, "decode", lambda self, *a: calls.append(a[0].shape) or real(*a))
    out = torch.empty(n, hq * d)
    with attention.recording() as ran:
        cache.attend(0, chunk.decode, q, k, v, out)
    assert calls == [torch.Size([n, hq, d])] and ran == {"math_decode"}
    for i in range(n):
        keys, values = torch.cat([old_k[i], k[i : i + 1]]), torch.cat([old_v[i], v[i : i + 1]])
        expect, _ = attention_kernels.softmax_attention(q[i : i + 1], keys, values, causal=False)
        torch.testing.assert_close(out[i].view(hq, d), expect[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(cache.k[0][:, ctx_len], k) and torch.equal(cache.k[0][:, :ctx_len], old_k)
