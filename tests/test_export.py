"""Engine exports (overlapbench/export/): each engine's file says what the tuned ranges say, as far
as the engine can, and says where it cannot. Synthetic tuned configs, no engine installed; the
engines' own parsers load the exports in tests/checks/engine_exports.py."""

from __future__ import annotations

import json
import math
import random

import pytest
from typer.testing import CliRunner

from overlapbench import tuned
from overlapbench.cli import app
from overlapbench.errors import UserError
from overlapbench.export import defaults, sglang, tokenweave, tokenweave_facts, trtllm, vllm, vllm_facts
from overlapbench.export.picks import MIB
from overlapbench.tuning import analysis
from tests import synthetic

SHAPE_8B = {"hidden": 4096, "ffn": 14336, "heads": 32, "kv_heads": 8, "head_dim": 128}
BASE = {"nccl_max_ctas": "default"}


def config(rules: list[tuple[int, int, str, dict]], *, model: str = "llama3-8b", hidden: int = 4096, tp: int = 2,
           device: str = "NVIDIA H200") -> tuned.TunedConfig:
    """A tuned config built directly (knobs not checked against the registry: the lead's sparse
    baseline knobs may not exist yet)."""
    return tuned.TunedConfig(device, tp, tp, model, SHAPE_8B | {"hidden": hidden}, "bf16",
                             tuple(tuned.Rule(lo, hi, s, k) for lo, hi, s, k in rules))


def ranges(rng: random.Random, n: int, top: int) -> list[tuple[int, int]]:
    """n contiguous ranges covering 1..top with random cuts."""
    cuts = sorted(rng.sample(range(1, top), n - 1))
    los = [1] + [c + 1 for c in cuts]
    his = cuts + [top]
    return list(zip(los, his))


# -- vLLM ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_vllm_fusion_bound_gives_back_the_last_fused_token_count(seed):
    """vLLM fuses ranges ending at or below int(MiB * 2**20) // (hidden * dtype bytes): the exported
    MiB, read as vLLM reads it, must give back exactly where fused_norm stops winning."""
    rng = random.Random(seed)
    hidden = rng.choice([1024, 2048, 4096, 5120, 7168, 8192, 12288])
    end = rng.randint(1, 60000)
    cfg = config([(1, end, "fused_norm", {"comm_ctas": 16}), (end + 1, end + 1 + rng.randint(1, 9999), "baseline", BASE)],
                 hidden=hidden)
    export = vllm.export(cfg, "synthetic", "0.33.0")
    passes = json.loads(export.files["compilation-config.json"])["pass_config"]
    assert passes["fuse_allreduce_rms"] is True
    assert int(passes["fi_allreduce_fusion_max_size_mb"] * MIB) // (hidden * 2) == end
    assert not export.warnings
    cli = export.files["serve.sh"].splitlines()[-1]
    assert "--tensor-parallel-size 2" in cli and json.dumps(json.loads(export.files["compilation-config.json"]),
                                                             separators=(", ", ": ")) in cli


def test_vllm_old_releases_bound_the_fusion_in_tokens():
    cfg = config([(1, 3000, "fused_norm", {"comm_ctas": 8}), (3001, 9000, "baseline", BASE)])
    passes = json.loads(vllm.export(cfg, "s", "0.11.0").files["compilation-config.json"])["pass_config"]
    assert passes == {"enable_fi_allreduce_fusion": True, "fi_allreduce_fusion_max_token_num": 3000,
                      "enable_sequence_parallelism": False, "enable_async_tp": False}


def test_vllm_fusion_that_does_not_start_at_one_token_is_off_and_warned():
    cfg = config([(1, 999, "baseline", BASE), (1000, 4000, "fused_norm", {"comm_ctas": 8}), (4001, 8000, "baseline", BASE)])
    export = vllm.export(cfg, "s", None)
    assert json.loads(export.files["compilation-config.json"])["pass_config"] == {"fuse_allreduce_rms": False}
    assert any("1000..4000" in w and "not fused" in w for w in export.warnings)
    assert "WARNING: 1000..4000" in export.files["serve.sh"]


