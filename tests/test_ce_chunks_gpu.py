"""`ce_chunks` and `ce_out` on 2 and 4 GPUs (NCCL, bf16): token_split with comm=copy_engine at
ce_chunks 1 (the serial schedule), 2 and 4 and auto, and iso and fused_norm at one count each,
match the single-GPU reference eager and replayed from a CUDA graph; every call of the
copy-engine kernel runs the count asked (the pieces its plan is cut into), `auto` the kernel's own
count by size. The `ce_out: kernel` cases (the add + norm kernel writes the rank's own output
rows, no local copy) match the reference too, every call asks the kernel for it, and their output
is the same bits as their `copy` twin's (the same setting without the knob). All settings run back
to back in one set of processes, so they share the run's one copy-engine buffer, as a sweep's
points do.

At the small shape a call's rows are far below the automatic count's 8 MiB pieces, so `auto` is
1 there; the llama3-8b cases (8192 tokens cut in equal halves: 16 MiB of a rank's rows per call
at 2 ranks) make it 2.

One set of processes per world size runs every case in lockstep and reports per case, so each
case fails on its own; a hang fails them all at the timeout. The protocol on CPU threads is
tests/test_copy_engine_norm.py's and tests/test_ce_out.py's, the knobs' rules
tests/test_ce_chunks.py's and tests/test_ce_out.py's. Only the ce_out cases: -k ce_out.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from overlapbench.distributed.runtime import apply_safe_env  # noqa: E402
from overlapbench.model.models import PRESETS, ModelShape  # noqa: E402
from tests import distributed  # noqa: E402

pytestmark = distributed.two_gpus()

apply_safe_env()  # no NVLink multicast, in the spawned processes too
LAYERS = 2
MAX_TOKENS = 8192  # sizes the copy-engine buffer once for every case
SHAPES = {"small": ModelShape(hidden=512, ffn=1024, heads=8, kv_heads=4, head_dim=64), "llama3-8b": PRESETS["llama3-8b"]}
SPLIT = {"comm": "copy_engine", "comm_ctas_attn": 32, "comm_ctas_mlp": 32}

# (shape, seq_lens, strategy, knobs)
SETTINGS = [
    *(("small", lens, "token_split", SPLIT | {"ce_chunks": c}) for lens in [(1023,), (300, 257, 5)] for c in (1, 2, 4, "auto")),
    ("small", (1023,), "token_split", SPLIT | {"split_ratio": "balanced", "ce_chunks": 2}),
    ("small", (1023,), "token_split", SPLIT | {"split_ratio": "balanced", "chunks": 4, "ce_chunks": 4}),
    ("small", (300, 257, 5), "iso", {"comm": "copy_engine", "comm_ctas": 16, "ce_chunks": 2}),
    ("small", (1023,), "fused_norm", {"comm": "copy_engine", "comm_ctas": 16, "ce_chunks": 1}),
    *(("llama3-8b", (8192,), "token_split", SPLIT | {"ce_chunks": c}) for c in (1, 4, "auto")),
]
# the add + norm kernel writes the rank's own output rows: each has its copy twin above (its knobs less ce_out)
KERNEL_OUT = {"ce_out": "kernel"}
SETTINGS += [
    *(("small", (1023,), "token_split", SPLIT | {"ce_chunks": c} | KERNEL_OUT) for c in (1, 2, "auto")),
    ("small", (300, 257, 5), "iso", {"comm": "copy_engine", "comm_ctas": 16, "ce_chunks": 2} | KERNEL_OUT),
    ("small", (1023,), "fused_norm", {"comm": "copy_engine", "comm_ctas": 16, "ce_chunks": 1} | KERNEL_OUT),
    ("llama3-8b", (8192,), "token_split", SPLIT | {"ce_chunks": "auto"} | KERNEL_OUT),
]
CASES = [(f"{shape} {lens} {strategy} {knobs}", shape, lens, strategy, knobs) for shape, lens, strategy, knobs in SETTINGS]
LABELS = [c[0] for c in CASES]
CE_OUT_LABELS = [c[0] for c in CASES if "ce_out" in c[4]]


def _twin(label: str) -> str:
    """The `copy` case of a `ce_out: kernel` case: the same shape, lengths, strategy and knobs less ce_out."""
    _, shape, lens, strategy, knobs = next(c for c in CASES if c[0] == label)
    plain = {k: v for k, v in knobs.items() if k != "ce_out"}
    return next(c[0] for c in CASES if c[1:4] == (shape, lens, strategy) and c[4] == plain)


def _run_cases(rank: int, world: int) -> dict:
    from kernels.copy_engine_norm import CopyEngineNorm
    from overlapbench.distributed import runtime
    from overlapbench.model.layer import reference_forward
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.timing.step import BuildContext

    pieces: list[tuple[int, int]] = []  # every call of the copy-engine kernel: (its chunk count, the count by size)
    writers: list = []  # every call's sm_out as asked (None: the instance's)
    plan, call = CopyEngineNorm._plan, CopyEngineNorm.__call__

    def recorded(self, row_start, row_end, chunks):
        pieces.append((chunks, self.chunk_count(row_end - row_start)))
        return plan(self, row_start, row_end, chunks)

    def recorded_call(self, *args, sm_out=None, **kwargs):
        writers.append(sm_out)
        return call(self, *args, sm_out=sm_out, **kwargs)

    CopyEngineNorm._plan, CopyEngineNorm.__call__ = recorded, recorded_call
    rt = runtime.init(timeout_s=120)
    out: dict = {}
    stacks: dict = {}
    for label, shape_name, lens, strategy, knobs in CASES:
        try:
            shape = SHAPES[shape_name]
            if shape_name not in stacks:
                stacks.clear()  # one model's weights at a time
                stacks[shape_name] = build_stack(shape, LAYERS, world, rank, torch.bfloat16, rt.device, seed=0)
            ref = reference_forward(shape, LAYERS, world, lens, torch.bfloat16, rt.device)
            ctx = BuildContext(rt, stacks[shape_name], lens, RopeTable(shape, max(lens), rt.device), MAX_TOKENS)
            step = distributed.build_step(ctx, strategy, knobs)
            x = random_input(sum(lens), shape.hidden, 0, torch.bfloat16, rt.device)
            pieces.clear()
            writers.clear()
            y = step.forward(x)
            torch.cuda.synchronize()
            out[f"pieces {label}"] = sorted(set(pieces))
            out[f"writers {label}"] = sorted(set(writers), key=str)
            out[f"bits {label}"] = distributed.digest(step.to_full(y))
            errors = [distributed.rel_err(step.to_full(y), ref), distributed.rel_err(step.to_full(step.forward(x)), ref)]
            out[label] = max(errors)
            out[f"graph {label}"] = distributed.rel_err(step.to_full(distributed.graph_forward(step, x)), ref)
        except Exception as e:
            out[label] = distributed.error_text(e)
        torch.cuda.synchronize()
    return out


@pytest.fixture(scope="module")
def results() -> distributed.Launches:
    return distributed.nccl_launches(_run_cases)


@pytest.mark.parametrize(("world", "label"), distributed.world_params(LABELS))
def test_copy_engine_settings_match_the_reference_eager_and_replayed(results, world, label):
    distributed.assert_eager_and_replayed_within(results(world), label, world)


@pytest.mark.parametrize(("world", "label"), distributed.world_params(LABELS))
def test_every_call_runs_the_count_asked(results, world, label):
    asked = next(c[4] for c in CASES if c[0] == label)["ce_chunks"]
    for rank, found in enumerate(results(world)):
        calls = found.get(f"pieces {label}")
        assert calls, f"rank {rank}: no call of the copy-engine kernel recorded ({found[label]})"
        if asked == "auto":
            assert all(used == by_size for used, by_size in calls), f"rank {rank}: {calls}"
            if label.startswith("llama3-8b") and world == 2:
                assert {used for used, _ in calls} == {2}, f"rank {rank}: {calls}"  # 16 MiB of own rows a call
        else:
            assert {used for used, _ in calls} == {asked}, f"rank {rank}: {calls}"


@pytest.mark.parametrize(("world", "label"), distributed.world_params(CE_OUT_LABELS))
def test_ce_out_kernel_asks_every_call_and_gives_the_bits_of_its_copy_twin(results, world, label):
    twin = _twin(label)
    for rank, found in enumerate(results(world)):
        assert found.get(f"writers {label}") == [True], f"rank {rank}: {found.get(f'writers {label}')} ({found[label]})"
        assert found.get(f"writers {twin}") == [False], f"rank {rank}: the copy twin asked {found.get(f'writers {twin}')}"
        assert found[f"bits {label}"] == found[f"bits {twin}"], f"rank {rank}: ce_out=kernel's output differs from {twin}'s"
