"""The sequence-parallel layer: the decomposition's bookkeeping (pure, world sizes 2-8), the P2P
copy kernel (Triton interpreter), and sp_baseline / flash_agrs against the single-process
reference on gloo processes (fp32), token counts the world size does not divide included."""

from __future__ import annotations

import pytest
import torch

from overlapbench import strategies
from overlapbench.errors import UserError
from overlapbench.model.layer import reference_forward
from overlapbench.model.models import PRESETS, ModelShape
from overlapbench.overlap.sp_schedule import ORDERS, Plan, ShardLayout, owner_order, pieces, schedule, transfers
from tests import distributed
from tests.fake_symmetric import FakeHandle, run_ranks

WORLDS = (2, 4, 8)
CHUNKS = (1, 2, 4)
TOKENS = (1, 7, 37, 64, 1001)

# ---------------------------------------------------------------------------------------------
# Bookkeeping


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("tokens", TOKENS)
def test_layout_pads_only_the_end(world, tokens):
    layout = ShardLayout(tokens, world)
    assert 0 <= layout.padded - tokens < world
    real = [layout.real_rows(r) for r in range(world)]
    assert real[0][0] == 0 and real[-1][1] == tokens
    assert all(a[1] == b[0] for a, b in zip(real, real[1:]))  # contiguous, in rank order
    assert all(hi - lo == layout.shard for lo, hi in real if hi < tokens)  # only the tail is short


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("chunks", CHUNKS)
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("phase", ["gather", "scatter"])
def test_every_rank_visits_every_row_once(world, tokens, chunks, order, phase):
    layout = ShardLayout(tokens, world)
    for rank in range(world):
        visited = schedule(layout, rank, chunks, order, phase)
        rows = sorted(r for p in visited for r in range(p.lo, p.hi))
        assert rows == list(range(layout.padded))
        for p in visited:  # a piece lies inside its owner's shard, at its offset
            lo, hi = layout.rows(p.owner)
            assert lo <= p.lo < p.hi <= hi and p.offset == p.lo - lo
        assert len({p.lo for p in visited}) == len(visited)  # first rows tell pieces apart (gloo tags)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("chunks", CHUNKS)
def test_local_first_for_gather_and_last_for_scatter(world, chunks):
    layout = ShardLayout(8 * world + 3, world)
    for rank in range(world):
        own = len(pieces(layout, rank, chunks))
        gather = schedule(layout, rank, chunks, "local_first_last", "gather")
        scatter = schedule(layout, rank, chunks, "local_first_last", "scatter")
        assert all(p.owner == rank for p in gather[:own]) and all(p.owner != rank for p in gather[own:])
        assert all(p.owner == rank for p in scatter[-own:]) and all(p.owner != rank for p in scatter[:-own])
        # peers in ring order after (gather) or before (scatter) the local slice
        assert owner_order(rank, world, "local_first_last", "gather") == [(rank + s) % world for s in range(world)]
        assert owner_order(rank, world, "local_first_last", "scatter")[:-1] == [(rank + s) % world for s in range(1, world)]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("phase", ["gather", "scatter"])
def test_rank_ordered_steps_are_permutations(world, phase):
    """local_first_last: at every step each rank sends one slice and receives one, so no link
    is shared; the local step moves nothing."""
    moves = [transfers(world, s, "local_first_last", phase) for s in range(world)]
    local_step = 0 if phase == "gather" else world - 1
    assert moves[local_step] == []
    for s, step in enumerate(moves):
        if s == local_step:
            continue
        assert sorted(src for src, _ in step) == list(range(world))
        assert sorted(dst for _, dst in step) == list(range(world))
        assert all(src != dst for src, dst in step)


@pytest.mark.parametrize("world", WORLDS)
def test_ring_order_queues_every_rank_on_one_owner(world):
    """ring: at step 0 every rank wants slice 0, so rank 0 serves all peers at once, and the
    reduce-scatter's last slice (world-1's) leaves after the last GEMM on every other rank."""
    assert transfers(world, 0, "ring", "gather") == [(0, r) for r in range(1, world)]
    assert transfers(world, world - 1, "ring", "scatter") == [(r, world - 1) for r in range(world - 1)]


def test_sends_and_receives_pair_up():
    """What a rank serves a peer is exactly what the peer fetches from it, in the peer's order."""
    plan = Plan(ShardLayout(37, 4), chunks=2, order="local_first_last")
    for rank in range(4):
        for peer in range(4):
            if peer == rank:
                continue
            assert plan.served(rank, peer) == [p for p in plan.gather(peer) if p.owner == rank]
            assert plan.received(rank, peer) == [p for p in plan.scatter(peer) if p.owner == rank]
            assert len(plan.served(rank, peer)) == len(pieces(plan.layout, rank, 2))


