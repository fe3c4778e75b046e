"""Attention of chunks (overlapbench/model/attention.py) against a plain masked softmax, on CPU.

Every split the strategies make is replayed here: the batch's q, k, v are drawn once in the
natural layout; chunks attend in order, storing their keys and values where later chunks read
them; each chunk's rows must equal the reference's rows of the same (sequence, position).
"""

from __future__ import annotations

import math

import pytest
import torch

from overlapbench.model import attention, attention_kernels
from overlapbench.model.chunks import KVBuffer, prefix_suffix, sequence_starts, token_range
from overlapbench.strategies import iso

HQ, HKV, D = 6, 2, 16


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens) -> torch.Tensor:
    """Causal attention of every whole sequence, float64, K/V repeated to q's heads: [T, Hq, D]."""
    out, groups, dim = [], q.shape[1] // k.shape[1], q.shape[-1]
    for s, n in zip(sequence_starts(seq_lens), seq_lens, strict=True):
        qq, kk, vv = (t[s : s + n].double() for t in (q, k, v))
        kk, vv = kk.repeat_interleave(groups, 1), vv.repeat_interleave(groups, 1)
        scores = torch.einsum("qhd,khd->hqk", qq, kk) / math.sqrt(dim)
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), vv))
    return torch.cat(out)


def inputs(tokens: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, HQ, D, generator=g)
    kv = torch.randn(tokens, 3 * HKV, D, generator=g)
    return q, kv[:, :HKV].contiguous(), kv[:, 2 * HKV :]  # v strided, as the layer's view is


def run_chunks(chunks, order, q, k, v, tokens, seq_lens) -> torch.Tensor:
    """Attend the chunks in order (layout rows = natural rows `order`); output in natural order."""
    kv = KVBuffer(tokens, HKV, D, torch.float32, "cpu")
    out = torch.empty(tokens, HQ, D)
    for chunk in chunks:
        rows = order[chunk.begin : chunk.end]
        cq, ck, cv = q[rows], k[rows], v[rows]
        kv.store(chunk, ck, cv)
        got = attention.causal_attention(chunk.attention, cq, ck, cv, kv.k, kv.v)
        out[rows] = got.view(-1, HQ, D)
    return out


