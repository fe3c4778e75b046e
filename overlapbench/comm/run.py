"""Measuring cases on every rank: check, time, agree, and one store row each."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from overlapbench.comm.buffers import Buffers
from overlapbench.comm.cases import Case
from overlapbench.comm.in_layer import FIELDS as IN_LAYER_FIELDS
from overlapbench.comm.output import summary_line
from overlapbench.comm.pair import FIELDS as PAIR_FIELDS
from overlapbench.comm.paired_loss import GEMM, LAYER, one_call_fields, paired_fields
from overlapbench.comm.paths import PATHS_BY_NAME, Bench, build
from overlapbench.comm.sizes import algbw, busbw, ops_per_sample
from overlapbench.errors import one_line

if TYPE_CHECKING:
    from rich.console import Console

    from overlapbench.distributed.runtime import Runtime
    from overlapbench.tuning.results import ResultStore


def check(bench: Bench, seed: int, rt: Runtime) -> int:
    """#wrong: fresh inputs, one run, the elements differing from the exact result, summed
    over ranks."""
    bench.fill(seed)
    bench.run()
    return _sum_over_ranks(bench.wrong(seed), rt)


def _sum_over_ranks(value: int, rt: Runtime) -> int:
    import torch
    import torch.distributed as dist

    total = torch.tensor([value], dtype=torch.int64, device=rt.device)
    dist.all_reduce(total)
    return int(total.item())


@dataclass(frozen=True)
class RunInfo:
    """What every row of a run shares."""

    spec: str  # "comm" for the command, the study's name inside a sweep
    run_id: str
    env: dict  # environment.run_environment
    warmup: int
    iters: int
    graphs: bool


def measure_case(rt: Runtime, case: Case, buffers: Buffers, info: RunInfo, streams=None) -> dict:
    """Check, then time one case on every rank (and beside the compute of `streams`, a
    beside_layer.BesideStreams, if the case asks); the result fields of its row."""
    from overlapbench.timing import measure
    from overlapbench.timing.step import Step

    if case.skip:
        return {"status": "skipped", "error": case.skip}
    log = rt.tuning_log if PATHS_BY_NAME[case.path].nccl else None
    mark = log.mark() if log is not None else 0
    bench, layer, failure = None, None, None
    try:
        bench = build(rt, case, buffers)
        if case.beside_layer is not None and streams is not None:
            layer = streams.layer_for(rt, case)
    except Exception as e:
        failure = {"status": "failed", "error": one_line(e)}
    failure = rt.first_failure(failure)  # every rank learns it: none walks alone into a collective
    if failure:
        return failure
    try:
        wrong = check(bench, case.seed, rt)
        if wrong:
            return {"status": "failed", "wrong": wrong, "error": f"#wrong {wrong}: result differs from the exact expected one"}
        reps = ops_per_sample(case.nbytes, rt.is_cuda)
        step = Step(lambda _x: _repeat(bench.run, reps))
        timing = measure.time_step(step, bench.out(), info.warmup, info.iters, info.graphs)
        stats = timing.summary(per=reps)
        beside = _beside(rt, case, bench, stats["ms"], streams, layer, info)
    except Exception as e:
        return {"status": "failed", "error": one_line(e)}
    ran = _nccl_kernel(rt, case, log, mark)
    if ran.get("error"):
        return ran
    seconds = stats["ms"] / 1e3
    return ran | beside | stats | {
        "status": "ok",
        "error": None,
        "wrong": 0,
        "algbw": algbw(case.nbytes, seconds),
        "busbw": busbw(case.op, case.nbytes, seconds, rt.world_size),
        "ops_per_sample": reps,
        "samples_ms": [round(s / reps, 6) for s in timing.samples_ms],
        "graphs": timing.graphs,
        "graph_error": timing.graph_error,
    }


def _nccl_kernel(rt: Runtime, case: Case, log, mark: int) -> dict:
    """What NCCL's tuning log says the case's collectives ran on (rank 0 of a communicator logs
    them; other ranks and runs without the log record nothing). A case on registered windows
    that ran anything but a symmetric kernel fails: its row would claim what did not run."""
    from overlapbench.distributed.nccl_log import matching, summarize

    if log is None:
        return {}
    launches = matching(log.since(mark), case.op, case.nbytes, rt.world_size)
    fields = summarize(launches)
    classic = next((x for x in launches if not x.symmetric), None)
    if case.window and classic is not None:
        error = (f"NCCL ran {classic.kernel} on {classic.channels} channels, not a symmetric kernel: "
                 f"the buffers are not symmetric windows of this communicator")
        return fields | {"status": "failed", "error": error}
    return fields


def _beside(rt: Runtime, case: Case, bench: Bench, op_ms: float, streams, layer, info: RunInfo) -> dict:
    """The contention fields of a --beside-gemm or --beside-layer case (none otherwise)."""
    from overlapbench.comm.beside_layer import layer_fields
    from overlapbench.comm.contention import measure_beside

    if case.beside_gemm and streams is not None and streams.gemms is not None:
        beside_ms, gemm_ms, paired = measure_beside(rt, bench.run, op_ms, streams.gemms, info.iters)
        fields = {"beside_ms": beside_ms} | streams.gemms.fields(gemm_ms) | paired.fields(streams.gemms.prefix)
    elif layer is not None:
        fields = layer_fields(rt, case, bench.run, op_ms, layer, info.iters)
    else:
        return {}
    return fields | {"beside_busbw": busbw(case.op, case.nbytes, fields["beside_ms"] / 1e3, rt.world_size)}


def _repeat(fn: Callable[[], None], times: int) -> None:
    for _ in range(times):
        fn()


def _agree(result: dict, rt: Runtime) -> dict:
    """All ranks' results merged: one failing rank fails the case for everyone."""
    import torch.distributed as dist

    results: list = [None] * rt.world_size
    dist.all_gather_object(results, result)
    bad = [(rank, r) for rank, r in enumerate(results) if r["status"] != "ok"]
    if not bad:
        return result
    rank, first = bad[0]
    if all(r == first for r in results):  # a skip, or a failure every rank saw (#wrong is summed)
        return first
    return first | {"error": f"rank {rank}: {first['error']}"}


