"""Processes for the tests: a function on N gloo processes (CPU) or NCCL ones (GPUs), each
rank's return value collected; the command line run as a user runs it; what the GPU tests that
run every case in one set of processes report per case (rel_err, error_text, digest) and launch
them by (nccl_launches); and the world sizes those tests run at (world_params, Launches,
bf16_tolerance)."""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parent.parent


# The world sizes of the GPU tests whose subject depends on the number of ranks (the comm paths,
# the split and sequence-parallel families, the fused all-reduce + norm kernels): the first runs
# on every GPU machine, each other where the machine has that many GPUs.
WORLD_SIZES = (2, 4)


def gpu_count() -> int:
    """CUDA GPUs visible to this process (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def two_gpus() -> list:
    """pytestmark of a module whose tests need two CUDA GPUs."""
    import pytest

    return [pytest.mark.gpu, pytest.mark.skipif(gpu_count() < 2, reason="needs >= 2 CUDA GPUs")]


def gpu_world_sizes(gpus: int | None = None) -> list[int]:
    """The sizes of WORLD_SIZES that run on `gpus` GPUs (default: this machine's): [2] below 4
    GPUs, [2, 4] from 4 on. The smallest is always listed: below 2 GPUs its tests are skipped by
    the `gpu` marker (conftest.py), not dropped."""
    gpus = gpu_count() if gpus is None else gpus
    return [w for w in WORLD_SIZES if w == WORLD_SIZES[0] or w <= gpus]


def world_params(cases: Sequence | Callable[[int], Sequence], ids: Callable[[Any], str] = str,
                 gpus: int | None = None) -> list:
    """Values for `@pytest.mark.parametrize(("world", "case"), world_params(...))`: (world, case)
    for each size of WORLD_SIZES and each of its cases (`cases`, or `cases(world)` where a size
    runs a subset), with ids `ws<world>-<ids(case)>`. A size this machine has too few GPUs for is
    skipped with a reason naming both counts, so a log shows what did not run and why."""
    import pytest

    gpus = gpu_count() if gpus is None else gpus
    runnable = gpu_world_sizes(gpus)
    params = []
    for world in WORLD_SIZES:
        marks = [] if world in runnable else [
            pytest.mark.skip(reason=f"world size {world} needs {world} CUDA GPUs, {gpus} here")]
        for case in cases(world) if callable(cases) else cases:
            params.append(pytest.param(world, case, id=f"ws{world}-{ids(case)}", marks=marks))
    return params


class Launches:
    """A module's launches of processes, one per key (a world size, with whatever else the module
    varies), each run once when a test first asks for it. A launch that fails is kept failed: every
    test of its key fails (or skips) with the same error, and nothing is launched twice. Tests of
    every size share it (one module fixture), whatever order pytest runs them in."""

    def __init__(self, launch: Callable[..., Any]) -> None:
        self._launch = launch
        self._done: dict[Hashable, tuple[bool, Any]] = {}

    def __call__(self, *key: Hashable) -> Any:
        import pytest

        if key not in self._done:
            try:
                self._done[key] = (True, self._launch(*key))
            except (Exception, pytest.fail.Exception, pytest.skip.Exception) as e:
                self._done[key] = (False, e)
        ok, value = self._done[key]
        if not ok:
            raise value
        return value


def nccl_launches(run_cases: Callable[[int, int], dict], timeout: float = 600) -> Launches:
    """The Launches of a GPU module whose cases all run in one set of NCCL processes per world
    size: `run_cases(rank, world)` on every rank, each rank's dict of results collected."""
    return Launches(lambda world: run(run_cases, world=world, timeout=timeout, backend="nccl"))


def bf16_tolerance(world: int) -> float:
    """The relative error allowed between a bf16 tensor-parallel result on `world` ranks and its
    reference: 1e-2 at 2 ranks, growing as the square root of the ranks whose rounded bf16
    partials are summed (independent roundings add in quadrature): 1.41e-2 at 4. Two correct bf16
    schedules were seen 7.5e-3 apart at TP=4 (docs/workload.md), inside 1e-2 only narrowly."""
    return 1e-2 * math.sqrt(world / WORLD_SIZES[0])


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in fp32; NaN (a kernel gone wrong) as inf, so it fails every bound."""
    import torch

    out, ref = out.float(), ref.float()
    err = (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()
    return err if err == err else float("inf")


def graph_forward(step, x, replays: int = 1):
    """A step's output from its CUDA graph replayed `replays` times (timing/cuda_graph.capture:
    warmed up on a side stream, as the sweep captures it)."""
    import torch

    from overlapbench.timing.cuda_graph import capture

    out = {}
    graph = capture(lambda: out.update(y=step.forward(x)))
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    return out["y"]


def digest(t) -> str:
    """The bits of a 16-bit tensor (bf16, fp16) as a hex string: equal digests, equal bits, so
    ranks and runs compare outputs without shipping them."""
    import torch

    return hashlib.sha256(t.contiguous().view(torch.int16).cpu().numpy().tobytes()).hexdigest()


def build_step(ctx, strategy: str, knobs: dict):
    """The step of `strategy` with `knobs` checked (defaults filled) as a spec's are, on `ctx`."""
    from overlapbench import strategies

    cls = strategies.get(strategy)
    return cls.build(ctx, cls.check_knobs(knobs, strategy))


def assert_eager_and_replayed_within(found_by_rank: list[dict], label: str, world: int) -> None:
    """Every rank's `label` (the eager forwards' relative error against the reference) and
    `graph label` (one CUDA-graph replay's) is a number below bf16_tolerance(world); a case that
    failed holds its error_text instead, which the assertion shows."""
    tol = bf16_tolerance(world)
    for rank, found in enumerate(found_by_rank):
        for key in (label, f"graph {label}"):
            err = found[key]
            assert isinstance(err, float), f"rank {rank}, {key}: {err}"
            assert err < tol, f"rank {rank}, {key}: rel err {err:.3g} >= {tol:.3g}"


def error_text(e: BaseException) -> str:
    """A case's failure as one line, for the report of its rank."""
    return f"{type(e).__name__}: {e}".splitlines()[0][:500]


def overlapbench(command: str, *args: str, env: dict | None = None, timeout: float = 300,
                 cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`python -m overlapbench COMMAND ARGS` from the repo root (or `cwd`), output captured;
    `env` adds variables to this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "overlapbench", command, *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env=os.environ | {"PYTHONPATH": str(REPO)} | (env or {}),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, fn, args, queue, backend: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
    )
    try:
        import torch.distributed as dist

        if backend == "nccl":
            import torch

            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world)
        result = fn(rank, world, *args)
        if dist.is_initialized():  # a sweep's rank code (run/command.work) leaves the group itself
            dist.destroy_process_group()
        queue.put((rank, "ok", pickle.dumps(result)))  # by value: no shared-memory handles
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))


def run(fn, *args, world: int = 2, timeout: float = 120, backend: str = "gloo"):
    """fn(rank, world, *args) on `world` processes; returns [result of rank 0, rank 1, ...].
    Results travel by pickle: return CPU tensors."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, queue, backend)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict = {}
    try:
        for _ in range(world):
            rank, status, value = queue.get(timeout=timeout)
            if status != "ok":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]
