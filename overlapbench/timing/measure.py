"""The sequential mode: a step timed on every rank with `bench`, each iteration's time the max
over ranks (a layer is as slow as its slowest rank); where a step's CUDA graph is captured (every
rank, or none); the relative error the checks use; a point's profile (the profiler's kernel table, its timelines).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from overlapbench.errors import one_line
from overlapbench.timing.bench import CudaClock, Timing, WallClock, bench
from overlapbench.timing.cuda_graph import capture
from overlapbench.timing.interleave import slowest
from overlapbench.timing.step import Step

REL_ERR_CHUNK = 1 << 24  # elements per fp32 slice: 64 MiB, whatever the output's size


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error ||out - ref|| / ||ref||, in fp32; inf for NaN/inf output.

    Summed over slices of REL_ERR_CHUNK elements: a check at 64K tokens of a 70B layer needs
    no whole-output fp32 copies (2 GiB each) beside the candidates' memory."""
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from the reference's {tuple(ref.shape)}")
    out, ref = out.reshape(-1), ref.reshape(-1)
    diff_sq = torch.zeros((), dtype=torch.float64, device=out.device)
    ref_sq = torch.zeros((), dtype=torch.float64, device=out.device)
    for start in range(0, out.numel(), REL_ERR_CHUNK):
        o, r = out[start:start + REL_ERR_CHUNK].float(), ref[start:start + REL_ERR_CHUNK].float()
        diff_sq += torch.linalg.vector_norm(o - r).double() ** 2
        ref_sq += torch.linalg.vector_norm(r).double() ** 2
    err = (diff_sq / ref_sq).sqrt()
    return float(err) if torch.isfinite(err) else float("inf")


def _capture(step: Step, x: torch.Tensor):
    """A replay function for the step's CUDA graph."""
    return capture(lambda: step.forward(x)).replay


def runner(step: Step, x: torch.Tensor, graphs: bool) -> tuple[Callable[[], object], bool, str | None]:
    """What one timed iteration runs: the step's CUDA-graph replay where `graphs` and every rank
    captured it, else its eager forward; whether it is the graph, and why not where capture failed."""
    run, used_graphs, error = (lambda: step.forward(x)), False, None
    if x.device.type != "cuda" or not (graphs and step.graphable):
        return run, used_graphs, error
    try:
        replay = _capture(step, x)
    except Exception as e:
        error = one_line(e, limit=300)
    failed = _failures(error)
    if not failed:  # every rank captured
        run, used_graphs = replay, True
    else:  # the row is written by rank 0: it names the rank that failed and why
        rank, why = failed[0]
        error = f"capture failed on rank {rank}: {why}"
    return run, used_graphs, error


def _failures(error: str | None) -> list[tuple[int, str]]:
    """(rank, reason) of every rank whose capture failed, lowest rank first; the same on every rank."""
    errors: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return [(rank, why) for rank, why in enumerate(errors) if why is not None]


def time_step(
    step: Step, x: torch.Tensor, warmup: int, iters: int, graphs: bool,
    warmup_s: float = 0.0, min_time_s: float = 0.0,
) -> Timing:
    """Per-iteration times of `step`, max over ranks, and each rank's own median (`rank_medians_ms`).

    On GPUs: warm-up runs at least `warmup` iterations and `warmup_s` seconds, so clocks settle
    into the steady state the timed loop sees; the timed loop runs at least `iters` iterations and
    `min_time_s` seconds (at most bench.MAX_ITERS), the same counts on every rank (`agreed_count`),
    after the ranks meet; where graph replays were timed, the Timing holds the replay (and so the
    graph) for --profile. On CPU (gloo; the numbers test the tool, they measure nothing): exactly
    `warmup` and `iters` forwards, the ranks meeting before each, so no rank's sample holds its
    wait for a slower one.
    """
    if x.device.type != "cuda":
        timed = bench(lambda: step.forward(x), 0.0, 0.0, warmup=warmup, iters=iters, clock=WallClock(),
                      before_each=dist.barrier)
        slowest, medians = _over_ranks(torch.tensor(timed.samples_ms))
        return Timing(slowest, graphs=False, rank_medians_ms=medians)
    run, used_graphs, error = runner(step, x, graphs)
    timed = bench(run, warmup_s * 1e3, min_time_s * 1e3, warmup=warmup, iters=iters, clock=CudaClock(),
                  agree=agreed_count, before_loop=dist.barrier)
    slowest, medians = _over_ranks(torch.tensor(timed.samples_ms, device=x.device))
    return Timing(slowest, used_graphs, error, replay=run if used_graphs else None, rank_medians_ms=medians)


