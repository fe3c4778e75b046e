"""`comm: copy_engine_pull` on CPU: the pull protocol (kernels/copy_engine_pull.py) with threads
playing 2 and 4 ranks over tests/fake_symmetric.py's symmetric memory, the add + norm in torch
(its Triton kernel on the same layout in the interpreter: tests/test_kernels_cpu.py); the split
strategies built with it against the single-process reference; its knob rules, what `predict`
and the exports say of it. On GPUs: tests/test_copy_engine_pull_gpu.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernels.copy_engine_pull import CopyEnginePull, buffer_elems  # noqa: E402
from overlapbench.distributed.runtime import SymmetricBuffer  # noqa: E402
from overlapbench.errors import UserError  # noqa: E402
from tests.fake_symmetric import EPS, FakeHandle, layer_context, patch_engines, reference, run_ranks  # noqa: E402


def _pull_kernels(world: int, hidden: int, max_tokens: int) -> tuple[list[CopyEnginePull], FakeHandle]:
    """One CopyEnginePull per rank on NaN-filled fake symmetric buffers (a row read before it was
    written shows), and their shared handle."""
    bufs = [torch.full((buffer_elems(max_tokens, hidden, world),), float("nan")) for _ in range(world)]
    handle = FakeHandle(bufs, world)
    return [CopyEnginePull(SymmetricBuffer(bufs[r], handle, "fake", r, world, 0), max_tokens, hidden)
            for r in range(world)], handle


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("cut, tokens", [(1, 3), (37, 100), (0, 5)])
def test_every_rank_gets_the_whole_normed_sum_and_the_whole_residual(world, interleaved, cut, tokens):
    """Two row ranges back to back, twice, each transfer then its finish; `interleaved`: both
    transfers first, then both finishes (a split's order: the other chunk's transfer runs before
    this chunk's finish), so one range's pulls must not touch the other's staged rows. Every rank:
    out and the residual of every row equal the reference and are bit-identical across ranks; per
    non-empty transfer one barrier on channel 0, then one on channel 1."""
    hidden, max_tokens, offset, rounds = 48, 110, 3, 2
    g = torch.Generator().manual_seed(world * 1000 + tokens + interleaved)
    weight = torch.randn(hidden, generator=g)
    ranges = [(offset, offset + cut), (offset + cut, offset + tokens)]
    inputs = [[([torch.randn(b - a, hidden, generator=g) for _ in range(world)], torch.randn(b - a, hidden, generator=g))
               for a, b in ranges] for _ in range(rounds)]
    kernels, handle = _pull_kernels(world, hidden, max_tokens)

    def rank_main(rank):
        kernel, outs = kernels[rank], []
        for rnd in range(rounds):
            calls = []
            for (a, b), (partials, residual) in zip(ranges, inputs[rnd]):
                kernel.partial(a, b).copy_(partials[rank])
                calls.append((a, b, residual.clone(), torch.full_like(residual, float("nan"))))
            for a, b, res, out in calls:
                logged = len(handle.log[rank])
                kernel.transfer(a, b)
                assert handle.log[rank][logged:] == ([0, 1] if b > a else [])
                if not interleaved:
                    assert kernel.finish(a, b, res, weight, EPS, out) is out
            if interleaved:
                for a, b, res, out in calls:
                    assert kernel.finish(a, b, res, weight, EPS, out) is out
            outs += [(res, out) for _, _, res, out in calls]
        return outs

    rank_main.handle = handle
    results = run_ranks(world, rank_main)
    expected = [reference(p, r, weight) for rnd in inputs for p, r in rnd]
    for rank, outs in enumerate(results):
        for i, ((res, out), (ref_res, ref_out)) in enumerate(zip(outs, expected)):
            torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(res, ref_res, rtol=1e-6, atol=1e-6)
            assert torch.equal(res, results[0][i][0]) and torch.equal(out, results[0][i][1]), f"rank {rank} differs"


def test_bad_calls_are_refused():
    (kernel, _), _ = _pull_kernels(2, 16, 8)
    res, w = torch.randn(4, 16), torch.randn(16)
    with pytest.raises(ValueError, match="outside"):
        kernel.transfer(0, 9)
    with pytest.raises(ValueError, match="outside"):
        kernel.partial(5, 3)
    with pytest.raises(ValueError, match="residual must be"):
        kernel.finish(0, 4, torch.randn(3, 16), w, EPS, res.clone())
    with pytest.raises(ValueError, match="dense rows"):
        kernel.finish(0, 4, res, w, EPS, torch.randn(4, 32)[:, :16])


# --- the split strategies with comm: copy_engine_pull, ranks as threads ---------------------------


@pytest.mark.parametrize("world", [2, 4])
def test_split_strategies_with_copy_engine_pull_match_the_reference(monkeypatch, world):
    """token_split (equal and balanced cuts, 2 and 4 chunks) and iso built with comm:
    copy_engine_pull, each rank's reducers on one stand-in pull kernel: the output equals the
    reference, bit-identical on every rank; each reduction is one transfer (barriers 0 then 1) and
    one finish, and every finish runs (the stack's last ones after the last task)."""
    from overlapbench import strategies
    from overlapbench.model.layer import reference_forward
    from overlapbench.model.models import ModelShape

    shape, layers, seq_lens = ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8), 2, (29, 14)
    kernels, handle = _pull_kernels(world, shape.hidden, sum(seq_lens))
    patch_engines(monkeypatch, {"copy_engine_pull": kernels})
    finished: list[list[tuple[int, int]]] = [[] for _ in range(world)]
    finish = CopyEnginePull.finish

    def counted(self, row_start, row_end, *args):
        finished[self.rank].append((row_start, row_end))
        return finish(self, row_start, row_end, *args)

    monkeypatch.setattr(CopyEnginePull, "finish", counted)
    settings = [("token_split", {"comm": "copy_engine_pull"}, 2),
                ("token_split", {"comm": "copy_engine_pull", "split_ratio": "balanced"}, 2),
                ("token_split", {"comm": "copy_engine_pull", "chunks": 4}, 4),
                ("token_split", {"comm": "copy_engine_pull", "split_ratio": "balanced", "chunks": 4}, 4),
                ("iso", {"comm": "copy_engine_pull"}, 2)]

    def rank_main(rank):
        ctx, x = layer_context(rank, world, shape, layers, seq_lens)
        outs = []
        for name, knobs, _ in settings:
            cls = strategies.get(name)
            step = cls.build(ctx, cls.check_knobs(knobs, name))
            logged, done = len(handle.log[rank]), len(finished[rank])
            out = step.to_full(step.forward(x)).clone()
            outs.append((out, handle.log[rank][logged:], finished[rank][done:]))
        return outs

    rank_main.handle = handle
    ref = reference_forward(shape, layers, world, seq_lens, seed=0)
    results = run_ranks(world, rank_main)
    for rank, outs in enumerate(results):
        for i, ((name, knobs, chunks), (out, log, calls)) in enumerate(zip(settings, outs)):
            err = ((out - ref).norm() / ref.norm()).item()
            assert err < 1e-5, f"{name} {knobs} on rank {rank}: rel err {err:.2e}"
            assert torch.equal(out, results[0][i][0]), f"{name} {knobs}: rank {rank} differs from rank 0"
            reductions = 2 * layers * chunks
            assert log == [0, 1] * reductions, (name, knobs, log)
            assert len(calls) == reductions and sum(b - a for a, b in calls) == 2 * layers * sum(seq_lens), calls


def test_the_method_is_a_split_s_only_and_takes_no_cta_budget():
    """token_split and iso offer it, fused_norm does not; its CTA and NCCL knobs are reset like
    comm: none's (set, they are ignored); on CPU its points are skipped with the symmetric methods'
    reason."""
    from overlapbench import strategies
    from overlapbench.overlap import comm_methods

    method = comm_methods.get("copy_engine_pull")
    assert method.deferred and method.budget is None and method.path is None and method.symmetric
    assert "copy_engine_pull" not in comm_methods.FUSED_CHOICES and "copy_engine_pull" not in comm_methods.CTA_BUDGETED
    split = strategies.get("token_split")
    knobs = split.check_knobs({"comm": "copy_engine_pull", "comm_ctas_attn": 4, "nccl_max_ctas": 8}, "strategies.token_split")
    assert knobs["comm_ctas_attn"] is None and knobs["comm_ctas_mlp"] is None and knobs["nccl_max_ctas"] == "default"
    iso = strategies.get("iso")
    assert iso.check_knobs({"comm": "copy_engine_pull", "comm_ctas": 16}, "strategies.iso")["comm_ctas"] is None
    assert split.skip_reason(knobs, cuda=False) == "comm=copy_engine_pull needs CUDA GPUs with symmetric memory"
    assert split.skip_reason(knobs, cuda=True) is None and split.is_checked(knobs)
    fused = strategies.get("fused_norm")
    with pytest.raises(UserError, match=r"^strategies.fused_norm.comm: 'copy_engine_pull' is not one of fused \| copy_engine$"):
        fused.check_knobs({"comm": "copy_engine_pull"}, "strategies.fused_norm")


def test_a_spec_with_it_validates_and_a_fused_norm_one_is_refused(tmp_path):
    from overlapbench.specs import spec

    good = tmp_path / "pull.yaml"
    good.write_text("model: tiny\ntokens: [16]\nstrategies:\n  token_split: {comm: copy_engine_pull}\n"
                    "  iso: {comm: copy_engine_pull, split_ratio: balanced}\n")
    for cuda in (False, True):
        points = spec.load(good, cuda).points(2, cuda)
        assert {p.strategy for p in points} == {"token_split", "iso"}
        assert all(p.knobs["comm"] == "copy_engine_pull" for p in points)
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: tiny\ntokens: [16]\nstrategies:\n  fused_norm: {comm: copy_engine_pull}\n")
    with pytest.raises(UserError, match=r"strategies.fused_norm.comm: 'copy_engine_pull' is not one of fused \| copy_engine"):
        spec.load(bad, cuda=True)


def test_predict_skips_its_points_saying_why():
    """No comm path prices its transfer and its add + norm runs on the main lane: `predict` gives
    a skipped row, never a number (no inputs are read before the skip)."""
    from overlapbench.model.models import PRESETS
    from overlapbench.model.schedule import Batch
    from overlapbench.predict.estimate import Skip, estimate

    batch = Batch.of((8192,), None, PRESETS["llama3-70b"], 2)
    for strategy, knobs in (("token_split", {"comm": "copy_engine_pull", "split_ratio": "balanced", "align": 256,
                                             "split_offset": 0, "comm_ctas_attn": None, "comm_ctas_mlp": None,
                                             "nccl_max_ctas": "default"}),
                            ("iso", {"comm": "copy_engine_pull", "split_ratio": "balanced", "align": 64,
                                     "comm_ctas": None, "nccl_max_ctas": "default"})):
        found = estimate(strategy, knobs, batch, 4, "bf16", inputs=None)
        assert isinstance(found, Skip), found
        assert found.reason.startswith("comm=copy_engine_pull: no comm path times its transfer yet")
        assert found.reason.endswith("measure the point with `overlapbench sweep`") and "\n" not in found.reason


def test_exports_say_what_an_engine_runs_instead_of_a_pull_split():
    """A tuned token_split or iso pick with comm: copy_engine_pull (kind: the strategy) is exported
    with a note that names the method: TokenWeave keeps the cut and says it reduces with its fused
    kernel only; vLLM says it has no split."""
    from overlapbench.export import tokenweave, vllm
    from overlapbench.export.picks import Pick, kind_of
    from tests.export_rows import config

    knobs = {"align": 256, "comm": "copy_engine_pull", "split_offset": 128}
    assert kind_of("token_split", knobs) == "token_split" and kind_of("iso", {"comm": "copy_engine_pull"}) == "iso"
    export = tokenweave.export(config([(1, 9000, "token_split", knobs)]), [], "s", None)
    assert any("token_split with comm=copy_engine_pull picked; TokenWeave reduces with its fused kernel only" in w
               and "keeps the cut" in w for w in export.warnings), export.warnings
    why = vllm.ENGINE.why_not(Pick(1, 9000, "token_split", knobs, "token_split"))
    assert why is not None and "no token-split overlap" in why
