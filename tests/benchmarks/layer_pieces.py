"""The layer's memory-bound pieces at the shard shapes, each three ways: our Triton kernel, the
torch code it replaced (eager: the oracle), and torch.compile of that torch code. Which is
fastest says whether a kernel of our own is worth having.

    python tests/benchmarks/layer_pieces.py --out FILE.jsonl

Pieces: RoPE of q and k (with and without q/k norms), SwiGLU (and the SwiGLU kernel at other
tiles), RMSNorm, residual add + RMSNorm. Each is timed from a CUDA graph (median over rounds);
GB/s counts the fewest bytes the piece must move (each input read once, each output written
once), against which HBM's ~4.3-4.8 TB/s is the ceiling. With --gemms, also the layer's GEMMs
one by one, ours (QKV, O, gate|up, down) and transformers' (q, k, v, o, gate, up, down), in
TFLOP/s, and the 8192^3 GEMM's burst and sustained rates (overlapbench/timing/peak.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `kernels` and `overlapbench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from kernels.rmsnorm import add_rmsnorm_reference, fused_add_rmsnorm, rmsnorm
from kernels.rope import rope_qkv as rope_kernel
from kernels.swiglu import swiglu as swiglu_kernel
from overlapbench.launch import environment
from overlapbench.model.activation import torch_swiglu
from overlapbench.model.models import preset
from overlapbench.model.norms import torch_rms_norm
from overlapbench.model.rope import RopeTable, torch_rope_qkv
from overlapbench.timing.bench import bench
from overlapbench.tuning.results import RunLog

CUDA = torch.device("cuda")


def replay_ms(fn, rounds: int = 7, reps: int = 20) -> float:
    """Median over `rounds` samples (each from an idle GPU) of ms per replay of fn's CUDA graph,
    a sample being `reps` replays back to back."""
    timed = bench(fn, 0.0, 0.0, graphs=True, iters=rounds, calls_per_sample=reps, before_each=torch.cuda.synchronize)
    return timed.median_ms


def pieces(shape, tokens: int):
    """(name, bytes moved at least, {impl: fn}) for each piece at this shape and token count."""
    g = torch.Generator(device=CUDA).manual_seed(tokens)
    bf = dict(dtype=torch.bfloat16, device=CUDA)
    h, hq, hkv, d, f = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.ffn
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, generator=g, device=CUDA).to(torch.bfloat16)
    positions = torch.arange(tokens, device=CUDA)
    table = RopeTable(shape, tokens, CUDA)
    qn, kn = (torch.ones(d, **bf) for _ in range(2))
    gate_up = torch.randn(tokens, 2 * f, generator=g, device=CUDA).to(torch.bfloat16)
    x, res = (torch.randn(tokens, h, generator=g, device=CUDA).to(torch.bfloat16) for _ in range(2))
    w = torch.ones(h, **bf)
    elem = 2
    rope_bytes = 2 * tokens * (hq + hkv) * d * elem
    compiled_rope = torch.compile(torch_rope_qkv)
    compiled_swiglu, compiled_norm = torch.compile(torch_swiglu), torch.compile(torch_rms_norm)
    compiled_add_norm = torch.compile(add_rmsnorm_reference)
    tiles = [(4, 1024, 4), (2, 2048, 8), (16, 256, 4), (8, 1024, 8), (1, 4096, 8)]
    cases = [
        ("rope", rope_bytes, {
            "triton": lambda: rope_kernel(qkv, positions, table.cos, table.sin, hq, hkv, d),
            "torch": lambda: torch_rope_qkv(qkv, positions, table, hq, hkv, d, shape.eps),
            "compiled": lambda: compiled_rope(qkv, positions, table, hq, hkv, d, shape.eps)}),
        ("rope+qk_norm", rope_bytes, {
            "triton": lambda: rope_kernel(qkv, positions, table.cos, table.sin, hq, hkv, d, shape.eps, None, qn, kn),
            "torch": lambda: torch_rope_qkv(qkv, positions, table, hq, hkv, d, shape.eps, None, qn, kn),
            "compiled": lambda: compiled_rope(qkv, positions, table, hq, hkv, d, shape.eps, None, qn, kn)}),
        ("swiglu", 3 * tokens * f * elem, {
            "triton": lambda: swiglu_kernel(gate_up), "torch": lambda: torch_swiglu(gate_up),
            "compiled": lambda: compiled_swiglu(gate_up),
            **{"triton_{}x{}w{}".format(*t): (lambda t=t: swiglu_kernel(gate_up, tile=t)) for t in tiles}}),
        ("rmsnorm", 2 * tokens * h * elem, {
            "triton": lambda: rmsnorm(x, w, shape.eps), "torch": lambda: torch_rms_norm(x, w, shape.eps),
            "compiled": lambda: compiled_norm(x, w, shape.eps)}),
        ("add+rmsnorm", 4 * tokens * h * elem, {
            "triton": lambda: fused_add_rmsnorm(x, res, w, shape.eps),
            "torch": lambda: add_rmsnorm_reference(x, res, w, shape.eps),
            "compiled": lambda: compiled_add_norm(x, res, w, shape.eps)}),
    ]
    return cases


def gemms(shape, tokens: int):
    """(name, flops, {impl: fn}) for each GEMM of the layer: ours fused, transformers' apart."""
    g = torch.Generator(device=CUDA).manual_seed(tokens + 1)
    h, q, kv, f = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.ffn
    rand = lambda *s: (torch.randn(*s, generator=g, device=CUDA) * s[-1] ** -0.5).to(torch.bfloat16)
    x, attn, act = rand(tokens, h), rand(tokens, q), rand(tokens, f)
    cases = []
    for name, a, n in (("qkv", x, q + 2 * kv), ("o", attn, h), ("gate_up", x, 2 * f), ("down", act, h),
                       ("q", x, q), ("k", x, kv), ("v", x, kv), ("gate", x, f), ("up", x, f)):
        w = rand(n, a.shape[1])  # nn.Linear's [out, in], as the layer stores it
        w_kn = w.t().contiguous()  # [in, out]: the other layout an engine could keep
        cases.append((f"gemm:{name}", 2 * tokens * a.shape[1] * n, {
            "cublas": lambda a=a, w=w: a @ w.t(), "cublas_kn": lambda a=a, w=w_kn: a @ w,
            "cublaslt": lambda a=a, w=w: _on_cublaslt(lambda: a @ w.t())}))
    return cases


