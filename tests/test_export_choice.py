"""How an export chooses (overlapbench/export/choice.py): the fastest setting the engine can express
by the rows, never slower than the engine's own defaults, on a host with NVLink multicast or
without; the default kept wherever it measures as fast, or a change cannot be priced. Synthetic
rows (tests/export_rows.py), the engines' models from their facts."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pytest

from overlapbench.export import engines, sglang, sglang_engine, trtllm, vllm, vllm_engine
from overlapbench.export.choice import choose
from overlapbench.export.stand_ins import Path, stand_in
from tests.export_rows import config, measured, rule

COUNTS = (1024, 2048, 4096, 8192, 16384)


def never_slower(choice) -> None:
    """Every measured batch: the export runs the default's path, or a priced one no slower."""
    for line in choice.lines:
        if line.chosen != line.default:
            assert line.default_row is not None and line.chosen_row is not None, line
            assert line.chosen_row.ms <= line.default_row.ms, line


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_the_export_is_never_slower_than_the_default_at_any_measured_count(tmp_path, engine, seed):
    """Random medians for every stand-in, some settings left unmeasured: whatever the export
    changes, its stand-in is no slower than the default's, on either host."""
    rng = random.Random(seed)
    names = ("nccl", "one_shot", "two_shot", "nccl_symm", "fused", "split")
    medians = {t: {n: t / 1024 * rng.uniform(0.8, 1.2) for n in names if n == "nccl" or rng.random() < 0.8}
               for t in COUNTS}
    cfg = config([rule(1, 3000, "split"), rule(3001, 16384, rng.choice(["fused", "nccl", "two_shot"]))],
                 hidden=rng.choice([4096, 8192]), tp=rng.choice([2, 4, 8]))
    rows = measured(tmp_path, medians, seed)
    model = engines.get(engine).model(cfg, None)
    choice = choose(model, cfg, rows)
    never_slower(choice)
    for t in COUNTS:  # and on a host without NVLink multicast
        ours, theirs = model.runs(choice.setting, t, False), model.runs(choice.default, t, False)
        if ours != theirs:
            batch = [m for m in rows if m.tokens == t]
            assert stand_in(ours, batch).ms <= stand_in(theirs, batch).ms


def test_vllm_keeps_its_fusion_where_it_measures_faster_than_what_it_can_run(tmp_path):
    """The picks are token_split (vLLM cannot run it); the fusion beats NCCL and the symmetric-
    memory rows: the export keeps vLLM's defaults and says what the split would add."""
    rows = measured(tmp_path, {t: {"nccl": t / 1000, "fused": t / 1020, "two_shot": t / 1010, "split": t / 1060}
                               for t in (1024, 2048, 4096)})
    cfg = config([rule(1, 4096, "split")])
    export = vllm.export(cfg, rows, "s", None)
    assert json.loads(export.files["compilation-config.json"]) == {"pass_config": {}}
    assert export.choice.setting == vllm_engine.Setting()
    assert any("keeps every vLLM default" in h for h in export.header)
    warning = next(w for w in export.warnings if w.startswith("1..4096 tokens: token_split"))
    assert "vLLM has no token-split overlap" in warning and "1024: +" in warning


def test_vllm_turns_its_fusion_off_only_where_unfused_measures_faster(tmp_path):
    """Where both one-/two-shot rows beat the fused one beyond the noise at every count the fusion
    covers, vLLM's unfused FlashInfer all-reduce (its stand-in: the faster of them) wins there."""
    rows = measured(tmp_path, {t: {"nccl": t / 900, "fused": t / 1000, "one_shot": t / 1100, "two_shot": t / 1080}
                               for t in (1024, 2048, 4096, 8192)})
    export = vllm.export(config([rule(1, 8192, "one_shot")]), rows, "s", None)
    passes = json.loads(export.files["compilation-config.json"])["pass_config"]
    model = vllm_engine.Model(config([rule(1, 8192, "one_shot")]), "0.33.0")
    assert model.fusion_tokens(export.choice.setting) is None or model.fusion_tokens(export.choice.setting) < 1024
    assert passes  # something written
    assert all(line.chosen.text.startswith("FlashInfer all-reduce, unfused") for line in export.choice.lines)
    never_slower(export.choice)


def test_runs_that_never_measured_the_fusion_keep_it(tmp_path):
    """No fused_norm rows (a sequence-parallel study): nothing prices vLLM's default fusion, so no
    setting may change what runs where it is on."""
    rows = measured(tmp_path, {t: {"nccl": t / 1000, "two_shot": t / 1200, "async_tp": t / 1300} for t in (1024, 2048)})
    export = vllm.export(config([rule(1, 2048, "two_shot")]), rows, "s", "0.31.0")
    assert export.choice.setting == vllm_engine.Setting()
    assert "enable_sp" not in export.files["compilation-config.json"]


