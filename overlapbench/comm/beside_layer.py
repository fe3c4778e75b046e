"""`comm --beside-layer MODEL`: each all-reduce timed beside the layer's own kernels.

A stream of persistent GEMMs (`--beside-gemm`) holds a transfer's SMs far longer than a layer
does, so what it measures (the transfer 2-12x slower, the GEMMs' loss) is not what a token split
pays. Here the compute is one rank's shard of the model's decoder layer at TP=k: its attention
block (QKV GEMM, RoPE, causal attention, O-projection) then its MLP (gate/up GEMM, SwiGLU, down
GEMM), on as many rows as the all-reduce carries, replayed from a CUDA graph (eager where capture
fails; the row says which). Each case gives five numbers (comm.contention's windows, and two
more):

- the compute's loss: 1 - one pass's time alone / beside the path, paired in the same rounds
  (`compute_loss_paired`: comm/paired_loss.py), and against the pass timed alone by its own
  harness (`compute_loss`, what rows made before hold);
- the compute's extra beside one call of the path, issued just before the pass as a split issues
  a reduction: the pass beside one call - the pass alone, in the same rounds
  (`compute_one_call_extra_ms`, ms: comm/paired_loss.py);
- the transfer's stretch: its time beside the compute / alone (`beside_ms` / `ms`);
- the blocking all-reduce's extra cost inside the layer: attention, the all-reduce, the MLP, the
  all-reduce, in line on one stream (as the baseline runs them), against the same pass without
  the all-reduces and the two all-reduces alone, the three captured alike and timed in the same
  interleaved rounds (`in_layer_extra_ms`, per all-reduce: comm/in_layer.py);
- the pair's extra, per block: one call of the path and the attention block (or the MLP block)
  released at once from one CUDA graph when the same block ends, as a split releases a reduction
  and the next chunk's block, less the same pair with the residual add + RMSNorm in the call's
  place, in interleaved rounds (`pair_attention_extra_ms`, `pair_mlp_extra_ms`: comm/pair.py).

`predict` charges the loss and the stretch (under `--transfer-beside one-call`, the extra beside
one call; under `pair`, the pair's extra) to a split's transfers beside compute and the in-layer
term to every blocking transfer of a serial plan (predict/contention.py, predict/estimate.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from overlapbench.comm.cases import BesideLayer, Case
from overlapbench.comm.contention import compute_loss, time_alone
from overlapbench.comm.in_layer import INLINE, OPS, PASS, SPAN_MS, InLayer, time_paired
from overlapbench.comm.pair import GRAPHS, PAIR_ATTENTION, PAIR_MLP, PAIR_TIMELINES, Pairs, time_pairs
from overlapbench.comm.paired_loss import LAYER
from overlapbench.model.chunks import rope_positions, token_range
from overlapbench.model.layer import attention_partial, mlp_partial
from overlapbench.model.models import preset
from overlapbench.model.norms import add_rms_norm, rms_norm
from overlapbench.model.rope import RopeTable
from overlapbench.model.weights import build_stack, random_input

if TYPE_CHECKING:
    from overlapbench.distributed.runtime import Runtime

SEED = 1


class LayerStream:
    """One rank's shard of the layer on `tokens` rows (one causal sequence), with random
    operands (never zeros): a compute stream of comm.contention (run, alone_ms, fields, prefix)."""

    prefix = LAYER  # of its paired loss's fields (comm/paired_loss.py)

    def __init__(self, shape, tp: int, rank: int, tokens: int, dtype: torch.dtype, device, stack=None) -> None:
        self.tokens = tokens
        self.stack = stack if stack is not None else build_stack(shape, 1, tp, rank, dtype, device, SEED)
        batch = (tokens,)
        self.chunk = token_range(batch, 0, tokens, device)
        self.rope = RopeTable(shape, rope_positions(batch, None), device)
        x = random_input(tokens, shape.hidden, SEED, dtype, device)
        self.normed = rms_norm(x, self.stack.layers[0].attn_norm, shape.eps)
        self.out = torch.empty_like(x)
        self.alone_ms = 0.0
        self.graphs = False  # whether a pass replays a CUDA graph (prepare)
        self.graph_error: str | None = None
        self._pass = self.once

    def attention(self) -> None:
        attention_partial(self.stack, 0, self.normed, self.chunk, self.rope, None, self.out)

    def mlp(self) -> None:
        mlp_partial(self.stack, 0, self.normed, self.out)

    def once(self) -> None:
        self.attention()
        self.mlp()

    def run(self, passes: int = 1) -> None:
        for _ in range(passes):
            self._pass()

    def prepare(self, rt: Runtime, iters: int) -> None:
        """Capture a pass (every rank, or none: measure.runner agrees) and time it alone; once.
        Collective: every rank calls it for the same case."""
        from overlapbench.timing import measure
        from overlapbench.timing.step import Step

        if self.alone_ms:
            return
        self._pass, self.graphs, self.graph_error = measure.runner(Step(lambda _x: self.once()), self.normed, True)
        self.alone_ms = time_alone(rt, self, iters)

    def fields(self, beside_ms: float) -> dict:
        """The row fields of one pass that took `beside_ms` beside the path."""
        return {"compute_ms_alone": self.alone_ms, "compute_ms_beside": beside_ms,
                "compute_loss": compute_loss(self.alone_ms, beside_ms), "compute_graphs": self.graphs}

    def in_line(self, run) -> None:
        """One pass with the all-reduce `run` after its attention and after its MLP, in line on
        this stream, as the baseline runs them."""
        self.attention()
        run()
        self.mlp()
        run()

    def in_layer(self, rt: Runtime, run, iters: int, span_ms: float = SPAN_MS, settle_ms: float = 0.0) -> InLayer:
        """The in-line pass, the pass alone (its graph from `prepare`) and the two all-reduces
        alone, captured alike (all three graphs, or all three eager where one fails to capture) and
        timed in the same interleaved rounds, each replayed as often per round (comm/in_layer.py).
        Collective: every rank calls it for the same case, after `prepare`."""
        from overlapbench.timing import bench, interleave, measure
        from overlapbench.timing.step import Step

        def ops() -> None:
            run()
            run()

        eager = {INLINE: lambda: self.in_line(run), PASS: self.once, OPS: ops}
        graphs, error = self.graphs, self.graph_error
        captured = {PASS: self._pass}
        for which in (INLINE, OPS):
            fn = eager[which]
            captured[which], used, why = measure.runner(Step(lambda _x, fn=fn: fn()), self.normed, graphs)
            graphs, error = graphs and used, error or why
        runs = [captured[i] if graphs else eager[i] for i in (INLINE, PASS, OPS)]
        clock = bench.CudaClock()
        per_replay, own = replay_times(rt, runs, (INLINE,), settle_ms, clock)
        return time_paired(runs, per_replay, iters, clock, interleave.ranks_gather(rt), interleave.ranks_barrier(rt),
                           graphs, error, span_ms, settle_ms, own)

    def pairs(self, rt: Runtime, run, iters: int, span_ms: float = SPAN_MS, settle_ms: float = 0.0) -> Pairs:
        """The pair window (comm/pair.py), per block: the block, then one call of `run` forked onto
        a high-priority side stream (as a split's communication lane) and the block again on this
        stream, released together when the first block ends, then joined; the same with the
        residual add + RMSNorm of the call's rows in the call's place (what the split's chain, the
        stack with its reducers local, runs there); and the call alone, forked and joined. The five
        are captured alike (all five graphs, or all five eager where one fails to capture) and timed
        in the same interleaved rounds. With OVERLAPBENCH_PAIR_TIMELINES=DIR in the environment (a
        diagnostic: which kernel takes the SMs first), each rank also writes the five graphs'
        timelines, four replays each, as DIR/<graph>-<rows>[.rank<k>].replay.timeline.json (timing/timeline.py).
        Collective: every rank calls it for the same case, after `prepare`."""
        from overlapbench.timing import bench, interleave, measure, timeline
        from overlapbench.timing.step import Step

        timelines = os.environ.get(PAIR_TIMELINES)
        if timelines:
            timeline.prepare_for_graphs()
        side = torch.cuda.Stream(priority=-100)
        hidden, dtype, device = self.normed.shape[1], self.normed.dtype, self.normed.device
        partial, residual = (random_input(self.tokens, hidden, SEED + k, dtype, device) for k in (1, 2))
        normed, weight, eps = torch.empty_like(partial), self.stack.layers[0].mlp_norm, self.stack.shape.eps

        def local_norm() -> None:  # the chain's reduction of the call's rows: residual add + RMSNorm, no transfer
            add_rms_norm(partial, residual, weight, eps, out=normed)

        def forked(call: Callable[[], None], beside: Callable[[], None]) -> None:
            """`call` on the side stream and `beside` on this one, released and joined together."""
            main = torch.cuda.current_stream()
            side.wait_stream(main)
            with torch.cuda.stream(side):
                call()
            beside()
            main.wait_stream(side)

        def released(block: Callable[[], None], call: Callable[[], None]) -> Callable[[], None]:
            def pair() -> None:
                block()  # the chunk whose partial the call reduces: its end releases both, as in a split
                forked(call, block)
            return pair

        eager = [released(self.attention, run), released(self.attention, local_norm), released(self.mlp, run),
                 released(self.mlp, local_norm), lambda: forked(run, lambda: None)]
        graphs, error, captured = self.graphs, self.graph_error, []
        for fn in eager:
            replay, used, why = measure.runner(Step(lambda _x, fn=fn: fn()), self.normed, graphs)
            captured.append(replay)
            graphs, error = graphs and used, error or why
        runs = captured if graphs else eager
        clock = bench.CudaClock()
        per_replay, own = replay_times(rt, runs, (PAIR_ATTENTION, PAIR_MLP), settle_ms, clock)
        found = time_pairs(runs, per_replay, iters, clock, interleave.ranks_gather(rt), interleave.ranks_barrier(rt),
                           graphs, error, span_ms, settle_ms, own)
        if timelines:
            for name, fn in zip(GRAPHS, runs):
                recorded = timeline.record(lambda fn=fn: [fn() for _ in range(4)], True, rt.rank, rt.world_size, rt.in_step)
                timeline.write(recorded, Path(timelines) / timeline.file_name(f"{name}-{self.tokens}", True, rt.rank))
        return found


def replay_times(rt: Runtime, runs: list[Callable[[], object]], spans_by: tuple[int, ...], settle_ms: float,
                 clock) -> tuple[float, list[float] | None]:
    """What the windows' rounds count in, each graph warmed up with two replays and the max over
    the ranks taken: the replay time every graph's span is counted in (the longest of the graphs
    `spans_by` names), and, where they settle, each graph's own replay time, which its settling is
    counted in (None without settling: only `spans_by`'s graphs are warmed up). Collective."""
    from overlapbench.timing import bench, interleave

    warmed = range(len(runs)) if settle_ms > 0 else spans_by
    own = dict(zip(warmed, interleave.ranks_max(rt)([bench.warm_up(runs[i], 2, 0.0, clock) for i in warmed])))
    return max(own[i] for i in spans_by), ([own[i] for i in range(len(runs))] if settle_ms > 0 else None)


@dataclass
class BesideStreams:
    """The compute a run's cases are timed beside: the GEMM stream of --beside-gemm (made up
    front), and the layer's shard per row count of --beside-layer (made as cases ask, sharing
    one stack of weights)."""

    gemms: object = None  # comm.contention.GemmStream
    layers: dict[int, LayerStream] = field(default_factory=dict)
    stack: object = None

    def layer_for(self, rt: Runtime, case: Case) -> LayerStream:
        """The layer stream beside `case`, built here (no collectives: a rank that fails to
        build it fails the case for everyone through rt.first_failure)."""
        layer: BesideLayer = case.beside_layer
        rows = layer.rows(case.nbytes, case.dtype)
        if rows not in self.layers:
            shape = preset(layer.model)
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case.dtype]
            stream = LayerStream(shape, layer.tp, rt.rank % layer.tp, rows, dtype, rt.device, self.stack)
            self.stack = stream.stack
            self.layers[rows] = stream
        return self.layers[rows]


def layer_fields(rt: Runtime, case: Case, run, op_ms: float, stream: LayerStream, iters: int) -> dict:
    """The contention fields of a --beside-layer case: the path beside the layer's pass, the pass
    beside the path (and alone and beside one call, in the same rounds), and the all-reduce in line with the pass
    (comm/in_layer.py's fields)."""
    from overlapbench.comm.contention import measure_beside

    layer: BesideLayer = case.beside_layer
    windows = dict(span_ms=layer.span_ms, settle_ms=layer.settle_ms)
    stream.prepare(rt, max(5, iters))
    beside_ms, compute_ms, paired = measure_beside(rt, run, op_ms, stream, iters)
    return {"beside_ms": beside_ms, **stream.fields(compute_ms), **paired.fields(stream.prefix),
            **stream.in_layer(rt, run, iters, **windows).fields(), **stream.pairs(rt, run, iters, **windows).fields(),
            "beside_layer": {"model": layer.model, "tp": layer.tp, "tokens": stream.tokens, **windows}}