def test_vllm_sequence_parallel_lower_bound_is_where_the_sp_family_starts_for_good():
    cfg = config([(1, 2000, "baseline", BASE), (2001, 3000, "async_tp", {}), (3001, 5000, "baseline", BASE),
                  (5001, 9000, "sp_baseline", BASE), (9001, 20000, "async_tp", {})])
    export = vllm.export(cfg, "s", "0.28.0")
    passes = json.loads(export.files["compilation-config.json"])["pass_config"]
    assert passes == {"fuse_allreduce_rms": False, "enable_sp": True, "fuse_gemm_comms": True, "sp_min_token_num": 5001}
    assert any(w.startswith("2001..3000") for w in export.warnings)  # an SP range before the bound
    assert any(w.startswith("5001..9000") and "async TP" in w for w in export.warnings)  # async TP on there too
    # a release without the lower bound cannot start SP at 5001; one without SP says so for each range
    older = vllm.export(cfg, "s", "0.14.0")
    assert json.loads(older.files["compilation-config.json"])["pass_config"]["enable_sp"] is False
    newest = vllm.export(cfg, "s", "0.33.0")
    assert "enable_sp" not in newest.files["compilation-config.json"]
    assert sum("no sequence-parallel" in w for w in newest.warnings) == 3


def test_vllm_symmetric_memory_pick_sets_the_backend_switches():
    cfg = config([(1, 4096, "baseline", BASE | {"allreduce": "one_shot"}), (4097, 65536, "baseline", BASE)])
    export = vllm.export(cfg, "s", None)
    script = export.files["serve.sh"]
    assert f"export {vllm_facts.ENV_SYMM_MEM}=1" in script and f"export {vllm_facts.ENV_FLASHINFER_AR}=0" in script
    assert script.rstrip().endswith(vllm_facts.DISABLE_CUSTOM_AR)
    # 4097 tokens x 4096 x 2 B = 32 MiB + 8 KiB < vLLM's 64 MiB symmetric-memory cap at TP=2: NCCL cannot be kept there
    assert any(w.startswith("4097..65536") for w in export.warnings)


def test_an_allreduce_value_without_an_engine_counterpart_is_refused():
    with pytest.raises(UserError, match="baseline knob allreduce: 'ring' has no engine counterpart here"):
        vllm.export(config([(1, 9000, "baseline", BASE | {"allreduce": "ring"})]), "s", None)


def test_vllm_nccl_symm_below_world_size_four_is_warned():
    export = vllm.export(config([(1, 9000, "baseline", BASE | {"nccl_symm": True})]), "s", None)
    assert f"export {vllm_facts.ENV_NCCL_SYMM}=1" in export.files["serve.sh"]
    assert any("world size 4" in w for w in export.warnings)


def test_vllm_unknown_version_is_refused_with_the_known_ones():
    with pytest.raises(UserError, match=r"--engine-version: vllm '0\.9\.9'.*known: 0\.10\.1\.1, .*0\.33\.0"):
        vllm.export(config([(1, 10, "baseline", BASE)]), "s", "0.9.9")


# -- TokenWeave ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_tokenweave_nearest_key_lookup_returns_each_range(seed):
    """TokenWeave reads the entry of the nearest key (the first on a tie): every token count from
    its switch to twice the largest range must find its own range's CTAs and offset."""
    rng = random.Random(seed)
    rules = []
    for lo, hi in ranges(rng, rng.randint(2, 7), rng.randint(4000, 40000)):
        knobs = {"align": 256, "comm": "fused", "comm_ctas_attn": rng.choice([2, 4, 8, 16, 32]),
                 "comm_ctas_mlp": rng.choice([2, 4, 8, 16, 32]), "split_offset": rng.choice([-256, 0, 128, 256]),
                 "split_ratio": None, "nccl_max_ctas": "default"}
        rules.append((lo, hi, "token_split", knobs))
    cfg = config(rules, model="llama3-70b")
    export = tokenweave.export(cfg, "s", None)
    table = {int(k): v for k, v in json.loads(export.files["llama_config_2.json"]).items()}
    for n in range(tokenweave_facts.SPLIT_FROM["llama"], 2 * cfg.max_tokens):
        knobs = cfg.choose(n).knobs
        assert table[tokenweave_facts.nearest_key(table, n)] == {
            "attention_ctas": knobs["comm_ctas_attn"], "mlp_ctas": knobs["comm_ctas_mlp"],
            "split_offset": knobs["split_offset"]}, n


