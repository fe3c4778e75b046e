"""Our layer against what a user would run instead: transformers' decoder layer of the same shape,
eager and torch.compile'd, on one GPU, with the same weights and input.

    python tests/benchmarks/layer_vs_transformers.py --out results/h200/<commit>/bench-layer.jsonl [--profile DIR]

Each model is taken at its shard shape (`llama3-70b:2`: one rank of TP=2, which a tp=1 layer of
that shape computes exactly: models.ModelShape.shard). Per shape and token count, three stacks of
`--layers` layers computing the same function:

  overlapbench  our no_comm layer stack (forward_stack, LocalReducer: no collective)
  hf_eager      transformers' layers (Llama, Qwen2 with its QKV bias, Qwen3 with its q/k norms;
                SDPA attention, causal), the rotary embedding once per forward as its model does
  hf_compiled   the same under torch.compile (default options; the token dimension marked
                dynamic, so one compile per shape serves every token count, as engines compile)

Each is checked against the float32 truth (our reference stack in float32 on the same rounded
weights) up to --check-max tokens, captured in a CUDA graph, and timed in interleaved rounds
(each round replays every impl for about --span-ms, in a rotating order): `ms` is the median
over rounds per layer. One JSON line per (impl, shape, tokens) with `impl`, `tokens`, `ms`, the
shape's `hidden`, `heads`, `kv_heads`, `ffn`, and `flops`/`tflops`/`peak_frac` as layer rows
have them. With --profile, a kernel table per (impl, shape, tokens): eager forwards under
torch.profiler, the device time per kernel name per layer (tables and a JSON summary).

Needs transformers (`pip install 'overlapbench[hf]'`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `kernels` and `overlapbench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from overlapbench.errors import UserError, one_line
from overlapbench.launch import environment
from overlapbench.model import attention, flops, transformers_layer
from overlapbench.model.chunks import whole_batch
from overlapbench.model.layer import LocalReducer, forward_stack
from overlapbench.model.models import preset
from overlapbench.model.norms import rms_norm
from overlapbench.model.rope import RopeTable
from overlapbench.model.weights import build_stack, cast, random_input
from overlapbench.timing import bench, interleave, measure, peak
from overlapbench.timing.cuda_graph import capture
from overlapbench.tuning.results import RunLog

IMPLS = ("overlapbench", "hf_eager", "hf_compiled")
REFERENCE = "hf_compiled"  # what rows' vs_compiled is against
SCHEMA = "overlapbench/bench-layer-v1"


def parse_model(text: str) -> tuple[str, int]:
    name, _, tp = text.partition(":")
    return name, int(tp or 1)


class Stacks:
    """The three implementations of one shape, with their weights; forwards per token count."""

    def __init__(self, name: str, tp: int, layers: int, impls: list[str], seed: int = 0, device: str = "cuda") -> None:
        self.shape = preset(name).shard(tp)
        self.model, self.tp, self.layers = name, tp, layers
        device = torch.device(device)
        self.stack = build_stack(self.shape, layers, 1, 0, torch.bfloat16, device, seed)
        self.hf = transformers_layer.DecoderStack(self.shape, self.stack.layers) if set(impls) - {"overlapbench"} else None
        self.compiled = torch.compile(self.hf) if "hf_compiled" in impls else None
        self.exact = None  # the float32 stack, made at the first check

    def forward(self, impl: str, x: torch.Tensor):
        """impl's forward on x [tokens, hidden] -> the final normed hidden states (transformers'
        residual stream through our final norm, so every impl computes the same function)."""
        tokens, device, eps = x.shape[0], x.device, self.shape.eps
        if impl == "overlapbench":
            rope, chunk, reducer = RopeTable(self.shape, tokens, device), whole_batch((tokens,), device), LocalReducer(eps)
            return lambda: forward_stack(self.stack, x, chunk, rope, reducer)
        positions = torch.arange(tokens, device=device)
        module = self.hf if impl == "hf_eager" else self.compiled
        if impl == "hf_compiled":
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(positions, 0)
        return lambda: module(x, positions)

    def truth(self, x: torch.Tensor) -> torch.Tensor:
        """Our reference stack in float32 on the same (rounded) weights: torch arithmetic throughout."""
        if self.exact is None:
            self.exact = cast(self.stack, torch.float32)
        tokens = x.shape[0]
        rope = RopeTable(self.shape, tokens, x.device)
        return forward_stack(self.exact, x.float(), whole_batch((tokens,), x.device), rope, LocalReducer(self.shape.eps))

    def normed(self, impl: str, out: torch.Tensor) -> torch.Tensor:
        return out if impl == "overlapbench" else rms_norm(out, self.stack.final_norm, self.shape.eps)


def kernel_table(fn, calls: int, layers: int) -> dict[str, tuple[float, float]]:
    """Per kernel name: (launches, microseconds) per layer, over `calls` eager forwards."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    table: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            entry = table[event.name]
            entry[0] += 1 / (calls * layers)
            entry[1] += event.time_range.elapsed_us() / (calls * layers)
    return {name: (round(n, 3), round(us, 2)) for name, (n, us) in sorted(table.items(), key=lambda kv: -kv[1][1])}


