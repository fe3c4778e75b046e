"""`overlapbench comm` on 2 and 4 GPUs: every path (NCCL under CTA budgets, on plain buffers and on
registered symmetric windows, symmetric-memory one- and
two-shot all-reduce, the fused all-reduce + RMSNorm kernels v2 and v1, the copy-engine all-gather, the
copy-engine all-reduce + RMSNorm, by size-chosen chunks, serial and in 3 chunks) gets
every size exactly right (#wrong == 0), and is timed from CUDA-graph replays; NCCL's rows say
which kernel ran on how many channels (nccl_symm: a symmetric kernel, on its exact budget).

Sizes are chosen so that row counts split unevenly over the ranks (3 rows: fewer than 4 ranks),
one size is below a row (the fused kernel skips it) and the CTA budgets include an odd one. One
command run per world size and dtype (at 4 ranks bf16 only), shared by the tests below."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from overlapbench.comm import paths
from overlapbench.tuning.results import read_rows
from tests import distributed

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parent.parent
RUNS = {
    "bf16": ("8192", "12K", "3M"),  # 12K < one 16 KiB row; then 3, 12, 48, 192 rows
    "fp32": ("2048", "24K", "6M"),  # 3, 12, 48, 192, 768 rows of 8 KiB
}
CASES = distributed.world_params(lambda world: sorted(RUNS) if world == 2 else ["bf16"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> distributed.Launches:
    """runs(world, dtype): (the JSON records printed, the rows stored) of one `comm` run on `world` GPUs."""

    def launch(world: int, dtype: str) -> tuple[list[dict], list[dict]]:
        hidden, lo, hi = RUNS[dtype]
        out = tmp_path_factory.mktemp(f"comm-ws{world}") / "comm.jsonl"
        done = subprocess.run(
            [sys.executable, "-m", "overlapbench", "comm", "-b", lo, "-e", hi, "-f", "4", "--dtype", dtype,
             "--hidden", hidden, "--paths", ",".join(paths.PATHS),
             "--nccl-max-ctas", "default,4", "--comm-ctas", "1,3,64", "--ce-chunks", "auto,1,3",
             "--iters", "3", "--warmup", "1", "--nproc", str(world), "--format", "json", "--output", str(out)],
            capture_output=True, text=True, timeout=600, cwd=REPO, env=os.environ | {"PYTHONPATH": str(REPO)},
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout), read_rows(out)

    return distributed.Launches(launch)


@pytest.mark.parametrize(("world", "dtype"), CASES)
def test_every_path_is_exact(runs, world, dtype):
    records, rows = runs(world, dtype)
    failed = [r for r in records if r["status"] == "failed"]
    assert not failed, json.dumps(failed, indent=1)
    ok = [r for r in records if r["status"] == "ok"]
    assert all(r["wrong"] == 0 and r["time_us"] > 0 and r["busbw"] > 0 for r in ok)
    measured = {(r["op"], r["path"]) for r in ok}
    assert measured == {(op, path) for op, paths in paths.PATHS_BY_OP.items() for path in paths}, measured
    assert {r["ctas"] for r in ok if r["path"] == "fused_norm"} == {1, 3, 64}
    assert {r["ctas"] for r in ok if r["path"] == "copy_engine_norm"} == {1, 3, 64}
    assert {r["chunks"] for r in ok if r["path"] == "copy_engine_norm"} == {None, 1, 3}  # auto, serial, pipelined
    assert {(r["ctas"], r["chunks"]) for r in ok if r["path"] == "copy_engine_norm_kernel"} == {
        (c, k) for c in (1, 3, 64) for k in (None, 1, 3)}  # the kernel writing its own rows: exact alike
    assert {r["ctas"] for r in ok if r["path"] == "fused_norm_v1"} == {1, 3, 64}
    assert {r["ctas"] for r in ok if r["path"] == "fused_norm_push"} == {1, 3, 64}
    assert {r["ctas"] for r in ok if r["path"] == "fused_norm_pull_push"} == {1, 3, 64}
    assert {r["ctas"] for r in ok if r["path"] == "nccl"} == {"default", 4}
    skipped = [r for r in records if r["status"] == "skipped"]
    row_paths = ("fused_norm", "fused_norm_v1", "fused_norm_push", "fused_norm_pull_push", "copy_engine_norm",
                 "copy_engine_norm_kernel")
    assert all(r["path"] in row_paths and "below one row" in r["error"] for r in skipped), skipped
    assert {r["backend"] for r in rows} == {"nccl"} and {r["world_size"] for r in rows} == {world}
    assert all(r["multicast_env"]["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" for r in rows)


@pytest.mark.parametrize(("world", "dtype"), CASES)
def test_every_path_is_timed_from_cuda_graphs(runs, world, dtype):
    _, rows = runs(world, dtype)
    eager = {(r["op"], r["strategy"], r["graph_error"]) for r in rows if r["status"] == "ok" and not r["graphs"]}
    assert not eager, f"fell back to eager timing: {eager}"


SYMMETRIC_KERNELS = {
    "all_reduce": {"AllReduce_RSxLD_AGxST", "AllReduce_AGxLL_R"},  # never the multicast (MC) ones: NVLS is off
    "all_gather": {"AllGather_ST", "AllGather_LL"},
    "reduce_scatter": {"ReduceScatter_LD", "ReduceScatter_LL"},
}


@pytest.mark.parametrize(("world", "dtype"), CASES)
def test_nccl_rows_say_which_kernel_ran_and_nccl_symm_ran_a_symmetric_one_on_its_budget(runs, world, dtype):
    _, rows = runs(world, dtype)
    nccl = [r for r in rows if r["status"] == "ok" and r["strategy"] in ("nccl", "nccl_symm")]
    assert all(r["nccl_kernel"] and r["nccl_channels"] >= 1 for r in nccl), [r["key"] for r in nccl if not r.get("nccl_kernel")]
    assert not any(r["nccl_symmetric"] for r in nccl if r["strategy"] == "nccl")  # plain buffers: NCCL's ring/tree
    symm = [r for r in nccl if r["strategy"] == "nccl_symm"]
    assert {r["op"] for r in symm} == set(paths.OPS)
    for r in symm:
        assert r["nccl_symmetric"] and r["nccl_kernel"] in SYMMETRIC_KERNELS[r["op"]], (r["key"], r["nccl_kernel"])
        ctas = r["knobs"]["ctas"]
        if ctas != "default":  # min_ctas = max_ctas: exactly the budget, once there are cells enough to share
            assert r["nccl_channels"] <= ctas and (r["bytes"] < 2**20 or r["nccl_channels"] == ctas), r