def test_tokenweave_says_what_it_cannot_run():
    cfg = config([(1, 700, "baseline", BASE), (701, 3000, "fused_norm", {"comm_ctas": 32}),
                  (3001, 9000, "flash_agrs", {"transport": "copy_engine"})], model="qwen2.5-7b")
    export = tokenweave.export(cfg, "s", None)
    assert set(export.files) == {"qwen2_config_2.json", "qwen2_config_2.notes.txt"}
    table = json.loads(export.files["qwen2_config_2.json"])
    assert list(table) == ["1024", "3000", "3001", "9000"]  # nothing below the 1024-token switch
    assert table["1024"] == {"attention_ctas": 32, "mlp_ctas": 32, "split_offset": 0}
    assert table["9000"] == {"attention_ctas": 16, "mlp_ctas": 16, "split_offset": 0}  # its built-in CTAs
    text = " | ".join(export.warnings)
    assert "1..700 tokens: baseline" in text and "701..1023 tokens: fused_norm with 32 CTAs" in text
    assert "1024..3000 tokens: fused_norm picked (no split)" in text and "3001..9000 tokens: flash_agrs" in text
    assert "ships no qwen2 config for TP=2" in export.files["qwen2_config_2.notes.txt"]


def test_tokenweave_keeps_the_cut_of_a_split_it_reduces_differently():
    knobs = {"align": 256, "comm": "copy_engine", "comm_ctas_attn": 32, "comm_ctas_mlp": 4, "split_offset": 256}
    export = tokenweave.export(config([(1, 9000, "token_split", knobs)]), "s", None)
    assert json.loads(export.files["llama_config_2.json"])["9000"] == {"attention_ctas": 16, "mlp_ctas": 16,
                                                                       "split_offset": 256}
    assert any("comm=copy_engine" in w and "keeps the cut" in w for w in export.warnings)


def test_tokenweave_mixtral_switch_and_unknown_family():
    cfg = config([(1, 5000, "token_split", {"align": 256, "comm": "fused", "comm_ctas_attn": 8, "comm_ctas_mlp": 4,
                                             "split_offset": 0})], model="mixtral-8x7b")
    assert list(json.loads(tokenweave.export(cfg, "s", None).files["mixtral_config_2.json"])) == ["2048", "5000"]
    with pytest.raises(UserError, match="tuned up to 1500 tokens, below TokenWeave's split switch at 2048"):
        tokenweave.export(config([(1, 1500, "fused_norm", {"comm_ctas": 8})], model="mixtral-8x7b"), "s", None)
    with pytest.raises(UserError, match="model 'qwen3-32b': TokenWeave has model files for llama, qwen2, mixtral"):
        tokenweave.export(config([(1, 5000, "baseline", BASE)], model="qwen3-32b"), "s", None)


def test_tokenweave_split_point_is_its_formula():
    rng = random.Random(7)
    for _ in range(200):
        n, offset = rng.randint(2, 70000), rng.choice([-256, 0, 128, 256])
        assert tokenweave_facts.split_point(n, offset) == ((n + 255) & ~255) // 2 + offset


# -- SGLang and TensorRT-LLM -----------------------------------------------------------------------


def test_sglang_flags_and_its_constant_cap():
    exact = sglang.export(config([(1, 2048, "fused_norm", {"comm_ctas": 8}), (2049, 9000, "baseline", BASE)]), "s", None)
    line = exact.files["launch.sh"].splitlines()[-1]
    assert line.endswith("--tp 2 --flashinfer-allreduce-fusion-backend auto") and not exact.warnings
    longer = sglang.export(config([(1, 5792, "fused_norm", {"comm_ctas": 8}), (5793, 9000, "baseline", BASE)]), "s", None)
    assert any("5792" in w and "2048" in w for w in longer.warnings)
    symm = sglang.export(config([(1, 9000, "baseline", BASE | {"allreduce": "two_shot"})]), "s", None)
    assert "--enable-torch-symm-mem" in symm.files["launch.sh"] and any("not TP=2" in w for w in symm.warnings)
    with pytest.raises(UserError, match="--engine-version: sglang '0.4.0'"):
        sglang.export(config([(1, 10, "baseline", BASE)]), "s", "0.4.0")


