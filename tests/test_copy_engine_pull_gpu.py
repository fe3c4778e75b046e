"""`comm: copy_engine_pull` on 2 and 4 GPUs (NCCL, bf16): token_split (equal and balanced cuts, 2
and 4 chunks) and iso with the copy engines pulling every peer's partial on the side stream and
the add + norm on the main stream match the single-GPU reference, eager and replayed from a CUDA
graph, at a few token counts (an odd one included); every rank's output is bit-identical to rank
0's (every rank sums the same partials in rank order). All cases run back to back in one set of
processes, sharing the run's one pull buffer, as a sweep's points do.

One set of processes per world size runs every case in lockstep and reports per case, so each
case fails on its own; a hang fails them all at the timeout. The protocol on CPU threads is
tests/test_copy_engine_pull.py's.
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
MAX_TOKENS = 4096  # sizes the pull buffer once for every case
SHAPE = ModelShape(hidden=512, ffn=1024, heads=8, kv_heads=4, head_dim=64)
PULL = {"comm": "copy_engine_pull"}

# (seq_lens, strategy, knobs)
SETTINGS = [
    *(((n,), "token_split", PULL) for n in (256, 1023, 4096)),
    ((1023,), "token_split", PULL | {"split_ratio": "balanced"}),
    ((1023,), "token_split", PULL | {"chunks": 4}),
    ((300, 257, 5), "token_split", PULL | {"split_ratio": "balanced", "chunks": 4}),
    ((1023,), "iso", PULL),
    ((300, 257, 5), "iso", PULL | {"split_ratio": 0.4}),
]
CASES = [(f"{lens} {strategy} {knobs}", lens, strategy, knobs) for lens, strategy, knobs in SETTINGS]
LABELS = [c[0] for c in CASES]


def _run_cases(rank: int, world: int) -> dict:
    from overlapbench.distributed import runtime
    from overlapbench.model.layer import reference_forward
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.timing.step import BuildContext

    rt = runtime.init(timeout_s=120)
    stack = build_stack(SHAPE, LAYERS, world, rank, torch.bfloat16, rt.device, seed=0)
    out: dict = {}
    for label, lens, strategy, knobs in CASES:
        try:
            ref = reference_forward(SHAPE, LAYERS, world, lens, torch.bfloat16, rt.device)
            ctx = BuildContext(rt, stack, lens, RopeTable(SHAPE, max(lens), rt.device), MAX_TOKENS)
            step = distributed.build_step(ctx, strategy, knobs)
            x = random_input(sum(lens), SHAPE.hidden, 0, torch.bfloat16, rt.device)
            eager = step.to_full(step.forward(x)).clone()
            again = step.to_full(step.forward(x)).clone()
            replayed = step.to_full(distributed.graph_forward(step, x)).clone()
            out[label] = max(distributed.rel_err(eager, ref), distributed.rel_err(again, ref))
            out[f"graph {label}"] = distributed.rel_err(replayed, ref)
            out[f"outputs {label}"] = (eager.cpu(), replayed.cpu())
        except Exception as e:
            out[label] = distributed.error_text(e)
        torch.cuda.synchronize()
    return out


@pytest.fixture(scope="module")
def results() -> distributed.Launches:
    return distributed.nccl_launches(_run_cases)


@pytest.mark.parametrize(("world", "label"), distributed.world_params(LABELS))
def test_pull_settings_match_the_reference_eager_and_replayed(results, world, label):
    distributed.assert_eager_and_replayed_within(results(world), label, world)


@pytest.mark.parametrize(("world", "label"), distributed.world_params(LABELS))
def test_every_rank_gets_the_same_bits(results, world, label):
    found = results(world)
    first = found[0].get(f"outputs {label}")
    assert first is not None, f"rank 0: {found[0][label]}"
    for rank in range(1, world):
        outputs = found[rank].get(f"outputs {label}")
        assert outputs is not None, f"rank {rank}: {found[rank][label]}"
        for kind, mine, ranks0 in zip(("eager", "replayed"), outputs, first):
            assert torch.equal(mine, ranks0), f"rank {rank}, {kind}: differs from rank 0"
