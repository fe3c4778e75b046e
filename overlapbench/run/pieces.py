"""`sweep --pieces --tp K`: the compute pieces of one TP=K rank's layer, timed on one GPU.

One rank of a TP=K layer computes what one GPU computes on the shard's shapes (heads, KV heads
and FFN divided by K; measured within about 1% of `no_comm` on two GPUs: shared/device-facts.md),
so one GPU times what `predict` needs of compute. The pieces are those the schedules
(model/schedule.py) are made of, for every chunk any point of the spec cuts:

- `attention` of a chunk: QKV GEMM, RoPE, causal attention (over the earlier chunks' keys too),
  O-projection (layer.attention_partial); with the split's KV buffer where the plan pipelines;
- `mlp` of a row count: gate/up GEMM, SwiGLU, down GEMM;
- `norm` of a row count: the residual add + RMSNorm a reduction runs after NCCL's all-reduce;
- `entry`: the stack's first RMSNorm of the whole batch (once per stack);
- `chain`: each plan's whole stack with the communication removed, run by the real executors:
  the pieces in context (several layers' weights, the lanes' norms beside the compute), which
  ran 2-11% slower than the isolated pieces' sum on the same H100 (estimate.py scales by it).

Each distinct piece is timed once per batch, however many strategies use it. A piece is timed as
a CUDA graph of enough repetitions to last about a millisecond, so launch gaps do not inflate it.

Where the spec settles each choice before its spans (`measure.settle_ms` > 0, the default), the
chains are timed so too, each at the clock its own load sets: a plan's chain and the studies'
timings then share a clock, and estimate.py's in-context scale carries it into every phase. The
isolated pieces are timed in shared rounds either way (settling each of a batch's dozens of pieces
would take minutes), so the chain alone says what a plan's own clock adds. On one H200, llama3-70b
TP=4's shard split at 2048 tokens (`token_split comm: none`) ran 4.2% over `no_comm` each at its
own clock and 0.3% in shared 20 ms spans (results/h200/4746a2d): the chain timed in shared rounds
said 0.4%, the 4x H200 study at each choice's own clock 4.3%.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import torch

from overlapbench import printing
from overlapbench.distributed import runtime
from overlapbench.errors import UserError
from overlapbench.launch import environment
from overlapbench.launch.session import session
from overlapbench.model.chunks import KVBuffer, build_decode_cache, layout, rope_positions, token_range
from overlapbench.model.layer import LocalReducer, attention_partial, forward_stack, mlp_partial
from overlapbench.model.norms import add_rms_norm, rms_norm
from overlapbench.model.rope import RopeTable
from overlapbench.model.schedule import Rows, SequenceParts
from overlapbench.model.weights import build_stack, random_input
from overlapbench.overlap.split import SplitForward, SplitPlan
from overlapbench.run.piece_keys import WORKLOAD, wanted_pieces
from overlapbench.specs.spec import SweepSpec
from overlapbench.timing import bench, interleave, measure
from overlapbench.timing.step import BuildContext, Step
from overlapbench.tuning import results

TARGET_MS = 1.0  # one timed sample lasts about this long (repetitions of the piece in one graph)
# A batch's pieces are timed interleaved, by the rounds the sweep times a batch's points with
# (interleave.time_rounds): after WARMUP_S of running them all, ROUNDS rounds each time every piece
# once, in a shuffled order, so the clock's drift (an H100 slows as it warms) moves every piece
# alike. Timed one after the other,
# a whole batch's MLP and its two halves came out of different clock states: the split looked up
# to 7% cheaper than no split, where the two-GPU run measured it 0.3-2% dearer.
WARMUP_S, ROUNDS = 2.0, 30
# Rounds of the chains at their own clock (settle_ms, then span_ms, per chain and round): a chain's
# 200 ms spans vary by about 0.5%, so a few rounds place its median well inside the gaps it decides
CHAIN_ROUNDS = 6


def _chunk(chunk: Rows | SequenceParts, seq_lens, device, decode):
    """One chunk as the strategy's build lays it out (model/chunks.layout)."""
    chunks, _ = layout((chunk,), seq_lens, device, decode)
    return chunks[chunk.part] if isinstance(chunk, SequenceParts) else chunks[0]


