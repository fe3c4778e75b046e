"""The attention kernels behind overlapbench/model/attention.py, and the pick among them.

Each kernel computes, for packed runs of rows (`Ragged`: lengths and cumulative lengths),

    causal(q, k, v, runs)            each run's queries over its own keys, causal and square;
    cross(q, k, v, q_runs, k_runs)   each run's queries over its keys, no mask;

returning the output [rows, Hq, D] and the natural-log log-sum-exp of the scaled scores
[Hq, rows] (any strides), with K/V of fewer heads than q taken as they are (GQA), and

    decode(q, k_cache, v_cache)      n decode queries [n, Hq, D], each over its own cache
                                     [n, keys, Hkv, D], no mask: one batched call (`decode_path`
                                     names it: math_decode, flash_decode, cudnn_decode, sdpa_decode).

  * `cudnn`: PyTorch's private cuDNN attention op, the whole-sequence kernel on Hopper; one
    dense call for one run, one batched call for runs of equal lengths, PyTorch's flash varlen
    kernel (one call) for runs of unequal lengths.
  * `math`: explicit float32 scores, one run at a time: the CPU path.
  * `sdpa`: the GPU fallback without the above: SDPA per run with a lower-right mask (no
    log-sum-exp needed, no merge).

`select` checks each candidate once on a small problem against a float32 reference (shape,
base and layout of the log-sum-exp included) and takes the first that passes, so a torch or
cuDNN that behaves differently falls back to a slower, correct kernel instead of a wrong one.
`OVERLAPBENCH_ATTENTION=cudnn|sdpa|math` forces one (for measurements).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ENV = "OVERLAPBENCH_ATTENTION"


@dataclass(frozen=True)
class Ragged:
    """Lengths of packed runs, and their cumulative lengths (int32, on the device)."""

    lengths: tuple[int, ...]
    cu: torch.Tensor
    max: int

    @classmethod
    def of(cls, lengths: list[int], device) -> Ragged:
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        return cls(tuple(lengths), torch.tensor(cu, dtype=torch.int32, device=device), max(lengths, default=0))

    @property
    def starts(self) -> list[int]:
        return [int(sum(self.lengths[:i])) for i in range(len(self.lengths))]

    def runs(self) -> list[slice]:
        return [slice(s, s + n) for s, n in zip(self.starts, self.lengths, strict=True)]


def bhsd(t: torch.Tensor) -> torch.Tensor:
    """[S, H, D] -> the [1, H, S, D] view SDPA-style ops take (no copy)."""
    return t.transpose(0, 1).unsqueeze(0)


def softmax_attention(q, k, v, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One run in float32: q [Sq, Hq, D] over k, v [Sk, Hkv, D]; causal means square, top-left.
    Returns (out [Sq, Hq, D] in q's dtype, lse [Hq, Sq])."""
    sq, hq, d = q.shape
    sk, hkv, _ = k.shape
    qf = q.float().reshape(sq, hkv, hq // hkv, d)  # q head h reads kv head h // (hq // hkv)
    scores = torch.einsum("qhgd,khd->hgqk", qf, k.float()) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("hgqk,khd->qhgd", torch.exp(scores - lse[..., None]), v.float())
    return out.reshape(sq, hq, d).to(q.dtype), lse.reshape(hq, sq)


def decode_reference(q, k, v) -> torch.Tensor:
    """n decode queries over their caches in float32, batched: q [n, Hq, D], k/v [n, S, Hkv, D]."""
    n, hq, d = q.shape
    hkv = k.shape[2]
    qf = q.float().reshape(n, hkv, hq // hkv, d)  # q head h reads kv head h // (hq // hkv)
    scores = torch.einsum("nhgd,nshd->nhgs", qf, k.float()) / math.sqrt(d)
    out = torch.einsum("nhgs,nshd->nhgd", scores.softmax(dim=-1), v.float())
    return out.reshape(n, hq, d).to(q.dtype)


def _flash_decode(q, k, v) -> torch.Tensor:
    """PyTorch's flash kernel, dense batch: q as [n, 1, Hq, D] over the caches as they are
    ([n, S, Hkv, D], GQA native); flash splits the keys across CTAs for one-row queries."""
    return torch.ops.aten._flash_attention_forward(
        q.unsqueeze(1), k, v, None, None, 1, k.shape[1], 0.0, False, False, scale=1 / math.sqrt(q.shape[-1]))[0].squeeze(1)


def _cudnn_decode(q, k, v) -> torch.Tensor:
    """cuDNN's attention with batch = decode tokens, one query each (K/V as strided views)."""
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), None, False, 0.0, False, False,
        scale=1 / math.sqrt(q.shape[-1]))[0]
    return out.squeeze(2)


