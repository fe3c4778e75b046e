"""The SP strategies on 2 and 4 GPUs (NCCL, bf16): sp_baseline, async_tp and flash_agrs (both
transports, both orders, over-decomposed) against the single-GPU reference, on a small shape
and a Llama-3-8B-sized point, token counts the world size does not divide included; the micro
workloads against their unsharded reference; and CUDA-graph replay of each strategy. Every case
runs at each world size (the pieces' rank order and the uneven shards change with it).

One set of processes per world size runs every case in lockstep and reports a relative error or
the error text per case, so each case fails on its own; a hang fails them all at the timeout.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from overlapbench.distributed.runtime import apply_safe_env  # noqa: E402
from overlapbench.model.models import PRESETS, ModelShape  # noqa: E402
from overlapbench.tuning.rows import Gemm, Point  # noqa: E402
from tests import distributed  # noqa: E402

pytestmark = distributed.two_gpus()

apply_safe_env()  # no NVLink multicast, in the spawned processes too
LAYERS = 2
MAX_TOKENS = 8192  # sizes the symmetric buffers once for every case
SHAPES = {"small": ModelShape(hidden=512, ffn=1024, heads=8, kv_heads=4, head_dim=64), "llama3-8b": PRESETS["llama3-8b"]}
FLASH_SETTINGS = [
    {"transport": t, "order": o} for t in ("copy_engine", "sm") for o in ("local_first_last", "ring")
] + [
    {"transport": "copy_engine", "chunks_per_rank": 4},
    {"transport": "copy_engine", "attention": "per_piece"},
    {"transport": "sm", "comm_ctas": 4, "order": "ring", "chunks_per_rank": 2, "attention": "per_piece"},
]
ALL = [("sp_baseline", {}), ("async_tp", {})] + [("flash_agrs", k) for k in FLASH_SETTINGS]
FEW = [
    ("sp_baseline", {}), ("async_tp", {}), ("flash_agrs", {"chunks_per_rank": 2}),
    ("flash_agrs", {"transport": "sm", "comm_ctas": 16}), ("flash_agrs", {"attention": "per_piece"}),
]


def _label(*parts) -> str:
    return " ".join(str(p) for p in parts)


# (label, shape, seq_lens, strategy, knobs)
LAYER_CASES = [
    (_label("small", lens, s, k), "small", lens, s, k)
    for lens in [(1000,), (1023,), (300, 257, 5)]
    for s, k in ALL
] + [(_label("llama3-8b", (4097,), s, k), "llama3-8b", (4097,), s, k) for s, k in FEW]
# (label, workload, m, n, k, strategy, knobs)
MICRO_CASES = [
    (_label(w, m, s, kn), w, m, n, k, s, kn)
    for w, n, k in [("gemm_ag", 1536, 1024), ("gemm_rs", 1024, 1536)]
    for m in (1023, 4096)
    for s, kn in FEW + [("flash_agrs", {"order": "ring"})]
]
# Replayed from a CUDA graph, as the sweep times them.
GRAPH_CASES = [(_label("graph", s, k), "small", (1023,), s, k)
               for s, k in FEW + [("flash_agrs", {"transport": "sm", "chunks_per_rank": 4})]]


def _run_cases(rank: int, world: int) -> dict:
    from overlapbench.distributed import runtime
    from overlapbench.model.layer import reference_forward
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.run import micro
    from overlapbench.timing.step import BuildContext

    rt = runtime.init(timeout_s=120)
    errors: dict = {}

    stacks, refs = {}, {}
    for label, shape_name, lens, strategy, knobs in LAYER_CASES + GRAPH_CASES:
        shape = SHAPES[shape_name]
        try:
            if shape_name not in stacks:
                stacks.clear()
                stacks[shape_name] = build_stack(shape, LAYERS, world, rank, torch.bfloat16, rt.device, seed=0)
            if (shape_name, lens) not in refs:
                refs[(shape_name, lens)] = reference_forward(shape, LAYERS, world, lens, torch.bfloat16, rt.device)
            ref = refs[(shape_name, lens)]
            ctx = BuildContext(rt, stacks[shape_name], lens, RopeTable(shape, max(lens), rt.device), MAX_TOKENS)
            step = distributed.build_step(ctx, strategy, knobs)
            x = random_input(sum(lens), shape.hidden, 0, torch.bfloat16, rt.device)
            if label.startswith("graph"):
                errors[label] = distributed.rel_err(step.to_full(distributed.graph_forward(step, x, replays=2)), ref)
            else:
                first = distributed.rel_err(step.to_full(step.forward(x)), ref)
                errors[label] = max(first, distributed.rel_err(step.to_full(step.forward(x)), ref))
        except Exception as e:
            errors[label] = distributed.error_text(e)
        torch.cuda.synchronize()
    stacks.clear()
    refs.clear()

    for label, workload, m, n, k, strategy, knobs in MICRO_CASES:
        try:
            point = Point("gpu", "custom", None, world, "bf16", 1, 0, (m,), strategy, knobs, workload, Gemm(n, k))
            ctx, x = micro.build(rt, point, torch.bfloat16, MAX_TOKENS)
            ref = micro.reference(workload, m, n, k, world, 0, torch.bfloat16, rt.device)[rank]
            step = distributed.build_step(ctx, strategy, knobs)
            errors[label] = distributed.rel_err(step.to_full(step.forward(x)), ref)
            graph_label = _label("graph", label)  # replayed from a CUDA graph, as the sweep times it
            errors[graph_label] = distributed.rel_err(step.to_full(distributed.graph_forward(step, x, replays=2)), ref)
        except Exception as e:
            errors[label] = distributed.error_text(e)
        torch.cuda.synchronize()
    return errors


@pytest.fixture(scope="module")
def results() -> distributed.Launches:
    return distributed.nccl_launches(_run_cases, timeout=300)


LABELS = [c[0] for c in LAYER_CASES + GRAPH_CASES + MICRO_CASES] + [_label("graph", c[0]) for c in MICRO_CASES]


@pytest.mark.parametrize(("world", "label"), distributed.world_params(LABELS))
def test_case_matches_reference(results, world, label):
    tol = distributed.bf16_tolerance(world)
    for rank, errors in enumerate(results(world)):
        err = errors[label]
        assert isinstance(err, float), f"rank {rank}: {err}"
        assert err < tol, f"rank {rank}: rel err {err:.3g} >= {tol:.3g}"