def test_unknown_order_is_rejected():
    with pytest.raises(ValueError, match="unknown order"):
        owner_order(0, 2, "zigzag", "gather")


# ---------------------------------------------------------------------------------------------
# Knobs


def test_flash_knobs():
    cls = strategies.get("flash_agrs")
    assert cls.check_knobs({"comm_ctas": 4}, "s")["comm_ctas"] is None  # copy_engine: irrelevant
    assert cls.check_knobs({"transport": "sm", "comm_ctas": 4}, "s")["comm_ctas"] == 4
    with pytest.raises(UserError, match="comm_ctas"):
        cls.check_knobs({"transport": "sm", "comm_ctas": None}, "s")
    with pytest.raises(UserError, match="chunks_per_rank"):
        cls.check_knobs({"chunks_per_rank": 3}, "s")
    assert "CUDA" in cls.skip_reason(cls.check_knobs({"transport": "sm"}, "s"), cuda=False)
    assert cls.skip_reason(cls.check_knobs({}, "s"), cuda=False) is None
    assert strategies.get("async_tp").needs.cuda and strategies.get("async_tp").needs.symmetric_memory


# ---------------------------------------------------------------------------------------------
# The P2P copy kernel (interpreter on CPU: the kernel's addressing, not its peer access)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_p2p_copy_moves_rows_between_tensors(dtype):
    from kernels import p2p

    src, dst, anchor = torch.randn(300, 64).to(dtype), torch.randn(50, 64).to(dtype), torch.zeros(8, dtype=dtype)
    p2p.copy(dst[10:40], src[200:230], num_ctas=3, anchor=anchor)
    assert torch.equal(dst[10:40], src[200:230])
    before = dst.clone()
    p2p.copy(dst[:5], src[:5], num_ctas=1)
    assert torch.equal(dst[:5], src[:5]) and torch.equal(dst[5:], before[5:])


def test_p2p_copy_rejects_what_it_cannot_vectorize():
    from kernels import p2p

    with pytest.raises(ValueError, match="16-byte"):
        p2p.copy(torch.zeros(3), torch.randn(3), num_ctas=1)
    with pytest.raises(ValueError, match="contiguous"):
        p2p.copy(torch.zeros(8, 4), torch.randn(4, 8).t(), num_ctas=1)


# ---------------------------------------------------------------------------------------------
# The SP layer on gloo processes

LAYERS = 2
TINY = PRESETS["tiny"]
FOUR_WAY = ModelShape(hidden=64, ffn=128, heads=4, kv_heads=4, head_dim=16)  # tp=4 divides its heads
FLASH = "flash_agrs"
# (strategy, knobs, sequence lengths): odd totals, several sequences, a rank holding only padding.
CASES_TP2 = [
    ("sp_baseline", {}, (37,)),
    ("sp_baseline", {}, (24, 13, 5)),
    ("sp_baseline", {}, (1,)),
    (FLASH, {}, (37,)),
    (FLASH, {"order": "ring"}, (24, 13, 5)),
    (FLASH, {"chunks_per_rank": 2}, (37,)),
    (FLASH, {"attention": "per_piece"}, (24, 13, 5)),
    (FLASH, {"attention": "per_piece", "chunks_per_rank": 4}, (37,)),  # query chunks cut the sequence: KV across chunks
    (FLASH, {"attention": "per_piece", "chunks_per_rank": 2, "order": "ring"}, (10, 20, 3)),
    (FLASH, {"attention": "per_piece", "chunks_per_rank": 4}, (3,)),  # fewer rows than pieces
]
CASES_TP4 = [  # four ranks: peers at different ring distances, two ranks of padding-free shards
    (FLASH, {}, (37,)),
    (FLASH, {"attention": "per_piece", "chunks_per_rank": 2}, (37,)),
    (FLASH, {"attention": "per_piece", "order": "ring"}, (11, 19)),
]