def _on_cublaslt(fn):
    """fn with torch's preferred BLAS library set to cuBLASLt (the choice is made at the call,
    and a CUDA graph keeps the kernel it picked)."""
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        return fn()
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--models", default="llama3-70b:2,llama3-8b:2")
    p.add_argument("--tokens", type=lambda s: [int(t) for t in s.split(",")], default=[2048, 8192])
    p.add_argument("--gemms", action="store_true", help="also the layer's GEMMs one by one, and the device's peak")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_pieces: needs a CUDA GPU")
    log = RunLog(args.out, environment.git_commit())
    common = {"device": torch.cuda.get_device_name(), "versions": environment.versions()} | log.stamp
    lines = []
    if args.gemms:
        from overlapbench.timing.peak import dense_peak

        device_peak = dense_peak(CUDA)
        lines.append(f"8192^3 GEMM: {device_peak.burst_tflops} TFLOP/s burst, {device_peak.sustained_tflops} sustained")
        print(lines[-1], flush=True)
    for model in args.models.split(","):
        name, _, tp = model.partition(":")
        shape = preset(name).shard(int(tp or 1))
        for tokens in args.tokens:
            for piece, nbytes, impls in pieces(shape, tokens) + (gemms(shape, tokens) if args.gemms else []):
                found = {}
                for impl, fn in impls.items():
                    try:
                        found[impl] = replay_ms(fn)
                    except Exception as e:  # a compile that fails is a finding, not the end of the run
                        found[impl] = None
                        print(f"{model} {tokens} {piece} {impl}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                gemm = piece.startswith("gemm:")  # nbytes holds its FLOPs
                for impl, ms in found.items():
                    rate = None if ms is None else nbytes / ms / (1e9 if gemm else 1e6)
                    row = common | {"model": name, "tp": int(tp or 1), "tokens": tokens, "piece": piece, "impl": impl,
                                    "ms": ms, ("flops" if gemm else "bytes"): nbytes, ("tflops" if gemm else "gbps"): rate}
                    log.write(row)
                unit, scale = ("TFLOP/s", 1e9) if gemm else ("GB/s", 1e6)
                text = "  ".join(f"{i} {m * 1e3:7.1f} us {nbytes / m / scale:5.0f} {unit}" if m else f"{i} failed"
                                 for i, m in found.items())
                lines.append(f"{model:<13} {tokens:>6} {piece:<13} {text}")
                print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
