"""GPU facts about the attention of a chunk that continues a sequence, on one GPU.

    python tests/probes/attention_ops.py --out $OUT

Establishes what overlapbench/model/attention.py relies on, printing what failed with the exception
text instead of stopping:
  1. environment: torch / cuDNN versions, flash-attention impls, the varlen module;
  2. which SDPA backend runs (forced one by one, and the kernels the default picks) for a causal
     square call, a non-causal call with q_len != kv_len and a lower-right causal call, GQA
     passed with enable_gqa and with repeated K/V;
  3. the private ops (cuDNN dense and ragged, flash dense and varlen, efficient dense and
     varlen, varlen_attn, nested-jagged SDPA): whether K/V with fewer heads go in as they are,
     the mask alignment of is_causal with q_len != kv_len, and the shape, strides, dtype and base
     of the log-sum-exp they return, each checked against a float32 reference;
  3b. what overlapbench/model/attention.py picks here, and its token_split / iso chunks (batches of
     unequal sequences: the ragged calls) against the reference, eager and from a CUDA graph;
  4. timings (CUDA events, median of 20 after warm-up) at 4K..32K tokens, llama3-70b and
     llama3-8b TP=2 heads: whole causal attention, today's chunk-2 path, the two cuDNN calls
     merged by kernels/lse_merge.py, and a batch of 64 short sequences (loop vs one ragged call).
Rows go to $OUT/probe_attention.jsonl; the timing table is printed last.

Long because it is one self-contained script the lead runs as is on the GPU machine; it is a
record of facts, not part of the tool (results/h200x2/probes/ holds a run of it).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import traceback
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `kernels` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from overlapbench.launch.environment import git_commit
from overlapbench.timing.bench import bench
from overlapbench.tuning.results import RunLog

D = 128
HEADS = {"llama3-70b": (32, 4), "llama3-8b": (16, 4)}  # (q heads, kv heads) per rank at TP=2
DEV = torch.device("cuda")
ROWS: list[dict] = []
LOG: RunLog | None = None  # $OUT/probe_attention.jsonl


def emit(section: str, name: str, ok: bool, **detail) -> None:
    row = {"section": section, "name": name, "ok": ok, **detail}
    ROWS.append(row if LOG is None else LOG.write(row))
    text = " ".join(f"{k}={v}" for k, v in detail.items())
    print(f"[{section}] {name}: {'ok' if ok else 'FAIL'} {text}", flush=True)


def attempt(section: str, name: str, fn) -> object:
    """Run fn() -> detail dict; record it, or the exception's first line. Returns fn's value."""
    try:
        detail = fn() or {}
        emit(section, name, True, **detail)
        return detail
    except Exception as e:
        msg = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
        emit(section, name, False, error=msg)
        if "--verbose" in sys.argv:
            traceback.print_exc()
        return None


# ----------------------------------------------------------------------------- inputs, reference


def layer_qkv(rows: int, hq: int, hkv: int, seed: int, dtype=torch.bfloat16):
    """q, k, v [rows, heads, D] as the layer makes them: q, k contiguous, v a strided view of the
    QKV projection's output."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    qkv = torch.randn(rows, (hq + 2 * hkv) * D, generator=g, device=DEV).to(dtype)
    q = qkv[:, : hq * D].reshape(rows, hq, D).contiguous()
    k = qkv[:, hq * D : (hq + hkv) * D].reshape(rows, hkv, D).contiguous()
    v = qkv[:, (hq + hkv) * D :].view(rows, hkv, D)
    return q, k, v


def bhsd(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1).unsqueeze(0)