def _rank_forwards(rank: int, world: int, shape: ModelShape, cases: list):
    from overlapbench.distributed import runtime
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.timing.step import BuildContext

    rt = runtime.init(timeout_s=60)
    stack = build_stack(shape, LAYERS, world, rank, torch.float32, rt.device, seed=0)
    outs = []
    for strategy, knobs, seq_lens in cases:
        ctx = BuildContext(rt, stack, seq_lens, RopeTable(shape, max(seq_lens), rt.device), 64)
        cls = strategies.get(strategy)
        step = cls.build(ctx, cls.check_knobs(knobs, strategy))
        x = random_input(sum(seq_lens), shape.hidden, 0, torch.float32, rt.device)
        first = step.to_full(step.forward(x)).clone()
        second = step.to_full(step.forward(x)).clone()  # re-runnable (graphs replay it)
        outs.append((first, second))
    return outs


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


def _check_all(shape: ModelShape, world: int, cases: list) -> None:
    results = distributed.run(_rank_forwards, shape, cases, world=world)
    # The comparison is not vacuous: another seed's reference is far from the output.
    assert _rel_err(results[0][0][0], reference_forward(shape, LAYERS, world, cases[0][2], seed=1)) > 0.1
    failures = []
    for i, (strategy, knobs, seq_lens) in enumerate(cases):
        ref = reference_forward(shape, LAYERS, world, seq_lens)
        assert ref.shape == (sum(seq_lens), shape.hidden)
        for rank, outs in enumerate(results):
            for out in outs[i]:
                err = _rel_err(out, ref)
                if not err < 1e-5:
                    failures.append(f"{strategy} {knobs} {seq_lens} rank {rank}: rel err {err:.2e}")
    assert not failures, "\n".join(failures)


def _attention_calls(rank: int, world: int, attention: str) -> list[int]:
    """Query rows of every attention call of one forward."""
    from overlapbench.distributed import runtime
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.overlap import sequence_parallel
    from overlapbench.timing.step import BuildContext

    rt = runtime.init(timeout_s=60)
    stack = build_stack(TINY, LAYERS, world, rank, torch.float32, rt.device, seed=0)
    ctx = BuildContext(rt, stack, (37,), RopeTable(TINY, 37, rt.device), 64)
    cls = strategies.get(FLASH)
    step = cls.build(ctx, cls.check_knobs({"attention": attention, "chunks_per_rank": 2}, FLASH))
    calls, attend = [], sequence_parallel.attend

    def counting(stack, q, *args, **kwargs):
        calls.append(q.shape[0])
        return attend(stack, q, *args, **kwargs)

    sequence_parallel.attend = counting
    step.forward(random_input(37, TINY.hidden, 0, torch.float32, rt.device))
    return calls


@pytest.mark.parametrize("attention, per_layer", [("whole", [37]), ("per_piece", [9, 9, 9, 10])])
def test_attention_mode_decides_the_calls(attention, per_layer):
    """whole: one call over the sequence per layer; per_piece: one per O-proj piece, in the
    rank's order (rank 0 makes rank 1's rows first: 19..28, 28..37 and a padding row; then its
    own: 0..9, 9..19)."""
    rank0, _ = distributed.run(_attention_calls, attention, world=2)
    assert sorted(rank0) == sorted(per_layer * LAYERS)
    if attention == "per_piece":
        assert rank0[:4] == [9, 9, 9, 10]


@pytest.mark.slow
def test_sp_layer_matches_reference_tp2():
    _check_all(TINY, 2, CASES_TP2)


@pytest.mark.slow
def test_sp_layer_matches_reference_tp4():
    _check_all(FOUR_WAY, 4, CASES_TP4)


def _rank_async_tp_reference(rank: int, world: int, seq_lens: tuple, micro_cases: list):
    """async_tp's exchange with PyTorch's own reference versions of the fused ops (the CUDA ones
    compute the same, pipelined): checks our arguments (transposed weights, gather and scatter
    dims, row order) on CPU."""
    from types import SimpleNamespace

    import torch.distributed as dist
    from torch.distributed import _symmetric_memory as symm_mem

    from overlapbench.distributed import runtime
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.overlap.sequence_parallel import FusedExchange, sp_layout, sp_step
    from overlapbench.run import micro
    from overlapbench.timing.step import BuildContext
    from overlapbench.tuning.rows import Gemm, Point

    rt = runtime.init(timeout_s=60)
    ops = SimpleNamespace(
        fused_all_gather_matmul=symm_mem._fused_all_gather_matmul_fallback,
        fused_matmul_reduce_scatter=symm_mem._fused_matmul_reduce_scatter_fallback,
    )
    name = dist.group.WORLD.group_name
    stack = build_stack(TINY, LAYERS, world, rank, torch.float32, rt.device, seed=0)
    ctx = BuildContext(rt, stack, seq_lens, RopeTable(TINY, max(seq_lens), rt.device), 64)
    step = sp_step(ctx, FusedExchange(sp_layout(ctx), name, ops))
    outs = [step.to_full(step.forward(random_input(sum(seq_lens), TINY.hidden, 0, torch.float32, rt.device)))]
    for workload, m in micro_cases:
        point = Point("m", "tiny", None, world, "fp32", 1, 0, (m,), "async_tp", {}, workload, Gemm(40, 24))
        mctx, x = micro.build(rt, point, torch.float32, 64)
        mstep = sp_step(mctx, FusedExchange(sp_layout(mctx), name, ops))
        outs.append(mstep.to_full(mstep.forward(x)))
    return outs


