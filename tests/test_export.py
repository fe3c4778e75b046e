"""Engine exports (overlapbench/export/): each engine's file says what the chosen setting is, in the
engine's own key names and flags, and how to pass it; bad input is one line. Synthetic tuned configs
and rows; how the setting is chosen: tests/test_export_choice.py; the committed configs:
tests/test_export_committed.py; the engines' own parsers: tests/checks/engine_exports.py."""

from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from overlapbench import tuned
from overlapbench.cli import app
from overlapbench.errors import UserError
from overlapbench.export import (
    defaults,
    engines,
    sglang,
    sglang_engine,
    tokenweave,
    tokenweave_facts,
    vllm,
    vllm_engine,
    vllm_facts,
)
from overlapbench.export.picks import MIB, write
from tests import synthetic
from tests.export_rows import BASE, config, measured, rule


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
    MiB, read as vLLM reads it, must give back exactly the bound the choice made."""
    rng = random.Random(seed)
    hidden = rng.choice([1024, 2048, 4096, 5120, 7168, 8192, 12288])
    end = rng.randint(1, 60000)
    model = vllm_engine.Model(config([rule(1, 10, "nccl")], hidden=hidden), "0.33.0")
    passes = vllm.pass_config(model, vllm_engine.Setting(fusion_tokens=end), vllm_facts.VERSIONS["0.33.0"])
    assert passes["fuse_allreduce_rms"] is True
    assert int(passes["fi_allreduce_fusion_max_size_mb"] * MIB) // (hidden * 2) == end
    old = vllm.pass_config(model, vllm_engine.Setting(fusion_tokens=end), vllm_facts.OLD)
    assert old == {"enable_fi_allreduce_fusion": True, "fi_allreduce_fusion_max_token_num": end}


def test_vllm_writes_only_what_differs_from_its_defaults():
    model = vllm_engine.Model(config([rule(1, 10, "nccl")]), "0.33.0")
    keys = vllm_facts.VERSIONS["0.33.0"]
    assert vllm.pass_config(model, vllm_engine.Setting(), keys) == {}
    assert vllm.pass_config(model, vllm_engine.Setting(fusion=False), keys) == {"fuse_allreduce_rms": False}
    env, flags = vllm.backend(vllm_engine.Setting(flashinfer_ar=False, custom_ar=False, symm_mem=False, nccl_symm=True))
    assert env == [f"{vllm_facts.ENV_FLASHINFER_AR}=0", f"{vllm_facts.ENV_SYMM_MEM}=0", f"{vllm_facts.ENV_NCCL_SYMM}=1"]
    assert flags == [vllm_facts.DISABLE_CUSTOM_AR]
    assert vllm.backend(vllm_engine.Setting()) == ([], [])


def test_vllm_serve_script_passes_the_json_text_not_the_file_name(tmp_path):
    """vLLM reads --compilation-config's value as JSON text: serve.sh, run by sh with a stand-in
    `vllm` on PATH, must hand it the file's JSON."""
    rows = measured(tmp_path, {t: {"nccl": t / 900, "fused": t / 1000} for t in (1024, 16384)})
    export = vllm.export(config([rule(1, 16384, "fused")]), rows, "s", None)
    folder = tmp_path / "out"
    write(export, folder)
    script = folder / "serve.sh"
    assert os.stat(script).st_mode & stat.S_IXUSR
    stub = tmp_path / "bin" / "vllm"
    stub.parent.mkdir()
    stub.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}", "MODEL": "m"}
    argv = json.loads(subprocess.run(["sh", str(script)], capture_output=True, text=True, env=env, check=True).stdout)
    value = argv[argv.index("--compilation-config") + 1]
    assert json.loads(value) == json.loads((folder / "compilation-config.json").read_text())
    assert argv[:4] == ["serve", "m", "--tensor-parallel-size", "2"]


def test_an_allreduce_value_without_an_engine_counterpart_is_refused():
    with pytest.raises(UserError, match="baseline knob allreduce: 'ring' has no engine counterpart here"):
        vllm.export(config([(1, 9000, "baseline", BASE | {"allreduce": "ring"})]), [], "s", None)


