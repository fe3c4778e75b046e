"""The `ce_out` knob of the strategies whose `comm` can be copy_engine (token_split, iso,
fused_norm): who writes the rank's own rows of each reduction's output, a same-device copy on the
gather copy stream (`copy`, the default) or the add + norm kernel itself (`kernel`: the kernel's
`sm_out`, asked per call).

On CPU: the knob's domain and help, that it is sparse and reset exactly as ce_chunks is, the
value reaching every call of the kernel, the protocol on threads playing 2 and 4 ranks with the
setting changed per call on one instance (the same bits as `copy`, the local copy skipped), the
strategies against the reference with both settings sharing one buffer, predict's skipped rows
and the TokenWeave export's warning. On GPUs: tests/test_ce_chunks_gpu.py's `ce_out` cases."""

from __future__ import annotations

import json
import random
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from overlapbench import strategies
from overlapbench.cli import app
from overlapbench.errors import UserError
from overlapbench.overlap import comm_methods
from overlapbench.specs import spec
from overlapbench.strategies.knobs import CE_CHUNKS, CE_OUT, COPY_ENGINE_KNOBS

TAKERS = ("token_split", "iso", "fused_norm")


def test_the_knob_applies_where_ce_chunks_does():
    assert (CE_OUT.name, CE_OUT.default, CE_OUT.choices) == ("ce_out", "copy", ("copy", "kernel"))
    assert CE_OUT.help.startswith("comm=copy_engine only") and CE_OUT.sparse
    assert COPY_ENGINE_KNOBS == (CE_CHUNKS, CE_OUT)
    for cls in strategies.all_strategies():
        assert (CE_OUT in cls.knobs) == (CE_CHUNKS in cls.knobs), cls.name
    assert {cls.name for cls in strategies.all_strategies() if CE_OUT in cls.knobs} == set(TAKERS)


@pytest.mark.parametrize("name", TAKERS)
def test_the_knob_is_sparse_and_checked(name):
    cls = strategies.get(name)
    base = {"comm": "copy_engine"}
    assert "ce_out" not in cls.check_knobs(base, name)  # the points of earlier runs keep their keys
    assert cls.check_knobs(base | {"ce_out": "copy"}, name) == cls.check_knobs(base, name)
    assert cls.check_knobs(base | {"ce_out": "kernel"}, name)["ce_out"] == "kernel"
    for bad in ("sm", "Kernel", "", 1, True, None, 0.5):
        with pytest.raises(UserError, match=rf"^{name}\.ce_out: .* is not one of copy \| kernel$"):
            cls.check_knobs(base | {"ce_out": bad}, name)


@pytest.mark.parametrize("name, comm", [(s, c) for s in ("token_split", "iso") for c in ("nccl", "nccl_symm", "fused", "none",
                                                                                         "copy_engine_pull")]
                         + [("fused_norm", "fused")])
def test_it_is_reset_where_the_comm_method_is_not_the_copy_engine_path(name, comm):
    cls = strategies.get(name)
    with_it = cls.check_knobs({"comm": comm, "ce_out": "kernel", "ce_chunks": 2}, name)
    assert with_it == cls.check_knobs({"comm": comm}, name) and not {"ce_out", "ce_chunks"} & set(with_it)


def test_a_grid_over_comm_and_ce_out_measures_each_setting_once():
    grid = spec.from_dict({"model": "tiny", "tokens": [64], "strategies": {
        "token_split": {"comm": ["nccl", "copy_engine"], "ce_out": ["copy", "kernel"], "ce_chunks": [1, "auto"]},
        "fused_norm": {"comm": ["fused", "copy_engine"], "ce_out": ["copy", "kernel"]}}}, "file", cuda=True)
    found = sorted((p.strategy, p.knobs["comm"], p.knobs.get("ce_out", "-"), str(p.knobs.get("ce_chunks", "-")))
                   for p in grid.points(2, True))
    assert found == [("fused_norm", "copy_engine", "-", "-"), ("fused_norm", "copy_engine", "kernel", "-"),
                     ("fused_norm", "fused", "-", "-"),
                     ("token_split", "copy_engine", "-", "-"), ("token_split", "copy_engine", "-", "1"),
                     ("token_split", "copy_engine", "kernel", "-"), ("token_split", "copy_engine", "kernel", "1"),
                     ("token_split", "nccl", "-", "-")]