def reference(q, k, v, mask: str):
    """fp32 attention of q [Sq, Hq, D] over k, v [Sk, Hkv, D]; mask none | top_left | lower_right.
    Returns (out [Sq, Hq, D], lse [Hq, Sq] natural log of the scaled scores)."""
    sq, hq, _ = q.shape
    sk, hkv, _ = k.shape
    kf = k.float().repeat_interleave(hq // hkv, dim=1)
    vf = v.float().repeat_interleave(hq // hkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) / math.sqrt(D)
    i = torch.arange(sq, device=DEV)[:, None]
    j = torch.arange(sk, device=DEV)[None, :]
    if mask == "top_left":
        scores = scores.masked_fill(j > i, float("-inf"))
    elif mask == "lower_right":
        scores = scores.masked_fill(j > i + sk - sq, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), vf)
    return out, lse


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def describe_lse(lse: torch.Tensor, ref_lse: torch.Tensor, hq: int, sq: int) -> dict:
    """Shape/strides/dtype of a returned LSE, and its max error read as [heads, rows] or as
    [rows, heads] (after dropping size-1 and padding dims), as a natural log and as a log2."""
    out = {"lse_shape": tuple(lse.shape), "lse_stride": tuple(lse.stride()), "lse_dtype": str(lse.dtype)}
    if lse.numel() == 0:
        return out | {"lse_note": "empty"}
    f = lse.float()
    readings = {}
    if f.numel() == hq * sq:
        readings["[H,S]"] = f.reshape(hq, sq)
        readings["[S,H]"] = f.reshape(sq, hq).t()
    elif f.shape[-1] > sq and f.numel() == hq * f.shape[-1]:
        readings["[H,Spad]"] = f.reshape(hq, -1)[:, :sq]
    else:
        return out | {"lse_note": f"size {f.numel()} is not heads*rows={hq * sq}"}
    for name, r in readings.items():
        out[f"err_ln{name}"] = round((r - ref_lse).abs().max().item(), 5)
        out[f"err_log2{name}"] = round((r * math.log(2) - ref_lse).abs().max().item(), 5)
    return out


def which_mask(out: torch.Tensor, q, k, v) -> str:
    tl_err = rel(out, reference(q, k, v, "top_left")[0])
    lr_err = rel(out, reference(q, k, v, "lower_right")[0])
    return f"top_left={tl_err:.1e} lower_right={lr_err:.1e}"


# ----------------------------------------------------------------------------- 1. environment


def environment() -> None:
    def env():
        import torch.nn.attention as att

        impls = att.list_flash_attention_impls() if hasattr(att, "list_flash_attention_impls") else "absent"
        current = att.current_flash_attention_impl() if hasattr(att, "current_flash_attention_impl") else "absent"
        return {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                "device": torch.cuda.get_device_name(), "cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled(),
                "flash_sdp": torch.backends.cuda.flash_sdp_enabled(), "flash_impls": impls, "flash_impl": current}

    attempt("env", "versions", env)

    def varlen():
        import inspect

        from torch.nn.attention import varlen as vl

        members = [m for m in dir(vl) if not m.startswith("_")]
        return {"varlen_attn": str(inspect.signature(vl.varlen_attn))[:300], "members": members}

    attempt("env", "torch.nn.attention.varlen", varlen)


# ----------------------------------------------------------------------------- 2. SDPA backends


def kernel_names(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    return sorted({n[:90] for n in names})


def sdpa_case(case: str, sq: int, sk: int, mask: str, hq: int, hkv: int, backends: list) -> None:
    q, _, _ = layer_qkv(sq, hq, hkv, seed=1)
    _, k, v = layer_qkv(sk, hq, hkv, seed=2)
    ref = reference(q, k, v, mask)[0]
    for gqa in ("enable_gqa", "repeat"):
        kk, vv = (k, v) if gqa == "enable_gqa" else (k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1))
        kw = {"enable_gqa": True} if gqa == "enable_gqa" else {}
        if mask == "top_left":
            kw["is_causal"] = True
        elif mask == "lower_right":
            kw["attn_mask"] = causal_lower_right(sq, sk)

        def call(kk=kk, vv=vv, kw=kw):
            return F.scaled_dot_product_attention(bhsd(q), bhsd(kk), bhsd(vv), **kw)

        for backend in backends:
            label = "default" if backend is None else backend.name

            def run(call=call, backend=backend):
                if backend is None:
                    out = call()
                    detail = {"kernels": kernel_names(call)}
                else:
                    with sdpa_kernel([backend]):
                        out = call()
                    detail = {}
                return {"rel_err": f"{rel(out.squeeze(0).transpose(0, 1), ref):.1e}"} | detail

            attempt("sdpa", f"{case} {gqa} {label}", run)


def sdpa_backends() -> None:
    hq, hkv = HEADS["llama3-70b"]
    cases = {  # name: (sq, sk, mask, sdpa kwargs builder)
        "causal_square": (333, 333, "top_left"),
        "noncausal_rect": (200, 456, "none"),
        "lower_right": (200, 456, "lower_right"),
    }
    backends = [None, SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    for case, (sq, sk, mask) in cases.items():
        sdpa_case(case, sq, sk, mask, hq, hkv, backends)


# ----------------------------------------------------------------------------- 3. private ops


def private_ops_for(model: str, hq: int, hkv: int, scale: float) -> None:
    sq, sk = 200, 456
    q, _, _ = layer_qkv(sq, hq, hkv, seed=3)
    _, k, v = layer_qkv(sk, hq, hkv, seed=4)
    qs, ks, vs = layer_qkv(333, hq, hkv, seed=5)
    cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention
    flash = torch.ops.aten._scaled_dot_product_flash_attention
    eff = torch.ops.aten._scaled_dot_product_efficient_attention

    def dense(op_name, args_of, qq, kk, vv, mask, causal):
        def run():
            res = args_of(bhsd(qq), bhsd(kk), bhsd(vv), causal)
            out, lse = res[0], res[1]
            ref_out, ref_lse = reference(qq, kk, vv, mask)
            detail = {"out_shape": tuple(out.shape), "out_stride": tuple(out.stride()),
                      "rel_err": f"{rel(out.squeeze(0).transpose(0, 1), ref_out):.1e}"}
            if causal and qq.shape[0] != kk.shape[0]:
                detail["mask"] = which_mask(out.squeeze(0).transpose(0, 1), qq, kk, vv)
            return detail | describe_lse(lse, ref_lse, qq.shape[1], qq.shape[0])

        attempt("op", f"{model} {op_name}", run)

    cud = lambda a, b, c, causal: cudnn(a, b, c, None, True, 0.0, causal, False, scale=scale)
    dense("cudnn gqa causal square", cud, qs, ks, vs, "top_left", True)
    dense("cudnn gqa noncausal rect", cud, q, k, v, "none", False)
    dense("cudnn gqa causal rect (alignment)", cud, q, k, v, "lower_right", True)
    dense("cudnn gqa noncausal rect no-lse", lambda a, b, c, causal: cudnn(a, b, c, None, False, 0.0, causal, False, scale=scale),
          q, k, v, "none", False)
    fl = lambda a, b, c, causal: flash(a, b, c, 0.0, causal, False, scale=scale)
    dense("flash gqa causal square", fl, qs, ks, vs, "top_left", True)
    dense("flash gqa causal rect (alignment)", fl, q, k, v, "lower_right", True)
    ef = lambda a, b, c, causal: eff(a, b, c, None, True, 0.0, causal, scale=scale)
    dense("efficient gqa noncausal rect", ef, q, k, v, "none", False)
    ragged(model, hq, hkv, scale)


def private_ops() -> None:
    scale = 1 / math.sqrt(D)
    for model, (hq, hkv) in HEADS.items():
        private_ops_for(model, hq, hkv, scale)


def packed(lens: list[int], hq: int, hkv: int, seed: int):
    q, k, v = layer_qkv(sum(lens), hq, hkv, seed)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=DEV)
    return q, k, v, cu


def ragged_reference(q, k, v, cq, ck, mask):
    outs, lses = [], []
    for i in range(len(cq) - 1):
        o, lse = reference(q[cq[i] : cq[i + 1]], k[ck[i] : ck[i + 1]], v[ck[i] : ck[i + 1]], mask)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=1)