def category(kernel: str) -> str:
    """A kernel's part of the layer, from its name (cuDNN/flash attention, cuBLAS/CUTLASS GEMMs,
    the rest by what it does; inductor's kernel that rotates q and k as it prepares attention's
    inputs, `..._cos_mul_neg_sin_...`, is RoPE)."""
    name = kernel.lower()
    if any(k in name for k in ("cudnn_generated", "flash_fwd", "fmha")) and not name.startswith("triton"):
        return "attention"
    if any(k in name for k in ("nvjet", "gemm", "cutlass", "xmma")):
        return "gemm"
    if "rope" in name or "rotary" in name or ("cos" in name and "sin" in name):
        return "rope"
    if "swiglu" in name or "silu" in name:
        return "swiglu"
    if "norm" in name or "rsqrt" in name or "mean" in name or "red_fused" in name:
        return "norm"
    if "copy" in name or "memcpy" in name or "memset" in name or "cat" in name:
        return "copy"
    return "elementwise"


def write_profile(folder: Path, label: str, table: dict[str, tuple[float, float]]) -> dict[str, float]:
    by_category: dict[str, float] = defaultdict(float)
    for name, (_, us) in table.items():
        by_category[category(name)] += us
    lines = [f"{label}: device time per layer (eager forwards under torch.profiler)", "",
             "category      us/layer", *(f"{c:<12} {us:>9.1f}" for c, us in sorted(by_category.items(), key=lambda kv: -kv[1])),
             f"{'total':<12} {sum(by_category.values()):>9.1f}", "", "launches/layer  us/layer  kernel"]
    lines += [f"{n:>14.2f} {us:>9.1f}  {name[:150]}" for name, (n, us) in table.items()]
    (folder / f"{label}.txt").write_text("\n".join(lines) + "\n")
    return dict(by_category)


def profile(fn, layers: int, folder: Path, label: str, profiles: dict) -> str | None:
    """A kernel table of fn into folder/label.txt and its categories into `profiles`; the error, if any."""
    try:
        profiles[label] = write_profile(folder, label, kernel_table(fn, 3, layers))
    except Exception as e:  # a table that cannot be made leaves the timing alone
        return one_line(e, limit=300)
    return None


def measure_point(stacks: Stacks, impls: list[str], tokens: int, args, common: dict, device_peak, profiles: dict) -> list[dict]:
    """Check, (profile,) capture and time every impl at one token count; their rows (an impl
    that fails to run or capture gets a failed row with its error, the others go on)."""
    shape, device = stacks.shape, torch.device("cuda")
    x = random_input(tokens, shape.hidden, tokens, torch.bfloat16, device)
    truth = stacks.truth(x) if tokens <= args.check_max else None
    label = f"{stacks.model}-tp{stacks.tp}-{tokens}"
    base = common | {"model": stacks.model, "tp": stacks.tp, "tokens": tokens, "layers": stacks.layers,
                     "hidden": shape.hidden, "heads": shape.heads, "kv_heads": shape.kv_heads, "ffn": shape.ffn,
                     "head_dim": shape.head_dim, "shape": shape.as_dict()}
    graphs, forwards, rows = {}, {}, {}  # forwards: what each graph reads (rope tables, positions) stays alive
    for impl in impls:
        row = base | {"impl": impl, "status": "ok", "error": None,
                      "compile": "torch.compile default options, token dimension dynamic" if impl == "hf_compiled" else None}
        try:
            fn = stacks.forward(impl, x)
            with attention.recording() as names, torch.no_grad():
                out = fn()
                row["rel_err"] = None if truth is None else measure.rel_err(stacks.normed(impl, out), truth)
                del out
                row["check"] = None if truth is None else "fp32"
                row["attention"] = attention.describe(names)
                if args.profile is not None and (args.profile_tokens is None or tokens in args.profile_tokens):
                    row["profile_error"] = profile(fn, stacks.layers, args.profile, f"{label}-{impl}", profiles)
                graphs[impl], forwards[impl] = capture(fn), fn
        except Exception as e:  # one impl's failure is a row, not the end of the run
            row |= {"status": "failed", "error": one_line(e, limit=300)}
        rows[impl] = row
    del truth
    names = list(graphs)
    reference = names.index(REFERENCE) if REFERENCE in names else 0
    timed = dict(zip(names, time_interleaved([graphs[n].replay for n in names], reference, args))) if names else {}
    del graphs, forwards
    for impl, row in rows.items():
        t = timed.get(impl)
        per_layer = [] if t is None else [s / stacks.layers for s in t.samples_ms]
        summary = bench.summarize(per_layer) if per_layer else {"ms": None}
        row |= summary | {"samples_ms": [round(s, 5) for s in per_layer], "rounds": len(per_layer)}
        if t is not None and REFERENCE in timed:  # paired, round by round: t_impl / t_hf_compiled
            row |= {"vs_compiled": 1 / t.speedup, "vs_compiled_ci": [1 / t.speedup_ci[1], 1 / t.speedup_ci[0]]}
        row |= flops.row_fields(shape, 1, (tokens,), None, summary["ms"], device_peak)
    return list(rows.values())