def check(chunks, order, seq_lens, seed: int) -> None:
    tokens = sum(seq_lens)
    q, k, v = inputs(tokens, seed)
    got = run_chunks(chunks, order, q, k, v, tokens, seq_lens)
    ref = reference(q, k, v, seq_lens)
    err = ((got.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-4, f"{seq_lens}: rel err {err:.2e}"


def token_split(seq_lens, cut: int, device="cpu"):
    tokens = sum(seq_lens)
    return [token_range(seq_lens, 0, cut, device), token_range(seq_lens, cut, tokens, device)], torch.arange(tokens)


def iso_split(seq_lens, ratio: float, align: int, device="cpu"):
    """iso's chunks (as iso.py cuts them) and its layout order (natural row of each layout row)."""
    first, second, order = prefix_suffix(seq_lens, iso.cuts(seq_lens, ratio, align), device)
    return [first, second], (torch.arange(sum(seq_lens), device=device) if order is None else order)


@pytest.fixture(params=["math", "sdpa"])
def kernel(request, monkeypatch):
    """Every test runs on the CPU path (math) and on the GPU fallback's code (sdpa)."""
    monkeypatch.setenv(attention_kernels.ENV, request.param)
    attention_kernels.select.cache_clear()
    yield request.param
    attention_kernels.select.cache_clear()


@pytest.mark.parametrize("seq_lens", [(1,), (37,), (24, 13, 5), (1, 70, 2, 33)])
def test_whole_batch_matches_reference(kernel, seq_lens):
    chunks, order = token_split(seq_lens, sum(seq_lens))[0][:1], torch.arange(sum(seq_lens))
    check(chunks, order, seq_lens, seed=len(seq_lens))


@pytest.mark.parametrize("seq_lens, cut", [((37,), 19), ((37,), 1), ((37,), 36), ((24, 13, 5), 30),
                                           ((24, 13, 5), 24), ((100, 3, 61), 77), ((129,), 65)])
def test_token_split_matches_reference(kernel, seq_lens, cut):
    check(*token_split(seq_lens, cut), seq_lens, seed=cut)


@pytest.mark.parametrize("seq_lens, ratio, align", [((37,), 0.5, 1), ((24, 13, 5), 0.4, 1), ((24, 1, 13, 5), 0.6, 1),
                                                    ((100, 70, 33, 2), 0.55, 8), ((129, 3), 0.3, 1)])
def test_iso_split_matches_reference(kernel, seq_lens, ratio, align):
    check(*iso_split(seq_lens, ratio, align), seq_lens, seed=sum(seq_lens))


@pytest.mark.parametrize("bounds", [(0, 11, 40, 57, 90), (0, 45, 90)])
def test_pieces_over_a_held_buffer_match_reference(kernel, bounds):
    """flash_agrs `per_piece`: pieces of the natural layout over the whole batch's K/V."""
    seq_lens = (30, 41, 19)
    tokens = sum(seq_lens)
    q, k, v = inputs(tokens, seed=7)
    kv = KVBuffer.holding(k, v)
    got = torch.empty(tokens, HQ * D)
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        chunk = token_range(seq_lens, lo, hi, "cpu")
        attention.causal_attention(chunk.attention, q[lo:hi], k[lo:hi], v[lo:hi], kv.k, kv.v, out=got[lo:hi])
    ref = reference(q, k, v, seq_lens)
    assert ((got.view(-1, HQ, D).double() - ref).norm() / ref.norm()).item() < 1e-4


def test_iso_prefixes_are_one_prefix_call():
    """The KV buffer in chunk 1's layout puts every prefix back to back: one ragged call."""
    (_, second), _ = iso_split((24, 13, 5), 0.5, 1)
    assert len(second.attention.prefixed) == 1
    p = second.attention.prefixed[0]
    assert (p.rows, p.keys) == (slice(0, second.size), slice(0, 24 + 13 + 5 - second.size))
    assert p.k_lens.cu.tolist() == [0, 12, 18, 20] and p.q_lens.cu.tolist() == [0, 12, 19, 22]
    (_, gap), _ = iso_split((24, 1, 13), 0.5, 1)  # a 1-token sequence stays whole in chunk 1
    assert [p.keys for p in gap.attention.prefixed] == [slice(0, 12), slice(13, 19)]


def test_only_continued_segments_are_stored():
    (first, second), _ = token_split((10, 20, 5), 15)
    assert [s.continued for s in first.segments] == [False, True]
    assert [s.continued for s in second.segments] == [False, False]
    kv = KVBuffer(35, HKV, D, torch.float32, "cpu")
    kv.k.fill_(float("nan"))
    k = torch.randn(15, HKV, D)
    kv.store(first, k, k)
    assert torch.equal(kv.k[10:15], k[10:15]) and kv.k[:10].isnan().all() and kv.k[15:].isnan().all()


def test_recording_names_the_kernel(kernel):
    (first, second), order = token_split((24, 13), 30)
    with attention.recording() as ran:
        run_chunks([first], order, *inputs(37, 0), 37, (24, 13))
    assert ran == {kernel}
    with attention.recording() as ran:
        run_chunks([first, second], order, *inputs(37, 0), 37, (24, 13))
    assert ran == ({"math", "math+lse_merge"} if kernel == "math" else {"sdpa"})
    assert attention.describe(ran) is not None and attention.describe(set()) is None


def test_unknown_forced_kernel_is_refused(monkeypatch):
    monkeypatch.setenv(attention_kernels.ENV, "fa9")
    attention_kernels.select.cache_clear()
    with pytest.raises(ValueError, match="cudnn, sdpa or math"):
        attention_kernels.select(torch.device("cuda"), torch.bfloat16, 8, 2, 128)
    attention_kernels.select.cache_clear()


def test_math_kernel_lse_is_natural_log():
    q, k, v = inputs(9, seed=3)
    out, lse = attention_kernels.softmax_attention(q, k, v, causal=False)
    kk = k.repeat_interleave(HQ // HKV, 1)
    ref = torch.logsumexp(torch.einsum("qhd,khd->hqk", q, kk) / math.sqrt(D), -1)
    assert lse.shape == (HQ, 9) and torch.allclose(lse, ref, atol=1e-5)


@pytest.mark.parametrize("heads_first", [True, False])
@pytest.mark.parametrize("log2", [False, True])
def test_the_lse_reading_of_an_op_is_found(heads_first, log2):
    """The check that picks the GPU kernel reads any layout and base of the LSE right."""

    def op(q, k, v, rq, rk, causal):
        out, lse = attention_kernels.MathKernel()._each(q, k, v, rq, rk, causal)
        lse = lse / math.log(2) if log2 else lse
        return out, (lse[None, :, :, None] if heads_first else lse.t().contiguous()[:, :, None])

    found = attention_kernels._reading(op, torch.device("cpu"), torch.float32, HQ, HKV, D, [77, 5], [45, 3])
    assert found == attention_kernels.LseReading(heads_first, log2)


@pytest.mark.parametrize("fault", ["output", "lse"])
def test_a_wrong_op_is_not_picked(fault):
    def op(q, k, v, rq, rk, causal):
        out, lse = attention_kernels.MathKernel()._each(q, k, v, rq, rk, causal)
        return (out * 1.1, lse) if fault == "output" else (out, lse + 0.5)

    assert attention_kernels._reading(op, torch.device("cpu"), torch.float32, HQ, HKV, D, [77], [45]) is None


def test_cudnn_kernel_routes_runs_by_their_lengths():
    """One run: dense cuDNN; equal runs: one batched call; unequal: flash varlen when short, a
    cuDNN call each when long (or when varlen failed its check)."""
    reading = attention_kernels.LseReading(True, False)
    kernel = attention_kernels.CudnnKernel(reading, batched=True, varlen=reading, contiguous_v=False)
    ragged = lambda *n: attention_kernels.Ragged.of(list(n), "cpu")
    assert kernel.path(ragged(70), ragged(70)) == "cudnn"
    assert kernel.path(ragged(64, 64), ragged(40, 40)) == "cudnn_batched"
    assert kernel.path(ragged(64, 64), ragged(40, 41)) == "flash_varlen"
    assert kernel.path(ragged(1024, 3000), ragged(1024, 3000)) == "cudnn_loop"  # long runs: cuDNN each
    no_varlen = attention_kernels.CudnnKernel(reading, batched=False, varlen=None, contiguous_v=False)
    assert no_varlen.path(ragged(64, 64), ragged(40, 40)) == "cudnn_loop"


def test_bench_script_writes_rows(tmp_path):
    """tests/benchmarks/attention_split.py end to end on CPU (a smoke test: CPU times mean nothing)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "b.jsonl"
    script = Path(__file__).resolve().parent / "benchmarks" / "attention_split.py"
    done = subprocess.run([sys.executable, str(script), "--out", str(out), "--models", "llama3-8b", "--tokens", "130",
                           "--batches", "3x50;40+70", "--kernels", "math", "--iters", "1", "--warmup", "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["tokens"], r["cut"]) for r in rows] == [(130, "half"), (130, "balanced"), (150, "balanced"), (110, "balanced")]
    for r in rows:
        assert r["rel_err_split_vs_whole"] < 1e-5 and r["ran"] == "math,math+lse_merge"
        assert r["first_tokens"] + 0 < r["tokens"] and r["split_over_whole"] > 0
    assert len({r["run_id"] for r in rows}) == 1 and all("git" in r for r in rows)  # every row says its run and code
