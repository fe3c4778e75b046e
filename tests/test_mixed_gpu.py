"""Mixed prefill + decode batches on the GPU (bf16): the batched decode attention against a naive
per-token softmax in float32, eager and replayed from a CUDA graph; and every strategy that runs
on 2 and 4 GPUs against baseline on a mixed batch.

    PYTHONPATH=$PWD python -m pytest -q tests/test_mixed_gpu.py
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from overlapbench.distributed.runtime import apply_safe_env  # noqa: E402
from overlapbench.model import attention, attention_kernels  # noqa: E402
from overlapbench.model.chunks import build_decode_cache, whole_batch  # noqa: E402
from overlapbench.model.models import PRESETS  # noqa: E402
from overlapbench.timing.cuda_graph import capture  # noqa: E402
from tests import distributed  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.one_gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

apply_safe_env()
TOL = 1e-2


def naive(q, cache_k, cache_v) -> torch.Tensor:
    """Each token alone: its query over its own cache, float32, K/V repeated to q's heads."""
    n, hq, d = q.shape
    out = torch.empty(n, hq, d, device=q.device)
    for i in range(n):
        k = cache_k[i].float().repeat_interleave(hq // cache_k.shape[2], dim=1)  # [S, Hq, D]
        v = cache_v[i].float().repeat_interleave(hq // cache_v.shape[2], dim=1)
        p = (torch.einsum("hd,shd->hs", q[i].float(), k) / math.sqrt(d)).softmax(-1)
        out[i] = torch.einsum("hs,shd->hd", p, v)
    return out.reshape(n, hq * d)


@pytest.mark.parametrize("model, tokens, context", [("llama3-70b", 64, 4096), ("llama3-8b", 200, 1000)])
def test_batched_decode_attention_equals_per_token_attention_and_replays(model, tokens, context):
    shape = PRESETS[model]
    device = torch.device("cuda")
    cache = build_decode_cache(shape, 1, 2, 0, tokens, context, torch.bfloat16, device, seed=3)  # rank 0 of tp=2
    hq, hkv, d = shape.heads // 2, shape.kv_heads // 2, shape.head_dim
    attention_kernels.select(device, torch.bfloat16, hq, hkv, d)  # picked before any capture
    chunk = whole_batch((), device, cache)
    g = torch.Generator(device="cuda").manual_seed(9)
    q = torch.randn(tokens, hq, d, generator=g, device="cuda").bfloat16()
    k, v = (torch.randn(tokens, hkv, d, generator=g, device="cuda").bfloat16() for _ in range(2))
    out = torch.empty(tokens, hq * d, dtype=torch.bfloat16, device="cuda")

    def run():
        cache.attend(0, chunk.decode, q, k, v, out)

    with attention.recording() as ran:
        run()
    assert len(ran) == 1 and next(iter(ran)).endswith("_decode"), ran  # one decode kernel, recorded
    err = ((out.float() - naive(q, cache.k[0], cache.v[0])).norm() / out.float().norm()).item()
    assert err < TOL, f"{ran}: rel err {err:.3g}"
    assert torch.equal(cache.k[0][:, context], k)  # the new token's key went into its slot

    graph = capture(run)
    for t in (q, k, v):  # new inputs in place: the replay must read them
        t.copy_(torch.randn(t.shape, generator=g, device="cuda").bfloat16())
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    err = ((out.float() - naive(q, cache.k[0], cache.v[0])).norm() / out.float().norm()).item()
    assert err < TOL, f"replayed {ran}: rel err {err:.3g}"
    assert torch.equal(cache.k[0][:, context], k)


# ------------------------------------------------------------------------ strategies, 2 and 4 GPUs

CASES = [("token_split", {}), ("token_split", {"split_ratio": 0.05}), ("iso", {}), ("sp_baseline", {}),
         ("async_tp", {}), ("flash_agrs", {}), ("fused_norm", {"comm": "fused"}), ("token_split", {"comm": "fused"})]
BATCH, DECODE = (2048,), (256, 4096)


def _run(rank: int, world: int) -> dict:
    from overlapbench.distributed import runtime
    from overlapbench.model.chunks import rope_positions
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.timing.step import BuildContext

    rt = runtime.init(timeout_s=120)
    shape = PRESETS["llama3-8b"]
    stack = build_stack(shape, 2, world, rank, torch.bfloat16, rt.device, seed=0)
    cache = build_decode_cache(shape, 2, world, rank, *DECODE, torch.bfloat16, rt.device, seed=0)
    tokens = sum(BATCH) + DECODE[0]
    ctx = BuildContext(rt, stack, BATCH, RopeTable(shape, rope_positions(BATCH, cache), rt.device), tokens, cache)
    x = random_input(tokens, shape.hidden, 0, torch.bfloat16, rt.device)

    def forward(strategy, knobs):
        step = distributed.build_step(ctx, strategy, knobs)
        with attention.recording() as ran:
            out = step.to_full(step.forward(x)).float()
        return out, attention.describe(ran)

    found = {}
    ref, _ = forward("baseline", {})
    for strategy, knobs in CASES:
        try:
            out, ran = forward(strategy, knobs)
            found[f"{strategy} {knobs}"] = (distributed.rel_err(out, ref), ran)
        except Exception as e:
            found[f"{strategy} {knobs}"] = (distributed.error_text(e), None)
        torch.cuda.synchronize()
    return found


def _launch(world: int) -> list[dict]:
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs")
    return distributed.run(_run, world=world, timeout=300, backend="nccl")


@pytest.fixture(scope="module")
def results() -> distributed.Launches:
    return distributed.Launches(_launch)


@pytest.mark.parametrize(("world", "case"), distributed.world_params(CASES, ids=lambda c: f"{c[0]} {c[1]}"))
def test_strategy_matches_baseline_on_a_mixed_batch(results, world, case):
    tol = distributed.bf16_tolerance(world)
    for rank, found in enumerate(results(world)):
        err, ran = found[f"{case[0]} {case[1]}"]
        assert isinstance(err, float), f"rank {rank}: {err}"
        assert err < tol, f"rank {rank}: rel err {err:.3g} >= {tol:.3g} (attention {ran})"
        assert ran is not None and "_decode" in ran, ran