def agreed_count(wanted: int) -> int:
    """The largest of the ranks' counts: each rank runs it, so all issue the same collectives."""
    count = torch.tensor([wanted], device=_collective_device())
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _over_ranks(local: torch.Tensor) -> tuple[list[float], list[float]]:
    """Every rank's samples, by one all-gather: each iteration's max over the ranks (its time: the
    slowest rank's, interleave.slowest), and each rank's own median, in rank order (as
    interleave's Timed.rank_medians)."""
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    every = [samples.tolist() for samples in gathered]
    return slowest(every), [statistics.median(samples) for samples in every]


@dataclass(frozen=True)
class ProfilePart:
    """One part of a point's profile (profile_parts): what it records, as a message names it; the
    file it writes on this rank (None where it writes none: the kernel table off rank 0); and the
    call that records and writes it."""

    what: str
    file: Path | None
    run: Callable[[], None]


def profile_parts(step: Step, x: torch.Tensor, path: Path, iterations: int = 3,
                  replay: Callable[[], object] | None = None, rank: int = 0, world: int = 1,
                  in_step: Callable[[], None] | None = None, replays: int = 1) -> list[ProfilePart]:
    """A few eager forwards under torch.profiler, their kernel table (by device time) to `path`
    (rank 0's only); then one more forward's timeline (its device kernels, timeline.py) beside it;
    and where the step was timed as a CUDA-graph replay (`replay`: what the timed iterations ran,
    on every rank or none), the timeline of `replays` replays back to back (as a timed span runs
    them after the ranks meet), its kernels linked to this rank's eager
    forward's ops (timeline.link_replay), beside that (where none is recorded, the first part
    removes an earlier run's replay timeline of the point). Every rank writes its own timelines, named
    by `rank` (timeline.file_name: rank 0's keep the plain names), each marked `rank` of `world`,
    each forward started after `in_step` (Runtime.in_step: every rank at once; timeline.record).
    Parts, to run in order: the sweep lets the ranks agree after each, so no rank enters a part's
    collectives after another's part failed, and a failure names its part."""
    from torch.profiler import ProfilerActivity, profile

    from overlapbench.timing import timeline

    cuda = x.device.type == "cuda"
    eager: list[dict] = []  # the eager forward's timeline, which the replay's kernels are linked to
    table_file = path if rank == 0 else None
    eager_file, replay_file = timeline.beside(path, False, rank), timeline.beside(path, True, rank)
    replaying = replay is not None and cuda

    def table() -> None:
        if not replaying:  # an earlier run's replay of this point would read as this one's
            replay_file.unlink(missing_ok=True)
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            for _ in range(iterations):
                step.forward(x)
            if cuda:
                torch.cuda.synchronize()
        if table_file is not None:
            text = prof.key_averages().table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=90)
            table_file.write_text(f"{iterations} eager forwards\n{text}\n")

    def eager_timeline() -> None:
        eager.append(timeline.record(lambda: step.forward(x), cuda, rank, world, in_step))
        timeline.write(eager[0], eager_file)

    def replay_timeline() -> None:
        def back_to_back() -> None:
            for _ in range(replays):
                replay()

        replayed = timeline.record(back_to_back, cuda, rank, world, in_step)
        timeline.write(timeline.link_replay(replayed, eager[0], replays), replay_file)

    parts = [ProfilePart("the kernel table", table_file, table), ProfilePart("the eager timeline", eager_file, eager_timeline)]
    if replaying:
        parts.append(ProfilePart("the replay timeline", replay_file, replay_timeline))
    return parts