@pytest.mark.slow
def test_async_tp_exchange_computes_the_reference():
    from torch.distributed import _symmetric_memory as symm_mem

    from overlapbench.run import micro

    if not hasattr(symm_mem, "_fused_all_gather_matmul_fallback"):
        pytest.skip("this torch has no reference versions of the fused symm_mem ops")
    micro_cases = [("gemm_ag", 37), ("gemm_rs", 37)]
    results = distributed.run(_rank_async_tp_reference, (24, 13), micro_cases)
    ref = reference_forward(TINY, LAYERS, 2, (24, 13))
    for rank, (layer_out, *micro_outs) in enumerate(results):
        assert _rel_err(layer_out, ref) < 1e-5
        for (workload, m), out in zip(micro_cases, micro_outs):
            assert _rel_err(out, micro.reference(workload, m, 40, 24, 2, seed=0)[rank]) < 1e-5


# ---------------------------------------------------------------------------------------------
# The symmetric-memory transport's bookkeeping, with threads as ranks over a fake symmetric
# memory (views of one process's tensors; synchronous copies, so the copy engine's: the Triton
# interpreter is not thread-safe): its views, offsets and slots, not the GPU's streams.


class _NoStream:
    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass


class _NoEvent:
    def record(self, stream=None):
        pass


@pytest.mark.parametrize(
    "world, tokens, order, chunks",
    [(2, 37, "local_first_last", 1), (2, 37, "ring", 2), (4, 37, "local_first_last", 2), (4, 3, "ring", 1)],
)
def test_symmetric_transport_gathers_and_scatters(monkeypatch, world, tokens, order, chunks):
    import contextlib

    from overlapbench.distributed.runtime import SymmetricBuffer
    from overlapbench.overlap import flash_overlap as fo

    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _NoStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", _NoEvent)
    k, n = 16, 24
    plan = Plan(ShardLayout(tokens, world), chunks, order)
    layout = plan.layout
    a_full = torch.randn(layout.padded, k)
    a_full[tokens:] = 0
    weights = [torch.randn(n, k) for _ in range(world)]
    partial_inputs = [torch.randn(layout.padded, k) for _ in range(world)]
    sizes = dict(max_shard=layout.shard + 3, gather_width=k, scatter_width=n)  # a point smaller than the buffers
    elems = 2 * fo._round(sizes["max_shard"] * k) + 2 * fo._round(world * sizes["max_shard"] * n)
    bufs = [torch.full((elems,), float("nan")) for _ in range(world)]
    handle = FakeHandle(bufs, world)

    def rank_main(rank):
        sym = SymmetricBuffer(bufs[rank], handle, "fake", rank, world, offset=0)
        buffers = fo.SymmetricBuffers(sym, world, **sizes)
        transport = fo.SymmetricTransport(buffers, plan, rank, lambda dst, src: dst.copy_(src), _NoStream())
        ex = fo.FlashExchange(plan, rank, transport, k, n, torch.float32, "cpu")
        found = []
        for block in (0, 1):  # both blocks' regions, twice (buffers are reused)
            for _ in range(2):
                lo, hi = layout.rows(rank)
                shard = ex.shard_buffer(block).copy_(a_full[lo:hi])
                gathered = ex.gather_matmul(block, shard, weights[rank]).clone()
                scattered = ex.matmul_scatter(block, lambda a, b: partial_inputs[rank][a:b], weights[rank]).clone()
                ex.fence()
                found.append((gathered, scattered))
        return found

    rank_main.handle = handle  # a failing rank aborts the barriers (run_ranks)
    results = run_ranks(world, rank_main)
    total = sum(x @ w.t() for x, w in zip(partial_inputs, weights))
    for rank in range(world):
        lo, hi = layout.rows(rank)
        for gathered, scattered in results[rank]:
            torch.testing.assert_close(gathered, a_full @ weights[rank].t())
            torch.testing.assert_close(scattered, total[lo:hi])