def _sdpa_decode(q, k, v) -> torch.Tensor:
    """SDPA with batch = decode tokens (PyTorch picks the backend; GQA without repeating K/V)."""
    return F.scaled_dot_product_attention(q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True).squeeze(2)


# Checked in this order, the first that passes runs: cuDNN reads the cache at 4.2-4.5 TB/s on an
# H200, PyTorch's flash forward at 2.5-2.7 (results/h200x2/8f58a81/bench-decode.log).
DECODE_PATHS = {"cudnn_decode": _cudnn_decode, "flash_decode": _flash_decode, "sdpa_decode": _sdpa_decode}


def _decode_passes(fn, device, dtype, hq: int, hkv: int, d: int) -> bool:
    """Whether fn matches the float32 reference on a small decode batch (caches sliced from a
    larger one, as the layer slices its cache)."""
    try:
        g = torch.Generator(device=device).manual_seed(4321)
        q = torch.randn(5, hq, d, generator=g, device=device).to(dtype)
        k = torch.randn(7, 78, hkv, d, generator=g, device=device).to(dtype)[1:6]
        v = torch.randn(7, 78, hkv, d, generator=g, device=device).to(dtype)[1:6]
        out, ref = fn(q, k, v).float(), decode_reference(q, k, v).float()
        return out.shape == ref.shape and ((out - ref).norm() / ref.norm()).item() < 2e-2
    except Exception:
        return False


def decode_path(device, dtype, hq: int, hkv: int, d: int) -> str:
    """The first decode kernel that passes its check here (sdpa_decode, the fallback, unchecked)."""
    return next((name for name, fn in DECODE_PATHS.items() if _decode_passes(fn, device, dtype, hq, hkv, d)),
                "sdpa_decode")


class MathKernel:
    name = "math"
    has_lse = True
    decode_path = "math_decode"

    def decode(self, q, k, v):
        return decode_reference(q, k, v)

    def path(self, q_runs: Ragged, k_runs: Ragged) -> str:
        return self.name

    def _each(self, q, k, v, q_runs: Ragged, k_runs: Ragged, causal: bool):
        rows, hq, d = q.shape
        out = torch.empty(rows, hq, d, dtype=q.dtype, device=q.device)
        lse = torch.empty(hq, rows, dtype=torch.float32, device=q.device)
        for qs, ks in zip(q_runs.runs(), k_runs.runs(), strict=True):
            out[qs], lse[:, qs] = softmax_attention(q[qs], k[ks], v[ks], causal)
        return out, lse

    def causal(self, q, k, v, runs: Ragged, want_lse: bool):
        return self._each(q, k, v, runs, runs, causal=True)

    def cross(self, q, k, v, q_runs: Ragged, k_runs: Ragged):
        return self._each(q, k, v, q_runs, k_runs, causal=False)


@dataclass(frozen=True)
class LseReading:
    """How an op's log-sum-exp maps to [Hq, rows] natural log: its layout and base."""

    heads_first: bool  # [.., Hq, rows, ..] (else [rows, Hq, ..])
    log2: bool

    def read(self, lse: torch.Tensor, heads: int, rows: int) -> torch.Tensor:
        t = lse.reshape(heads, rows) if self.heads_first else lse.reshape(rows, heads).t()
        return t * math.log(2) if self.log2 else t


