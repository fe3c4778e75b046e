"""The attention details on 2 and 4 GPUs (NCCL, bf16): a shape with a QKV bias and Qwen3's q/k
norms (and heads * head_dim != hidden), under every registered strategy at its defaults and the
symmetric-memory variants of the split and SP families, eager and replayed from a CUDA graph,
against the single-GPU reference. The bias is added in the QKV GEMM (addmm) in the all-reduce
family and after the fused all-gather GEMM in the SP family: both must match. At 4 ranks (one KV
head and its bias shard per rank) every setting runs eagerly on the batch of several sequences
only: the graph replays and the single sequence run at 2.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from overlapbench.distributed.runtime import apply_safe_env  # noqa: E402
from overlapbench.model.models import ModelShape  # noqa: E402
from tests import distributed  # noqa: E402

pytestmark = distributed.two_gpus()

apply_safe_env()  # no NVLink multicast, in the spawned processes too
LAYERS = 2
MAX_TOKENS = 4096
SHAPE = ModelShape(hidden=384, ffn=1024, heads=8, kv_heads=4, head_dim=64, eps=1e-6, rope_theta=1e6,
                   qkv_bias=True, qk_norm=True)
VARIANTS = [
    ("fused_norm", {}), ("token_split", {"comm": "fused"}), ("iso", {"comm": "fused"}),
    ("flash_agrs", {"transport": "sm", "comm_ctas": 16}), ("flash_agrs", {"attention": "per_piece"}),
]
SEQ_LENS = [(1023,), (300, 257, 5)]


def _settings(world: int) -> list[tuple[str, dict]]:
    from overlapbench import strategies

    strategies.load_plugins()
    defaults = [(c.name, {}) for c in strategies.all_strategies() if "layer" in c.needs.workloads
                and c.needs.min_world_size <= world and c.is_checked(c.check_knobs({}, c.name))]
    return defaults + [v for v in VARIANTS if v not in defaults]


def cases(world: int) -> list[tuple[str, str, dict, tuple[int, ...]]]:
    """(label, strategy, knobs, seq_lens) of the cases run at `world` ranks."""
    if world > 2:
        return [(f"{s} {k} {SEQ_LENS[1]}", s, k, SEQ_LENS[1]) for s, k in _settings(world)]
    return ([(f"{s} {k} {lens}", s, k, lens) for s, k in _settings(world) for lens in SEQ_LENS]
            + [(f"graph {s} {k} {lens}", s, k, lens) for s, k in _settings(world) for lens in SEQ_LENS[:1]])


def _graph_forward(step, x):
    """The step's output from a CUDA-graph replay (eager where the step is not graphable)."""
    return distributed.graph_forward(step, x) if step.graphable else step.forward(x)


def _run(rank: int, world: int) -> dict:
    from overlapbench.distributed import runtime
    from overlapbench.model.layer import reference_forward
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.timing.step import BuildContext

    rt = runtime.init(timeout_s=120)
    stack = build_stack(SHAPE, LAYERS, world, rank, torch.bfloat16, rt.device, seed=0)
    errors: dict = {}
    for label, strategy, knobs, lens in cases(world):
        try:
            ref = reference_forward(SHAPE, LAYERS, world, lens, torch.bfloat16, rt.device)
            ctx = BuildContext(rt, stack, lens, RopeTable(SHAPE, max(lens), rt.device), MAX_TOKENS)
            step = distributed.build_step(ctx, strategy, knobs)
            x = random_input(sum(lens), SHAPE.hidden, 0, torch.bfloat16, rt.device)
            out = _graph_forward(step, x) if label.startswith("graph") else step.forward(x)
            errors[label] = distributed.rel_err(step.to_full(out), ref)
        except Exception as e:
            errors[label] = distributed.error_text(e)
        torch.cuda.synchronize()
    return errors


@pytest.fixture(scope="module")
def results() -> distributed.Launches:
    return distributed.nccl_launches(_run, timeout=300)


@pytest.mark.parametrize(("world", "label"), distributed.world_params(lambda world: [c[0] for c in cases(world)]))
def test_case_matches_reference(results, world, label):
    tol = distributed.bf16_tolerance(world)
    for rank, errors in enumerate(results(world)):
        err = errors[label]
        assert isinstance(err, float), f"rank {rank}: {err}"
        assert err < tol, f"rank {rank}: rel err {err:.3g} >= {tol:.3g}"
