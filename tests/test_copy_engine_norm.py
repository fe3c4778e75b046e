"""The copy-engine all-reduce + norm's protocol on CPU: threads play the ranks over a fake
symmetric memory (views of one process's tensors, synchronous copies, a threading barrier), the
local step in torch (its Triton kernel is checked in the interpreter in test_kernels_cpu.py).
What is checked: the row ownership, the staging and published offsets, the barriers' places and
the sharded-residual contract, for 2, 4 and 8 ranks, over two row ranges back to back, twice."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernels.copy_engine_norm import CopyEngineNorm, buffer_elems  # noqa: E402
from overlapbench.distributed.runtime import SymmetricBuffer  # noqa: E402
from tests.fake_symmetric import EPS, FakeHandle, SimStreams, layer_outputs, patch_engines, run_ranks  # noqa: E402
from tests.fake_symmetric import reference as _reference  # noqa: E402


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("cut, tokens", [(1, 3), (37, 100), (5, 6), (0, 1)])
def test_every_rank_gets_the_normed_sum_and_keeps_its_residual_rows(world, cut, tokens):
    hidden, max_tokens, offset, rounds = 48, 110, 3, 2
    g = torch.Generator().manual_seed(world * 1000 + tokens)
    weight = torch.randn(hidden, generator=g)
    ranges = [(offset, offset + cut), (offset + cut, offset + tokens)]  # halves A and B
    inputs = [[([torch.randn(b - a, hidden, generator=g) for _ in range(world)], torch.randn(b - a, hidden, generator=g))
               for a, b in ranges] for _ in range(rounds)]
    bufs = [torch.full((buffer_elems(max_tokens, hidden, world),), float("nan")) for _ in range(world)]
    handle = FakeHandle(bufs, world)

    def rank_main(rank):
        engine = CopyEngineNorm(SymmetricBuffer(bufs[rank], handle, "fake", rank, world, 0), max_tokens, hidden)
        outs = []
        for rnd in range(rounds):
            for (a, b), (partials, residual) in zip(ranges, inputs[rnd]):
                engine.partial(a, b).copy_(partials[rank])
                res = residual.clone()
                out = torch.full_like(res, float("nan"))
                assert engine(a, b, res, weight, EPS, out, num_ctas=3) is out
                outs.append((engine.own_rows(a, b), res, out))
        return outs

    rank_main.handle = handle
    results = run_ranks(world, rank_main)
    expected = [_reference(p, r, weight) for rnd in inputs for p, r in rnd]
    for outs in results:
        for ((lo, hi), res, out), (ref_res, ref_out), (_, residual) in zip(
                outs, expected, [x for rnd in inputs for x in rnd]):
            torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(res[lo:hi], ref_res[lo:hi], rtol=1e-6, atol=1e-6)
            mask = torch.ones(res.shape[0], dtype=torch.bool)
            mask[lo:hi] = False
            assert torch.equal(res[mask], residual[mask]), "rows of other ranks must stay untouched"
    for i in range(len(expected)):  # bit-identical on every rank
        for rank in range(1, world):
            assert torch.equal(results[rank][i][2], results[0][i][2])


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("chunks", [1, 2, 3, 7])
@pytest.mark.parametrize("rows", [1, 3, 1000, 4097])
def test_chunked_pipeline_on_stand_in_streams(world, chunks, rows):
    """The chunked schedule (7 divides none of the row blocks) with its ops in a random valid
    order per rank: two ranges back to back, twice, with sm_out off (the published rows copied
    to `out`) and, on odd rounds, on. Per call: out, the residual's own rows, the other rows
    untouched, the published rows at their offset, one barrier on channel 0 then one per chunk
    on channel 1, out bit-identical on every rank."""
    hidden, offset, rounds = 8, 3, 2
    max_tokens, cut = offset + rows + 2, rows // 3
    g = torch.Generator().manual_seed(world * 100_000 + rows * 10 + chunks)
    weight = torch.randn(hidden, generator=g)
    ranges = [(offset, offset + cut), (offset + cut, offset + rows)]
    inputs = [[([torch.randn(b - a, hidden, generator=g) for _ in range(world)], torch.randn(b - a, hidden, generator=g))
               for a, b in ranges] for _ in range(rounds)]
    bufs = [torch.full((buffer_elems(max_tokens, hidden, world),), float("nan")) for _ in range(world)]
    handle = FakeHandle(bufs, world)

    def rank_main(rank):
        sym = SymmetricBuffer(bufs[rank], handle, "fake", rank, world, 0)
        engine = CopyEngineNorm(sym, max_tokens, hidden, chunks=chunks, streams=SimStreams(rank * 7 + rows))
        outs = []
        for rnd in range(rounds):
            engine.sm_out = bool(rnd % 2)
            for (a, b), (partials, residual) in zip(ranges, inputs[rnd]):
                engine.partial(a, b).copy_(partials[rank])
                res, logged = residual.clone(), len(handle.log[rank])
                out = torch.full_like(res, float("nan"))
                assert engine(a, b, res, weight, EPS, out, num_ctas=2) is out
                lo, hi = engine.own_rows(a, b)
                n_chunks = engine.chunk_count(b - a)
                assert n_chunks == max(1, min(chunks, (b - a) // world))
                assert handle.log[rank][logged:] == ([0] + [1] * n_chunks if b > a else [])
                published = sym.view(engine._pub_start + (a + lo) * hidden, (hi - lo, hidden))
                assert torch.equal(published, out[lo:hi]), "published rows not at their offset"
                outs.append(((lo, hi), res, out))
        return outs

    rank_main.handle = handle
    results = run_ranks(world, rank_main)
    flat = [x for rnd in inputs for x in rnd]
    expected = [_reference(p, r, weight) for p, r in flat]
    for outs in results:
        for ((lo, hi), res, out), (ref_res, ref_out), (_, residual) in zip(outs, expected, flat):
            torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(res[lo:hi], ref_res[lo:hi], rtol=1e-6, atol=1e-6)
            mask = torch.ones(res.shape[0], dtype=torch.bool)
            mask[lo:hi] = False
            assert torch.equal(res[mask], residual[mask]), "rows of other ranks must stay untouched"
    for i in range(len(expected)):
        for rank in range(1, world):
            assert torch.equal(results[rank][i][2], results[0][i][2])


def test_automatic_chunks_are_about_chunk_bytes_and_agree_on_every_rank():
    import types

    from kernels.copy_engine_norm import CHUNK_BYTES, MAX_AUTO_CHUNKS

    world, hidden, max_tokens = 2, 8192, 40000
    bf16 = torch.empty(0, dtype=torch.bfloat16)
    engines = [CopyEngineNorm(types.SimpleNamespace(world=world, rank=r, tensor=bf16, view=lambda *a: None), max_tokens,
                              hidden) for r in range(world)]  # chunk_count only: no buffer needed
    row_bytes = hidden * 2
    assert {e.chunk_count(4096) for e in engines} == {MAX_AUTO_CHUNKS}  # 64 MiB: 32 MiB a rank
    assert engines[0].chunk_count(2 * CHUNK_BYTES // row_bytes) == 1
    assert engines[0].chunk_count(2 * CHUNK_BYTES // row_bytes - 2) == 1  # below one chunk: still 1
    assert engines[0].chunk_count(2 * 3 * CHUNK_BYTES // row_bytes) == 3
    assert engines[1].chunk_count(1) == engines[1].chunk_count(3) == 1
    assert engines[0].chunk_count(4096, 5) == 5 and engines[0].chunk_count(5, 4) == 2


def test_rows_are_owned_once_and_in_order():
    from kernels.allreduce_norm import row_block

    for world in (2, 4, 8):
        for n in (0, 1, 3, 7, 8, 4097):
            blocks = [row_block(n, world, r) for r in range(world)]
            assert blocks[0][0] == 0 and blocks[-1][1] == n
            assert all(blocks[r][1] == blocks[r + 1][0] for r in range(world - 1))


def test_bad_calls_are_refused():
    world, hidden = 2, 16
    bufs = [torch.zeros(buffer_elems(8, hidden, world)) for _ in range(world)]
    engine = CopyEngineNorm(SymmetricBuffer(bufs[0], FakeHandle(bufs, world), "fake", 0, world, 0), 8, hidden)
    res, w = torch.zeros(4, hidden), torch.ones(hidden)
    with pytest.raises(ValueError, match="outside"):
        engine(0, 9, res, w, EPS, res.clone(), 1)
    with pytest.raises(ValueError, match="num_ctas"):
        engine(0, 4, res, w, EPS, res.clone(), 0)
    with pytest.raises(ValueError, match="dense rows"):
        engine(0, 4, res, w, EPS, torch.zeros(4, 2 * hidden)[:, :hidden], 1)
    with pytest.raises(ValueError, match="chunks"):
        engine(0, 4, res, w, EPS, res.clone(), 1, chunks=0)
    with pytest.raises(ValueError, match="chunks"):
        CopyEngineNorm(engine.sym, 8, hidden, chunks=0)


# --- the strategies with comm: copy_engine, ranks as threads -------------------------------------


def _stand_in_engines(monkeypatch, world: int, hidden: int, tokens: int, chunks: int | None, streams) -> FakeHandle:
    """One copy-engine kernel per rank on the fake symmetric memory (`chunks` pieces, None: by size;
    `streams(rank)` its stand-in streams, or None: the caller's), patched in as the run's one
    kernel that every copy-engine reducer gets; their shared handle, whose log records the barriers."""
    bufs = [torch.full((buffer_elems(tokens, hidden, world),), float("nan")) for _ in range(world)]
    handle = FakeHandle(bufs, world)
    engines = [CopyEngineNorm(SymmetricBuffer(bufs[r], handle, "fake", r, world, 0), tokens, hidden, chunks,
                              streams=None if streams is None else streams(r)) for r in range(world)]
    patch_engines(monkeypatch, {"copy_engine": engines})
    return handle


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("chunks", [None, 3])
def test_strategies_with_copy_engine_match_the_reference(monkeypatch, world, chunks):
    """fused_norm, token_split and iso built with comm: copy_engine, each rank's reducers on the
    fake symmetric memory: the layers keep the residual token-sharded (no forward reads a row a
    reducer did not update) and the output still equals the reference. chunks None: by size
    (1 here, the serial schedule); 3: the pipeline on stand-in streams."""
    from overlapbench.model.layer import reference_forward
    from overlapbench.model.models import ModelShape

    shape, layers, seq_lens = ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8), 2, (29, 14)
    handle = _stand_in_engines(monkeypatch, world, shape.hidden, sum(seq_lens), chunks,
                               (lambda r: SimStreams(r)) if chunks else None)
    settings = [("fused_norm", {"comm": "copy_engine", "comm_ctas": 4}),
                ("token_split", {"comm": "copy_engine", "comm_ctas_attn": 4, "comm_ctas_mlp": 16}),
                ("iso", {"comm": "copy_engine", "comm_ctas": 4})]
    ref = reference_forward(shape, layers, world, seq_lens, seed=0)
    for rank, outs in enumerate(layer_outputs(world, handle, shape, layers, seq_lens, settings)):
        for (name, _), out in zip(settings, outs):
            err = ((out - ref).norm() / ref.norm()).item()
            assert err < 1e-5, f"{name} on rank {rank}: rel err {err:.2e}"


@pytest.mark.parametrize("world", [2, 4])
def test_ce_chunks_cut_every_call_and_settings_of_different_counts_share_one_buffer(monkeypatch, world):
    """The run's one copy-engine kernel (its own count by size: 1 here) serves settings whose
    `ce_chunks` differ, back to back, on stand-in streams: every call of a setting is cut into
    its count (one channel-1 barrier per piece after the call's channel-0 barrier, on every
    rank), and every output equals the reference."""
    from overlapbench.model.layer import reference_forward
    from overlapbench.model.models import ModelShape

    shape, layers, seq_lens = ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8), 2, (45, 22)
    handle = _stand_in_engines(monkeypatch, world, shape.hidden, sum(seq_lens), None, lambda r: SimStreams(r + 11))
    settings = [("token_split", {"comm": "copy_engine", "comm_ctas_attn": 4, "comm_ctas_mlp": 16, "ce_chunks": 3}),
                ("token_split", {"comm": "copy_engine", "ce_chunks": 1}),
                ("iso", {"comm": "copy_engine", "comm_ctas": 4, "ce_chunks": 2}),
                ("fused_norm", {"comm": "copy_engine", "comm_ctas": 4, "ce_chunks": 4}),
                ("token_split", {"comm": "copy_engine", "split_ratio": "balanced", "chunks": 3, "ce_chunks": 2})]

    def with_pieces(rank, run):
        logged = len(handle.log[rank])
        out = run()
        calls = "".join(map(str, handle.log[rank][logged:])).split("0")[1:]  # each call: "0" then one "1" a piece
        return out, {len(c) for c in calls}, len(calls)

    ref = reference_forward(shape, layers, world, seq_lens, seed=0)
    for rank, outs in enumerate(layer_outputs(world, handle, shape, layers, seq_lens, settings, with_pieces)):
        for (name, knobs), (out, pieces, calls) in zip(settings, outs):
            err = ((out - ref).norm() / ref.norm()).item()
            assert err < 1e-5, f"{name} {knobs} on rank {rank}: rel err {err:.2e}"
            assert pieces == {knobs["ce_chunks"]} and calls >= 2 * layers, (name, knobs, pieces, calls)