READINGS = [LseReading(h, b) for b in (False, True) for h in (True, False)]


def _cudnn_dense(q, k, v, causal: bool, want_lse: bool):
    """One run on cuDNN: out [S, Hq, D] and the op's raw log-sum-exp ([1, Hq, S, 1] in 2.11)."""
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        bhsd(q), bhsd(k), bhsd(v), None, want_lse, 0.0, causal, False, scale=1 / math.sqrt(q.shape[-1]))[:2]
    return out.squeeze(0).transpose(0, 1), lse


def _cudnn_batched(q, k, v, runs: int, causal: bool, want_lse: bool):
    """`runs` runs of equal lengths as one batched cuDNN call (rows are evenly strided, so the
    batch is a view); the LSE comes back as [Hq, rows] read per batch the dense way."""
    rows, hq, d = q.shape
    as_batch = lambda t: t.view(runs, t.shape[0] // runs, t.shape[1], d).transpose(1, 2)
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        as_batch(q), as_batch(k), as_batch(v), None, want_lse, 0.0, causal, False, scale=1 / math.sqrt(d))[:2]
    out = out.transpose(1, 2).reshape(rows, hq, d)
    if want_lse:
        lse = lse.reshape(runs, hq, rows // runs).permute(1, 0, 2).reshape(hq, rows)
    return out, lse


def _flash_varlen(q, k, v, q_runs: Ragged, k_runs: Ragged, causal: bool):
    """Several runs of any lengths in one call of PyTorch's flash varlen kernel (GQA native;
    its raw LSE is [Hq, rows]). cuDNN's ragged op measured ~45 ms for 64 runs of 512 on H200
    with torch 2.11 (a graph built per call), so runs of unequal lengths take this one."""
    return torch.ops.aten._flash_attention_forward(
        q, k, v, q_runs.cu, k_runs.cu, q_runs.max, k_runs.max, 0.0, causal, False, scale=1 / math.sqrt(q.shape[-1]))[:2]


# Runs of unequal lengths at least this long each take their own cuDNN call: 1024 query rows
# of >= 16 heads are >= 128 tiles of 128 rows, about a wave on 132 SMs, so a few such calls lose
# little to launches and keep cuDNN's ~1.6x over flash (the whole-sequence baseline of a batch
# like [2048, 2048, 4096] stays on cuDNN). Shorter runs go together into one flash varlen call.
LOOP_MIN_ROWS = 1024


class CudnnKernel:
    """cuDNN attention through PyTorch's private op: one dense call for one run, one batched
    call for runs of equal lengths, one call per run for long runs of unequal lengths; short
    runs of unequal lengths go to flash varlen in one call (a loop where that fails its check)."""

    name = "cudnn"
    has_lse = True

    def __init__(self, dense: LseReading, batched: bool, varlen: LseReading | None, contiguous_v: bool,
                 decode_path: str = "sdpa_decode") -> None:
        self.dense, self.batched, self.varlen, self.contiguous_v = dense, batched, varlen, contiguous_v
        self.decode_path = decode_path  # the decode kernel that passed its check (DECODE_PATHS)

    def decode(self, q, k, v):
        return DECODE_PATHS[self.decode_path](q, k, v)

    def path(self, q_runs: Ragged, k_runs: Ragged) -> str:
        if len(q_runs.lengths) <= 1:
            return "cudnn"
        if self.batched and len(set(q_runs.lengths)) == 1 and len(set(k_runs.lengths)) == 1:
            return "cudnn_batched"
        if self.varlen is None or min(q_runs.lengths) >= LOOP_MIN_ROWS:
            return "cudnn_loop"
        return "flash_varlen"

    def _run(self, q, k, v, q_runs: Ragged, k_runs: Ragged, causal: bool, want_lse: bool):
        if self.contiguous_v:
            v = v.contiguous()
        rows, hq, _ = q.shape
        path = self.path(q_runs, k_runs)
        if path == "cudnn":
            out, lse = _cudnn_dense(q, k, v, causal, want_lse)
            return out, (self.dense.read(lse, hq, rows) if want_lse else None)
        if path == "cudnn_batched":
            out, lse = _cudnn_batched(q, k, v, len(q_runs.lengths), causal, want_lse)
            return out, (LseReading(True, self.dense.log2).read(lse, hq, rows) if want_lse else None)
        if path == "flash_varlen":
            out, lse = _flash_varlen(q, k, v, q_runs, k_runs, causal)
            return out.reshape(q.shape), (self.varlen.read(lse, hq, rows) if want_lse else None)
        out = torch.empty_like(q)
        lse = torch.empty(hq, rows, dtype=torch.float32, device=q.device) if want_lse else None
        for qs, ks in zip(q_runs.runs(), k_runs.runs(), strict=True):
            o, l_ = _cudnn_dense(q[qs], k[ks], v[ks], causal, want_lse)
            out[qs] = o
            if want_lse:
                lse[:, qs] = self.dense.read(l_, hq, qs.stop - qs.start)
        return out, lse

    def causal(self, q, k, v, runs: Ragged, want_lse: bool):
        return self._run(q, k, v, runs, runs, True, want_lse)

    def cross(self, q, k, v, q_runs: Ragged, k_runs: Ragged):
        return self._run(q, k, v, q_runs, k_runs, False, True)


class SdpaKernel:
    """The fallback: one SDPA call per run over its prefix and own keys, mask aligned lower-right
    (PyTorch runs it on its flash kernel); K/V repeated to q's heads for that call."""

    name = "sdpa"
    has_lse = False
    decode_path = "sdpa_decode"

    def decode(self, q, k, v):
        return _sdpa_decode(q, k, v)

    def lower_right(self, plan, q, k, v, kv_k, kv_v, out):
        from torch.nn.attention.bias import causal_lower_right

        runs = plan.own.runs()
        prefix_of = {}
        for p in plan.prefixed:
            for qs, ks in zip(p.q_lens.runs(), p.k_lens.runs(), strict=True):
                prefix_of[p.rows.start + qs.start] = slice(p.keys.start + ks.start, p.keys.start + ks.stop)
        out3 = out.view(q.shape)
        for r in runs:
            qq, kk, vv = q[r], k[r], v[r]
            if r.start in prefix_of:
                keys = prefix_of[r.start]
                kk, vv = torch.cat([kv_k[keys], kk]), torch.cat([kv_v[keys], vv])
            # K/V repeated to q's heads: SDPA's memory-efficient kernel (float32, the truth's)
            # takes no GQA, and math would hold [heads, rows, rows] scores (128 GiB at 32K rows)
            groups = qq.shape[1] // kk.shape[1]
            kk, vv = kk.repeat_interleave(groups, dim=1), vv.repeat_interleave(groups, dim=1)
            if kk.shape[0] == qq.shape[0]:
                o = F.scaled_dot_product_attention(bhsd(qq), bhsd(kk), bhsd(vv), is_causal=True)
            else:
                mask = causal_lower_right(qq.shape[0], kk.shape[0])
                o = F.scaled_dot_product_attention(bhsd(qq), bhsd(kk), bhsd(vv), attn_mask=mask)
            out3[r] = o.squeeze(0).transpose(0, 1)
        return out


# ------------------------------------------------------------------------------ selection


def _check_case(fn, q, k, v, q_runs: Ragged, k_runs: Ragged, causal: bool):
    """Max errors of fn's output (relative) and of each LSE reading (absolute) on one case."""
    out, lse = fn(q, k, v, q_runs, k_runs, causal)
    ref_out, ref_lse = MathKernel()._each(q, k, v, q_runs, k_runs, causal)
    out_err = ((out.float() - ref_out.float()).norm() / ref_out.float().norm()).item()
    lse_errs = {}
    for r in READINGS:
        try:
            lse_errs[r] = (r.read(lse, q.shape[1], q.shape[0]) - ref_lse).abs().max().item()
        except RuntimeError:  # not that layout
            continue
    return out_err, lse_errs


def _reading(fn, device, dtype, hq: int, hkv: int, d: int, lengths: list[int], k_lengths: list[int]):
    """The LSE reading under which fn matches the reference on a causal and a cross case, with v
    a strided view as the layer makes it; None if it fails or matches under none."""
    g = torch.Generator(device=device).manual_seed(1234)
    total_q, total_k = sum(lengths), sum(k_lengths)
    q = torch.randn(total_q, hq, d, generator=g, device=device).to(dtype)
    kv = torch.randn(total_k, 3 * hkv, d, generator=g, device=device).to(dtype)
    k, v = kv[:, :hkv].contiguous(), kv[:, 2 * hkv :]  # v: a strided view, like the layer's
    qk = torch.randn(total_q, 3 * hkv, d, generator=g, device=device).to(dtype)
    runs_q, runs_k = Ragged.of(lengths, device), Ragged.of(k_lengths, device)
    passing = set(READINGS)
    for qq, kk, vv, rq, rk, causal in ((q, qk[:, :hkv].contiguous(), qk[:, 2 * hkv :], runs_q, runs_q, True),
                                       (q, k, v, runs_q, runs_k, False)):
        out_err, lse_errs = _check_case(fn, qq, kk, vv, rq, rk, causal)
        if not out_err < 2e-2:
            return None
        passing &= {r for r, e in lse_errs.items() if e < 5e-2}
    return next((r for r in READINGS if r in passing), None)


def _passes(fn, device, dtype, hq, hkv, d, lengths, k_lengths) -> LseReading | None:
    try:
        return _reading(fn, device, dtype, hq, hkv, d, lengths, k_lengths)
    except Exception:
        return None


def _cudnn_kernel(device, dtype, hq: int, hkv: int, d: int) -> CudnnKernel | None:
    """The cuDNN kernel with the paths that pass their checks, or None if the dense one fails."""
    if not torch.backends.cuda.cudnn_sdp_enabled():
        return None
    for contiguous_v in (False, True):
        def fix(v, contiguous_v=contiguous_v):
            return v.contiguous() if contiguous_v else v

        dense = _passes(lambda q, k, v, rq, rk, causal: _cudnn_dense(q, k, fix(v), causal, True),
                        device, dtype, hq, hkv, d, [77], [45])
        if dense is None:
            continue
        batched = _passes(lambda q, k, v, rq, rk, causal: _cudnn_batched(q, k, fix(v), 3, causal, True),
                          device, dtype, hq, hkv, d, [64, 64, 64], [40, 40, 40])
        varlen = _passes(lambda q, k, v, rq, rk, causal: _flash_varlen(q, k, fix(v), rq, rk, causal),
                         device, dtype, hq, hkv, d, [77, 130, 5], [45, 3, 200])
        return CudnnKernel(dense, batched == LseReading(True, dense.log2), varlen, contiguous_v,
                           decode_path(device, dtype, hq, hkv, d))
    return None


def select(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int):
    """The attention kernel for these shapes here (checked once per setting of $OVERLAPBENCH_ATTENTION)."""
    return _select(os.environ.get(ENV, "").strip().lower(), device, dtype, heads, kv_heads, head_dim)


@functools.cache
def _select(forced: str, device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int):
    if forced == "math" or (device.type != "cuda" and forced != "sdpa"):
        return MathKernel()
    if forced == "sdpa":
        return SdpaKernel()
    if forced not in ("", "cudnn"):
        raise ValueError(f"{ENV}={forced!r}: expected cudnn, sdpa or math")
    kernel = _cudnn_kernel(device, dtype, heads, kv_heads, head_dim)
    if kernel is None and forced == "cudnn":
        raise RuntimeError(f"{ENV}=cudnn: cuDNN attention does not pass its check on this GPU")
    return kernel or SdpaKernel()


select.cache_clear = _select.cache_clear  # forget the checks (tests)