def test_vllm_releases_refused_with_what_was_read():
    with pytest.raises(UserError, match=r"--engine-version: vllm '0\.9\.9'.*known: 0\.10\.1\.1, .*0\.33\.0"):
        vllm.export(config([rule(1, 10, "nccl")]), [], "s", "0.9.9")
    with pytest.raises(UserError, match=r"vllm 0\.28\.0's defaults were not read .* read: 0\.31\.0, 0\.33\.0"):
        vllm.export(config([rule(1, 10, "nccl")]), [], "s", "0.28.0")


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
    export = tokenweave.export(cfg, [], "s", None)
    table = {int(k): v for k, v in json.loads(export.files["llama_config_2.json"]).items()}
    for n in range(tokenweave_facts.SPLIT_FROM["llama"], 2 * cfg.max_tokens):
        knobs = cfg.choose(n).knobs
        assert table[tokenweave_facts.nearest_key(table, n)] == {
            "attention_ctas": knobs["comm_ctas_attn"], "mlp_ctas": knobs["comm_ctas_mlp"],
            "split_offset": knobs["split_offset"]}, n


def test_tokenweave_says_what_it_cannot_run():
    cfg = config([(1, 700, "baseline", BASE), (701, 3000, "fused_norm", {"comm_ctas": 32}),
                  (3001, 9000, "flash_agrs", {"transport": "copy_engine"})], model="qwen2.5-7b")
    export = tokenweave.export(cfg, [], "s", None)
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
    export = tokenweave.export(config([(1, 9000, "token_split", knobs)]), [], "s", None)
    assert json.loads(export.files["llama_config_2.json"])["9000"] == {"attention_ctas": 16, "mlp_ctas": 16,
                                                                       "split_offset": 256}
    assert any("comm=copy_engine" in w and "keeps the cut" in w for w in export.warnings)
    assert not any("ce_chunks" in w for w in export.warnings)  # auto: left out of the pick, nothing to say
    chunked = tokenweave.export(config([(1, 9000, "token_split", knobs | {"ce_chunks": 2})]), [], "s", None)
    assert chunked.files["llama_config_2.json"] == export.files["llama_config_2.json"]  # the count has no place in it
    assert [w for w in chunked.warnings if "ce_chunks" in w] == [
        "1024..9000 tokens: token_split with comm=copy_engine picked; TokenWeave reduces with its fused kernel only: "
        "entry keeps the cut (split_offset) and holds its built-in 16 CTAs; its ce_chunks=2 (the copy-engine path's "
        "pieces per reduction) has no counterpart either"]


def test_tokenweave_says_which_split_knobs_it_has_no_entry_for():
    fused = {"align": 256, "comm": "fused", "comm_ctas_attn": 32, "comm_ctas_mlp": 16, "split_offset": 0}
    export = tokenweave.export(config([(1, 4000, "token_split", fused | {"chunks": 4}),
                                       (4001, 9000, "token_split", fused | {"gemm_carveout": 8}),
                                       (9001, 20000, "token_split", fused | {"reduce_start": "after_next_gemm"})]),
                                [], "s", None)
    table = json.loads(export.files["llama_config_2.json"])
    assert table["4000"] == {"attention_ctas": 16, "mlp_ctas": 16, "split_offset": 0}  # its built-in entry
    assert table["9000"] == {"attention_ctas": 32, "mlp_ctas": 16, "split_offset": 0}  # the CTAs, not the carveout
    assert table["20000"] == table["9000"]  # the CTAs and the cut, not the later start
    text = " | ".join(export.warnings)
    assert "chunks=4 picked; TokenWeave cuts the batch in two" in text
    assert "4001..9000 tokens: token_split with gemm_carveout=8 picked" in text
    assert "9001..20000 tokens: token_split with reduce_start=after_next_gemm picked; TokenWeave starts each" in text


