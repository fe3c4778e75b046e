"""`model: path/to/config.json`: Hugging Face configs read into shapes, their attention details
(QKV bias, Qwen3's q/k norms) computed by every strategy as by the reference, and bad configs
refused in one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from overlapbench.errors import UserError
from overlapbench.model import hf_config
from overlapbench.model.layer import reference_forward
from overlapbench.model.models import PRESETS, ModelShape
from overlapbench.model.weights import build_stack
from overlapbench.specs import spec as spec_mod
from tests import distributed
from tests.test_registry import _runs_on_cpu

LAYERS = 2
SEQ_LENS = (29, 14)  # two sequences, neither a multiple of any alignment

# Small configs of each dense model type, as their config.json files spell them. Each leaves
# out something transformers fills in, and together they cover the attention variants: llama
# with attention_bias (q/k/v bias), mistral with head_dim != hidden / heads, qwen2 (always a
# q/k/v bias), qwen3 (q/k norms, rope_theta in transformers 5's rope_parameters).
DENSE = {
    "llama": (
        {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 8,
         "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "attention_bias": True,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192}},
        ModelShape(hidden=64, ffn=96, heads=8, kv_heads=4, head_dim=8, eps=1e-5, rope_theta=5e5, qkv_bias=True),
    ),
    "mistral": (
        {"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 8,
         "head_dim": 16, "sliding_window": 4096},  # kv heads: transformers' default 8
        ModelShape(hidden=64, ffn=128, heads=8, kv_heads=8, head_dim=16, eps=1e-6, rope_theta=1e4),
    ),
    "qwen2": (
        {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "use_sliding_window": False,
         "sliding_window": 131072},
        ModelShape(hidden=64, ffn=128, heads=4, kv_heads=2, head_dim=16, eps=1e-6, rope_theta=1e6, qkv_bias=True),
    ),
    "qwen3": (
        {"model_type": "qwen3", "hidden_size": 48, "intermediate_size": 96, "num_attention_heads": 8,
         "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "attention_bias": False,
         "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
        ModelShape(hidden=48, ffn=96, heads=8, kv_heads=2, head_dim=16, eps=1e-6, rope_theta=1e6, qk_norm=True),
    ),
}

MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5,
           "rope_theta": 1e6, "sliding_window": None}
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
             "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
             "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6,
             "rope_theta": 1e6, "attention_bias": False, "norm_topk_prob": True}


def _write(folder: Path, name: str, data: dict) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


# -- reading configs ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", DENSE)
def test_each_dense_type_reads_as_transformers_builds_it(kind, tmp_path):
    config, shape = DENSE[kind]
    read = hf_config.read(_write(tmp_path, f"{kind}-small.json", config))
    assert read.shape == shape and read.name == f"{kind}-small"


def test_the_moe_types_read_their_experts(tmp_path):
    mixtral = hf_config.read(_write(tmp_path, "Mixtral-8x7B-v0.1/config.json", MIXTRAL))
    assert mixtral.name == "Mixtral-8x7B-v0.1"  # a Hub download's folder names it
    assert mixtral.shape == ModelShape(hidden=4096, ffn=14336, heads=32, kv_heads=8, head_dim=128, eps=1e-5,
                                       rope_theta=1e6, experts=8, top_k=2, expert_ffn=14336)
    qwen = hf_config.read(_write(tmp_path, "qwen3-30b-a3b.json", QWEN3_MOE)).shape
    assert qwen == ModelShape(hidden=2048, ffn=6144, heads=32, kv_heads=4, head_dim=128, eps=1e-6, rope_theta=1e6,
                              qk_norm=True, experts=128, top_k=8, expert_ffn=768)


def test_what_is_not_modelled_is_a_note_not_an_error(tmp_path):
    notes = hf_config.read(_write(tmp_path, "l.json", DENSE["llama"][0])).notes
    assert any("rope_scaling" in n and "llama3" in n for n in notes), notes
    assert any("o_proj" in n for n in notes), notes  # llama's attention_bias also biases o_proj
    assert any("sliding_window" in n for n in hf_config.read(_write(tmp_path, "m.json", DENSE["mistral"][0])).notes)
    assert hf_config.read(_write(tmp_path, "q.json", DENSE["qwen2"][0])).notes == ()  # window switched off


def test_presets_follow_their_models():
    assert PRESETS["qwen2.5-72b"].qkv_bias and not PRESETS["qwen2.5-72b"].qk_norm
    qwen3 = PRESETS["qwen3-32b"]
    assert qwen3.qk_norm and not qwen3.qkv_bias and qwen3.heads * qwen3.head_dim != qwen3.hidden
    assert not any(PRESETS[name].qkv_bias or PRESETS[name].qk_norm for name in ("tiny", "llama3-8b", "llama3-70b"))


BAD = [
    ({"model_type": "gpt2", "n_embd": 768}, "model_type: 'gpt2' is not supported; supported: llama, mistral"),
    ({"hidden_size": 64}, "model_type: missing"),
    ({**DENSE["qwen2"][0], "num_attention_heads": None}, "num_attention_heads: missing"),
    ({**DENSE["qwen2"][0], "hidden_size": "64"}, "hidden_size: must be an integer"),
    ({**DENSE["qwen2"][0], "num_key_value_heads": 3}, "num_key_value_heads: 3 does not divide num_attention_heads 4"),
    ({**DENSE["qwen2"][0], "num_attention_heads": 5}, "num_attention_heads: 5 does not divide hidden_size 64"),
    ({**DENSE["llama"][0], "attention_bias": "yes"}, "attention_bias: must be true or false"),
    ({**DENSE["llama"][0], "rms_norm_eps": 0}, "rms_norm_eps: must be a positive number"),
    ({**MIXTRAL, "num_experts_per_tok": 9}, "num_experts_per_tok: 9 exceeds num_local_experts 8"),
    ({**QWEN3_MOE, "moe_intermediate_size": None}, "moe_intermediate_size: missing"),
    ({**QWEN3_MOE, "decoder_sparse_step": 2}, "mixes dense and MoE layers"),
    ({**QWEN3_MOE, "mlp_only_layers": [0]}, "mixes dense and MoE layers"),
    ([1, 2], "not a JSON object"),
]


@pytest.mark.parametrize("config, message", BAD)
def test_a_bad_config_names_its_field(config, message, tmp_path):
    path = _write(tmp_path, "bad.json", config)
    with pytest.raises(UserError, match=message) as e:
        hf_config.read(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_spec_reads_a_config_relative_to_its_own_folder(tmp_path, monkeypatch):
    _write(tmp_path / "specs", "models/qwen2-small.json", DENSE["qwen2"][0])
    spec_path = tmp_path / "specs" / "s.yaml"
    spec_path.write_text("model: models/qwen2-small.json\ntokens: [16]\nstrategies: [baseline]\n")
    monkeypatch.chdir(tmp_path)  # not the spec's folder
    loaded = spec_mod.load(spec_path, cuda=False)
    assert loaded.model == "qwen2-small" and loaded.shape == DENSE["qwen2"][1]
    (point,) = loaded.points(2, cuda=False)
    assert point.model == "qwen2-small" and json.loads(point.key())["shape"]["qkv_bias"] is True
    # A preset name is still a preset; a .json that is not there is a one-line error naming it.
    assert spec_mod.from_dict({"model": "qwen2.5-72b", "tokens": [16], "strategies": ["baseline"]}, "s", False).shape.qkv_bias
    spec_path.write_text("model: models/missing.json\ntokens: [16]\nstrategies: [baseline]\n")
    with pytest.raises(UserError, match=r"s.yaml: model: .*missing.json: no such config file"):
        spec_mod.load(spec_path, cuda=False)


# -- the command line -----------------------------------------------------------------------------


def test_models_config_shows_what_was_read(tmp_path):
    path = _write(tmp_path, "Qwen3-Small/config.json", DENSE["qwen3"][0])
    result = distributed.overlapbench("models", "--config", str(path))
    assert result.returncode == 0, result.stderr
    assert "Qwen3-Small" in result.stdout and "rope_parameters.rope_theta" in result.stdout
    for name, value in DENSE["qwen3"][1].as_dict().items():
        assert any(name in line and str(value) in line for line in result.stdout.splitlines()), (name, result.stdout)


@pytest.mark.parametrize("config, message", [BAD[0], BAD[2], BAD[4]], ids=["model_type", "missing", "heads"])
def test_bad_configs_end_the_cli_in_one_line(config, message, tmp_path):
    path = _write(tmp_path, "bad.json", config)
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text("model: bad.json\ntokens: [16]\nstrategies: [baseline]\n")
    for args in (("models", "--config", str(path)), ("sweep", str(spec_path))):
        result = distributed.overlapbench(*args)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert message.split(";")[0] in result.stderr


# -- the layer computes the attention details -------------------------------------------------------


def test_dense_shapes_allocate_no_bias_or_norm_and_details_change_the_result():
    shape = DENSE["mistral"][1]
    layer = build_stack(shape, 1, 2, 0, torch.float32, torch.device("cpu")).layers[0]
    assert layer.bqkv is None and layer.q_norm is None and layer.k_norm is None
    plain = reference_forward(shape, LAYERS, 2, SEQ_LENS)
    for detail in ({"qkv_bias": True}, {"qk_norm": True}):
        other = reference_forward(replace(shape, **detail), LAYERS, 2, SEQ_LENS)
        err = (torch.linalg.vector_norm(other - plain) / torch.linalg.vector_norm(plain)).item()
        assert err > 1e-3, f"{detail} hardly changes the output ({err:.1e}): a strategy dropping it would pass"


def test_the_bias_is_sharded_like_wqkv_and_the_norms_replicated():
    shape = replace(DENSE["qwen3"][1], qkv_bias=True)  # both details at once
    cpu = torch.device("cpu")
    full = build_stack(shape, 1, 2, None, torch.float32, cpu).layers[0]
    shards = [build_stack(shape, 1, 2, r, torch.float32, cpu).layers[0] for r in range(2)]
    q, kv = shape.heads // 2 * shape.head_dim, shape.kv_heads // 2 * shape.head_dim
    # A shard's bias is its q | k | v rows; the full one is all q | all k | all v, as wqkv.
    for lo, n, full_lo in ((0, q, 0), (q, kv, 2 * q), (q + kv, kv, 2 * q + 2 * kv)):
        assert torch.equal(torch.cat([s.bqkv[lo : lo + n] for s in shards]), full.bqkv[full_lo : full_lo + 2 * n])
    for s in shards:
        assert s.bqkv.shape == (q + 2 * kv,) and s.q_norm.shape == (shape.head_dim,)
        assert torch.equal(s.q_norm, full.q_norm) and torch.equal(s.k_norm, full.k_norm)
    assert not torch.equal(full.q_norm, full.k_norm)


def _rank_all(rank: int, world: int, shapes: dict[str, ModelShape], names: list[str]) -> dict:
    from overlapbench import strategies
    from overlapbench.distributed import runtime
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import random_input
    from overlapbench.timing.step import BuildContext

    rt = runtime.init(timeout_s=60)
    outputs = {}
    for kind, shape in shapes.items():
        stack = build_stack(shape, LAYERS, world, rank, torch.float32, rt.device, 0)
        ctx = BuildContext(rt, stack, SEQ_LENS, RopeTable(shape, max(SEQ_LENS), rt.device), sum(SEQ_LENS))
        x = random_input(sum(SEQ_LENS), shape.hidden, 0, torch.float32, rt.device)
        for name in names:
            cls = strategies.get(name)
            step = cls.build(ctx, cls.check_knobs({}, name))
            outputs[kind, name] = step.to_full(step.forward(x)).clone()
    return outputs


@pytest.mark.slow
def test_every_config_type_sweeps_correct_at_tp2(tmp_path):
    """Each dense type read from its config.json, every strategy that runs on CPU, against the
    reference (fp32): the bias and the q/k norms in the all-reduce paths and in the SP path."""

    shapes = {kind: hf_config.read(_write(tmp_path, f"{kind}.json", config)).shape for kind, (config, _) in DENSE.items()}
    _assert_every_strategy_matches(shapes)


def _assert_every_strategy_matches(shapes: dict[str, ModelShape]) -> None:
    """Every checked strategy that runs on CPU, at TP=2 on gloo, within 1e-4 of the reference."""
    from overlapbench import strategies

    names = [c.name for c in strategies.all_strategies()
             if _runs_on_cpu(c, c.check_knobs({}, c.name), 2) is None and c.is_checked(c.check_knobs({}, c.name))]
    assert {"baseline", "token_split", "iso", "sp_baseline"} <= set(names), names
    outputs = distributed.run(_rank_all, shapes, names, world=2, timeout=300)
    for kind, shape in shapes.items():
        ref = reference_forward(shape, LAYERS, 2, SEQ_LENS)
        for rank_outputs in outputs:
            for name in names:
                out = rank_outputs[kind, name]
                err = distributed.rel_err(out, ref)
                assert err < 1e-4, f"{kind} ({shape}) with {name}: rel err {err:.2e}"


@pytest.mark.slow
def test_a_sweep_of_a_config_writes_its_name_and_shape(tmp_path):
    _write(tmp_path, "Qwen2-Small/config.json", DENSE["qwen2"][0])
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text(
        "model: Qwen2-Small/config.json\nlayers: 2\nbatches: [[24, 13]]\n"
        "strategies: [baseline, token_split, sp_baseline]\nmeasure: {warmup: 0, iters: 2, timeout_s: 60}\n"
    )
    out = tmp_path / "r.jsonl"
    result = distributed.overlapbench("sweep", str(spec_path), "--output", str(out))
    assert result.returncode == 0, result.stderr
    from overlapbench.tuning.results import read_rows

    rows = read_rows(out)
    assert {r["status"] for r in rows} == {"ok"} and len(rows) == 3
    assert {r["model"] for r in rows} == {"Qwen2-Small"}
    assert all(r["shape"] == DENSE["qwen2"][1].as_dict() for r in rows)
    assert all(r["rel_err"] < 1e-4 for r in rows if r["strategy"] != "baseline")


@pytest.mark.slow
def test_the_moe_config_types_sweep_correct_at_tp2():
    small = {"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 4}
    shapes = {
        "mixtral": hf_config.from_config({**MIXTRAL, **small, "intermediate_size": 32, "num_local_experts": 4}, "m").shape,
        "qwen3_moe": hf_config.from_config({**QWEN3_MOE, **small, "head_dim": 8, "intermediate_size": 96,
                                            "moe_intermediate_size": 16, "num_experts": 6, "num_experts_per_tok": 2},
                                           "q").shape,
    }
    _assert_every_strategy_matches(shapes)


# -- rows written before the shape had these fields -----------------------------------------------


def _as_written_before(row: dict) -> dict:
    """A row as an overlapbench without qkv_bias, qk_norm and the MoE fields wrote it."""
    new = ("qkv_bias", "qk_norm", "experts", "top_k", "expert_ffn")
    key = json.loads(row["key"])
    key["shape"] = {k: v for k, v in key["shape"].items() if k not in new}
    return row | {"shape": {k: v for k, v in row["shape"].items() if k not in new},
                  "key": json.dumps(key, sort_keys=True)}


def test_old_rows_read_as_rows_of_the_same_shape(tmp_path):
    import random

    from overlapbench.report.compare import compare_pairs
    from overlapbench.tuning import analysis, tune
    from overlapbench.tuning.results import ResultStore
    from tests import synthetic

    rng = random.Random(7)
    rows = [synthetic.row(s, t, median=m * t / 1024, rng=rng)
            for t in (1024, 2048) for s, m in (("baseline", 1.0), ("token_split", 0.9))]
    old = synthetic.write(tmp_path / "old.jsonl", [_as_written_before(r) for r in rows])
    new = synthetic.write(tmp_path / "new.jsonl", rows)
    assert "qkv_bias" not in old.read_text()

    both = analysis.read([old, new])
    assert len({m.group for m in both.measured}) == 1 and len(both.measured) == 4  # new rows replace old ones
    assert all(m.source == str(new) for m in both.measured)
    assert len(compare_pairs(analysis.read([old]), analysis.read([new]))) == 4
    assert len(analysis.by_point(analysis.read([old]).measured)) == 1
    assert tune.file_names(list(analysis.by_point(analysis.read([old]).measured))) == \
        tune.file_names(list(analysis.by_point(analysis.read([new]).measured)))
    # --resume of an old store skips the points it holds.
    store = ResultStore(old)
    assert store.open(resume=True) == {r["key"] for r in rows}
    store.close()
