"""Triton kernels on CPU, in Triton's interpreter.

The all-reduce kernel runs for real: W forked processes play the W ranks, their buffers and
signal pads in shared memory, exactly as the kernel sees peers through symmetric memory. The
interpreter runs a grid's CTAs one after another, in the same order on every rank, so each
per-CTA barrier meets its peers: a kernel whose CTA read rows that another CTA pushed would
read them too early and fail here.

Long because v1, v2 push and v2 pull share one emulated-rank harness (forked ranks, fresh inputs).
"""

from __future__ import annotations

import multiprocessing

import pytest

from tests.interpreter import use_interpreter

triton = use_interpreter()  # before anything imports triton
torch = pytest.importorskip("torch")
import triton.language as tl  # noqa: E402

from kernels import allreduce_norm as arn  # noqa: E402
from kernels.rmsnorm import add_rmsnorm_reference, fused_add_rmsnorm  # noqa: E402
from overlapbench.model.models import ModelShape  # noqa: E402

EPS = 1e-6


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# ---------------------------------------------------------------- fused_add_rmsnorm


@pytest.mark.parametrize("rows,hidden", [(1, 64), (3, 96), (17, 128), (33, 1000), (5, 4096)])
def test_fused_add_rmsnorm_matches_reference(rows: int, hidden: int) -> None:
    g = torch.Generator().manual_seed(rows * 7919 + hidden)
    x, residual = torch.randn(rows, hidden, generator=g), torch.randn(rows, hidden, generator=g)
    weight = torch.randn(hidden, generator=g)
    ref_res, before = residual.clone(), residual.clone()
    ref_out = add_rmsnorm_reference(x, ref_res, weight, EPS)
    out = fused_add_rmsnorm(x, residual, weight, EPS)
    assert rel_err(out, ref_out) < 1e-5
    assert rel_err(residual, ref_res) < 1e-6, "residual must be updated in place"
    assert rel_err(residual, before + x) < 1e-6


def test_fused_add_rmsnorm_writes_into_out_with_row_strides() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 160, generator=g)[:, :96]  # row stride 160, not 96
    residual, weight = torch.randn(7, 96, generator=g), torch.randn(96, generator=g)
    out = torch.full((7, 128), float("nan"))[:, :96]
    ref_res = residual.clone()
    ref_out = add_rmsnorm_reference(x, ref_res, weight, EPS)
    assert fused_add_rmsnorm(x, residual, weight, EPS, out=out).data_ptr() == out.data_ptr()
    assert rel_err(out, ref_out) < 1e-5 and rel_err(residual, ref_res) < 1e-6


# ---------------------------------------------------------------- index arithmetic


@triton.jit
def _row_block_probe(out_ptr, n_rows, WORLD: tl.constexpr, LANES: tl.constexpr):
    q = tl.arange(0, LANES)
    lo, hi = arn._row_block(q, n_rows, WORLD)
    tl.store(out_ptr + 2 * q, lo, mask=q < WORLD)
    tl.store(out_ptr + 2 * q + 1, hi, mask=q < WORLD)


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("n_rows", [1, 3, 1000, 4097])
def test_row_blocks_partition_the_range(world: int, n_rows: int) -> None:
    blocks = [arn.row_block(n_rows, world, r) for r in range(world)]
    assert blocks[0][0] == 0 and blocks[-1][1] == n_rows
    assert all(blocks[r][1] == blocks[r + 1][0] for r in range(world - 1)), "contiguous, no gap or overlap"
    sizes = [hi - lo for lo, hi in blocks]
    assert max(sizes) - min(sizes) <= 1 and max(sizes) <= arn.slot_rows(n_rows, world)
    probe = torch.full((2 * world,), -1, dtype=torch.int32)
    _row_block_probe[(1,)](probe, n_rows, WORLD=world, LANES=world)
    assert probe.view(world, 2).tolist() == [list(b) for b in blocks], "kernel and host disagree"


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("hidden,elem", [(64, 4), (96, 4), (4096, 2), (5120, 2), (8192, 2), (8192, 4), (16384, 2)])
def test_tiling_steps_divide_and_fit(world: int, hidden: int, elem: int) -> None:
    t = arn.tiling(world, hidden, elem)
    pow2 = lambda x: x > 0 and x & (x - 1) == 0
    assert t.block_h >= hidden and t.peers >= world - 1 and t.lanes >= world
    for lanes, group in ((t.peers, t.scatter_lanes), (t.peers, t.reduce_lanes), (t.lanes, t.gather_lanes)):
        assert pow2(group) and lanes % group == 0
    for rows in (t.tile_rows, t.reduce_rows, t.gather_rows):
        assert pow2(rows) and t.tile_rows % rows == 0, "sub-steps must not cross a tile (CTA ownership)"
    row = t.block_h * elem
    assert t.scatter_lanes * t.tile_rows * row <= max(arn.STEP_BYTES, row)
    assert (t.reduce_lanes + 2) * t.reduce_rows * row <= max(arn.STEP_BYTES, 3 * row)
    assert arn.MAX_CTAS * arn.MAX_WORLD * 4 <= 2048, "flags must fit the smallest signal pad"