def test_tokenweave_mixtral_switch_and_unknown_family():
    cfg = config([(1, 5000, "token_split", {"align": 256, "comm": "fused", "comm_ctas_attn": 8, "comm_ctas_mlp": 4,
                                             "split_offset": 0})], model="mixtral-8x7b")
    assert list(json.loads(tokenweave.export(cfg, [], "s", None).files["mixtral_config_2.json"])) == ["2048", "5000"]
    with pytest.raises(UserError, match="tuned up to 1500 tokens, below TokenWeave's split switch at 2048"):
        tokenweave.export(config([(1, 1500, "fused_norm", {"comm_ctas": 8})], model="mixtral-8x7b"), [], "s", None)
    with pytest.raises(UserError, match="model 'qwen3-32b': TokenWeave has model files for llama, qwen2, mixtral"):
        tokenweave.export(config([(1, 5000, "baseline", BASE)], model="qwen3-32b"), [], "s", None)


def test_tokenweave_split_point_is_its_formula():
    rng = random.Random(7)
    for _ in range(200):
        n, offset = rng.randint(2, 70000), rng.choice([-256, 0, 128, 256])
        assert tokenweave_facts.split_point(n, offset) == ((n + 255) & ~255) // 2 + offset


# -- SGLang ----------------------------------------------------------------------------------------


def test_sglang_flags_are_what_differs_from_its_defaults():
    assert sglang.flags(sglang_engine.Setting()) == []
    assert sglang.flags(sglang_engine.Setting(fusion=True, custom_ar=False, torch_symm=True, nccl_symm=True)) == [
        "--flashinfer-allreduce-fusion-backend auto", "--disable-custom-all-reduce", "--enable-torch-symm-mem",
        "--enable-symm-mem"]
    with pytest.raises(UserError, match="--engine-version: sglang '0.4.0'"):
        sglang.export(config([rule(1, 10, "nccl")]), [], "s", "0.4.0")


# -- the engine's default, the export and the tuned pick -------------------------------------------


def test_defaults_table_and_export_agree_row_by_row(tmp_path):
    """llama3-8b at TP=2 on an H200: vLLM fuses up to 64 MiB = 8192 tokens by default. NCCL beats
    the fused row at 1024 tokens by more than the fusion beats NCCL at 16384 (pynccl by default),
    and one bound cannot give both: the export runs pynccl at 1024, keeps the default at 16384, and
    the table's export column says the same."""
    rows = measured(tmp_path, {1024: {"nccl": 1.0, "fused": 1.25, "two_shot": 1.3, "one_shot": 1.3},
                               16384: {"nccl": 17.6, "fused": 16.0, "two_shot": 17.0, "one_shot": 17.5}})
    cfg = config([rule(1, 4096, "nccl"), rule(4097, 16384, "fused")])
    export = vllm.export(cfg, rows, "s", None)
    first, second = export.choice.lines
    assert first.default.text == "FlashInfer all-reduce + RMSNorm fusion" and first.default_row.strategy == "fused_norm"
    assert first.chosen.text == "pynccl all-reduce (8 MiB)" and first.chosen_row.knobs == BASE
    assert first.cost.speedup == pytest.approx(first.default_row.ms / first.chosen_row.ms, rel=0.02)
    assert second.chosen == second.default and second.default.kind == "nccl"
    # the fusion kept below the first measured count (decode sizes: not measured), PyTorch's symmetric
    # memory off (it would take 8 MiB, two-shot); vLLM's custom all-reduce takes only under 8 MiB
    assert export.choice.setting == vllm_engine.Setting(fusion_tokens=1023, symm_mem=False)
    assert json.loads(export.files["compilation-config.json"])["pass_config"]["fi_allreduce_fusion_max_size_mb"] == (
        1023 * 4096 * 2 / MIB)
    assert "export VLLM_ALLREDUCE_USE_SYMM_MEM=0\n" in export.files["serve.sh"]
    assert any(w.startswith("4097..16384 tokens: fused_norm") and "vLLM can run it, but" in w for w in export.warnings)
    table = defaults.markdown(engines.get("vllm"), cfg, rows, "synthetic.yaml")
    body = [line for line in table.splitlines() if line.startswith("| 1")]
    assert len(body) == 2
    assert body[0].startswith("| 1024 | FlashInfer all-reduce + RMSNorm fusion | fused_norm comm=fused comm_ctas=64: ")
    assert "| pynccl all-reduce (8 MiB) | baseline: " in body[0]
    assert body[1].startswith("| 16384 (above the cap) | pynccl all-reduce (128 MiB) | baseline: ")
    assert "| the default |" in body[1] and "| 0 (the same setting) |" in body[1]


