"""The world sizes of the GPU tests (tests/distributed.py), on CPU with made-up GPU counts: which
sizes run where, the parametrize values and their skip reasons, launches run once per size (their
failures too), the bf16 tolerance by size; and, collected from the GPU modules, that each module
whose subject depends on the number of ranks has cases at both sizes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import distributed

WORLD_DEPENDENT = ("test_allreduce_norm_gpu", "test_attention_details_gpu", "test_attention_gpu", "test_comm_gpu",
                   "test_mixed_gpu", "test_nccl_symm_gpu", "test_sequence_parallel_gpu")


@pytest.mark.parametrize("gpus, sizes", [(0, [2]), (1, [2]), (2, [2]), (3, [2]), (4, [2, 4]), (8, [2, 4])])
def test_the_smallest_size_always_runs_and_4_from_4_gpus_on(gpus, sizes):
    assert distributed.gpu_world_sizes(gpus) == sizes


def _skip_reasons(param) -> list[str]:
    return [m.kwargs["reason"] for m in param.marks if m.name == "skip"]


def test_params_list_every_size_and_skip_the_ones_without_gpus_saying_why():
    params = distributed.world_params(lambda world: ["a", "b"] if world == 2 else ["b"], gpus=2)
    assert [(p.values, p.id) for p in params] == [((2, "a"), "ws2-a"), ((2, "b"), "ws2-b"), ((4, "b"), "ws4-b")]
    assert [_skip_reasons(p) for p in params] == [[], [], ["world size 4 needs 4 CUDA GPUs, 2 here"]]
    on_four = distributed.world_params(["x"], ids=str.upper, gpus=4)
    assert [(p.values, p.id, _skip_reasons(p)) for p in on_four] == [((2, "x"), "ws2-X", []), ((4, "x"), "ws4-X", [])]


def test_a_launch_runs_once_per_key_and_a_failed_one_stays_failed():
    calls = []

    def launch(world, dtype="bf16"):
        calls.append((world, dtype))
        if world == 4:
            raise RuntimeError(f"no rank {world - 1}")
        return {"world": world, "dtype": dtype}

    launches = distributed.Launches(launch)
    assert launches(2) == launches(2) == {"world": 2, "dtype": "bf16"}
    assert launches(2, "fp32")["dtype"] == "fp32"
    for _ in range(3):
        with pytest.raises(RuntimeError, match="no rank 3"):
            launches(4)
    assert calls == [(2, "bf16"), (2, "fp32"), (4, "bf16")]


def test_a_launch_that_skips_skips_every_test_of_its_size_once():
    calls = []

    def launch(world):
        calls.append(world)
        pytest.skip(f"needs {world} CUDA GPUs")

    launches = distributed.Launches(launch)
    for _ in range(2):
        with pytest.raises(pytest.skip.Exception, match="needs 4 CUDA GPUs"):
            launches(4)
    assert calls == [4]


def test_the_bf16_tolerance_grows_as_the_root_of_the_ranks_summed():
    assert distributed.bf16_tolerance(2) == pytest.approx(1e-2)
    assert distributed.bf16_tolerance(4) == pytest.approx(1e-2 * 2**0.5)
    assert distributed.bf16_tolerance(8) == pytest.approx(2e-2)


MODULE = '''
import pytest
from tests import distributed

LAUNCHED = []


@pytest.fixture(scope="module")
def results():
    def launch(world):
        LAUNCHED.append(world)
        return {"world": world}
    return distributed.Launches(launch)


CASES = distributed.world_params(lambda world: ["a", "b", "c"][: 3 if world == 2 else 1], gpus={gpus})


@pytest.mark.parametrize(("world", "label"), CASES)
def test_one(results, world, label):
    assert results(world)["world"] == world


@pytest.mark.parametrize(("world", "label"), CASES)
def test_two(results, world, label):
    assert results(world)["world"] == world


def test_z_each_size_launched_once():
    assert LAUNCHED == {launched}
'''


@pytest.mark.parametrize("gpus, launched, outcome", [(4, [2, 4], "9 passed"), (2, [2], "7 passed, 2 skipped")])
def test_a_module_of_both_sizes_launches_each_once_and_reports_the_skipped_size(tmp_path: Path, gpus, launched, outcome):
    (tmp_path / "test_sizes.py").write_text(MODULE.replace("{gpus}", str(gpus)).replace("{launched}", str(launched)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "test_sizes.py"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(distributed.REPO)})
    assert done.returncode == 0, done.stdout[-3000:]
    assert outcome in done.stdout, done.stdout[-3000:]
    if gpus < 4:
        assert "world size 4 needs 4 CUDA GPUs, 2 here" in done.stdout, done.stdout[-3000:]


def test_each_world_dependent_gpu_module_has_cases_at_both_sizes():
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                           *(f"tests/{m}.py" for m in WORLD_DEPENDENT)],
                          capture_output=True, text=True, timeout=300, cwd=distributed.REPO,
                          env={**os.environ, "PYTHONPATH": str(distributed.REPO)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    counts = {(m, world): 0 for m in WORLD_DEPENDENT for world in distributed.WORLD_SIZES}
    for line in done.stdout.splitlines():
        if "::" in line and "[ws" in line:
            path, rest = line.split("[ws", 1)
            counts[Path(path.split("::")[0]).stem, int(rest.split("-", 1)[0])] += 1
    assert all(counts.values()), [key for key, n in counts.items() if not n]


def test_digest_tells_bits_apart_that_compare_equal_as_numbers():
    """The bit digest the GPU tests compare ranks and runs by: equal for equal bits, different for
    one bit flipped, and for +0.0 against -0.0, which == calls equal."""
    import torch

    t = torch.randn(64, 48, generator=torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little")))
    t = t.to(torch.bfloat16)
    assert distributed.digest(t) == distributed.digest(t.clone())
    assert distributed.digest(t.t()) != distributed.digest(t)  # the same numbers in another order differ
    flipped = t.clone().view(torch.int16)
    flipped[5, 7] ^= 1
    assert distributed.digest(flipped.view(torch.bfloat16)) != distributed.digest(t)
    zeros = torch.zeros(8, dtype=torch.bfloat16)
    assert bool((zeros == -zeros).all()) and distributed.digest(zeros) != distributed.digest(-zeros)


def test_nccl_launches_runs_a_module_s_cases_once_per_world_size_on_nccl(monkeypatch):
    calls = []

    def run(fn, *args, world, timeout, backend):
        calls.append((fn, args, world, timeout, backend))
        return [{"rank": r} for r in range(world)]

    def cases(rank, world):
        return {}

    monkeypatch.setattr(distributed, "run", run)
    launches = distributed.nccl_launches(cases, timeout=7)
    assert launches(4) == launches(4) == [{"rank": r} for r in range(4)] and len(launches(2)) == 2
    assert calls == [(cases, (), 4, 7, "nccl"), (cases, (), 2, 7, "nccl")]
    assert distributed.nccl_launches(cases)(2) and calls[-1][3] == 600
