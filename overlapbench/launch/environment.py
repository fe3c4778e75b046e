"""What the tool sees: devices, links, versions, symmetric memory, multicast. Goes into every row."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from pathlib import Path

MULTICAST_VARS = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


def git_commit() -> str | None:
    """HEAD of the checkout the package runs from, '+dirty' when it has local changes; where the
    code was copied without its .git (a remote GPU box, a container), OVERLAPBENCH_GIT says it."""
    if os.environ.get("OVERLAPBENCH_GIT"):
        return os.environ["OVERLAPBENCH_GIT"]
    root = Path(__file__).resolve().parent.parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if head.returncode:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, timeout=10,
        ).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__}
    out["cuda"] = torch.version.cuda
    try:
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    except Exception:
        out["nccl"] = None
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    return out


def nccl_windows() -> str:
    """Whether NCCL's symmetric windows (comm path and knob nccl_symm) can be registered by the
    tool's runs here, which turn multicast off unless the user turned it on; in words."""
    from overlapbench.distributed.nccl_windows import missing_support
    from overlapbench.distributed.runtime import SAFE_ENV

    reason = missing_support(SAFE_ENV | dict(os.environ))
    if reason is not None:
        return f"no: {reason}"
    return (f"torch and NCCL {versions()['nccl']} offer them (symmetric kernels by peer loads and stores); "
            "a run checks the backend's window allocator and skips nccl_symm with the reason where it refuses")


def local_devices() -> dict:
    """This host's GPUs, their peer access, symmetric memory and multicast settings."""
    import torch

    facts: dict = {"host": socket.gethostname(), "multicast_env": {k: os.environ.get(k) for k in MULTICAST_VARS}}
    if not torch.cuda.is_available():
        return facts | {"device": "cpu", "gpus": 0, "nccl_windows": nccl_windows()}
    n = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    facts |= {
        "device": props.name,
        "gpus": n,
        "sms": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "peer_access": [[i == j or torch.cuda.can_device_access_peer(i, j) for j in range(n)] for i in range(n)],
    }
    try:
        from torch.distributed import _symmetric_memory  # noqa: F401

        facts["symmetric_memory"] = True
    except ImportError:
        facts["symmetric_memory"] = False
    facts["nccl_windows"] = nccl_windows()
    try:
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
        facts["topology"] = topo.stdout.strip() if topo.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        facts["topology"] = None
    return facts


def run_environment(rt) -> dict:
    """The facts every result row of a run carries (collected once, on every rank)."""
    import torch.distributed as dist

    facts = local_devices()
    me = {
        "rank": rt.rank,
        "host": facts["host"],
        "node": int(os.environ.get("GROUP_RANK", 0)),  # torchrun's node rank
        "local_rank": rt.local_rank,
    }
    ranks: list = [None] * rt.world_size
    dist.all_gather_object(ranks, me)
    return {
        "hosts": sorted({r["host"] for r in ranks}),
        "nodes": len({r["node"] for r in ranks}),
        "ranks": ranks,
        "device": facts["device"],
        "gpus_per_host": facts["gpus"],
        "world_size": rt.world_size,
        "backend": rt.backend,
        "versions": versions(),
        "git": git_commit(),
        "multicast_env": facts["multicast_env"],
    }
