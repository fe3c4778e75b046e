"""Run under torchrun as is; started plainly, re-launch through torch.distributed.run."""

from __future__ import annotations

import os
import subprocess
import sys

from overlapbench.runtime import apply_safe_env


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def local_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_nproc() -> int:
    """All local GPUs, or 2 gloo processes on a machine without any."""
    return local_gpus() or 2


def relaunch(args: list[str], nproc: int) -> int:
    """`python -m torch.distributed.run --standalone --nproc-per-node N -m overlapbench ARGS`;
    returns its exit code. torchrun stops every rank when one fails."""
    env = os.environ.copy()
    apply_safe_env(env)
    if not local_gpus():
        env.setdefault("OMP_NUM_THREADS", "1")  # 2 processes on a small CPU box
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc}", "-m", "overlapbench", *args,
    ]
    return subprocess.call(cmd, env=env)