def test_buffer_has_room_for_every_staging_slot() -> None:
    for world in (2, 4, 8):
        for max_tokens in (1, 3, 1000, 4097):
            slot = arn.slot_rows(max_tokens, world)
            assert arn.buffer_rows(max_tokens, world) == max_tokens + (world - 1) * slot
            assert all(hi - lo <= slot for lo, hi in (arn.row_block(n, world, r)
                                                      for n in range(max_tokens + 1) for r in range(world)))


# ---------------------------------------------------------------- the all-reduce kernel on W emulated ranks


def _fresh(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _partial(rnd: int, rank: int, a: int, b: int, hidden: int) -> torch.Tensor:
    return _fresh(1_000_003 * rnd + 1009 * rank + a, b - a, hidden)


def _residual(rnd: int, a: int, b: int, hidden: int) -> torch.Tensor:
    return _fresh(7_000_001 * rnd + 31 * a + 5, b - a, hidden)


def _rank_main(rank, world, max_tokens, hidden, calls, rounds, bufs, pads, weight, res_all, out_all) -> None:
    """One emulated rank: like a layer, it writes fresh partials (as its GEMM would) right before
    each call, also over rows whose previous call has just returned, then calls the kernel."""
    torch.set_num_threads(1)
    me = bufs[rank].data_ptr()
    sym = arn.SymmetricRows(
        buf=bufs[rank],
        peer_off=torch.tensor([(b.data_ptr() - me) // 16 for b in bufs], dtype=torch.int64),
        pad_ptrs=torch.tensor([p.data_ptr() for p in pads], dtype=torch.int64),
        rank=rank, world=world, max_tokens=max_tokens,
    )
    for rnd in range(rounds):
        for a, b, ctas in calls:
            bufs[rank][a:b] = _partial(rnd, rank, a, b, hidden)
            residual, out = _residual(rnd, a, b, hidden), torch.empty(b - a, hidden)
            arn.reduce_norm(sym, a, b, residual, weight, EPS, out, ctas)
            res_all[rnd, rank, a:b], out_all[rnd, rank, a:b] = residual, out


def _run_forked(target, world: int, args: tuple, timeout: float, stuck: str) -> None:
    """target(rank, *args) on `world` forked processes (interpreted ranks sharing memory); fails
    naming the ranks still waiting after `timeout` s (`stuck` says on what) or a rank that failed."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=target, args=(r, *args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    hung = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not hung, f"ranks {hung} still waiting after {timeout:g} s{stuck}"
    assert [p.exitcode for p in procs] == [0] * world, "a rank failed (its traceback is in the captured stderr)"


def _emulate(world: int, hidden: int, calls: list[tuple[int, int, int]], rounds: int = 2) -> None:
    max_tokens = max(b for _, b, _ in calls) + 2  # the last rows are never in a range
    rows = arn.buffer_rows(max_tokens, world)
    bufs = [_fresh(90 + r, rows, hidden).share_memory_() for r in range(world)]
    untouched = [buf[max_tokens - 2:max_tokens].clone() for buf in bufs]
    pads = [torch.zeros(arn.SIGNAL_SLOTS, dtype=torch.int32).share_memory_() for _ in range(world)]
    weight = _fresh(77, hidden)
    res_all = torch.full((rounds, world, max_tokens, hidden), float("nan")).share_memory_()
    out_all = torch.full((rounds, world, max_tokens, hidden), float("nan")).share_memory_()

    _run_forked(_rank_main, world, (world, max_tokens, hidden, calls, rounds, bufs, pads, weight, res_all, out_all),
                120, ": a barrier never met")

    for rnd in range(rounds):
        for a, b, ctas in calls:
            total = sum(_partial(rnd, r, a, b, hidden) for r in range(world))
            ref_res = _residual(rnd, a, b, hidden)
            ref_out = add_rmsnorm_reference(total, ref_res, weight, EPS)
            where = f"round {rnd}, rows [{a}, {b}), {ctas} CTAs"
            for r in range(world):
                assert rel_err(res_all[rnd, r, a:b], ref_res) < 1e-5, f"residual, rank {r}, {where}"
                assert rel_err(out_all[rnd, r, a:b], ref_out) < 1e-5, f"out, rank {r}, {where}"
                assert torch.equal(res_all[rnd, r, a:b], res_all[rnd, 0, a:b]), f"residual differs, rank {r}, {where}"
                assert torch.equal(out_all[rnd, r, a:b], out_all[rnd, 0, a:b]), f"out differs, rank {r}, {where}"
    assert all(int(p.count_nonzero()) == 0 for p in pads), "barrier flags must return to 0 (graph replay)"
    assert all(torch.equal(buf[max_tokens - 2:max_tokens], u) for buf, u in zip(bufs, untouched)), \
        "rows outside the ranges were written"


# Token counts as ranges issued back to back, with CTA budgets from 1 to MAX_CTAS. Fewer rows and
# CTAs on 4 and 8 ranks: every CTA's barriers make all interpreted ranks meet on the 2 cores of CI.
_SMALL = [(0, 1, 1), (1, 4, 3)]


@pytest.mark.parametrize("world,hidden,calls", [
    (2, 64, _SMALL + [(4, 1004, 5), (1004, 5101, arn.MAX_CTAS)]),
    (4, 96, _SMALL + [(4, 504, 5), (504, 517, 8)]),
    (8, 64, _SMALL + [(4, 504, 5), (504, 517, 8)]),
])
def test_emulated_allreduce_norm_token_counts(world: int, hidden: int, calls: list) -> None:
    _emulate(world, hidden, calls, rounds=1)


@pytest.mark.parametrize("world,hidden", [(2, 1024), (3, 1024), (4, 2048), (8, 2048)])
def test_emulated_allreduce_norm_wide_rows(world: int, hidden: int) -> None:
    """Rows wide enough that steps split into sub-steps and lane groups; two rounds, so each
    rank overwrites its partial rows right after the previous call on them returned."""
    t = arn.tiling(world, hidden, 4)
    assert t.reduce_rows < t.tile_rows or t.gather_lanes < t.lanes or t.reduce_lanes < t.peers
    _emulate(world, hidden, [(0, 13, 2), (20, 29, 3), (29, 30, 8)], rounds=1 if world == 8 else 2)


def test_emulated_allreduce_norm_rejects_bad_arguments() -> None:
    buf = torch.zeros(arn.buffer_rows(8, 2), 64)
    sym = arn.SymmetricRows(buf, torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), 0, 2, 8)
    res, w = torch.zeros(4, 64), torch.ones(64)
    with pytest.raises(ValueError):
        arn.reduce_norm(sym, 0, 4, res, w, EPS, torch.zeros(4, 64), arn.MAX_CTAS + 1)
    with pytest.raises(ValueError):
        arn.reduce_norm(sym, 6, 10, res, w, EPS, torch.zeros(4, 64), 1)
    with pytest.raises(ValueError):
        arn.reduce_norm(sym, 0, 4, res, w, EPS, torch.zeros(3, 64), 1)


# ---------------------------------------------------------------- copy-engine path's local kernel


@pytest.mark.parametrize("staged, rows, hidden, ctas", [(1, 5, 64, 1), (3, 17, 96, 3), (7, 2, 128, 4), (1, 1, 4096, 2)])
@pytest.mark.parametrize("sm_out", [True, False])
def test_copy_engine_local_kernel_matches_reference(staged: int, rows: int, hidden: int, ctas: int, sm_out: bool) -> None:
    """The add + norm over a rank's own rows for 2, 4 and 8 ranks (1, 3, 7 staged partials),
    with strided residual and out, on a chunk's rows of the staging slots (slots longer than the
    rows, starting past their first row, as in a chunked call); without `out` (sm_out off) only
    the published rows are written."""
    from kernels.copy_engine_norm import add_norm_reference, add_norm_rows

    g = torch.Generator().manual_seed(staged * 100 + rows)
    part = torch.randn(rows, hidden, generator=g)
    slots = torch.randn(staged, rows + 5, hidden, generator=g)[:, 2:]  # chunk rows from slot row 2
    residual = torch.randn(rows, hidden + 16, generator=g)[:, :hidden]
    weight = torch.randn(hidden, generator=g)
    out = torch.full((rows, hidden + 8), float("nan"))[:, :hidden]
    published = torch.full((rows, hidden), float("nan"))
    ref_res, ref_out, ref_pub = residual.clone(), torch.empty(rows, hidden), torch.empty(rows, hidden)
    add_norm_reference(part, slots[:, :rows], ref_res, weight, EPS, ref_out, ref_pub)
    add_norm_rows(part, slots, residual, weight, EPS, out if sm_out else None, published, ctas, use_triton=True)
    assert rel_err(residual, ref_res) < 1e-6
    assert rel_err(published, ref_out) < 1e-5
    if sm_out:
        assert torch.equal(out, published)
    else:
        assert out.isnan().all(), "sm_out off: the kernel must not write out"


@pytest.mark.parametrize("world, hidden", [(2, 64), (3, 4096), (4, 96)])
def test_copy_engine_pull_finish_runs_the_add_norm_kernel_on_its_regions(monkeypatch, world: int, hidden: int) -> None:
    """CopyEnginePull.finish launches the copy-engine add + norm kernel on its buffer's layout
    (rank 0's region first, the other regions max_tokens rows apart, `out` the dense target, a
    row range past row 0) and matches the torch reference; at hidden 4096 its grid (4 CTAs on 1
    SM) is smaller than the tiles, so the CTAs stride over them."""
    from kernels import copy_engine_pull
    from kernels.copy_engine_norm import add_norm_reference, add_norm_rows
    from overlapbench.distributed.runtime import SymmetricBuffer

    monkeypatch.setattr(copy_engine_pull, "add_norm_rows", lambda *args, use_triton: add_norm_rows(*args, use_triton=True))
    max_tokens, (a, b) = 40, (5, 31)
    g = torch.Generator().manual_seed(world * 10_000 + hidden)
    buf = torch.randn(copy_engine_pull.buffer_elems(max_tokens, hidden, world), generator=g)
    kernel = copy_engine_pull.CopyEnginePull(SymmetricBuffer(buf, None, "fake", 1, world, 0), max_tokens, hidden, sm_count=1)
    residual, weight = torch.randn(b - a, hidden, generator=g), torch.randn(hidden, generator=g)
    out = torch.full((b - a, hidden), float("nan"))
    regions = buf.view(world, max_tokens, hidden)[:, a:b]
    ref_res, ref_out = residual.clone(), torch.empty(b - a, hidden)
    add_norm_reference(regions[0], regions[1:], ref_res, weight, EPS, None, ref_out)
    assert kernel.finish(a, b, residual, weight, EPS, out) is out
    assert rel_err(residual, ref_res) < 1e-6 and rel_err(out, ref_out) < 1e-5


# ---------------------------------------------------------------- kernel v2 on W emulated ranks


V2_VARIANTS = ["v2", "v2pull", "v2pullpush"]  # push, and its pull variants


def _v2_engine(variant: str):
    """Kernel v2's engine class by variant (kernels.allreduce_norm_pull.FUSED_KERNELS): its buffer's
    rows (_buffer_rows), its view of them (_view) and its launch (_reduce)."""
    from kernels.allreduce_norm_pull import FUSED_KERNELS

    return FUSED_KERNELS[variant]


def _rank_main_v2(rank, variant, world, max_tokens, hidden, calls, rounds, bufs, flags, weight, res_all,
                  out_all) -> None:
    """One emulated rank of kernel v2 (`variant`: v2, the push kernel, or a pull variant), as _rank_main; calls alternate
    between an `out` given and the output region's view returned."""
    engine = _v2_engine(variant)
    torch.set_num_threads(1)
    me = bufs[rank].data_ptr()
    sym = engine._view(
        buf=bufs[rank],
        peer_off=torch.tensor([(b.data_ptr() - me) // 16 for b in bufs], dtype=torch.int64),
        flag_ptrs=torch.tensor([f.data_ptr() for f in flags], dtype=torch.int64),
        rank=rank, world=world, max_tokens=max_tokens,
    )
    for rnd in range(rounds):
        for i, (a, b, ctas) in enumerate(calls):
            bufs[rank][a:b] = _partial(rnd, rank, a, b, hidden)
            residual = _residual(rnd, a, b, hidden)
            out = torch.full((b - a, hidden), float("nan")) if (i + rnd) % 2 == 0 else None
            got = engine._reduce(sym, a, b, residual, weight, EPS, out, ctas)
            assert out is None or got is out
            res_all[rnd, rank, a:b], out_all[rnd, rank, a:b] = residual, got


def _emulate_v2(world: int, hidden: int, calls: list[tuple[int, int, int]], rounds: int = 2,
                variant: str = "v2") -> None:
    from kernels import allreduce_norm_v2 as v2

    rows = _v2_engine(variant)._buffer_rows
    max_tokens = max(b for _, b, _ in calls) + 2  # the last rows are never in a range
    bufs = [_fresh(90 + r, rows(max_tokens, world), hidden).share_memory_() for r in range(world)]
    untouched = [buf[max_tokens - 2:max_tokens].clone() for buf in bufs]
    flags = [torch.zeros(v2.FLAG_SLOTS, dtype=torch.int32).share_memory_() for _ in range(world)]
    weight = _fresh(77, hidden)
    res_all = torch.full((rounds, world, max_tokens, hidden), float("nan")).share_memory_()
    out_all = torch.full((rounds, world, max_tokens, hidden), float("nan")).share_memory_()
    _run_forked(_rank_main_v2, world,
                (variant, world, max_tokens, hidden, calls, rounds, bufs, flags, weight, res_all, out_all),
                120, ": a flag never came")
    for rnd in range(rounds):
        for a, b, ctas in calls:
            total = sum(_partial(rnd, r, a, b, hidden) for r in range(world))
            before = _residual(rnd, a, b, hidden)
            ref_res = before.clone()
            ref_out = add_rmsnorm_reference(total, ref_res, weight, EPS)
            where = f"round {rnd}, rows [{a}, {b}), {ctas} CTAs"
            for r in range(world):
                lo, hi = arn.row_block(b - a, world, r)
                res = res_all[rnd, r, a:b]
                assert rel_err(res[lo:hi], ref_res[lo:hi]) < 1e-5 or lo == hi, f"residual, rank {r}, {where}"
                assert torch.equal(res[:lo], before[:lo]) and torch.equal(res[hi:], before[hi:]), \
                    f"rank {r} wrote residual rows it does not own, {where}"
                assert rel_err(out_all[rnd, r, a:b], ref_out) < 1e-5, f"out, rank {r}, {where}"
                assert torch.equal(out_all[rnd, r, a:b], out_all[rnd, 0, a:b]), f"out differs, rank {r}, {where}"
    assert all(int(f.count_nonzero()) == 0 for f in flags), "flags must return to 0 (graph replay)"
    assert all(torch.equal(buf[max_tokens - 2:max_tokens], u) for buf, u in zip(bufs, untouched)), \
        "partial rows outside the ranges were written"


@pytest.mark.parametrize("world,hidden,calls", [
    (2, 64, _SMALL + [(4, 1004, 5), (1004, 5101, arn.MAX_CTAS)]),
    (4, 96, _SMALL + [(4, 504, 5), (504, 517, 8)]),
    (8, 64, _SMALL + [(4, 504, 5), (504, 517, 8)]),
])
@pytest.mark.parametrize("variant", V2_VARIANTS)
def test_emulated_allreduce_norm_v2_token_counts(world: int, hidden: int, calls: list, variant: str) -> None:
    _emulate_v2(world, hidden, calls, rounds=2, variant=variant)


@pytest.mark.parametrize("world,hidden", [(2, 1024), (3, 1024), (4, 2048), (8, 2048)])
@pytest.mark.parametrize("variant", V2_VARIANTS)
def test_emulated_allreduce_norm_v2_wide_rows(world: int, hidden: int, variant: str) -> None:
    """Tiles of several reduce steps; each rank overwrites its partial rows right after the
    previous call on them returned; CTA budgets change from call to call."""
    from kernels import allreduce_norm_v2 as v2

    t = v2.tiling(world, hidden, 4)
    assert t.reduce_rows < t.tile_rows and t.tile_rows % t.reduce_rows == 0
    _emulate_v2(world, hidden, [(0, 13, 2), (20, 29, 3), (29, 30, 8)], rounds=1 if world == 8 else 2,
                variant=variant)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("hidden,elem", [(64, 4), (4096, 2), (5120, 2), (8192, 2), (8192, 4), (16384, 2)])
def test_v2_tiling_steps_divide_and_fit(world: int, hidden: int, elem: int) -> None:
    from kernels import allreduce_norm_v2 as v2

    t = v2.tiling(world, hidden, elem)
    pow2 = lambda x: x > 0 and x & (x - 1) == 0
    assert pow2(t.tile_rows) and pow2(t.reduce_rows) and t.tile_rows % t.reduce_rows == 0
    row = t.block_h * elem
    assert t.tile_rows * row <= max(arn.STEP_BYTES, row)
    assert (world + 1) * t.reduce_rows * row <= max(arn.STEP_BYTES, (world + 1) * row)


def _rank_strategies_v2(rank, variant, world, bufs, flags, max_tokens, settings, outs) -> None:
    """One emulated rank running the strategies with comm: fused on kernel v2 (`variant`) in the
    interpreter."""
    from overlapbench import strategies
    from overlapbench.distributed.runtime import Runtime
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.overlap import reducers
    from overlapbench.timing.step import BuildContext

    torch.set_num_threads(1)
    engine = _v2_engine(variant).__new__(_v2_engine(variant))  # buffers in shared memory, not symmetric memory
    me = bufs[rank].data_ptr()
    engine._sym = engine._view(
        buf=bufs[rank], peer_off=torch.tensor([(b.data_ptr() - me) // 16 for b in bufs], dtype=torch.int64),
        flag_ptrs=torch.tensor([f.data_ptr() for f in flags], dtype=torch.int64),
        rank=rank, world=world, max_tokens=max_tokens)
    reducers._engine = lambda ctx, comm, make_kernel: engine  # this process only (forked)
    rt = Runtime(rank, world, rank, torch.device("cpu"), "gloo")
    stack = build_stack(_V2_SHAPE, 2, world, rank, torch.float32, rt.device, 0)
    ctx = BuildContext(rt, stack, _V2_SEQS, RopeTable(_V2_SHAPE, max(_V2_SEQS), rt.device), sum(_V2_SEQS))
    x = random_input(sum(_V2_SEQS), _V2_SHAPE.hidden, 0, torch.float32, rt.device)
    for i, (name, knobs) in enumerate(settings):
        cls = strategies.get(name)
        step = cls.build(ctx, cls.check_knobs(knobs, name))
        outs[i, rank] = step.to_full(step.forward(x))


_V2_SEQS = (13, 6)
_V2_SHAPE = ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8)


@pytest.mark.parametrize("variant", V2_VARIANTS)
def test_emulated_strategies_with_kernel_v2_match_the_reference(variant: str) -> None:
    """fused_norm takes the output region's view (out=None), token_split and iso pass `out`:
    both ways, with the residual token-sharded, the layers equal the reference."""
    from kernels import allreduce_norm_v2 as v2
    from overlapbench.model.layer import reference_forward

    rows = _v2_engine(variant)._buffer_rows
    world, tokens = 2, sum(_V2_SEQS)
    settings = [("fused_norm", {"comm": "fused", "comm_ctas": 2}),
                ("token_split", {"comm": "fused", "comm_ctas_attn": 1, "comm_ctas_mlp": 3}),
                ("iso", {"comm": "fused", "comm_ctas": 2})]
    bufs = [_fresh(50 + r, rows(tokens, world), _V2_SHAPE.hidden).share_memory_() for r in range(world)]
    flags = [torch.zeros(v2.FLAG_SLOTS, dtype=torch.int32).share_memory_() for _ in range(world)]
    outs = torch.full((len(settings), world, tokens, _V2_SHAPE.hidden), float("nan")).share_memory_()
    _run_forked(_rank_strategies_v2, world, (variant, world, bufs, flags, tokens, settings, outs), 300, "")
    ref = reference_forward(_V2_SHAPE, 2, world, _V2_SEQS, seed=0)
    for i, (name, _) in enumerate(settings):
        for r in range(world):
            assert rel_err(outs[i, r], ref) < 1e-5, f"{name}, rank {r}"
    assert all(int(f.count_nonzero()) == 0 for f in flags)