def test_trtllm_fused_then_nccl_is_twoshot_with_the_workspace_at_the_bound():
    rng = random.Random(3)
    end, hidden = rng.randint(100, 20000), rng.choice([4096, 8192])
    export = trtllm.export(config([(1, end, "fused_norm", {"comm_ctas": 8}), (end + 1, 40000, "baseline", BASE)],
                                  hidden=hidden), "s", None)
    assert export.files["extra_llm_api_options.yaml"].splitlines()[-1] == "allreduce_strategy: TWOSHOT"
    assert f"export TRTLLM_ALLREDUCE_FUSION_WORKSPACE_SIZE={end * hidden * 2}\n" in export.files["env.sh"]
    nccl = trtllm.export(config([(1, 40000, "baseline", BASE)]), "s", None)
    assert nccl.files["extra_llm_api_options.yaml"].endswith("allreduce_strategy: NCCL\n")
    assert "\nexport " not in nccl.files["env.sh"]
    mixed = trtllm.export(config([(1, 100, "fused_norm", {}), (101, 900, "iso", {}), (901, 999, "baseline", BASE)]), "s", None)
    assert any(w.startswith("101..900") for w in mixed.warnings) and "\nexport " not in mixed.files["env.sh"]


# -- the engine's default against the tuned choice ------------------------------------------------


def _rows(tmp_path, medians: dict[tuple[str, str], float], tokens=(1024, 16384)) -> list[analysis.Measured]:
    knobs = {"baseline": BASE, "fused": {"comm_ctas": 64}, "symm": BASE | {"allreduce": "one_shot"}}
    strategy = {"baseline": "baseline", "fused": "fused_norm", "symm": "baseline"}
    rows = [synthetic.row(strategy[name], t, knobs[name], median=medians[(name, t)] * t / 1024,
                          rng=random.Random(f"{name}{t}"))
            for name in knobs for t in tokens if (name, t) in medians]
    return analysis.read([synthetic.write(tmp_path / "rows.jsonl", rows)]).measured


def test_vllm_default_costs_what_its_stand_in_row_says(tmp_path):
    """llama3-8b at TP=2 on an H200: vLLM fuses up to 64 MiB = 8192 tokens by default, so at 1024
    tokens its stand-in is fused_norm; at 16384 (128 MiB) pynccl, the baseline."""
    rows = _rows(tmp_path, {("baseline", 1024): 1.0, ("fused", 1024): 1.25, ("baseline", 16384): 1.1,
                            ("fused", 16384): 1.0})
    cfg = config([(1, 4096, "baseline", BASE), (4097, 16384, "fused_norm", {"comm_ctas": 64})])
    first, second = defaults.lines("vllm", cfg, rows)
    assert first.default.kind == "fused_norm" and first.engine_row.strategy == "fused_norm"
    assert first.tuned_row.strategy == "baseline"
    assert first.cost.speedup == pytest.approx(first.engine_row.ms / first.tuned_row.ms, rel=1e-9)
    assert first.cost.speedup > 1.2  # the fused default is slower here: the table shows its cost
    assert second.default.kind == "nccl" and second.engine_row.strategy == "baseline"
    assert second.cost.speedup > 1.05
    table = defaults.markdown("vllm", cfg, rows, "synthetic.yaml")
    assert "| 1024 | FlashInfer all-reduce + RMSNorm fusion (to 8192 tokens) | fused_norm comm_ctas=64 |" in table


def test_a_default_without_its_stand_in_row_says_so(tmp_path):
    rows = _rows(tmp_path, {("baseline", 1024): 1.0, ("baseline", 16384): 1.0})
    cfg = config([(1, 16384, "baseline", BASE)])
    sglang_lines = defaults.lines("sglang", cfg, rows)
    assert sglang_lines[0].default.kind == "symm" and sglang_lines[0].cost is None  # 8 MiB: custom all-reduce
    assert "no symmetric-memory all-reduce" in sglang_lines[0].note
    assert sglang_lines[1].default.kind == "nccl" and sglang_lines[1].cost.method == "same row"
    with_symm = _rows(tmp_path, {("baseline", 1024): 1.0, ("symm", 1024): 0.9})
    line = defaults.lines("sglang", cfg, with_symm)[0]
    assert line.engine_row.knobs.get("allreduce") == "one_shot" and line.cost.speedup < 1
    assert all(ln.cost is None and "ships no" in ln.note for ln in defaults.lines("tokenweave", cfg, rows))


# -- the command -----------------------------------------------------------------------------------


def _tuned_yaml(tmp_path):
    cfg = tuned.from_dict({
        "schema": tuned.SCHEMA, "device": "NVIDIA H200", "world_size": 2, "tp": 2, "model": "llama3-8b",
        "shape": SHAPE_8B, "dtype": "bf16",
        "rules": [{"tokens": [1, 5792], "strategy": "fused_norm", "knobs": {"comm_ctas": 64}},
                  {"tokens": [5793, 32768], "strategy": "baseline", "knobs": BASE}]})
    return tuned.save(cfg, tmp_path / "llama3-8b-tp2.yaml")


