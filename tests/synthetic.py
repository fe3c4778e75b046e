"""Synthetic result rows for the tune/tuned/report tests.

Rows go through the real `rows.make_row` with a real `rows.Point`, so these fixtures follow the
row schema as it changes. Timings are fresh random samples (never zeros) from a seeded RNG:
random enough to exercise the statistics, reproducible enough never to flake.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import random
from pathlib import Path

from overlapbench.model.models import PRESETS
from overlapbench.specs.spec import SweepSpec
from overlapbench.timing import bench
from overlapbench.tuning.rows import Decode, Gemm, Point, make_row

DEVICE = "NVIDIA H200"
DEFAULT_KNOBS = {"baseline": {"nccl_max_ctas": "default"}, "sp_baseline": {"nccl_max_ctas": "default"}}
SPEC = SweepSpec(
    name="synthetic", model="llama3-8b", shape=PRESETS["llama3-8b"], tp=2, dtype="bf16", layers=4,
    seed=0, batches=((1024,),), strategies=(),
)


def env(device: str = DEVICE, world_size: int = 2) -> dict:
    """What `environment.run_environment` reports, for a machine that does not exist. Facts the
    tests do not care about read as None, so a new environment field does not break them."""
    facts = {
        "world_size": world_size, "device": device, "backend": "nccl" if device != "cpu" else "gloo",
        "hosts": ["node0"], "nodes": 1, "gpus_per_host": world_size,
        "versions": {"python": "3.11", "torch": "2.11.0"}, "git": "0123abc", "multicast_env": {},
    }
    return collections.defaultdict(lambda: None, facts)


def draw(median: float, spread: float, rng: random.Random, n: int = 40) -> list[float]:
    """n per-iteration times around `median` with relative std `spread` (positive, never zero)."""
    return [max(median * (1 + rng.gauss(0, spread)), median * 0.5) for _ in range(n)]


def point(strategy: str, tokens: int, knobs: dict | None = None, *, model: str = "llama3-8b",
          tp: int = 2, dtype: str = "bf16", batch: tuple[int, ...] | None = None,
          gemm: tuple[str, int, int] | None = None, decode: tuple[int, int] | None = None, layers: int = 4) -> Point:
    """A layer point, or with `gemm=(workload, n, k)` a micro workload's (one GEMM: one "layer");
    `decode=(tokens, context)`: a mixed batch (its prefill by default one sequence of the rest);
    `layers`: the stack's depth."""
    knobs = DEFAULT_KNOBS.get(strategy, {}) if knobs is None else knobs
    mixed = Decode(*decode) if decode else None
    batch = batch if batch is not None else (tokens - (mixed.tokens if mixed else 0),)
    layer = Point("synthetic", model, PRESETS[model], tp, dtype, layers, 0, batch, strategy, knobs, decode=mixed)
    if gemm is None:
        return layer
    workload, n, k = gemm
    return dataclasses.replace(layer, layers=1, workload=workload, gemm=Gemm(n, k))


def row(strategy: str, tokens: int, knobs: dict | None = None, *, samples: list[float] | None = None,
        median: float = 1.0, spread: float = 0.01, rng: random.Random | None = None,
        keep_samples: bool = True, status: str = "ok", error: str | None = None,
        device: str = DEVICE, run_id: str = "run1", pairing: str | None = None,
        rank_ms: list[float] | None = None, **where) -> dict:
    """One row as the sweep writes it; `where` goes to `point` (model, tp, dtype, batch, gemm, decode, layers).
    With `pairing`, timed interleaved: `samples` are per round, rounds 0, 1, ... of that pairing;
    `rank_ms`: each rank's median, as timed rows carry it."""
    p = point(strategy, tokens, knobs, **where)
    if samples is None:
        samples = draw(median, spread, rng or random.Random(f"{strategy}-{tokens}-{median}"))
    result = bench.summarize(samples) | {
        "status": status, "error": error if status == "ok" else (error or "synthetic failure"),
        "samples_ms": samples if keep_samples else None, "graphs": True, "graph_error": None,
        "checked": strategy != "no_comm",
        "rel_err": None if strategy in ("baseline", "sp_baseline", "no_comm") else 1e-3, "tolerance": 1e-2,
    }
    if pairing is not None:
        result |= {"timing": "interleaved", "pairing": pairing, "round_ids": list(range(len(samples)))}
    if rank_ms is not None:
        result["rank_ms"] = rank_ms
    if status == "skipped":
        result = {"status": "skipped", "error": error or f"{strategy} needs CUDA GPUs"}
    return make_row(p, result, run_id, env(device, p.tp), SPEC.measure)


def failed(strategy: str, tokens: int, knobs: dict | None = None, **where) -> dict:
    """A failed row as the sweep writes it: an error and no timing."""
    p = point(strategy, tokens, knobs, **where)
    return make_row(p, {"status": "failed", "error": "OutOfMemoryError: synthetic"}, "run1", env(DEVICE, p.tp), SPEC.measure)


def write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def append(path: Path, rows: list[dict]) -> Path:
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    return path
