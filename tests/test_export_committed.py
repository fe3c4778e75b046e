"""The exports of every committed tuned config (results/*/.../tuned*/), judged from the committed rows
behind each: for vLLM, SGLang and TensorRT-LLM the export's expected time is never above the
engine default's at any measured batch, and `--defaults` shows the same choice. And the engines'
default paths at TP=2, 4 and 8 as their code has them (the facts), on the committed configs' shapes."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest

from overlapbench import tuned
from overlapbench.export import defaults, engines, sglang, trtllm, vllm
from overlapbench.export.command import Input, rows_of

ROOT = Path(__file__).resolve().parents[1]
JUDGED = {"vllm": vllm, "sglang": sglang, "trtllm": trtllm}


def committed_configs() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True, check=True)
    return sorted(p for p in listed.stdout.splitlines()
                  if p.endswith(".yaml") and any(part.startswith("tuned") for part in Path(p).parts[:-1]))


def test_the_committed_tuned_configs_are_found():
    found = committed_configs()
    assert len(found) >= 18 and any("predicted" in p for p in found) and any("/sp/" in p for p in found)


def _rows(path: str):
    with contextlib.chdir(ROOT):  # provenance names the rows relative to the repository root
        return rows_of(Input(tuned.load(path), path, Path(path).stem))


@pytest.mark.parametrize("path", committed_configs())
@pytest.mark.parametrize("engine", sorted(JUDGED))
def test_no_export_of_a_committed_config_is_slower_than_the_engine_default(engine, path):
    config, rows = tuned.load(ROOT / path), _rows(path)
    export = JUDGED[engine].export(config, rows, path, None)
    assert export.choice.lines, "no measured batch"
    for line in export.choice.lines:
        if line.chosen != line.default:
            assert line.default_row is not None and line.chosen_row is not None, line
            assert line.chosen_row.ms <= line.default_row.ms, (line.label, line.chosen.text, line.default.text)
    again = defaults.choice(engines.get(engine), config, rows, None)  # what --defaults shows
    assert again.setting == export.choice.setting
    assert [(ln.label, ln.chosen, ln.default) for ln in again.lines] == [
        (ln.label, ln.chosen, ln.default) for ln in export.choice.lines]


PREDICTED = "results/predicted-h100/tuned/llama3-70b-tp{tp}-nvidia-h100-80gb-hbm3-predicted-bf16.yaml"
H100_70B = "results/h100x2/331cb63/tuned/llama3-70b-tp2-nvidia-h100-80gb-hbm3-bf16.yaml"
H100_8B = "results/h100x2/331cb63/tuned/llama3-8b-tp2-nvidia-h100-80gb-hbm3-bf16.yaml"
# The default path per measured count, as the engines' code has it (hidden 8192 for 70B, 4096 for
# 8B, bf16): vLLM fuses up to 64/2/0.5 MiB at TP 2/4/8 (4096/128/32 tokens for 70B), its custom
# all-reduce takes under min(8 MiB, 32 MiB or 256 KiB) at TP 4/8, PyTorch symmetric memory up to
# 32/64 MiB at TP 4/8 (multimem); SGLang's custom all-reduce V2 takes up to 16 MiB, NCCL above.
EXPECTED = {
    ("vllm", PREDICTED.format(tp=4)): {1024: "PyTorch symmetric-memory all-reduce, multimem (16 MiB)",
                                       2048: "PyTorch symmetric-memory all-reduce, multimem (32 MiB)",
                                       4096: "pynccl all-reduce (64 MiB)", 32768: "pynccl all-reduce (512 MiB)"},
    ("vllm", PREDICTED.format(tp=8)): {1024: "PyTorch symmetric-memory all-reduce, multimem (16 MiB)",
                                       4096: "PyTorch symmetric-memory all-reduce, multimem (64 MiB)",
                                       8192: "pynccl all-reduce (128 MiB)"},
    ("vllm", H100_70B): {4096: "FlashInfer all-reduce + RMSNorm fusion", 8192: "pynccl all-reduce (128 MiB)"},
    ("vllm", H100_8B): {8192: "FlashInfer all-reduce + RMSNorm fusion", 16384: "pynccl all-reduce (128 MiB)"},
    ("sglang", PREDICTED.format(tp=4)): {1024: "custom all-reduce (16 MiB)", 2048: "NCCL all-reduce (32 MiB)"},
    ("sglang", PREDICTED.format(tp=8)): {1024: "custom all-reduce (16 MiB)", 2048: "NCCL all-reduce (32 MiB)"},
    ("sglang", H100_70B): {1024: "custom all-reduce (16 MiB)", 2048: "NCCL all-reduce (32 MiB)"},
    ("sglang", H100_8B): {2048: "custom all-reduce (16 MiB)", 4096: "NCCL all-reduce (32 MiB)"},
}


@pytest.mark.parametrize("engine, path", sorted(EXPECTED))
def test_the_default_paths_at_tp_2_4_and_8_are_the_engines_code(engine, path):
    config = tuned.load(ROOT / path)
    by_tokens = {line.tokens: line.default.text for line in defaults.choice(engines.get(engine), config, _rows(path), None).lines}
    for tokens, text in EXPECTED[(engine, path)].items():
        assert by_tokens[tokens] == text, tokens


def test_without_multicast_vllm_at_tp4_runs_its_custom_all_reduce_or_nccl():
    """PyTorch symmetric memory turns itself off without a multicast pointer, and without NVSwitch
    TP=4 has no all-to-all NVLink for the custom all-reduce: pynccl."""
    model = engines.get("vllm").model(tuned.load(ROOT / PREDICTED.format(tp=4)), None)
    assert model.runs(model.default(), 1024, False).text == "pynccl all-reduce (16 MiB)"
    assert model.runs(model.default(), 1024, True).needs_multicast