@pytest.mark.parametrize("engine", ["tokenweave", "vllm", "sglang", "trtllm"])
def test_export_command_writes_each_engines_files(tmp_path, engine):
    path = _tuned_yaml(tmp_path)
    result = CliRunner().invoke(app, ["export", str(path), "--engine", engine, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in (tmp_path / "out" / engine / "llama3-8b-tp2").iterdir())
    assert written == {"tokenweave": ["llama_config_2.json", "llama_config_2.notes.txt"],
                       "vllm": ["compilation-config.json", "serve.sh"], "sglang": ["launch.sh"],
                       "trtllm": ["env.sh", "extra_llm_api_options.yaml"]}[engine]
    again = tmp_path / "again"
    CliRunner().invoke(app, ["export", str(path), "--engine", engine, "--out", str(again)])
    for name in written:  # deterministic: the same input gives the same bytes
        first, second = (root / engine / "llama3-8b-tp2" / name for root in (tmp_path / "out", again))
        assert first.read_bytes() == second.read_bytes()


@pytest.mark.parametrize("args, message", [
    (["--engine", "tensorrt"], "--engine: 'tensorrt' is not one of tokenweave | vllm | sglang | trtllm"),
    (["--engine", "vllm", "--engine-version", "1.0"], "--engine-version: vllm '1.0'"),
    (["--engine", "trtllm", "--engine-version", "1.2.1"], "--engine-version: no TensorRT-LLM release was read"),
])
def test_export_command_refuses_bad_options_in_one_line_writing_nothing(tmp_path, args, message):
    path = _tuned_yaml(tmp_path)
    result = CliRunner().invoke(app, ["export", str(path), *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_export_from_results_tunes_them_and_defaults_read_the_same_rows(tmp_path):
    rng = random.Random(11)
    rows = []
    for t in (1024, 8192):
        base = 0.5 * t / 1024 * (1 + rng.random() * 0.1)
        rows += [synthetic.row("baseline", t, BASE, median=base, rng=rng),
                 synthetic.row("fused_norm", t, {"comm_ctas": 64}, median=base * (0.8 if t == 1024 else 1.3), rng=rng)]
    store = synthetic.write(tmp_path / "r.jsonl", rows)
    result = CliRunner().invoke(app, ["export", str(store), "--engine", "vllm", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    passes = json.loads((tmp_path / "out/vllm/llama3-8b-tp2-nvidia-h200-bf16/compilation-config.json").read_text())
    fused_end = math.isqrt(1024 * 8192)  # tune's boundary between the two measured counts
    assert int(passes["pass_config"]["fi_allreduce_fusion_max_size_mb"] * MIB) // (4096 * 2) == fused_end
    table = CliRunner().invoke(app, ["export", str(store), "--engine", "vllm", "--defaults"])
    assert table.exit_code == 0 and "| 8192 | FlashInfer all-reduce + RMSNorm fusion (to 8192 tokens) |" in table.output


def test_docs_example_is_what_the_committed_files_give():
    """docs/export.md's example section is made from the committed tuned configs and their rows;
    when those change (a new run), the page must be made again."""
    from tests.checks import export_docs

    page = export_docs.PAGE.read_text()
    assert export_docs.render(page, export_docs.section()) == page, (
        "docs/export.md's example is not what the committed files give: run python tests/checks/export_docs.py")


def test_defaults_without_the_rows_behind_a_config_say_which_file_is_missing(tmp_path):
    cfg = tuned.from_dict(tuned.load(_tuned_yaml(tmp_path)).as_dict() | {
        "provenance": {"sources": [str(tmp_path / "gone.jsonl")]}})
    path = tuned.save(cfg, tmp_path / "t.yaml")
    result = CliRunner().invoke(app, ["export", str(path), "--engine", "vllm", "--defaults"])
    assert result.exit_code == 2 and "gone.jsonl, not found here; pass the results .jsonl" in result.output


def test_export_imports_no_torch():
    """Like tune and tuned: `export` runs where torch is not installed (an engine's build box)."""
    import subprocess
    import sys

    code = ("import sys, overlapbench.export.command, overlapbench.export.defaults; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