def test_a_default_without_its_stand_in_row_says_so(tmp_path):
    rows = measured(tmp_path, {1024: {"nccl": 1.0}, 4096: {"nccl": 4.0}})
    cfg = config([rule(1, 4096, "nccl")])
    table = defaults.markdown(engines.get("sglang"), cfg, rows, "s")
    assert "| 1024 | custom all-reduce (8 MiB) | - (rows hold no symmetric-memory all-reduce" in table
    assert "| 4096 | NCCL all-reduce (32 MiB) | baseline: " in table
    tw = defaults.markdown(engines.get("tokenweave"), cfg, rows, "s")
    assert "TokenWeave ships no llama_config_2.json" in tw and "cannot be priced" in tw


# -- the command -----------------------------------------------------------------------------------


def _tuned_yaml(tmp_path):
    """A tuned config whose provenance names the rows behind it, as tune writes it."""
    rows = [synthetic.row(strategy, t, knobs, median=t / 1000 * scale, rng=random.Random(f"{name}{t}"))
            for t in (1024, 8192) for name, (strategy, knobs, scale) in
            {"nccl": ("baseline", BASE, 1.0), "fused": ("fused_norm", {"comm_ctas": 64}, 0.9 if t == 1024 else 1.1)}.items()]
    store = synthetic.write(tmp_path / "rows.jsonl", rows)
    cfg = tuned.from_dict({
        "schema": tuned.SCHEMA, "device": "NVIDIA H200", "world_size": 2, "tp": 2, "model": "llama3-8b",
        "shape": synthetic.row("baseline", 1024)["shape"], "dtype": "bf16",
        "rules": [{"tokens": [1, 2896], "strategy": "fused_norm", "knobs": {"comm_ctas": 64}},
                  {"tokens": [2897, 8192], "strategy": "baseline", "knobs": BASE}],
        "provenance": {"sources": [str(store)]}})
    return tuned.save(cfg, tmp_path / "llama3-8b-tp2.yaml")


FILES = {"tokenweave": ["llama_config_2.json", "llama_config_2.notes.txt"],
         "vllm": ["compilation-config.json", "serve.sh"], "sglang": ["launch.sh"],
         "trtllm": ["extra_llm_api_options.yaml", "serve.sh"]}