def test_vllm_never_turns_sequence_parallelism_on_and_says_why(tmp_path):
    rows = measured(tmp_path, {t: {"nccl": t / 1000, "fused": t / 990, "async_tp": t / 1100} for t in (1024, 16384)})
    export = vllm.export(config([rule(1, 4000, "fused"), rule(4001, 16384, "async_tp")]), rows, "s", "0.31.0")
    assert "enable_sp" not in export.files["compilation-config.json"]
    warning = next(w for w in export.warnings if w.startswith("4001..16384 tokens: async_tp"))
    assert "full CUDA graphs only, at every size" in warning and "vllm/config/compilation.py:1224" in warning


def test_cpu_rows_keep_every_default_and_say_so(tmp_path):
    rows = measured(tmp_path, {t: {"nccl": t / 1000, "fused": t / 1500, "two_shot": t / 1400} for t in (1024, 2048)},
                    device="cpu")
    for module in (vllm, sglang, trtllm):
        export = module.export(config([rule(1, 2048, "fused")], device="cpu"), rows, "s", None)
        assert export.choice.setting == export.choice.default
        assert any("not a GPU" in w for w in export.warnings), module.ENGINE


def test_sglang_symmetric_memory_at_tp2_is_judged_on_a_host_without_multicast_too(tmp_path):
    """70B at 2048 tokens is 32 MiB: above SGLang's custom all-reduce (16 MiB), NCCL by default.
    --enable-torch-symm-mem runs PyTorch's two-shot there with NVLink multicast, NCCL without:
    a win on one host, the default on the other, so it is taken, and the header says so."""
    rows = measured(tmp_path, {1024: {"nccl": 1.0, "two_shot": 0.95, "one_shot": 0.97},
                               2048: {"nccl": 2.0, "two_shot": 1.8, "one_shot": 1.9}})
    export = sglang.export(config([rule(1, 4096, "two_shot")], hidden=8192), rows, "s", None)
    assert export.choice.setting == sglang_engine.Setting(torch_symm=True)
    assert export.files["launch.sh"].rstrip().endswith("--tp 2 --enable-torch-symm-mem")
    host = next(h for h in export.header if h.startswith("on a host without NVLink multicast"))
    assert "2048: NCCL all-reduce (32 MiB)" in host


@dataclass(frozen=True)
class _Fake:
    """An engine of two settings: B runs `fast` with multicast and `slow` without."""

    fast: float
    slow: float
    engine = "fake"
    version = None

    def default(self):
        return "A"

    def candidates(self, counts):
        return ["A", "B"]

    def step_cap(self):
        return None

    def runs(self, setting, tokens, multicast):
        if setting == "A":
            return Path("default", ("two_shot",))
        return Path("B", ("one_shot",) if multicast else ("nccl",), needs_multicast=True)


def test_a_setting_slower_on_a_host_without_multicast_is_not_taken(tmp_path):
    rows = measured(tmp_path, {1024: {"two_shot": 1.0, "one_shot": 0.8, "nccl": 1.2}})
    cfg = config([rule(1, 1024, "one_shot")])
    assert choose(_Fake(0.8, 1.2), cfg, rows).setting == "A"
    rows = measured(tmp_path, {1024: {"two_shot": 1.0, "one_shot": 0.8, "nccl": 0.99}})
    assert choose(_Fake(0.8, 0.99), cfg, rows).setting == "B"


def test_a_tie_within_the_noise_keeps_the_default(tmp_path):
    """B is 0.5% faster by the medians: tune's rule (1% beyond the interval) does not call it a win."""
    rows = measured(tmp_path, {1024: {"two_shot": 1.0, "one_shot": 0.995, "nccl": 0.995}})
    assert choose(_Fake(0.995, 0.995), config([rule(1, 1024, "one_shot")]), rows).setting == "A"


def test_trtllm_keeps_auto_which_times_its_candidates(tmp_path):
    """The fused kernel beats NCCL at every count: AUTO's autotuner runs it; forcing NCCL (as the
    first range's pick) or TWOSHOT can only tie it."""
    rows = measured(tmp_path, {t: {"nccl": t / 1000, "fused": t / 1100} for t in (1024, 2048, 4096)})
    export = trtllm.export(config([rule(1, 4096, "nccl")]), rows, "s", None)
    assert export.files["extra_llm_api_options.yaml"].rstrip().endswith("allreduce_strategy: AUTO")
    assert all(line.chosen_row.strategy == "fused_norm" for line in export.choice.lines)