def _quiesce(rt: Runtime) -> None:
    """Every rank's GPU work done before the next case: paths signal peers through
    symmetric-memory pads with different protocols, which must never interleave."""
    import torch
    import torch.distributed as dist

    if rt.is_cuda:
        torch.cuda.synchronize()
    dist.barrier()


def make_row(case: Case, result: dict, info: RunInfo) -> dict:
    """A store row: the stable columns of `sweep` rows (schema result-v1), workload `comm`."""
    from overlapbench.tuning.results import SCHEMA

    env = info.env
    row = {
        "schema": SCHEMA,
        "run_id": info.run_id,
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "spec": info.spec,
        "key": case.key(),
        "status": result["status"],
        "error": result.get("error"),
        "workload": "comm",
        "strategy": case.strategy,
        "knobs": {"op": case.op, "ctas": case.ctas} | ({} if case.chunks is None else {"chunks": case.chunks}),
        "model": None,
        "shape": {"hidden": case.hidden} if case.hidden else None,
        "layers": None,
        "dtype": case.dtype,
        "batch": [case.rows] if case.rows else None,
        "tokens": case.rows or None,
        "tp": env["world_size"],
        "seed": case.seed,
        **env,
        "warmup": info.warmup,
        "iters": info.iters,
        "op": case.op,
        "bytes": case.nbytes,
        "count": case.count,
        "requested_bytes": case.size,
        "rel_err": None,
    }
    for key in ("ms", "p10_ms", "p90_ms", "iqr_ms", "cv", "graphs", "graph_error", "algbw", "busbw",
                "wrong", "ops_per_sample", "samples_ms"):
        row[key] = result.get(key)
    for key in ("nccl_kernel", "nccl_channels", "nccl_symmetric", "nccl_also"):  # NCCL paths, from its tuning log
        if key in result:
            row[key] = result[key]
    if case.beside_gemm:
        row["beside_gemm"] = True
        for key in ("beside_ms", "beside_busbw", "gemm_tflops_alone", "gemm_tflops_beside", "gemm_loss", "gemm_tokens",
                    *paired_fields(GEMM), *one_call_fields(GEMM)):
            row[key] = result.get(key)
    if case.beside_layer is not None:
        row["beside_layer"] = result.get("beside_layer") or {
            "model": case.beside_layer.model, "tp": case.beside_layer.tp,
            "tokens": case.beside_layer.rows(case.nbytes, case.dtype)}
        for key in BESIDE_LAYER_FIELDS:
            row[key] = result.get(key)
    return row


# A --beside-layer row's own fields (comm.beside_layer), beside `beside_layer` (the model, TP and
# rows): the contention, the paired loss's and the extra beside one call's (comm.paired_loss; rows
# made before them lack them), then the in-layer term's (comm.in_layer.FIELDS; rows made before it hold `inline_ms`,
# `inline_extra_ms` and `inline_graphs` instead, which predict does not charge), then the pair window's
# (comm.pair.FIELDS; rows made before it lack them).
BESIDE_LAYER_FIELDS = ("beside_ms", "beside_busbw", "compute_ms_alone", "compute_ms_beside", "compute_loss",
                       "compute_graphs", *paired_fields(LAYER), *one_call_fields(LAYER), *IN_LAYER_FIELDS,
                       *PAIR_FIELDS)


def run_cases(rt: Runtime, cases: list[Case], info: RunInfo, store: ResultStore | None,
              done: set[str], console: Console) -> list[dict]:
    """Measure every case not already in `done`, append a row each (rank 0 holds the store);
    returns the rows."""
    from overlapbench.comm.beside_layer import BesideStreams

    buffers = Buffers(rt, cases)
    streams = BesideStreams(gemms=_gemm_stream(rt, [c for c in cases if c.key() not in done], info, console))
    rows, told = [], set()
    for case in cases:
        if case.key() in done:
            continue
        result = _agree(measure_case(rt, case, buffers, info, streams), rt)
        row = make_row(case, result, info)
        if store is not None:
            store.append(row)
        rows.append(row)
        if row["status"] != "skipped" or (case.op, case.path, row["error"]) not in told:  # a skip once per path
            told.add((case.op, case.path, row["error"]))
            console.print(summary_line(row), highlight=False)
        _quiesce(rt)
    return rows



def _gemm_stream(rt: Runtime, cases: list[Case], info: RunInfo, console: Console):
    """The GEMM stream of --beside-gemm, timed alone once (None when no case runs beside it)."""
    from overlapbench.comm.contention import GemmStream, time_alone

    if not rt.is_cuda or not any(c.beside_gemm and c.skip is None for c in cases):
        return None
    gemms = GemmStream.make(rt.device)
    gemms.alone_ms = time_alone(rt, gemms, max(5, info.iters))
    console.print(f"beside-gemm: the MLP GEMMs alone {gemms.alone_ms:.3f} ms, "
                  f"{gemms.tflops(gemms.alone_ms):.0f} TFLOP/s", highlight=False)
    return gemms