def time_interleaved(replays: list, reference: int, args) -> list:
    """interleave.time_rounds over the graphs' replays: rounds of about span_ms each, in a shuffled
    order, until each impl's ratio to the reference is known within +-ci_target (95%), or the
    time budget is spent (interleave.Timed per replay)."""
    clock, per_call = bench.CudaClock(), []
    for replay in replays:
        replay()  # untimed: the estimate is of a replay after the first
        per_call.append(bench.warm_up(replay, 1, 0.0, clock))
    plan = interleave.Plan(args.span_ms, args.rounds, args.ci_target, warmup_s=0.5, min_rounds=20,
                           min_time_s=args.min_time_s, budget_factor=3.0)
    return interleave.time_rounds(replays, per_call, reference, plan, clock)


def main() -> None:
    ints = lambda s: [int(t) for t in s.split(",")]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    p.add_argument("--models", type=lambda s: [parse_model(m) for m in s.split(",")],
                   default="llama3-70b:2,llama3-8b:2", help="preset:tp, each taken at its shard shape")
    p.add_argument("--tokens", type=ints, default=[1024, 2048, 4096, 8192, 16384, 32768])
    p.add_argument("--impls", type=lambda s: s.split(","), default=list(IMPLS))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=200, help="at most this many rounds")
    p.add_argument("--span-ms", type=float, default=20.0, help="each impl's time in a round")
    p.add_argument("--ci-target", type=float, default=0.005, help="stop when the ratio to hf_compiled is known within this")
    p.add_argument("--min-time-s", type=float, default=1.0, help="rounds take at most 3x this per impl (the budget)")
    p.add_argument("--check-max", type=int, default=8192, help="check against the float32 truth up to this many tokens")
    p.add_argument("--profile", type=Path, default=None, help="folder for kernel tables (eager forwards)")
    p.add_argument("--profile-tokens", type=ints, default=None, help="profile only these token counts (default: all)")
    args = p.parse_args()
    if isinstance(args.models, str):
        args.models = [parse_model(m) for m in args.models.split(",")]
    unknown = set(args.impls) - set(IMPLS)
    try:
        if unknown:
            raise UserError(f"--impls: {', '.join(sorted(unknown))} not among {', '.join(IMPLS)}")
        if not torch.cuda.is_available():
            raise UserError("bench_layer: needs a CUDA GPU")
        if set(args.impls) - {"overlapbench"}:
            transformers_layer.require()
    except UserError as e:
        sys.exit(f"error: {e}")
    log = RunLog(args.out, environment.git_commit())
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    device_peak = peak.dense_peak(torch.device("cuda"))
    common = {"schema": SCHEMA, "device": torch.cuda.get_device_name(), "versions": environment.versions()} | log.stamp
    print(f"peak: {device_peak.tflops} TFLOP/s ({device_peak.source}); measured now: {device_peak.burst_tflops} burst, "
          f"{device_peak.sustained_tflops} sustained")
    profiles: dict = {}
    table = []
    for name, tp in args.models:
        stacks = Stacks(name, tp, args.layers, args.impls)
        for tokens in args.tokens:
            t0 = time.perf_counter()
            rows = measure_point(stacks, args.impls, tokens, args, common, device_peak, profiles)
            for row in rows:
                log.write(row)
            ok = {r["impl"]: r for r in rows if r["status"] == "ok"}
            line = f"{name}:{tp} {tokens:>6}" + "".join(
                f"  {impl} {r['ms']:.3f} ms {r['peak_frac']:.0%} err {r.get('rel_err') or float('nan'):.1e}"
                for impl, r in ok.items())
            line += "".join(f"  {r['impl']} FAILED: {r['error']}" for r in rows if r["status"] != "ok")
            if "overlapbench" in ok and "vs_compiled" in ok["overlapbench"]:
                lo, hi = ok["overlapbench"]["vs_compiled_ci"]
                line += f"  ours/compiled {ok['overlapbench']['vs_compiled']:.3f} [{lo:.3f}, {hi:.3f}]"
            print(line + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
            table.append(line)
            torch.cuda.empty_cache()
        del stacks
        torch.cuda.empty_cache()
    if args.profile is not None:
        (args.profile / "summary.json").write_text(json.dumps(profiles, indent=1) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
