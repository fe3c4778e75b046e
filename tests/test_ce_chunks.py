"""The `ce_chunks` knob of the strategies whose `comm` can be copy_engine (token_split, iso,
fused_norm): the pieces the copy-engine path cuts each reduction's rows into, one add + norm
kernel each.

On CPU: the knob's domain, that it is sparse (earlier rows keep their point keys), that it is
reset where the comm method does not cut its calls (the method records' `chunked`), and that
the value reaches every call of the kernel (a recording stand-in kernel; the protocol itself on
threads is tests/test_copy_engine_norm.py's, on 2 GPUs tests/test_ce_chunks_gpu.py's)."""

from __future__ import annotations

import types

import pytest

from overlapbench import strategies
from overlapbench.errors import UserError
from overlapbench.overlap import comm_methods
from overlapbench.specs import spec
from overlapbench.strategies.knobs import CE_CHUNKS

TAKERS = ("token_split", "iso", "fused_norm")


def test_the_chunked_methods_are_the_records():
    assert comm_methods.CHUNKED == tuple(m.name for m in comm_methods.METHODS if m.chunked) == ("copy_engine",)
    assert CE_CHUNKS.name == comm_methods.CE_CHUNKS and CE_CHUNKS.default == comm_methods.AUTO
    assert CE_CHUNKS.help.startswith("comm=copy_engine only")
    for name in TAKERS:
        assert CE_CHUNKS in strategies.get(name).knobs
    # every strategy whose comm can be a chunked method takes the knob, and only those
    for cls in strategies.all_strategies():
        comm = next((k for k in cls.knobs if k.name == "comm"), None)
        chunked = comm is not None and any(c in comm_methods.CHUNKED for c in comm.choices or ())
        assert (CE_CHUNKS in cls.knobs) == chunked, cls.name


@pytest.mark.parametrize("name", TAKERS)
def test_the_knob_is_sparse_bounded_and_auto_by_default(name):
    cls = strategies.get(name)
    base = {"comm": "copy_engine"}
    assert "ce_chunks" not in cls.check_knobs(base, name)  # the points of earlier runs keep their keys
    assert "ce_chunks" not in cls.check_knobs(base | {"ce_chunks": "auto"}, name)
    for value in (1, 2, 16):
        assert cls.check_knobs(base | {"ce_chunks": value}, name)["ce_chunks"] == value
    for bad in (0, 17, -1, 2.0, "3", "default", True, None):
        with pytest.raises(UserError, match=rf"^{name}\.ce_chunks: "):
            cls.check_knobs(base | {"ce_chunks": bad}, name)


@pytest.mark.parametrize("name, comm", [(s, c) for s in ("token_split", "iso") for c in ("nccl", "nccl_symm", "fused", "none")]
                         + [("fused_norm", "fused")])
def test_it_is_reset_where_the_comm_method_does_not_cut_its_calls(name, comm):
    cls = strategies.get(name)
    with_it = cls.check_knobs({"comm": comm, "ce_chunks": 3}, name)
    assert with_it == cls.check_knobs({"comm": comm}, name) and "ce_chunks" not in with_it


def test_a_grid_over_comm_and_ce_chunks_measures_each_setting_once():
    grid = spec.from_dict({"model": "tiny", "tokens": [64], "strategies": {
        "token_split": {"comm": ["fused", "copy_engine"], "ce_chunks": [1, 2, "auto"]},
        "fused_norm": {"comm": ["fused", "copy_engine"], "ce_chunks": [1, "auto"]}}}, "file", cuda=True)
    found = sorted((p.strategy, p.knobs["comm"], str(p.knobs.get("ce_chunks", "auto"))) for p in grid.points(2, True))
    assert found == [("fused_norm", "copy_engine", "1"), ("fused_norm", "copy_engine", "auto"), ("fused_norm", "fused", "auto"),
                     ("token_split", "copy_engine", "1"), ("token_split", "copy_engine", "2"),
                     ("token_split", "copy_engine", "auto"), ("token_split", "fused", "auto")]


@pytest.fixture
def kernel(monkeypatch):
    from overlapbench.overlap import reducers
    from tests.fake_symmetric import RecordingKernel

    made = RecordingKernel()
    monkeypatch.setattr(reducers, "_engine", lambda ctx, comm, make_kernel: made)
    return made


@pytest.mark.parametrize("value, passed", [(1, {"chunks": 1, "sm_out": False}), (4, {"chunks": 4, "sm_out": False}),
                                           ("auto", {"sm_out": False}), (None, {"sm_out": False})])
def test_the_count_reaches_every_call_of_the_kernel(kernel, value, passed):
    import torch

    ctx = types.SimpleNamespace(eps=1e-5)
    knobs = {} if value is None else {"ce_chunks": value}  # None: left out, as a sparse knob at auto is
    reducer = comm_methods.get("copy_engine").build(ctx, 12, knobs)
    assert reducer.chunks == passed.get("chunks") and reducer.num_ctas == 12
    residual = torch.randn(7, 16)
    for begin, end in ((0, 3), (3, 7)):
        reducer(None, types.SimpleNamespace(begin=begin, end=end), residual[begin:end], torch.randn(16))
    assert kernel.calls == [(0, 3, 12, passed), (3, 7, 12, passed)]


def test_a_method_that_does_not_cut_its_calls_never_gets_a_count(kernel):
    import torch

    reducer = comm_methods.get("fused").build(types.SimpleNamespace(eps=1e-5), 8, {"ce_chunks": 3})
    assert reducer.chunks is None
    reducer(None, types.SimpleNamespace(begin=0, end=5), torch.randn(5, 16), torch.randn(16))
    assert kernel.calls == [(0, 5, 8, {})]  # the fused kernel's call takes no chunk count


@pytest.mark.parametrize("name, knobs, budgets", [
    ("token_split", {"comm": "copy_engine", "comm_ctas_attn": 4, "comm_ctas_mlp": 16, "ce_chunks": 2}, (4, 16)),
    ("iso", {"comm": "copy_engine", "comm_ctas": 8, "ce_chunks": 1}, (8, 8)),
])
def test_a_split_builds_both_reducers_with_the_count(kernel, name, knobs, budgets):
    cls = strategies.get(name)
    checked = cls.check_knobs(knobs, name)
    if name == "iso":
        checked |= {"comm_ctas_attn": checked["comm_ctas"], "comm_ctas_mlp": checked["comm_ctas"]}  # as iso.build passes them
    attention, mlp = comm_methods.for_split(types.SimpleNamespace(eps=1e-5), checked)
    assert (attention.num_ctas, mlp.num_ctas) == budgets
    assert attention.chunks == mlp.chunks == knobs["ce_chunks"]