class BatchPieces:
    """One batch's shard layer (one layer of rank 0 of TP=tp) and random operands, never zeros;
    for the chains, the shard's whole stack of the point's layers."""

    def __init__(self, point, rt: runtime.Runtime) -> None:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[point.dtype]
        device = rt.device
        self.point, self.device, self.rt, self.dtype = point, device, rt, dtype
        self._chain_ctx = None
        self.stack = build_stack(point.shape, 1, point.tp, 0, dtype, device, point.seed)
        d = point.decode
        self.cache = None if d is None else build_decode_cache(point.shape, 1, point.tp, 0, d.tokens, d.context, dtype,
                                                               device, point.seed)
        tokens, hidden = point.tokens, point.shape.hidden
        self.rope = RopeTable(point.shape, rope_positions(point.batch, self.cache), device)
        self.x = random_input(tokens, hidden, point.seed, dtype, device)
        self.normed = rms_norm(self.x, self.stack.layers[0].attn_norm, point.shape.eps)
        self.partial = random_input(tokens, hidden, point.seed + 1, dtype, device)
        self.out = torch.empty_like(self.x)
        self.kv = KVBuffer(tokens, self.stack.kv_heads, point.shape.head_dim, dtype, device)
        self.kv.k.normal_()
        self.kv.v.normal_()

    def run(self, piece: str, rows: int, chunk, kv: bool):
        """What one repetition of the piece runs."""
        stack, eps, w = self.stack, self.point.shape.eps, self.stack.layers[0]
        if piece == "attention":
            c, buffer = _chunk(chunk, self.point.batch, self.device, self.cache), self.kv if kv else None
            return lambda: attention_partial(stack, 0, self.normed[c.rows], c, self.rope, buffer, self.out[c.rows])
        if piece == "mlp":
            return lambda: mlp_partial(stack, 0, self.normed[:rows], self.out[:rows])
        if piece == "norm":
            residual = self.x.clone()
            return lambda: add_rms_norm(self.partial[:rows], residual[:rows], w.mlp_norm, eps, self.out[:rows])
        if piece == "chain":
            return self._chain(chunk, kv)
        return lambda: rms_norm(self.x, w.attn_norm, eps, out=self.out)

    def _chain(self, chunks: tuple, pipelined: bool):
        """The plan's stack with its reductions' communication removed, run by the real executors
        (forward_stack, SplitForward): its compute, and its norms on their lanes."""
        ctx, eps = self._context(), self.point.shape.eps
        seq_lens, cache = self.point.batch, ctx.decode
        if not pipelined:
            whole = token_range(seq_lens, 0, self.point.tokens, self.device, cache)
            return lambda: forward_stack(ctx.stack, self.x, whole, ctx.rope, LocalReducer(eps))
        plan = SplitPlan(*layout(chunks, seq_lens, self.device, cache))
        forward = SplitForward(ctx, plan, (LocalReducer(eps), LocalReducer(eps)))
        return lambda: forward(self.x)

    def _context(self) -> BuildContext:
        if self._chain_ctx is None:
            p = self.point
            stack = build_stack(p.shape, p.layers, p.tp, 0, self.dtype, self.device, p.seed)
            cache = None if p.decode is None else build_decode_cache(p.shape, p.layers, p.tp, 0, p.decode.tokens,
                                                                     p.decode.context, self.dtype, self.device, p.seed)
            self._chain_ctx = BuildContext(self.rt, stack, p.batch, self.rope, p.tokens, cache)
        return self._chain_ctx


def _repeated(fn) -> tuple[Step, int, float]:
    """A step of enough repetitions of `fn` to last about TARGET_MS, the count, and the step's
    estimated ms (one call to warm, then three timed as one sample)."""
    timed = bench.bench(fn, 0.0, 0.0, warmup=1, iters=1, calls_per_sample=3, clock=bench.CudaClock())
    once = max(timed.samples_ms[0], 1e-3)
    reps = max(1, min(200, round(TARGET_MS / once)))
    return Step(lambda x: [fn() for _ in range(reps)]), reps, reps * once


def time_in_rounds(runs: list, estimates_ms: list[float], clock: bench.Clock) -> list[list[float]]:
    """Samples (ms) of each of `runs` (what one sample runs; `estimates_ms` its time), timed
    interleaved by the sweep's own rounds (interleave.time_rounds): whole warm-up rounds for
    WARMUP_S, then ROUNDS rounds, each run once per round in a shuffled order, none leaving early."""
    plan = interleave.Plan(span_ms=0.0, max_rounds=ROUNDS, ci_target=0.0, warmup_s=WARMUP_S, min_rounds=ROUNDS)
    return [t.samples_ms for t in interleave.time_rounds(runs, estimates_ms, 0, plan, clock)]


SHARED_CLOCK = {"settle_ms": 0.0, "span_ms": 0.0}  # a row timed in shared rounds: one sample a round, no settling


