"""Before a launch on GPUs: what else holds them, said in one paragraph, and a refusal where the
others leave too little free (gpu_sharing), from nvidia-smi's answers (faked here)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from overlapbench.errors import UserError
from overlapbench.launch import gpu_sharing, launch
from overlapbench.launch.gpu_sharing import GPU_QUERY, Gpu, Holder

GIB = 2**30


def fake_smi(gpus: str, apps: str | None):
    def ask(args: list[str]) -> str | None:
        return gpus if args == GPU_QUERY else apps
    return ask


def uuids(n: int, rng: random.Random) -> list[str]:
    return ["-".join(f"{rng.getrandbits(32):08x}" for _ in range(4)) for _ in range(n)]


def test_the_run_gpus_and_what_holds_them_are_read_by_uuid():
    rng = random.Random(42)
    ours, other = uuids(2, rng), uuids(1, rng)[0]
    # nvidia-smi's order is not CUDA's: the run's GPU 0 is the second line
    gpus = f"GPU-{ours[1]}, 81559, 50000\nGPU-{other}, 81559, 81000\nGPU-{ours[0]}, 81559, 20000\n"
    apps = (f"GPU-{ours[0]}, {os.getppid()}, 30000, python\n"
            f"GPU-{ours[1]}, {os.getpid()}, 500, this process\n"
            f"GPU-{other}, 999999, 100, elsewhere\n"
            f"GPU-{ours[0]}, 999998, [N/A], /usr/bin/python3\n"
            f"GPU-{ours[1]}, 999997, 31000, a, name, with commas\n")
    found, holders = gpu_sharing.survey(ours, fake_smi(gpus, apps))
    assert sorted(found, key=lambda g: g.index) == [Gpu(0, 81559 * 2**20, 20000 * 2**20), Gpu(1, 81559 * 2**20, 50000 * 2**20)]
    assert [(h.gpu, h.pid, h.used_bytes) for h in holders] == [
        (0, os.getppid(), 30000 * 2**20), (0, 999998, None), (1, 999997, 31000 * 2**20)]  # not this process
    parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    assert holders[0].command == (parent if len(parent) <= 100 else parent[:99] + "…")  # its command line, seen here
    assert holders[1].command == "/usr/bin/python3"  # not visible here: nvidia-smi's name
    assert holders[2].command == "a, name, with commas"


def test_nothing_is_said_without_nvidia_smi_or_other_processes():
    ours = uuids(1, random.Random(7))
    assert gpu_sharing.survey(ours, lambda args: None) == ([], [])
    alone = gpu_sharing.survey(ours, fake_smi(f"GPU-{ours[0]}, 81559, 81000\n", ""))
    assert alone == ([Gpu(0, 81559 * 2**20, 81000 * 2**20)], [])
    assert gpu_sharing.check([Gpu(0, 80 * GIB, 79 * GIB)], [], 90 * GIB, force=False) is None
    assert launch.gpu_sharing_check(2, 10 * GIB, False) is None  # this machine has no GPUs


def test_a_run_that_fits_only_without_the_others_is_refused_unless_forced():
    rng = random.Random(11)
    need = rng.randint(20, 60) * GIB
    held = [Holder(0, 4242, "python -u -m overlapbench sweep big.yaml --output r.jsonl", 70 * GIB),
            Holder(1, 4243, "python -u -m overlapbench sweep big.yaml --output r.jsonl", 70 * GIB)]
    gpus = [Gpu(0, 80 * GIB, 10 * GIB), Gpu(1, 80 * GIB, 10 * GIB)]
    with pytest.raises(UserError) as refused:
        gpu_sharing.check(gpus, held, need, force=False)
    line = str(refused.value)
    assert line.startswith("other processes hold memory on the GPUs this run uses: GPU 0 (10.0 GiB free of 80.0 GiB): "
                           "pid 4242 `python -u -m overlapbench sweep big.yaml --output r.jsonl` 70.0 GiB; GPU 1 ")
    assert f"needs about {need / GIB:.1f} GiB per GPU, more than they leave free on GPU 0, 1" in line
    assert "`kill 4242 4243`" in line and "--force" in line and "\n" not in line
    forced = gpu_sharing.check(gpus, held, need, force=True)
    assert forced.startswith("other processes hold memory") and "timings beside them are slower" in forced
    roomy = [Gpu(0, 80 * GIB, need + GIB), Gpu(1, 80 * GIB, need + GIB)]
    assert "pid 4243" in gpu_sharing.check(roomy, held, need, force=False)  # it fits: said, not refused
    assert gpu_sharing.check(gpus, held, 90 * GIB, force=False) is not None  # too big for any GPU: the size check says so
    assert gpu_sharing.check(gpus, held, None, force=False) is not None  # nothing estimated (comm): said only
