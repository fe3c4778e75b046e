"""nccl_symm on 2 and 4 GPUs (NCCL, bf16): registered windows exist here; NCCL's collectives on
them are exact at 64 MiB under NCCL's own budget and exact ones (4, 16 CTAs), and its tuning log
shows a symmetric kernel on exactly that many channels; every strategy that takes nccl_symm
matches the single-GPU reference, eager and replayed from a CUDA graph, and each NCCL launch of
its forward is a symmetric kernel on its budget. At 4 ranks the layer cases run on the token
counts 4 does not divide ((1023,) and (300, 257, 5)), not on (1000,).

One set of processes per world size runs every case in lockstep with NCCL's tuning log on (a
file per process) and reports per case, so each case fails on its own; a hang fails them all at
the timeout. The comm path itself runs in tests/test_comm_gpu.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from overlapbench.distributed.runtime import apply_safe_env  # noqa: E402
from overlapbench.model.models import ModelShape  # noqa: E402
from overlapbench.strategies.knobs import DEFAULT  # noqa: E402
from overlapbench.tuning.rows import Gemm, Point  # noqa: E402
from tests import distributed  # noqa: E402

pytestmark = distributed.two_gpus()

apply_safe_env()  # no NVLink multicast, in the spawned processes too
LAYERS = 2
MAX_TOKENS = 4096
SHAPE = ModelShape(hidden=512, ffn=1024, heads=8, kv_heads=4, head_dim=64)
COLLECTIVE_BYTES = 64 * 2**20
BUDGETS = (DEFAULT, 4, 16)
SYMMETRIC_KERNELS = {"AllReduce_RSxLD_AGxST", "AllReduce_AGxLL_R", "AllGather_ST", "AllGather_LL",
                     "ReduceScatter_LD", "ReduceScatter_LL"}  # never the multicast (MC) ones: NVLS is off

# (label, strategy, knobs, the budget every launch must run on: None for NCCL's own choice)
SETTINGS = [
    ("baseline default", "baseline", {"nccl_symm": True}, None),
    ("baseline 8", "baseline", {"nccl_symm": True, "nccl_max_ctas": 8}, 8),
    ("token_split 8/8", "token_split", {"comm": "nccl_symm", "comm_ctas_attn": 8, "comm_ctas_mlp": 8}, 8),
    ("token_split 4/16", "token_split", {"comm": "nccl_symm", "comm_ctas_attn": 4, "comm_ctas_mlp": 16}, 16),
    ("iso 8", "iso", {"comm": "nccl_symm", "comm_ctas": 8}, 8),
    ("sp_baseline 8", "sp_baseline", {"nccl_symm": True, "nccl_max_ctas": 8}, 8),
]
LAYER_LENS = [(1000,), (1023,), (300, 257, 5)]
LAYER_LENS_AT_4 = LAYER_LENS[1:]


def layer_cases(world: int) -> list[tuple[str, str, dict, tuple[int, ...], int | None]]:
    """(label, strategy, knobs, seq_lens, budget) of the layer cases run at `world` ranks."""
    return [(f"{label} {lens}", strategy, knobs, lens, ctas)
            for lens in (LAYER_LENS if world == 2 else LAYER_LENS_AT_4) for label, strategy, knobs, ctas in SETTINGS]


MICRO_CASES = [(f"{w} {m} sp_baseline", w, m, n, k) for w, n, k in [("gemm_ag", 1536, 1024), ("gemm_rs", 1024, 1536)]
               for m in (1023, 4096)]
COLLECTIVE_CASES = [(f"{op} {ctas}", op, ctas) for op in ("all_reduce", "all_gather", "reduce_scatter") for ctas in BUDGETS]


def _launches(log, mark: int, budget: int | None) -> str | None:
    """What is wrong with the NCCL launches logged since `mark` (rank 0 logs them), or None:
    each a symmetric kernel (no multicast one), on at most `budget` channels and on exactly
    that many at least once."""
    launches = [x for x in log.since(mark) if x.nbytes > 64]  # not the tiny collectives of a registration
    if not launches:
        return "no NCCL launch logged"
    wrong = [x for x in launches if not x.symmetric or x.kernel not in SYMMETRIC_KERNELS]
    if wrong:
        return f"not a symmetric kernel: {wrong[0]}"
    channels = {x.channels for x in launches}
    if budget is not None and (max(channels) != budget):
        return f"channels {sorted(channels)}, budget {budget}"
    return None


def _run_cases(rank: int, world: int, log_dir: str) -> dict:
    from overlapbench.comm import buffers, paths
    from overlapbench.comm import run as comm_run
    from overlapbench.comm.cases import Case
    from overlapbench.distributed import runtime
    from overlapbench.distributed.nccl_log import TuningLog
    from overlapbench.model.layer import reference_forward
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.run import micro
    from overlapbench.timing.step import BuildContext

    rt = runtime.init(timeout_s=120)
    log = TuningLog(Path(log_dir) / f"nccl-{os.getpid()}.log")
    unavailable = rt.nccl_windows_unavailable()
    if unavailable:
        return {"unavailable": unavailable}
    out: dict = {}

    def launches(mark, budget):
        return _launches(log, mark, budget) if rank == 0 else None

    for label, op, ctas in COLLECTIVE_CASES:
        try:
            count = COLLECTIVE_BYTES // 2
            case = Case(op, "nccl_symm", "nccl", ctas, COLLECTIVE_BYTES, count, "bf16", seed=3, window=True)
            bench = paths.build(rt, case, buffers.Buffers(rt, [case]))
            mark = log.mark()
            wrong = comm_run.check(bench, case.seed, rt)
            out[label] = wrong if wrong else launches(mark, None if ctas == DEFAULT else ctas)
        except Exception as e:
            out[label] = distributed.error_text(e)
        torch.cuda.synchronize()

    stack = build_stack(SHAPE, LAYERS, world, rank, torch.bfloat16, rt.device, seed=0)
    for label, strategy, knobs, lens, budget in layer_cases(world):
        try:
            ref = reference_forward(SHAPE, LAYERS, world, lens, torch.bfloat16, rt.device)
            ctx = BuildContext(rt, stack, lens, RopeTable(SHAPE, max(lens), rt.device), MAX_TOKENS)
            step = distributed.build_step(ctx, strategy, knobs)
            x = random_input(sum(lens), SHAPE.hidden, 0, torch.bfloat16, rt.device)
            mark = log.mark()
            y = step.forward(x)
            torch.cuda.synchronize()
            out[f"log {label}"] = launches(mark, budget)  # the forward's launches, not to_full's gather
            errors = [distributed.rel_err(step.to_full(y), ref), distributed.rel_err(step.to_full(step.forward(x)), ref)]
            out[label] = max(errors)
            out[f"graph {label}"] = distributed.rel_err(step.to_full(distributed.graph_forward(step, x)), ref)
        except Exception as e:
            out[label] = distributed.error_text(e)
        torch.cuda.synchronize()

    for label, workload, m, n, k in MICRO_CASES:
        try:
            point = Point("gpu", "custom", None, world, "bf16", 1, 0, (m,), "sp_baseline", {"nccl_symm": True},
                          workload, Gemm(n, k))
            ctx, x = micro.build(rt, point, torch.bfloat16, MAX_TOKENS)
            ref = micro.reference(workload, m, n, k, world, 0, torch.bfloat16, rt.device)[rank]
            step = distributed.build_step(ctx, "sp_baseline", {"nccl_symm": True})
            out[label] = distributed.rel_err(step.to_full(step.forward(x)), ref)
            out[f"graph {label}"] = distributed.rel_err(step.to_full(distributed.graph_forward(step, x)), ref)
        except Exception as e:
            out[label] = distributed.error_text(e)
        torch.cuda.synchronize()
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> distributed.Launches:
    def launch(world: int) -> list[dict]:
        folder = tmp_path_factory.mktemp(f"nccl-log-ws{world}")
        tuning = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "TUNING", "NCCL_DEBUG_FILE": str(folder / "nccl-%p.log")}
        with pytest.MonkeyPatch.context() as env:  # the spawned processes' NCCL, not this one's
            for name, value in tuning.items():
                env.setenv(name, value)
            found = distributed.run(_run_cases, str(folder), world=world, timeout=400, backend="nccl")
        if "unavailable" in found[0]:
            pytest.fail(f"NCCL windows cannot be registered on this machine: {found[0]['unavailable']}")
        return found

    return distributed.Launches(launch)


@pytest.mark.parametrize(("world", "label"), distributed.world_params([c[0] for c in COLLECTIVE_CASES]))
def test_collectives_on_windows_are_exact_and_run_symmetric_kernels_on_their_budget(results, world, label):
    for rank, found in enumerate(results(world)):
        assert found[label] is None, f"rank {rank}: {found[label]}"  # #wrong, or what the log says, or the error


@pytest.mark.parametrize(("world", "label"), distributed.world_params(
    lambda world: [c[0] for c in layer_cases(world)] + [c[0] for c in MICRO_CASES]))
def test_strategy_matches_reference_eager_and_replayed(results, world, label):
    distributed.assert_eager_and_replayed_within(results(world), label, world)


@pytest.mark.parametrize(("world", "label"), distributed.world_params(lambda world: [c[0] for c in layer_cases(world)]))
def test_each_nccl_launch_of_a_forward_is_a_symmetric_kernel_on_its_budget(results, world, label):
    found = results(world)[0]
    assert found[f"log {label}"] is None, found[f"log {label}"]
