"""What every strategy at one batch shares: the weights, the context (RoPE table, a mixed batch's
KV cache), the input, and the reference strategy's output they are all checked against.

Whatever of it cannot be built (too large for the device, or for any memory) fails the batch's
own points, on every rank alike, with the part that failed named in one line; the sweep goes on.
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass

import torch
import torch.distributed as dist

from overlapbench import strategies
from overlapbench.distributed import runtime
from overlapbench.model import attention_kernels
from overlapbench.model.chunks import build_decode_cache, rope_positions
from overlapbench.model.rope import RopeTable
from overlapbench.model.weights import Stack, build_stack, cast, random_input
from overlapbench.timing import measure
from overlapbench.timing.phases import PointFailed
from overlapbench.timing.phases import phase as _phase
from overlapbench.timing.step import BuildContext
from overlapbench.tuning import analysis
from overlapbench.tuning.rows import Point

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Workload:
    """What all strategies at one batch share: weights and context, input, and the reference
    strategy's output; `reference_error` (and no reference) where it could not be built."""

    ctx: BuildContext
    x: torch.Tensor | None
    reference: torch.Tensor | None
    reference_error: str | None
    truth: torch.Tensor | None = None  # measure.check fp32: the reference's arithmetic in fp32
    floor: float | None = None  # ... and the reference's own distance from it

    def local_check(self, out: torch.Tensor, tolerance: float) -> tuple[float, float]:
        """(rel_err on this rank, tolerance): against the truth, within the larger of the tolerance
        and twice the reference's own error, where there is a truth; else against the reference's
        output. No collective: a failure here (out of memory) is one rank's, for phase() to share."""
        if self.truth is None:
            return measure.rel_err(out, self.reference), tolerance
        return measure.rel_err(out, self.truth), max(tolerance, FLOOR_FACTOR * self.floor)


FLOOR_FACTOR = 2.0  # an output may be this many times further from the fp32 truth than the reference's


def reference_setting(workload: str) -> tuple[str, dict]:
    """The strategy and knobs whose output every other strategy is checked against."""
    name = analysis.REFERENCES[workload]
    return name, strategies.get(name).check_knobs({}, name)


def reference_output(ctx, x: torch.Tensor, workload: str) -> torch.Tensor:
    """The reference strategy's output on `x`: what every other strategy must reproduce."""
    name, knobs = reference_setting(workload)
    step = strategies.get(name).build(ctx, knobs)
    return step.to_full(step.forward(x)).clone()


def build_workload(rt: runtime.Runtime, point: Point, stacks: dict, max_tokens: int, fp32_truth: bool = False) -> Workload:
    """The batch's weights, context, input and reference output (with `fp32_truth`, also the truth
    the points are checked against). Whatever of it cannot be built (too large for the device, or
    for any memory) fails the batch's own points, on every rank alike, with the part that failed
    named, and the sweep goes on."""
    try:
        stack = weights(rt, point, stacks) if point.workload == analysis.LAYER else None
        ctx, x = _inputs(rt, point, stack, max_tokens)
        if point.workload == analysis.LAYER:
            dist.broadcast(x, src=0)  # identical input on every rank, whatever the RNG does per device
        name = f"{analysis.REFERENCES[point.workload]} reference"
        reference = _built(rt, name, lambda: reference_output(ctx, x, point.workload))
        if not (fp32_truth and point.workload == analysis.LAYER):
            return Workload(ctx, x, reference, None)
        truth = _built(rt, "the fp32 truth", lambda: _truth(ctx, x, point))
        return Workload(ctx, x, reference, None, truth, rt.max_over_ranks(measure.rel_err(reference, truth)))
    except PointFailed as failure:
        return Workload(None, None, None, failure.result["error"])


def weights(rt: runtime.Runtime, point: Point, stacks: dict) -> Stack:
    """This rank's shard of the point's layer stack, kept in `stacks` (one at a time: the batches of
    one shape follow each other) so the batches of a shape share it; a spec of several depths
    alternates them within each batch (spec.points), so there each (batch, depth) builds its own,
    one stack in memory at a time. A stack that cannot be built
    is remembered as its failure, so the shape's later batches fail at once with the same reason."""
    key = (point.shape, point.tp, point.dtype, point.layers, point.seed)
    if key not in stacks:
        stacks.clear()
        gc.collect()
        try:
            stacks[key] = _built(rt, "the weights", lambda: build_stack(
                point.shape, point.layers, point.tp, rt.rank, TORCH_DTYPES[point.dtype], rt.device, point.seed))
        except PointFailed as failure:
            stacks[key] = failure
    if isinstance(stacks[key], PointFailed):
        raise stacks[key]
    return stacks[key]


def _built(rt: runtime.Runtime, what: str, build):
    """`build()` as a phase of every rank (phases.phase); its failure names what could not be built."""
    try:
        return _phase(rt, build)
    except PointFailed as failure:
        raise PointFailed(failure.result | {"error": f"{what}: {failure.result['error']}"}) from None


def _truth(ctx: BuildContext, x: torch.Tensor, point: Point) -> torch.Tensor:
    """The reference strategy's output in fp32, on the stack's own (rounded) weights and input."""
    attention_kernels.select(x.device, torch.float32, ctx.stack.heads, ctx.stack.kv_heads, point.shape.head_dim)
    cache = None if ctx.decode is None else ctx.decode.to(torch.float32)  # a mixed batch's KV cache too
    exact = dataclasses.replace(ctx, stack=cast(ctx.stack, torch.float32), decode=cache)
    return reference_output(exact, x.float(), point.workload)


def _inputs(rt: runtime.Runtime, point: Point, stack: Stack | None, max_tokens: int):
    """A layer batch: its context (KV cache and RoPE table included) and a random input; a micro
    workload: one GEMM with its all-gather or reduce-scatter (micro.py)."""
    dtype = TORCH_DTYPES[point.dtype]
    if point.workload != analysis.LAYER:
        from overlapbench.run import micro

        return _built(rt, "the micro workload", lambda: micro.build(rt, point, dtype, max_tokens))
    cache = None
    if point.decode is not None:  # the decode tokens' KV cache: this rank's kv heads, every layer
        cache = _built(rt, "the decode tokens' KV cache", lambda: build_decode_cache(
            point.shape, point.layers, point.tp, rt.rank, point.decode.tokens, point.decode.context, dtype, rt.device,
            point.seed))
    rope = _built(rt, "the RoPE table", lambda: RopeTable(point.shape, rope_positions(point.batch, cache), rt.device))
    ctx = BuildContext(rt, stack, point.batch, rope, max_tokens, cache)
    # The attention kernel is picked (and checked) now, never while a CUDA graph is captured.
    _built(rt, "the attention kernel", lambda: attention_kernels.select(
        rt.device, dtype, stack.heads, stack.kv_heads, point.shape.head_dim))
    x = _built(rt, "the input", lambda: random_input(point.tokens, point.shape.hidden, point.seed, dtype, rt.device))
    return ctx, x
