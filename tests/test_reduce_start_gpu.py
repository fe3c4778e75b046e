"""`reduce_start: after_next_gemm` on 2 and 4 GPUs (NCCL, bf16): token_split (2 and 3 chunks) and
iso, with each reduction waiting for the next chunk's first GEMM, on every kind of transfer path
(NCCL's ring, its symmetric kernel, the fused all-reduce + norm kernel, the copy engines, the copy
engines' pull), match the single-GPU reference eager and replayed from a CUDA graph, give the same
bits as the same setting at `ready`, and record one first-GEMM event per gated reduction in each
forward (none at `ready`). All cases run back to back in one set of processes, as a sweep's points
do.

One set of processes per world size runs every case in lockstep and reports per case, so each
case fails on its own; a hang fails them all at the timeout. The schedule and the CPU forward:
tests/test_reduce_start.py.
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
MAX_TOKENS = 4096  # sizes the symmetric buffers once for every case
SHAPE = ModelShape(hidden=512, ffn=1024, heads=8, kv_heads=4, head_dim=64)
LATE = {"reduce_start": "after_next_gemm"}

# (seq_lens, strategy, knobs), each at after_next_gemm beside its ready twin
SETTINGS = [
    ((1023,), "token_split", {"comm": "nccl"}),
    ((1023,), "token_split", {"comm": "nccl_symm", "comm_ctas_attn": 16, "comm_ctas_mlp": 16}),
    ((1023,), "token_split", {"comm": "fused", "comm_ctas_attn": 16, "comm_ctas_mlp": 16}),
    ((300, 257, 5), "token_split", {"comm": "fused", "comm_ctas_attn": 16, "comm_ctas_mlp": 16, "chunks": 3}),
    ((4096,), "token_split", {"comm": "copy_engine", "comm_ctas_attn": 32, "comm_ctas_mlp": 32}),
    ((1023,), "token_split", {"comm": "copy_engine_pull"}),
    ((300, 257, 5), "iso", {"comm": "fused", "comm_ctas": 16}),
]
CASES = [(f"{lens} {strategy} {knobs}", lens, strategy, knobs) for lens, strategy, knobs in SETTINGS]
LABELS = [c[0] for c in CASES]


def _run_cases(rank: int, world: int) -> dict:
    from overlapbench.distributed import runtime
    from overlapbench.model.layer import reference_forward
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.overlap import split
    from overlapbench.timing.step import BuildContext

    recorded: list[int] = []  # gating computes that recorded their first-GEMM event, per forward
    gate = split.Lanes.first_gemm_done

    def counted(self, j):
        record = gate(self, j)
        if record is None:
            return None
        return lambda: recorded.append(j) or record()

    split.Lanes.first_gemm_done = counted
    rt = runtime.init(timeout_s=120)
    stack = build_stack(SHAPE, LAYERS, world, rank, torch.bfloat16, rt.device, seed=0)
    out: dict = {}
    for label, lens, strategy, knobs in CASES:
        try:
            ref = reference_forward(SHAPE, LAYERS, world, lens, torch.bfloat16, rt.device)
            ctx = BuildContext(rt, stack, lens, RopeTable(SHAPE, max(lens), rt.device), MAX_TOKENS)
            x = random_input(sum(lens), SHAPE.hidden, 0, torch.bfloat16, rt.device)
            bits = {}
            for start, setting in (("ready", knobs), ("late", knobs | LATE)):
                step = distributed.build_step(ctx, strategy, setting)
                recorded.clear()
                eager = step.to_full(step.forward(x)).clone()
                out[f"events {start} {label}"] = len(recorded)
                bits[start] = distributed.digest(eager)
                if start == "late":
                    again = step.to_full(step.forward(x)).clone()
                    replayed = step.to_full(distributed.graph_forward(step, x)).clone()
                    out[label] = max(distributed.rel_err(eager, ref), distributed.rel_err(again, ref))
                    out[f"graph {label}"] = distributed.rel_err(replayed, ref)
            out[f"bits {label}"] = bits
        except Exception as e:
            out[label] = distributed.error_text(e)
        torch.cuda.synchronize()
    return out


@pytest.fixture(scope="module")
def results() -> distributed.Launches:
    return distributed.nccl_launches(_run_cases)


@pytest.mark.parametrize(("world", "label"), distributed.world_params(LABELS))
def test_after_next_gemm_matches_the_reference_eager_and_replayed(results, world, label):
    distributed.assert_eager_and_replayed_within(results(world), label, world)


@pytest.mark.parametrize(("world", "label"), distributed.world_params(LABELS))
def test_the_same_bits_as_ready_and_one_event_per_gated_reduction(results, world, label):
    for rank, found in enumerate(results(world)):
        bits = found.get(f"bits {label}")
        assert bits is not None, f"rank {rank}: {found[label]}"
        assert bits["late"] == bits["ready"], f"rank {rank}: after_next_gemm changed the output"
        assert found[f"events ready {label}"] == 0, f"rank {rank}: ready recorded first-GEMM events"
        chunks = next(c[3] for c in CASES if c[0] == label).get("chunks", 2)
        gated = LAYERS * 2 * chunks - 1  # every reduction but the stack's last
        assert found[f"events late {label}"] == gated, f"rank {rank}: {found[f'events late {label}']} events, not {gated}"
