"""A result row: the point it measures (`Point`, whose `key` is the row's identity in a file, what
`--resume` matches) and how a result becomes one (`make_row`). The sweep and `predict` write their
rows through it; `comm` rows have their own maker beside their cases (comm/run.py). No torch at import."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass

from overlapbench.model import flops, models
from overlapbench.tuning.analysis import LAYER
from overlapbench.tuning.results import SCHEMA

WORKLOADS = (LAYER, "gemm_ag", "gemm_rs")  # a point runs the layer stack, or one GEMM with its all-gather / reduce-scatter


@dataclass(frozen=True)
class Gemm:
    """The GEMM of a micro workload: [M, K] @ [K, N], M being the tokens."""

    n: int
    k: int


@dataclass(frozen=True)
class Decode:
    """A mixed batch's decode tokens: `tokens` sequences, each decoding its next token after
    `context` cached ones."""

    tokens: int
    context: int

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Point:
    """One measurement: a batch through the stack with one strategy and one knob setting."""

    spec: str
    model: str
    shape: models.ModelShape
    tp: int
    dtype: str
    layers: int
    seed: int
    batch: tuple[int, ...]
    strategy: str
    knobs: dict
    workload: str = "layer"
    gemm: Gemm | None = None  # a micro workload's N and K
    decode: Decode | None = None  # a mixed batch's decode tokens (`batch`: its prefill sequences)

    @property
    def tokens(self) -> int:
        return sum(self.batch) + (self.decode.tokens if self.decode else 0)

    @property
    def workload_key(self) -> tuple:
        """Points sharing this key share weights, inputs and the baseline's reference output."""
        return (self.workload, self.gemm, self.shape, self.tp, self.dtype, self.layers, self.seed, self.batch,
                self.decode)

    def key(self) -> str:
        """Identity of the point in a results file (what `--resume` matches on)."""
        return json.dumps(
            {
                "workload": self.workload,
                **({"gemm": {"n": self.gemm.n, "k": self.gemm.k}} if self.gemm else {}),
                "shape": self.shape.as_dict(),
                "tp": self.tp,
                "dtype": self.dtype,
                "layers": self.layers,
                "seed": self.seed,
                "batch": list(self.batch),
                # only mixed batches carry it: a prefill-only point's key does not name decode tokens
                **({"decode": self.decode.as_dict()} if self.decode else {}),
                "strategy": self.strategy,
                "knobs": self.knobs,
            },
            sort_keys=True,
        )


@dataclass(frozen=True)
class MeasureSettings:
    """How a row's point was timed, the settings its row records: the spec's `measure` section has
    these fields (specs/spec_sections.Measure); a prediction times nothing (all zero)."""

    warmup: int = 0
    warmup_s: float = 0.0
    min_time_s: float = 0.0
    iters: int = 0
    span_ms: float | None = None
    settle_ms: float | None = None


def make_row(point: Point, result: dict, run_id: str, env: dict, measure: MeasureSettings) -> dict:
    """A point's row (schema result-v1): what it measures, where (`env`: environment.run_environment),
    how it was timed (`measure`) and the result's fields."""
    row = {
        "schema": SCHEMA,
        "run_id": run_id,
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "spec": point.spec,
        "key": point.key(),
        "status": result["status"],
        "error": result.get("error"),
        "workload": point.workload,
        "gemm": asdict(point.gemm) if point.gemm else None,  # a micro workload's N, K
        "strategy": point.strategy,
        "knobs": point.knobs,
        "model": point.model,
        "shape": point.shape.as_dict(),
        "layers": point.layers,
        "dtype": point.dtype,
        "batch": list(point.batch),  # the prefill sequences
        "decode": point.decode.as_dict() if point.decode else None,  # a mixed batch's decode tokens
        "tokens": point.tokens,  # prefill plus decode tokens
        "tp": point.tp,
        "seed": point.seed,
        "world_size": env["world_size"],
        "device": env["device"],
        "backend": env["backend"],
        "hosts": env["hosts"],
        "nodes": env["nodes"],
        "ranks": env["ranks"],
        "gpus_per_host": env["gpus_per_host"],
        "versions": env["versions"],
        "git": env["git"],
        "multicast_env": env["multicast_env"],
        "warmup": measure.warmup,
        "warmup_s": measure.warmup_s,
        "min_time_s": measure.min_time_s,
        "iters": result.get("iters") or (len(result["samples_ms"]) if result.get("samples_ms") else measure.iters),
        "span_ms": measure.span_ms if result.get("timing") == "interleaved" else None,
        "settle_ms": measure.settle_ms if result.get("timing") == "interleaved" else None,
    }
    # checked: the output equals baseline's within tolerance (baseline itself: the reference);
    # check: what rel_err is measured against, "baseline" or "fp32" (measure.check; the truth);
    # False for bounds that are not correct results (no_comm, comm=none): never a tuned choice.
    # Interleaved timing (results.py): samples_ms per round, round_ids, pairing, speedup, speedup_ci;
    # both timings: rank_ms (each rank's median).
    # attention: the attention kernels the forward ran ("cudnn", "cudnn+lse_merge", "sdpa", "math", ...),
    # so a slow strategy can be told from a slow kernel without a profile; None without attention.
    # profile_error: why --profile's profile of an ok point failed (run/sweep.py _profile); None otherwise.
    for key in ("ms", "p10_ms", "p90_ms", "iqr_ms", "cv", "graphs", "graph_error", "rel_err", "tolerance", "check", "checked",
                "attention", "timing", "speedup", "speedup_ci", "pairing", "round_ids", "samples_ms", "rank_ms", "profile_error"):
        row[key] = result.get(key)
    if point.workload == LAYER:  # flops, tflops, peak_frac and the device's peak (overlapbench/model/flops.py)
        row |= flops.row_fields(point.shape, point.tp, point.batch, point.decode, row["ms"], env.get("peak"))
    return row