def ragged(model: str, hq: int, hkv: int, scale: float) -> None:
    """Ragged/varlen ops: 3 sequences, one call; lengths no multiple of any tile."""
    q_lens, k_lens = [100, 257, 64], [100, 257, 64]
    rq_lens, rk_lens = [50, 100, 30], [120, 7, 200]
    square = packed(q_lens, hq, hkv, seed=6)
    rq, _, _, cq = packed(rq_lens, hq, hkv, seed=7)
    _, rk, rv, ck = packed(rk_lens, hq, hkv, seed=8)
    cases = {
        "causal square": (square[0], square[1], square[2], square[3], square[3], "top_left", True, max(q_lens), max(k_lens)),
        "noncausal rect": (rq, rk, rv, cq, ck, "none", False, max(rq_lens), max(rk_lens)),
        "causal rect (alignment)": (rq, rk, rv, cq, ck, "lower_right", True, max(rq_lens), max(rk_lens)),
    }
    for case, (q, k, v, c_q, c_k, mask, causal, mq, mk) in cases.items():
        ref_out, ref_lse = ragged_reference(q, k, v, c_q.tolist(), c_k.tolist(), mask)
        alt = ragged_reference(q, k, v, c_q.tolist(), c_k.tolist(), "top_left")[0] if causal else None

        def check(out, lse, q=q, ref_out=ref_out, ref_lse=ref_lse, alt=alt):
            out = out.reshape(q.shape)
            detail = {"out_shape": tuple(out.shape), "rel_err": f"{rel(out, ref_out):.1e}"}
            if alt is not None:
                detail["rel_err_if_top_left"] = f"{rel(out, alt):.1e}"
            return detail | describe_lse(lse, ref_lse, q.shape[1], q.shape[0])

        def cudnn_thd(q=q, k=k, v=v, c_q=c_q, c_k=c_k, causal=causal, mq=mq, mk=mk):
            res = torch.ops.aten._cudnn_attention_forward(q, k, v, None, c_q, c_k, mq, mk, True, 0.0, causal, False, scale=scale)
            return check(res[0], res[1])

        def flash_varlen(q=q, k=k, v=v, c_q=c_q, c_k=c_k, causal=causal, mq=mq, mk=mk):
            res = torch.ops.aten._flash_attention_forward(q, k, v, c_q, c_k, mq, mk, 0.0, causal, False, scale=scale)
            return check(res[0], res[1])

        def eff_varlen(q=q, k=k, v=v, c_q=c_q, c_k=c_k, causal=causal, mq=mq, mk=mk):
            res = torch.ops.aten._efficient_attention_forward(
                q.unsqueeze(0), k.repeat_interleave(hq // hkv, 1).unsqueeze(0), v.repeat_interleave(hq // hkv, 1).unsqueeze(0),
                None, c_q, c_k, mq, mk, 0.0, 2 if causal else 0, True, scale=scale)
            return check(res[0], res[1])

        def varlen_attn(q=q, k=k, v=v, c_q=c_q, c_k=c_k, causal=causal, mq=mq, mk=mk):
            from torch.nn.attention.varlen import AuxRequest
            from torch.nn.attention.varlen import varlen_attn as va

            gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
            out, aux = va(q, k, v, c_q, c_k, mq, mk, return_aux=AuxRequest(lse=True), scale=scale,
                          window_size=(-1, 0) if causal else (-1, -1), **gqa)
            return check(out, aux.lse if hasattr(aux, "lse") else aux)

        attempt("ragged", f"{model} cudnn_attention_forward THD gqa {case}", cudnn_thd)
        attempt("ragged", f"{model} flash_attention_forward varlen gqa {case}", flash_varlen)
        attempt("ragged", f"{model} efficient_attention_forward varlen repeat {case}", eff_varlen)
        attempt("ragged", f"{model} varlen_attn gqa {case}", varlen_attn)
        attempt("ragged", f"{model} varlen_attn repeat {case}", lambda f=varlen_attn, k=k, v=v: f(
            k=k.repeat_interleave(hq // hkv, 1), v=v.repeat_interleave(hq // hkv, 1)))

    def nested(backend, gqa: bool):
        q, k, v, cu = square
        ref_out = ragged_reference(q, k, v, cu.tolist(), cu.tolist(), "top_left")[0]
        if not gqa:
            k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        offsets = cu.long()
        nq, nk, nv = (torch.nested.nested_tensor_from_jagged(t.contiguous(), offsets).transpose(1, 2) for t in (q, k, v))

        def call():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(nq, nk, nv, is_causal=True, enable_gqa=gqa)

        out = call()
        return {"rel_err": f"{rel(out.transpose(1, 2).values(), ref_out):.1e}", "kernels": kernel_names(call)}

    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        for gqa in (True, False):
            label = "gqa" if gqa else "repeat"
            attempt("ragged", f"{model} nested-jagged SDPA causal {label} {backend.name}", lambda b=backend, g=gqa: nested(b, g))


# ----------------------------------------------------------------------------- 3b. overlapbench's own path


def overlapbench_path_for(model: str, hq: int, hkv: int) -> None:
    from overlapbench.model import attention, attention_kernels
    from overlapbench.model.chunks import KVBuffer, prefix_suffix, sequence_starts, token_range
    from overlapbench.strategies import iso

    attempt("ours", f"{model} select", lambda hq=hq, hkv=hkv: {
        "kernel": (lambda k: f"{type(k).__name__} {vars(k)}")(attention_kernels.select(DEV, torch.bfloat16, hq, hkv, D))})
    cases = {"token_split (1000,) cut 517": ((1000,), "token", 517),
             "token_split (300,700,77) cut 611": ((300, 700, 77), "token", 611),
             "iso (300,700,77,1,129) ratio 0.45": ((300, 700, 77, 1, 129), "iso", 0.45)}
    for name, (seq_lens, kind, where) in cases.items():
        def run(seq_lens=seq_lens, kind=kind, where=where, hq=hq, hkv=hkv):
            tokens = sum(seq_lens)
            order = torch.arange(tokens)
            if kind == "token":
                chunks = [token_range(seq_lens, 0, where, DEV), token_range(seq_lens, where, tokens, DEV)]
            else:
                first, second, laid = prefix_suffix(seq_lens, iso.cuts(seq_lens, where, 1), DEV)
                chunks, order = [first, second], (order if laid is None else laid)
            q, k, v = layer_qkv(tokens, hq, hkv, seed=tokens)
            ref = torch.cat([reference(q[s : s + n], k[s : s + n], v[s : s + n], "top_left")[0]
                             for s, n in zip(sequence_starts(seq_lens), seq_lens, strict=True)])
            order = order.to(DEV)
            kv = KVBuffer(tokens, hkv, D, torch.bfloat16, DEV)
            outs = [torch.empty(c.size, hq * D, dtype=torch.bfloat16, device=DEV) for c in chunks]
            ins = [(q[order[c.begin : c.end]], k[order[c.begin : c.end]], v[order[c.begin : c.end]]) for c in chunks]

            def step():
                for c, (cq, ck, cv), o in zip(chunks, ins, outs, strict=True):
                    kv.store(c, ck, cv)
                    attention.causal_attention(c.attention, cq, ck, cv, kv.k, kv.v, out=o)

            with attention.recording() as ran:
                step()
            got = torch.empty_like(ref)
            got[order] = torch.cat(outs).view(-1, hq, D).float()
            eager = rel(got, ref)
            for o in outs:
                o.zero_()
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()  # warm on a side stream, as cuda_graph.capture does
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph):
                step()
            for o in outs:
                o.zero_()
            graph.replay()
            torch.cuda.synchronize()
            got[order] = torch.cat(outs).view(-1, hq, D).float()
            return {"ran": attention.describe(ran), "rel_err_eager": f"{eager:.1e}", "rel_err_graph": f"{rel(got, ref):.1e}"}

        attempt("ours", f"{model} {name}", run)


def overlapbench_path() -> None:
    """What overlapbench.model.attention picks here, and its split chunks against the reference, eager
    and replayed from a CUDA graph (iso's batch: the ragged calls)."""

    for model, (hq, hkv) in HEADS.items():
        overlapbench_path_for(model, hq, hkv)


# ----------------------------------------------------------------------------- 4. timings


def median_ms(fn, iters: int = 20, warmup: int = 3) -> float:
    """The median (the upper one of an even count) of `iters` calls timed one by one, back to back."""
    return statistics.median_high(bench(fn, 0.0, 0.0, warmup=warmup, iters=iters).samples_ms)


def time_variants(variants: dict, res: dict) -> None:
    """Each variant's median ms into `res` under its name; one that fails: None, and its error."""
    for name, fn in variants.items():
        try:
            res[name] = median_ms(fn)
        except Exception as e:
            res[name] = None
            res[name + "_error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


def time_size(model: str, hq: int, hkv: int, n: int) -> dict:
    """One token count: every variant's median ms, the merged chunk 2's error against today's."""
    from kernels.lse_merge import lse_merge

    scale = 1 / math.sqrt(D)
    cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention
    p = n // 2
    q, k, v = layer_qkv(n, hq, hkv, seed=n)
    q2 = q[p:]
    groups = hq // hkv

    def whole_sdpa():
        return F.scaled_dot_product_attention(bhsd(q), bhsd(k), bhsd(v), is_causal=True, enable_gqa=True)

    def cudnn_call(qq, kk, vv, causal, lse):
        return cudnn(bhsd(qq), bhsd(kk), bhsd(vv), None, lse, 0.0, causal, False, scale=scale)

    def c2_today():
        kr, vr = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        return F.scaled_dot_product_attention(bhsd(q2), bhsd(kr), bhsd(vr), attn_mask=causal_lower_right(n - p, n))

    def c2_fa2_gqa():
        return torch.ops.aten._scaled_dot_product_flash_attention(bhsd(q2), bhsd(k), bhsd(v), 0.0, True, False, scale=scale)

    def parts():
        o1, l1 = cudnn_call(q2, k[:p], v[:p], False, True)[:2]
        o2, l2 = cudnn_call(q2, k[p:], v[p:], True, True)[:2]
        return o1, l1, o2, l2

    def flat(o, lse):
        return o.squeeze(0).transpose(0, 1), lse.reshape(hq, n - p)

    def merge_torch(o1, l1, o2, l2):
        a, b = l1.reshape(hq, -1, 1).float(), l2.reshape(hq, -1, 1).float()
        m = torch.maximum(a, b)
        wa, wb = torch.exp(a - m), torch.exp(b - m)
        return ((o1.float() * wa + o2.float() * wb) / (wa + wb)).to(q.dtype)

    def c2_two_triton():
        o1, l1, o2, l2 = parts()
        a, la = flat(o1, l1)
        b, lb = flat(o2, l2)
        return lse_merge(a, la, b, lb)

    def c2_two_torch():
        return merge_torch(*parts())

    res = {"model": model, "tokens": n}
    variants = {
        "whole_sdpa": whole_sdpa,
        "whole_cudnn": lambda: cudnn_call(q, k, v, True, False),
        "whole_cudnn_lse": lambda: cudnn_call(q, k, v, True, True),
        "c1_cudnn": lambda: cudnn_call(q[:p], k[:p], v[:p], True, False),
        "c2_today": c2_today,
        "c2_fa2_gqa": c2_fa2_gqa,
        "c2_prefix_cudnn": lambda: cudnn_call(q2, k[:p], v[:p], False, True),
        "c2_self_cudnn": lambda: cudnn_call(q2, k[p:], v[p:], True, True),
        "c2_two_torch": c2_two_torch,
        "c2_two_triton": c2_two_triton,
        "c2_recompute": lambda: cudnn_call(q, k, v, True, False),
    }
    try:  # correctness at scale, bf16: the merged chunk 2 against today's
        ref = c2_today().squeeze(0).transpose(0, 1)
        res["c2_two_rel_err"] = rel(c2_two_triton(), ref)
    except Exception as e:
        res["c2_two_rel_err"] = f"{type(e).__name__}: {str(e)[:200]}"
    try:
        o1, l1, o2, l2 = parts()
        a, la = flat(o1, l1)
        b, lb = flat(o2, l2)
        res["merge_triton"] = median_ms(lambda: lse_merge(a, la, b, lb))
        res["merge_torch"] = median_ms(lambda: merge_torch(o1, l1, o2, l2))
    except Exception as e:
        res["merge_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    time_variants(variants, res)
    emit("time", f"{model} {n}", True, **res)
    return res


def timings(sizes: list[int]) -> list[dict]:
    table = []
    for model, (hq, hkv) in HEADS.items():
        for n in sizes:
            table.append(time_size(model, hq, hkv, n))
            torch.cuda.empty_cache()
    return table


def batch_timing(model: str, hq: int, hkv: int, scale: float) -> dict:
    ragged_op = torch.ops.aten._cudnn_attention_forward
    lens = [512] * 64
    q, k, v, cu = packed(lens, hq, hkv, seed=9)
    res = {"model": model, "batch": "64x512"}

    def loop():
        for i in range(len(lens)):
            s = slice(512 * i, 512 * (i + 1))
            F.scaled_dot_product_attention(bhsd(q[s]), bhsd(k[s]), bhsd(v[s]), is_causal=True, enable_gqa=True)

    variants = {
        "loop_sdpa": loop,
        "ragged_cudnn": lambda: ragged_op(q, k, v, None, cu, cu, 512, 512, False, 0.0, True, False, scale=scale),
        "ragged_cudnn_lse": lambda: ragged_op(q, k, v, None, cu, cu, 512, 512, True, 0.0, True, False, scale=scale),
        "varlen_flash": lambda: torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, 512, 512, 0.0, True, False, scale=scale),
        "batched_cudnn_4d": lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(
            q.view(64, 512, hq, D).transpose(1, 2), k.view(64, 512, hkv, D).transpose(1, 2),
            v.reshape(64, 512, hkv, D).transpose(1, 2), None, False, 0.0, True, False, scale=scale),
    }
    time_variants(variants, res)
    emit("time", f"{model} batch 64x512", True, **res)
    return res


def batch_timings() -> list[dict]:
    """64 sequences of 512 tokens: a Python loop of SDPA calls against one ragged call."""
    scale = 1 / math.sqrt(D)
    rows = []
    for model, (hq, hkv) in HEADS.items():
        rows.append(batch_timing(model, hq, hkv, scale))
    return rows


def fmt(x) -> str:
    return f"{x:8.3f}" if isinstance(x, float) else f"{'-':>8}"


def print_table(table: list[dict], batches: list[dict]) -> None:
    print("\nAttention timings, ms (median of 20); chunk 1 + chunk 2 over whole, cut at 0.5")
    cols = ["whole_sdpa", "whole_cudnn", "c1_cudnn", "c2_today", "c2_fa2_gqa", "c2_two_torch", "c2_two_triton",
            "c2_recompute", "merge_triton"]
    print(f"{'model':<11} {'tokens':>6} " + " ".join(f"{c[:8]:>8}" for c in cols) + "   today/w  two/w  recomp/w")
    for r in table:
        whole = min(x for x in (r.get("whole_sdpa"), r.get("whole_cudnn")) if isinstance(x, float)) if any(
            isinstance(r.get(c), float) for c in ("whole_sdpa", "whole_cudnn")) else None

        def ratio(c2, r=r, whole=whole):
            c1 = r.get("c1_cudnn")
            known = whole and isinstance(c1, float) and isinstance(r.get(c2), float)
            return f"{(c1 + r[c2]) / whole:6.2f}" if known else "     -"

        print(f"{r['model']:<11} {r['tokens']:>6} " + " ".join(fmt(r.get(c)) for c in cols)
              + f"   {ratio('c2_today')}  {ratio('c2_two_triton')}  {ratio('c2_recompute')}")
    for b in batches:
        print(f"{b['model']:<11} 64x512 " + " ".join(f"{k}={fmt(b.get(k)).strip()}" for k in
              ("loop_sdpa", "ragged_cudnn", "ragged_cudnn_lse", "varlen_flash", "batched_cudnn_4d")))
    fails = [r for r in ROWS if not r["ok"]]
    print(f"{len(ROWS)} checks, {len(fails)} failed (see the [..] FAIL lines above)")


def main() -> None:
    global LOG
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="directory for probe_attention.jsonl")
    p.add_argument("--tokens", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 8192, 16384, 32768])
    p.add_argument("--skip-timings", action="store_true")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    args = p.parse_args()
    LOG = RunLog(args.out / "probe_attention.jsonl", git_commit())
    torch.backends.cuda.matmul.allow_tf32 = False
    for section in (environment, sdpa_backends, private_ops, overlapbench_path):
        try:
            section()
        except Exception as e:
            emit("probe", section.__name__, False, error=f"{type(e).__name__}: {str(e)[:300]}")
    table, batches = [], []
    if not args.skip_timings:
        try:
            table = timings(args.tokens)
            batches = batch_timings()
        except Exception as e:
            emit("probe", "timings", False, error=f"{type(e).__name__}: {str(e)[:300]}")
    print_table(table, batches)


if __name__ == "__main__":
    main()