def own_clock(measure_spec) -> dict | None:
    """How the spec times each choice, where it settles each before its spans (the chains are
    timed so too), else None: settle_ms and span_ms, as its rows record them."""
    if measure_spec.settle_ms <= 0:
        return None
    return {"settle_ms": measure_spec.settle_ms, "span_ms": measure_spec.span_ms}


def time_batch(runs: dict, estimates_ms: dict, chains: set, own: dict | None, clock: bench.Clock) -> dict:
    """Samples (ms) of each of one batch's `runs` by key: the pieces in shared rounds
    (time_in_rounds); the `chains` too, or, where the spec settles each choice (`own`: own_clock's),
    each chain at its own clock: settled, then timed for a span, in every one of CHAIN_ROUNDS
    shuffled rounds."""
    settled = [key for key in runs if own and key in chains]
    shared = [key for key in runs if key not in settled]
    samples = dict(zip(shared, time_in_rounds([runs[k] for k in shared], [estimates_ms[k] for k in shared], clock)))
    if settled:
        plan = interleave.Plan(max_rounds=CHAIN_ROUNDS, ci_target=0.0, min_rounds=CHAIN_ROUNDS, **own)
        timed = interleave.time_rounds([runs[k] for k in settled], [estimates_ms[k] for k in settled], 0, plan, clock)
        samples.update(zip(settled, (t.samples_ms for t in timed)))
    return samples


def run(spec: SweepSpec, output: Path, tp: int) -> int:
    """Every piece of every batch of the spec at TP=tp, on this one GPU; returns rows written."""
    spec = dataclasses.replace(spec, tp=tp)
    with session(spec.measure.timeout_s) as rt:
        if not rt.is_cuda or rt.world_size != 1:
            raise UserError("--pieces: times one rank's compute on one GPU; run it with --nproc 1 on a GPU machine")
        console = printing.console()
        env = environment.run_environment(rt)
        points = [p for p in spec.points(tp, cuda=True) if p.workload == "layer"]
        own = own_clock(spec.measure)
        store = results.ResultStore(output)
        store.open(resume=False, study=spec.name)
        run_id, written = results.new_run_id(), 0
        try:
            for _, group in itertools.groupby(points, key=lambda p: p.workload_key):
                group = list(group)
                first, wanted = group[0], wanted_pieces(group)
                batch = BatchPieces(first, rt)
                steps = {key: _repeated(batch.run(*what)) for key, what in wanted.items()}
                runs = {key: measure.runner(step, batch.x, True) for key, (step, _, _) in steps.items()}
                chains = {key for key, (piece, *_) in wanted.items() if piece == "chain"}
                samples = time_batch({key: run for key, (run, _, _) in runs.items()},
                                     {key: ms for key, (_, _, ms) in steps.items()}, chains, own, bench.CudaClock())
                for key, (piece, rows, _, _) in wanted.items():
                    (_, reps, _), (_, graphs, error) = steps[key], runs[key]
                    per_piece = [t / reps for t in samples[key]]
                    clock = (own or SHARED_CLOCK) if key in chains else SHARED_CLOCK
                    store.append(_row(first, key, piece, rows, per_piece, bench.Timing(per_piece, graphs, error),
                                      run_id, env, reps, clock))
                    written += 1
                console.print(f"{first.tokens} tokens: {len(wanted)} pieces timed"
                              + (f" (its {len(chains)} chains each at its own clock)" if own else ""))
                del batch, steps, runs
                torch.cuda.empty_cache()
        finally:
            store.close()
        console.print(printing.styled((f"wrote {written} piece rows to {output}", "bold"), f" (run {run_id})"))
        return written


def _row(point, key: str, piece: str, rows: int, samples: list[float], timing, run_id: str, env: dict, reps: int,
         clock: dict) -> dict:
    import datetime as dt

    return {
        "schema": results.SCHEMA, "run_id": run_id,
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "spec": point.spec, "key": key, "status": "ok", "error": None, "workload": WORKLOAD,
        "piece": piece, "rows": rows, "model": point.model, "shape": point.shape.as_dict(), "tp": point.tp,
        "dtype": point.dtype, "batch": list(point.batch), "decode": point.decode.as_dict() if point.decode else None,
        "tokens": point.tokens, "seed": point.seed, "world_size": 1, "device": env["device"],
        "versions": env["versions"], "git": env["git"], "multicast_env": env["multicast_env"],
        "graphs": timing.graphs, "graph_error": timing.graph_error, "repetitions": reps, **clock,
        **bench.summarize(samples), "samples_ms": [round(s, 6) for s in samples],
    }
