"""What a sweep will ask of the machine, estimated before anything is launched: the memory one
process needs (the layer stack's weights as they are built, the largest batch's activations) and
the arithmetic it does, from the model's shape, layers, tokens and dtype. No torch.

A lower bound rather than a forecast: it counts the big tensors (weights, the activations of one
batch, CPU attention's float32 scores) and the FLOPs of the forwards every point runs at the
least, not allocator slack or extra timed iterations. So when it exceeds what the machine has,
the run would not fit; that is what `sweep` refuses on a CPU (where running out of memory kills a
process) and warns of on GPUs (where it fails the batch's rows).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from overlapbench.comm.sizes import DTYPE_BYTES
from overlapbench.errors import UserError
from overlapbench.model.flops import layer_flops
from overlapbench.printing import gib
from overlapbench.specs.spec import SweepSpec
from overlapbench.tuning.rows import Point

FP32 = 4
ATTENTION_SCORE_BYTES = 12  # CPU attention's float32 scores, their masked copy and exp, per (query, key, head)
CPU_TFLOP = 10.0  # per process: more than a CPU process runs in minutes; a spec without a cpu: section above it is GPU-sized


@dataclass(frozen=True)
class Footprint:
    """One process's share of a sweep."""

    points: int
    weights_bytes: int  # the layer stack's shard at its peak (built in fp32, then cast)
    activation_bytes: int  # the largest batch: hidden states, the MLP's width, CPU attention's scores
    tflop: float  # the forwards every point runs at the least (warmup, iters, the check)

    @property
    def memory_bytes(self) -> int:
        return self.weights_bytes + self.activation_bytes

    def describe(self) -> str:
        """`138 points; per process about 197.2 GiB (1.6 GiB of weights, 195.6 GiB of activations) and 45,846 TFLOP`."""
        tflop = f"{self.tflop:,.0f}" if self.tflop >= 100 else f"{self.tflop:.2g}"
        return (f"{self.points} points; per process about {gib(self.memory_bytes)} ({gib(self.weights_bytes)} of "
                f"weights, {gib(self.activation_bytes)} of activations) and {tflop} TFLOP")


def estimate(spec: SweepSpec, points: list[Point], cuda: bool) -> Footprint:
    """The footprint of `points` (spec.points) on one process; each point at its own depth (a spec
    may list several), the weights those of the deepest stack (one is built at a time)."""
    if not points:
        return Footprint(0, 0, 0, 0.0)
    first = points[0]
    elem = DTYPE_BYTES[first.dtype]
    forwards = spec.measure.warmup + spec.measure.iters + 2  # the timed ones, the reference's and the check's
    if first.workload != "layer":  # one GEMM with its all-gather or reduce-scatter
        n, k, tp = first.gemm.n, first.gemm.k, first.tp
        weights = n * k // tp * elem
        activations = max(p.tokens for p in points) * (k + n) * elem * 2
        flops = sum(2 * p.tokens * n * k / tp for p in points) * forwards
        return Footprint(len(points), weights, activations, flops / 1e12)
    deepest = max(p.layers for p in points)  # one stack at a time: the deepest's
    truth = spec.measure.checks_against_fp32(first.tp, first.shape.moe, first.dtype, deepest)
    params = _params_per_rank(first) * deepest
    weights = params * FP32 + (params * elem if truth else 0)  # built in fp32; the truth's fp32 copy beside the stack
    activations = max(_activations(p, elem, cuda) for p in points)
    flops = sum(layer_flops(p.shape, p.tp, p.batch, None if p.decode is None else (p.decode.tokens, p.decode.context))
                * p.layers for p in points) * forwards
    return Footprint(len(points), weights, activations, flops / 1e12)


def _params_per_rank(point: Point) -> int:
    s, tp = point.shape, point.tp
    q, kv, width = s.heads // tp * s.head_dim, s.kv_heads // tp * s.head_dim, s.mlp_width // tp
    attention = (q + 2 * kv) * s.hidden + s.hidden * q
    mlp = 3 * s.hidden * width
    return attention + (s.experts * mlp + s.experts * s.hidden if s.moe else mlp)


def _activations(point: Point, elem: int, cuda: bool) -> int:
    """A batch's big tensors on one rank: per token the hidden states a layer keeps (input,
    residual, output, the reference's), its QKV, the MLP's gate|up and activation (each routed
    copy of a token on MoE layers); a decode batch's KV cache; on CPU, attention's float32 scores
    of the longest sequence (one sequence at a time)."""
    s, tp = point.shape, point.tp
    q, kv, width = s.heads // tp * s.head_dim, s.kv_heads // tp * s.head_dim, s.mlp_width // tp
    routed = max(1, s.top_k)
    per_token = 8 * s.hidden + q + 2 * kv + q + routed * 3 * width
    total = point.tokens * per_token * elem
    if point.decode is not None:
        total += point.layers * 2 * point.decode.tokens * (point.decode.context + 1) * kv * elem
    if not cuda:
        longest = max(point.batch, default=0)
        total += (s.heads // tp) * longest * longest * ATTENTION_SCORE_BYTES
    return total


def host_memory_bytes() -> int | None:
    """Memory this machine can still give (MemAvailable, within this cgroup's limit); None if unknown."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    limit = _cgroup_room()
    return available if limit is None else min(available, limit)


def _cgroup_room() -> int | None:
    """This cgroup's memory limit less what it uses (v2, then v1); None without a limit."""
    v1 = "/sys/fs/cgroup/memory/memory."
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   (v1 + "limit_in_bytes", v1 + "usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if not limit.isdigit() or int(limit) >= 1 << 60:  # "max", or v1's "no limit"
            return None
        return max(0, int(limit) - usage)
    return None


def check(spec: SweepSpec, footprint: Footprint, nproc: int, cuda: bool, gpu_bytes: int | None) -> str | None:
    """Refuse (UserError) a run that clearly does not fit this CPU machine: more memory than it has
    (a process out of memory is killed, the run with it), or a GPU-sized study (no `cpu:` section,
    more arithmetic than minutes of a CPU). On GPUs, a warning when one GPU's share exceeds its
    memory (the batches that do not fit fail with the reason). Else None."""
    if cuda:
        if gpu_bytes and footprint.memory_bytes > gpu_bytes:
            return (f"{spec.name} needs about {gib(footprint.memory_bytes)} per GPU ({footprint.describe()}), "
                    f"more than the {gib(gpu_bytes)} a GPU here has; the batches that do not fit fail with the reason")
        return None
    have = host_memory_bytes()
    need = footprint.memory_bytes * nproc
    if have is not None and need > have:
        raise UserError(
            f"needs about {gib(need)} of host memory for {nproc} processes, and this machine has {gib(have)} "
            f"available ({footprint.describe()}); make it smaller (model, layers, tokens: a cpu: section "
            f"as in sweeps/quick.yaml) or pass --force to run it anyway")
    if not spec.for_device and footprint.tflop > CPU_TFLOP:
        raise UserError(
            f"sized for GPUs, and this machine has none ({footprint.describe()}: hours on CPU processes); add a cpu: "
            f"section with a smaller model, layers and tokens (as sweeps/quick.yaml has), or pass --force to run it as it is")
    return None