def test_a_bad_value_in_a_spec_is_one_line_exit_2(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: tiny\ntokens: [8]\nstrategies: {token_split: {comm: copy_engine, ce_out: sm}}\n")
    result = CliRunner().invoke(app, ["sweep", str(path), "--output", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 2
    assert "strategies.token_split.ce_out: 'sm' is not one of copy | kernel" in " ".join(result.output.split())
    assert "Traceback" not in result.output and not (tmp_path / "r.jsonl").exists()


@pytest.fixture
def kernel(monkeypatch):
    from overlapbench.overlap import reducers
    from tests.fake_symmetric import RecordingKernel

    made = RecordingKernel()
    monkeypatch.setattr(reducers, "_engine", lambda ctx, comm, make_kernel: made)
    return made


@pytest.mark.parametrize("knobs, passed", [({"ce_out": "kernel"}, {"sm_out": True}), ({}, {"sm_out": False}),
                                           ({"ce_out": "kernel", "ce_chunks": 3}, {"chunks": 3, "sm_out": True})])
def test_the_setting_reaches_every_call_of_the_kernel(kernel, knobs, passed):
    import torch

    reducer = comm_methods.get("copy_engine").build(types.SimpleNamespace(eps=1e-5), 12, knobs)
    residual = torch.randn(7, 16)
    for begin, end in ((0, 3), (3, 7)):
        reducer(None, types.SimpleNamespace(begin=begin, end=end), residual[begin:end], torch.randn(16))
    assert kernel.calls == [(0, 3, 12, passed), (3, 7, 12, passed)]


def test_a_method_that_is_not_the_copy_engine_path_never_gets_it(kernel):
    import torch

    reducer = comm_methods.get("fused").build(types.SimpleNamespace(eps=1e-5), 8, {"ce_out": "kernel"})
    reducer(None, types.SimpleNamespace(begin=0, end=5), torch.randn(5, 16), torch.randn(16))
    assert kernel.calls == [(0, 5, 8, {})]  # the fused kernel's call takes no sm_out


# --- the protocol on threads: the setting per call, on one instance ----------------------------


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("chunks", [1, 3])
def test_the_kernel_writing_its_own_rows_gives_the_same_bits_and_skips_the_local_copy(monkeypatch, world, chunks):
    """One instance per rank, calls alternating sm_out off/on per call (its default off) over the
    same fresh inputs: out, the residual and the published rows are bit-identical either way; with
    it on, the add + norm kernel got `out`'s own rows and the gather stream ran one op fewer per
    piece (no local copy: the barrier follows the kernel at once)."""
    import torch

    import kernels.copy_engine_norm as cen
    from kernels.copy_engine_norm import CopyEngineNorm, buffer_elems
    from overlapbench.distributed.runtime import SymmetricBuffer
    from tests.fake_symmetric import EPS, FakeHandle, SimStreams, reference, run_ranks

    hidden, rows, offset = 16, 3 * world * 5 + 1, 2
    max_tokens = offset + rows
    g = torch.Generator().manual_seed(random.randrange(1 << 30))
    weight = torch.randn(hidden, generator=g)
    partials = [torch.randn(rows, hidden, generator=g) for _ in range(world)]
    residual = torch.randn(rows, hidden, generator=g)
    bufs = [torch.full((buffer_elems(max_tokens, hidden, world),), float("nan")) for _ in range(world)]
    handle = FakeHandle(bufs, world)
    wrote_out = {}  # rank -> [whether each add + norm got out's rows]
    real = cen.add_norm_rows

    def spy(part, staged, res, w, eps, out, published, num_ctas, use_triton):
        wrote_out.setdefault(FakeHandle.local.rank, []).append(out is not None)
        real(part, staged, res, w, eps, out, published, num_ctas, use_triton)

    monkeypatch.setattr(cen, "add_norm_rows", spy)

    class CountingStreams(SimStreams):
        def __init__(self, seed):
            super().__init__(seed)
            self.runs = {0: 0, 1: 0, 2: 0}

        def run(self, stream, fn):
            self.runs[stream] += 1
            super().run(stream, fn)

    def rank_main(rank):
        sym = SymmetricBuffer(bufs[rank], handle, "fake", rank, world, 0)
        streams = CountingStreams(rank * 13 + chunks)
        engine = CopyEngineNorm(sym, max_tokens, hidden, chunks=chunks, streams=streams)
        results = []
        for sm_out in (False, True, False, True):
            engine.partial(offset, offset + rows).copy_(partials[rank])
            res, out = residual.clone(), torch.full_like(residual, float("nan"))
            before = dict(streams.runs)
            engine(offset, offset + rows, res, weight, EPS, out, num_ctas=2, sm_out=sm_out)
            lo, hi = engine.own_rows(offset, offset + rows)
            published = sym.view(engine._pub_start + (offset + lo) * hidden, (hi - lo, hidden)).clone()
            gathered = streams.runs[2] - before[2]
            results.append((sm_out, out, res, published, gathered, engine.chunk_count(rows)))
        assert engine.sm_out is False  # the per-call setting leaves the instance's default alone
        return results

    rank_main.handle = handle
    ref_res, ref_out = reference(partials, residual, weight)
    for rank, results in enumerate(run_ranks(world, rank_main)):
        copied = results[0]
        for sm_out, out, res, published, gathered, pieces in results:
            torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
            assert torch.equal(out, copied[1]) and torch.equal(res, copied[2]) and torch.equal(published, copied[3])
            if chunks > 1:  # the pipeline: per piece a local copy (copy only), a barrier, the peers' pulls
                assert gathered == pieces * (2 if sm_out else 3), (sm_out, gathered, pieces)
        assert pieces == min(chunks, rows // world)
        assert wrote_out[rank] == [c for c in (False, True, False, True) for _ in range(pieces)]


@pytest.mark.parametrize("world", [2, 4])
def test_settings_of_both_values_share_one_buffer_and_match_the_reference(monkeypatch, world):
    """The run's one copy-engine kernel (its default: copy) serves settings of both values back to
    back, on stand-in streams: every output equals the reference, and a setting's output is the
    same bits with `kernel` as with `copy`."""
    import torch

    from kernels.copy_engine_norm import CopyEngineNorm, buffer_elems
    from overlapbench.distributed.runtime import SymmetricBuffer
    from overlapbench.model.layer import reference_forward
    from overlapbench.model.models import ModelShape
    from tests.fake_symmetric import FakeHandle, SimStreams, layer_outputs, patch_engines

    shape, layers, seq_lens = ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8), 2, (41, 23)
    tokens = sum(seq_lens)
    bufs = [torch.full((buffer_elems(tokens, shape.hidden, world),), float("nan")) for _ in range(world)]
    handle = FakeHandle(bufs, world)
    engines = [CopyEngineNorm(SymmetricBuffer(bufs[r], handle, "fake", r, world, 0), tokens, shape.hidden,
                              streams=SimStreams(r + 5)) for r in range(world)]
    patch_engines(monkeypatch, {"copy_engine": engines})
    settings = [(name, knobs | extra) for name, knobs in (
        ("token_split", {"comm": "copy_engine", "comm_ctas_attn": 4, "comm_ctas_mlp": 16, "ce_chunks": 3}),
        ("iso", {"comm": "copy_engine", "comm_ctas": 4, "ce_chunks": 2}),
        ("fused_norm", {"comm": "copy_engine", "comm_ctas": 4}))
        for extra in ({"ce_out": "kernel"}, {})]
    ref = reference_forward(shape, layers, world, seq_lens, seed=0)
    for rank, outs in enumerate(layer_outputs(world, handle, shape, layers, seq_lens, settings)):
        for (name, knobs), out in zip(settings, outs):
            err = ((out - ref).norm() / ref.norm()).item()
            assert err < 1e-5, f"{name} {knobs} on rank {rank}: rel err {err:.2e}"
        for kernel_out, copy_out in zip(outs[0::2], outs[1::2]):
            assert torch.equal(kernel_out, copy_out)
    assert all(e.sm_out is False for e in engines)


# --- predict and export ---------------------------------------------------------------------------


def _predicted_split(tmp_path, inputs) -> dict[str, dict]:
    """llama3-8b-like token_split on the copy engine 16/16 with its own rows copied and written by
    the kernel, predicted from `inputs`: {ce_out: row}, one token count."""
    from overlapbench.predict.command import predict
    from overlapbench.predict.summary import Summary
    from overlapbench.tuning.results import read_rows
    from tests.test_predict_estimate import SPEC

    setting = {"comm": "copy_engine", "comm_ctas_attn": 16, "comm_ctas_mlp": 16}
    spec_ = SPEC | {"tokens": [4096],
                    "strategies": {"token_split": [setting, setting | {"ce_out": "kernel"}]}}
    out = tmp_path / f"predicted-{random.randrange(10**9)}.jsonl"
    predict(spec.from_dict(spec_, "predicted", cuda=True), 2, inputs, out, summary=Summary())
    return {r["knobs"].get("ce_out", "copy"): r for r in read_rows(out) if r["strategy"] == "token_split"}


def test_predict_prices_kernel_out_from_its_own_comm_path_and_skips_without_it(tmp_path):
    """A split with `ce_out: kernel` sends the copy_engine_norm_kernel path's transfer: predicted
    from that path's rows where the table holds them (rows as the copy path's: the same time;
    faster rows: a faster layer), a skipped row naming the comm command that times them where it
    does not; the same setting at `copy` is predicted as ever."""
    from overlapbench.predict.comm_table import CommTable
    from tests.test_predict_estimate import SPEC, _inputs

    inputs = _inputs(random.randrange(100))
    without = _predicted_split(tmp_path, inputs)
    assert without["copy"]["status"] == "ok" and without["kernel"]["status"] == "skipped"
    assert "no 'copy_engine_norm_kernel' rows" in without["kernel"]["error"]
    assert "`overlapbench comm --paths copy_engine_norm_kernel`" in without["kernel"]["error"]

    copy_rows = inputs.comm.entries[("copy_engine_norm", 16, SPEC["shape"]["hidden"])]
    factor = random.uniform(0.3, 0.8)
    for rows, same in ((copy_rows, True), ([(b, ms * factor) for b, ms in copy_rows], False)):
        kernel_key = ("copy_engine_norm_kernel", 16, SPEC["shape"]["hidden"])
        inputs.comm = CommTable(inputs.comm.entries | {kernel_key: rows}, 2, "GPU", "synthetic")
        got = _predicted_split(tmp_path, inputs)
        assert {r["status"] for r in got.values()} == {"ok"}
        assert got["copy"]["ms"] == without["copy"]["ms"]
        if same:
            assert got["kernel"]["ms"] == pytest.approx(got["copy"]["ms"])
        else:
            assert got["kernel"]["ms"] < got["copy"]["ms"]


def test_the_tokenweave_export_says_it_has_no_counterpart():
    from overlapbench.export import tokenweave
    from tests.export_rows import config

    knobs = {"align": 256, "comm": "copy_engine", "comm_ctas_attn": 32, "comm_ctas_mlp": 4, "split_offset": 256}
    plain = tokenweave.export(config([(1, 9000, "token_split", knobs)]), [], "s", None)
    both = tokenweave.export(config([(1, 9000, "token_split", knobs | {"ce_out": "kernel", "ce_chunks": 2})]), [], "s", None)
    assert json.loads(both.files["llama_config_2.json"]) == json.loads(plain.files["llama_config_2.json"])
    assert [w for w in both.warnings if "ce_out" in w] == [
        "1024..9000 tokens: token_split with comm=copy_engine picked; TokenWeave reduces with its fused kernel only: "
        "entry keeps the cut (split_offset) and holds its built-in 16 CTAs; its ce_chunks=2 (the copy-engine path's "
        "pieces per reduction) and ce_out=kernel (who writes the rank's own rows of its output) have no counterpart "
        "either"]
