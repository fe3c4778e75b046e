"""Spec validation: every bad input is one UserError naming the field; good specs expand right."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from overlapbench.errors import UserError
from overlapbench.specs import spec
from overlapbench.tuning.rows import Decode

GOOD = {
    "name": "t",
    "model": "tiny",
    "tp": 2,
    "layers": 2,
    "tokens": [16, 33],
    "strategies": {"baseline": {"nccl_max_ctas": ["default", 4, 8]}, "no_comm": {}},
}


def parse(overrides: dict | None = None, drop: tuple = (), cuda: bool = False) -> spec.SweepSpec:
    data = {k: v for k, v in GOOD.items() if k not in drop} | (overrides or {})
    return spec.from_dict(data, "file", cuda)


def test_good_spec_expands_the_grid():
    points = parse().points(world_size=2, cuda=False)
    assert len(points) == 2 * (3 + 1)
    assert [p.tokens for p in points[:4]] == [16] * 4  # grouped by batch
    assert {p.knobs["nccl_max_ctas"] for p in points if p.strategy == "baseline"} == {"default", 4, 8}
    assert all(p.dtype == "fp32" for p in points)
    assert parse(cuda=True).points(2, cuda=True)[0].dtype == "bf16"
    assert len({p.key() for p in points}) == len(points)


def test_device_section_overrides():
    s = parse({"model": "llama3-8b", "tokens": [4096], "cpu": {"model": "tiny", "tokens": [8]}})
    assert s.model == "tiny" and s.batches == ((8,),)
    s = parse({"model": "llama3-8b", "tokens": [4096], "cpu": {"model": "tiny", "tokens": [8]}}, cuda=True)
    assert s.model == "llama3-8b" and s.batches == ((4096,),)


def test_grid_of_two_knobs_is_a_product():
    s = parse({"strategies": {"token_split": {"split_offset": [0, 128], "align": [128, 256]}}})
    assert len(s.points(2, False)) == 2 * 4


def test_irrelevant_knobs_do_not_double_points():
    s = parse({"strategies": {"token_split": {"comm": ["nccl", "fused"], "comm_ctas_attn": [4, 8]}}})
    knobs = [p.knobs for p in s.points(2, False) if p.tokens == 16]
    assert len(knobs) == 3  # nccl once, fused with 4 and 8


@pytest.mark.parametrize(
    "overrides, drop, field",
    [
        ({"modle": "tiny"}, (), "modle"),  # unknown key
        ({"model": "llama-70b"}, (), "model"),  # unknown preset
        ({"strategies": {"tokensplit": {}}}, (), "strategies"),  # unknown strategy
        ({"strategies": {"baseline": {"max_ctas": 4}}}, (), "strategies.baseline.max_ctas"),
        ({"strategies": {"baseline": {"nccl_max_ctas": 0}}}, (), "strategies.baseline.nccl_max_ctas"),
        ({"strategies": {"baseline": {"nccl_max_ctas": "lots"}}}, (), "strategies.baseline.nccl_max_ctas"),
        ({"strategies": {"token_split": {"comm": "mpi"}}}, (), "strategies.token_split.comm"),
        ({"strategies": {"token_split": {"split_ratio": 0.5, "split_offset": 128}}}, (), "strategies.token_split"),
        ({"strategies": {"iso": {"split_ratio": 1.5}}}, (), "strategies.iso.split_ratio"),
        ({"strategies": {"baseline": {"nccl_max_ctas": []}}}, (), "strategies.baseline.nccl_max_ctas"),
        ({"strategies": {"baseline": {"nccl_max_ctas": [4, 4]}}}, (), "strategies.baseline.nccl_max_ctas"),
        ({"strategies": {}}, (), "strategies"),
        ({"tokens": [16, -1]}, (), "tokens[1]"),
        ({"tokens": [0]}, (), "tokens[0]"),
        ({"tokens": [16, 16]}, (), "tokens"),
        ({"tokens": []}, (), "tokens"),
        ({"batches": [[8, 0]]}, (), "batches[0][1]"),
        ({"layers": 0}, (), "layers"),
        ({"dtype": "int8"}, (), "dtype"),
        ({"tp": 0}, (), "tp"),
        ({"measure": {"iters": 0}}, (), "measure.iters"),
        ({"measure": {"warmpu": 3}}, (), "measure.warmpu"),
        ({"measure": {"tolerance": -1}}, (), "measure.tolerance"),
        ({"measure": {"interleave": "yes"}}, (), "measure.interleave"),
        ({"measure": {"span_ms": 0}}, (), "measure.span_ms"),
        ({"measure": {"span_ms": float("nan")}}, (), "measure.span_ms"),
        ({"measure": {"rounds": 0}}, (), "measure.rounds"),
        ({"measure": {"profile_replays": 0}}, (), "measure.profile_replays"),
        ({"measure": {"profile_replays": 17}}, (), "measure.profile_replays: at most 16"),
        ({"measure": {"profile_replays": True}}, (), "measure.profile_replays"),
        ({"measure": {"ci_target": True}}, (), "measure.ci_target"),
        ({"measure": {"ci_target": 2}}, (), "measure.ci_target"),
        ({"measure": {"time_factor": 0}}, (), "measure.time_factor"),
        ({"shape": {"hidden": 64}}, ("model",), "shape.ffn"),
        ({"shape": {"hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 3, "head_dim": 16}}, ("model",), "shape.kv_heads"),
        ({"shape": {"hidden": -64, "ffn": 128, "heads": 4, "kv_heads": 2, "head_dim": 16}}, ("model",), "shape.hidden"),
        ({"output": "results/x.csv"}, (), "output"),
        ({"cpu": {"bogus": 1}}, (), "cpu.bogus"),
        ({"mo\ndel": "tiny"}, (), "'mo\\ndel'"),  # a key that would break the line is quoted
        ({"strategies": {"base\nline": {}}}, (), "strategies"),
        ({"strategies": {"baseline": {"max\n": 4}}}, (), "strategies.baseline.'max\\n'"),
    ],
)
def test_bad_input_names_the_field(overrides, drop, field):
    with pytest.raises(UserError) as info:
        parse(overrides, drop)
    message = str(info.value)
    assert message.startswith(field), message
    assert "\n" not in message


def test_did_you_mean():
    with pytest.raises(UserError, match="did you mean 'model'"):
        parse({"modle": "tiny"})


@pytest.mark.parametrize(
    "tp, world, field",
    [(3, 3, "tp: 3 does not divide"), (4, 2, "tp: 4 but the sweep runs on 2")],
)
def test_tp_must_fit_shape_and_world(tp, world, field):
    with pytest.raises(UserError, match=field):
        parse({"tp": tp}).points(world_size=world, cuda=False)


def test_auto_tp_is_the_world_size():
    assert {p.tp for p in parse({"tp": "auto"}).points(2, False)} == {2}


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "the spec is empty"),
        ("a: [1, 2", "not valid YAML"),
        ("- 1\n- 2\n", "must be a YAML mapping"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, message: str):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        spec.load(path, cuda=False)
    with pytest.raises(UserError, match="no such spec file"):
        spec.load(tmp_path / "missing.yaml", cuda=False)


def test_every_committed_spec_validates():
    for path in sorted(Path(__file__).parent.parent.glob("sweeps/*.yaml")):
        for cuda in (False, True):
            s = spec.load(path, cuda)
            world = s.tp if isinstance(s.tp, int) else 2
            assert s.points(world, cuda), path


def test_spec_from_yaml_text(tmp_path: Path):
    path = tmp_path / "mine.yaml"
    path.write_text(textwrap.dedent("""
        model: tiny
        tokens: [8]
        strategies: [baseline, no_comm]
    """))
    s = spec.load(path, cuda=False)
    assert s.name == "mine" and s.output_path().name.startswith("mine-")
    with pytest.raises(UserError, match="--resume: no earlier"):
        s.output_path(resume=True, results_dir=tmp_path)
    (tmp_path / "mine-20260101-000000.jsonl").write_text("")
    (tmp_path / "mine-20260102-000000.jsonl").write_text("")
    assert s.output_path(resume=True, results_dir=tmp_path).name == "mine-20260102-000000.jsonl"
    assert [p.strategy for p in s.points(2, False)] == ["baseline", "no_comm"]


def test_a_strategy_may_list_several_grids():
    grids = [{"comm": "nccl", "nccl_max_ctas": ["default", 8]}, {"comm": "fused", "comm_ctas_attn": [4, 8]}, {}]
    s = parse({"strategies": {"token_split": grids}})
    knobs = [p.knobs for p in s.points(2, False) if p.tokens == 16]
    assert len(knobs) == 4  # the empty grid is the nccl default, already listed
    with pytest.raises(UserError, match=r"strategies.token_split\[1\].comm"):
        parse({"strategies": {"token_split": [{}, {"comm": "x"}]}})


def test_interleaving_is_the_default_on_gpus_only():
    from overlapbench.specs.spec_sections import Measure

    assert Measure().interleaved(cuda=True) and not Measure().interleaved(cuda=False)
    assert Measure(interleave=True).interleaved(cuda=False) and not Measure(interleave=False).interleaved(cuda=True)


MIXED = {"prefill": [24], "decode": 8, "context": 40}


@pytest.mark.parametrize(
    "batch, field",
    [
        ({"prefill": [24], "decode": 0, "context": 40}, "batches[0].decode"),
        ({"prefill": [24], "decode": "many", "context": 40}, "batches[0].decode"),
        ({"prefill": [24], "context": 40}, "batches[0].decode"),
        ({"prefill": [24], "decode": 8}, "batches[0].context"),
        ({"prefill": [24], "decode": 8, "context": -1}, "batches[0].context"),
        ({"prefill": [24, 0], "decode": 8, "context": 40}, "batches[0].prefill[1]"),
        ({"prefill": "long", "decode": 8, "context": 40}, "batches[0].prefill"),
        ({"prefil": [24], "decode": 8, "context": 40}, "batches[0].prefil"),
    ],
)
def test_bad_mixed_batches_name_the_field(batch, field):
    with pytest.raises(UserError) as info:
        parse({"batches": [batch]}, ("tokens",))
    message = str(info.value)
    assert message.startswith(field), message
    assert "\n" not in message


def test_mixed_batches_expand_to_points_with_their_decode_tokens():
    s = parse({"batches": [[24], MIXED, {"decode": 8, "context": 40}]}, ("tokens",))
    assert s.compositions() == [((24,), None), ((24,), Decode(8, 40)), ((), Decode(8, 40))]
    points = [p for p in s.points(2, cuda=False) if p.strategy == "no_comm"]
    assert [p.tokens for p in points] == [24, 32, 8]
    assert [p.decode for p in points] == [None, Decode(8, 40), Decode(8, 40)]
    keys = [p.key() for p in points]
    assert len(set(keys)) == 3 and '"decode"' not in keys[0] and '"context": 40' in keys[1]
    assert len({p.workload_key for p in points}) == 3
    prefill_only = parse({"batches": [[24]]}, ("tokens",)).points(2, cuda=False)
    assert prefill_only[0].key() == next(p for p in s.points(2, cuda=False) if p.decode is None).key()


def test_a_mixed_batch_given_twice_is_refused():
    with pytest.raises(UserError, match="^tokens: the batch .*appears twice"):
        parse({"batches": [MIXED, dict(MIXED)]}, ("tokens",))
    parse({"batches": [MIXED, MIXED | {"context": 41}]}, ("tokens",))  # another context: another batch


def test_mixed_batches_are_for_the_layer_workload():
    with pytest.raises(UserError, match="^batches: mixed"):
        parse({"batches": [MIXED], "workload": "gemm_ag", "gemm": {"n": 64, "k": 32},
               "strategies": ["sp_baseline"]}, ("tokens",))
