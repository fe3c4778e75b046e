"""Processes for the tests: a function on N gloo processes (CPU) or NCCL ones (GPUs), each
rank's return value collected; the command line run as a user runs it; and what the GPU tests
that run every case in one pair of processes report per case (rel_err, error_text)."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parent.parent


def two_gpus() -> list:
    """pytestmark of a module whose tests need two CUDA GPUs."""
    import pytest
    import torch

    return [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs >= 2 CUDA GPUs")]


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in fp32; NaN (a kernel gone wrong) as inf, so it fails every bound."""
    import torch

    out, ref = out.float(), ref.float()
    err = (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()
    return err if err == err else float("inf")


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