@pytest.mark.parametrize("engine", ["tokenweave", "vllm", "sglang", "trtllm"])
def test_export_command_writes_each_engines_files(tmp_path, engine):
    path = _tuned_yaml(tmp_path)
    result = CliRunner().invoke(app, ["export", str(path), "--engine", engine.upper(), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "out" / engine / "llama3-8b-tp2"
    assert sorted(p.name for p in folder.iterdir()) == FILES[engine]
    for script in folder.glob("*.sh"):  # run as they are
        assert os.stat(script).st_mode & stat.S_IXUSR, script
    again = tmp_path / "again"
    CliRunner().invoke(app, ["export", str(path), "--engine", engine, "--out", str(again)])
    for name in FILES[engine]:  # deterministic: the same input gives the same bytes
        first, second = (root / engine / "llama3-8b-tp2" / name for root in (tmp_path / "out", again))
        assert first.read_bytes() == second.read_bytes()


def test_a_release_is_taken_with_its_tags_v(tmp_path):
    path = _tuned_yaml(tmp_path)
    result = CliRunner().invoke(app, ["export", str(path), "--engine", "vllm", "--engine-version", "v0.31.0",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "overlapbench export for vllm 0.31.0" in (tmp_path / "out/vllm/llama3-8b-tp2/serve.sh").read_text()


@pytest.mark.parametrize("args, message", [
    (["--engine", "tensorrt"], "--engine: 'tensorrt' is not one of tokenweave | vllm | sglang | trtllm"),
    (["--engine", "vllm", "--engine-version", "1.0"], "--engine-version: vllm '1.0'"),
    (["--engine", "vllm", "--engine-version", "0.20.0"], "vllm 0.20.0's defaults were not read"),
    (["--engine", "trtllm", "--engine-version", "1.2.1"], "--engine-version: no TensorRT-LLM release was read"),
])
def test_export_command_refuses_bad_options_in_one_line_writing_nothing(tmp_path, args, message):
    path = _tuned_yaml(tmp_path)
    result = CliRunner().invoke(app, ["export", str(path), *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_a_sweep_spec_is_refused_as_one(tmp_path):
    spec = tmp_path / "study.yaml"
    spec.write_text("name: study\nmodel: llama3-8b\ntp: 2\ntokens: [1024]\nstrategies:\n  baseline: {}\n")
    result = CliRunner().invoke(app, ["export", str(spec), "--engine", "vllm", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "a sweep spec, not a tuned config: run `overlapbench sweep" in result.output
    assert "then `overlapbench tune`" in result.output and not (tmp_path / "out").exists()


def test_comm_rows_are_refused_as_what_they_are(tmp_path):
    rows = [json.loads(line) for line in open("results/h100x2/331cb63/comm.jsonl")][:3]
    store = synthetic.write(tmp_path / "comm.jsonl", rows)
    result = CliRunner().invoke(app, ["export", str(store), "--engine", "vllm", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "ok rows of `overlapbench comm`" in result.output
    assert "holds" not in result.output


def test_export_from_results_tunes_them_and_judges_from_the_same_rows(tmp_path):
    rng = random.Random(11)
    rows = []
    for t in (1024, 16384):
        base = 0.5 * t / 1024 * (1 + rng.random() * 0.1)
        rows += [synthetic.row("baseline", t, BASE, median=base, rng=rng),
                 synthetic.row("fused_norm", t, {"comm_ctas": 64}, median=base * 0.8, rng=rng)]
    store = synthetic.write(tmp_path / "r.jsonl", rows)
    result = CliRunner().invoke(app, ["export", str(store), "--engine", "vllm", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    passes = json.loads((tmp_path / "out/vllm/llama3-8b-tp2-nvidia-h200-bf16/compilation-config.json").read_text())
    # the fusion wins at 16384 (pynccl by default): its bound moves to cover it
    assert int(passes["pass_config"]["fi_allreduce_fusion_max_size_mb"] * MIB) // (4096 * 2) >= 16384
    table = CliRunner().invoke(app, ["export", str(store), "--engine", "vllm", "--defaults"])
    assert table.exit_code == 0 and "| 16384 (above the cap) | pynccl all-reduce (128 MiB) |" in table.output


def test_docs_example_is_what_the_committed_files_give():
    """docs/export.md's example section is made from the committed tuned configs and their rows;
    when those change (a new run), the page must be made again."""
    from tests.checks import export_docs

    page = export_docs.PAGE.read_text()
    assert export_docs.render(page, export_docs.section()) == page, (
        "docs/export.md's example is not what the committed files give: run python tests/checks/export_docs.py")


def test_an_export_without_the_rows_behind_its_config_says_which_file_is_missing(tmp_path):
    cfg = tuned.from_dict(tuned.load(_tuned_yaml(tmp_path)).as_dict() | {
        "provenance": {"sources": [str(tmp_path / "gone.jsonl")]}})
    path = tuned.save(cfg, tmp_path / "t.yaml")
    for extra in (["--defaults"], ["--out", str(tmp_path / "out")]):
        result = CliRunner().invoke(app, ["export", str(path), "--engine", "vllm", *extra])
        assert result.exit_code == 2 and "gone.jsonl, not found here" in result.output
        assert "pass the results .jsonl instead" in result.output


def test_export_imports_no_torch():
    """Like tune and tuned: `export` runs where torch is not installed (an engine's build box)."""
    code = ("import sys, overlapbench.export.command, overlapbench.export.defaults; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
