"""An extension point is one record in one place: a layer comm method is a `CommMethod`
(overlap/comm_methods.py), an engine export an `Engine` (its module, listed in export/engines.py).
What derives from them (the knob's choices, the plans' transfers, predict's per-row paths, the
exports' kinds, `--engine`'s choices) is checked here against the records, and a kind no record
knows is said so, never taken as runnable."""

from __future__ import annotations

import typing

import pytest

from overlapbench import strategies
from overlapbench.comm.paths import PATHS_BY_NAME
from overlapbench.errors import UserError
from overlapbench.export import engines
from overlapbench.export.command import Options as ExportOptions
from overlapbench.export.picks import Pick, kind_of
from overlapbench.overlap import comm_methods
from overlapbench.strategies.knobs import COMM, FUSED_COMM

JUDGED = [e for e in engines.ENGINES if e.judged]


def test_the_comm_knob_is_the_methods():
    assert COMM.choices == comm_methods.NAMES == tuple(m.name for m in comm_methods.METHODS)
    assert FUSED_COMM.choices == comm_methods.FUSED_CHOICES == ("fused", "copy_engine")  # no deferred method
    assert comm_methods.CTA_BUDGETED == ("fused", "copy_engine", "nccl_symm")
    for method in comm_methods.METHODS:
        assert f"{method.name}: {method.summary}" in COMM.help


@pytest.mark.parametrize("method", comm_methods.METHODS, ids=lambda m: m.name)
def test_each_method_names_a_comm_path_and_a_budget_it_runs_on(method):
    """Its transfer is timed by a comm path that exists and reduces (the predictions read it),
    on the budget its record names; a method with none either sends nothing (a bound, unchecked)
    or says why no path prices it yet."""
    if method.path is None:
        transfer = comm_methods.get(method.name).transfer(8, 16)
        assert transfer.path is None
        if method.unpriced is None:
            assert not method.checked and transfer.unpriced is None
        else:
            assert method.checked and transfer.unpriced.startswith(f"comm={method.name}: ")
        return
    assert method.unpriced is None
    assert "all_reduce" in PATHS_BY_NAME[method.path].ops
    transfer = method.transfer(8, 16)
    assert transfer.path == method.path and transfer.norm == method.norm_after
    assert transfer.ctas == (16 if method.budget == comm_methods.NCCL_MAX_CTAS else 8)
    assert (method.path in comm_methods.PER_ROW_PATHS) == PATHS_BY_NAME[method.path].rows


def test_an_unknown_comm_method_is_a_one_line_error():
    names = r"nccl \| nccl_symm \| fused \| copy_engine \| copy_engine_pull \| none"
    with pytest.raises(UserError, match=rf"comm: 'nvls' is not one of {names}"):
        comm_methods.get("nvls")


@pytest.mark.parametrize("method", [m for m in comm_methods.METHODS if m.engine_kind], ids=lambda m: m.name)
@pytest.mark.parametrize("engine", JUDGED, ids=lambda e: e.name)
def test_every_engine_knows_each_methods_kind(method, engine):
    """Each method's engine kind is one every judged engine either runs or says why not."""
    pick = Pick(1, 2, "fused_norm", {"comm": method.name}, method.engine_kind)
    assert method.engine_kind in engine.runs or engine.why_not(pick) is not None
    assert "knows no counterpart" not in (engine.why_not(pick) or "")


@pytest.mark.parametrize("engine", JUDGED, ids=lambda e: e.name)
def test_every_registered_strategy_has_a_rule_in_every_engine(engine):
    """The kinds the built-in strategies give (at their default knobs, and each comm method of
    fused_norm and baseline's all-reduce) are known to each engine's record."""
    settings = [(cls.name, {k.name: k.default for k in cls.knobs}) for cls in strategies.all_strategies()
                if cls.name != "no_comm"]  # the bound is never a tuned pick
    settings += [("fused_norm", {"comm": m}) for m in comm_methods.FUSED_CHOICES]
    settings += [("baseline", {"allreduce": a}) for a in ("one_shot", "two_shot")] + [("baseline", {"nccl_symm": True})]
    for strategy, knobs in settings:
        pick = Pick(1, 2, strategy, knobs, kind_of(strategy, knobs))
        assert pick.kind in engine.runs or engine.why_not(pick), (strategy, knobs)
        assert "knows no counterpart" not in (engine.why_not(pick) or ""), (strategy, knobs)


@pytest.mark.parametrize("engine", JUDGED, ids=lambda e: e.name)
def test_a_kind_no_record_knows_is_said_so(engine):
    """A strategy added after an engine's record (a plugin's) is not taken for one it runs."""
    why = engine.why_not(Pick(1, 2, "my_overlap", {}, kind_of("my_overlap", {})))
    assert why is not None and "my_overlap" in why and f"overlapbench/export/{engine.name}.py" in why


def test_the_engine_choices_are_the_records():
    assert engines.CHOICES == "tokenweave | vllm | sglang | trtllm"
    assert engines.get(" VLLM ") is engines.BY_NAME["vllm"]
    option = typing.get_type_hints(ExportOptions, include_extras=True)["engine"].__metadata__[0]
    assert option.help == f"{engines.CHOICES} (any case)."
    with pytest.raises(UserError, match=r"--engine: 'lmdeploy' is not one of tokenweave \| vllm \| sglang \| trtllm"):
        engines.get("lmdeploy")
