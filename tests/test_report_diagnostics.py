"""`report --profile DIR` (where a point's GPU time goes) and `report --rounds` (how noisy the paired
rounds were): the views of one run that explain its numbers."""

from __future__ import annotations

import io
import json
import math
import random
import statistics
from pathlib import Path

import pytest
from rich.console import Console

from overlapbench import report
from overlapbench.errors import UserError
from overlapbench.report.profile import KIND_NAMES, kind_of
from overlapbench.tuning.results import profile_name
from tests import synthetic

KERNELS = {  # kernel name in a torch.profiler table -> its kind
    "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN": "gemm",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7": "attention",
    "_lse_merge_kernel": "lse_merge",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL": "comm",
    "Memcpy PtoP (Device -> Device)": "comm",
    "_fused_add_rmsnorm_kernel": "norm",
    "Memcpy DtoD (Device -> Device)": "copy",
    "void at::native::elementwise_kernel<128, 4>": "elementwise",
    "triton_red_fused_something": "other",
}
HOST = ("aten::mm", "cudaLaunchKernel")  # host rows: their device time is their kernels', counted once


def profiler_table(device_ms: dict[str, float], forwards: int) -> str:
    """A table as measure.profile_parts writes it: torch.profiler's key_averages columns."""
    header = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "Self CUDA",
              "Self CUDA %", "CUDA total", "CUDA time avg", "# of Calls"]
    rule = "  ".join("-" * 12 for _ in header)
    lines = [f"{forwards} eager forwards", rule, "  ".join(f"{h:>12}" for h in header), rule]
    for name, ms in device_ms.items():
        cells = [name, "0.00%", "0.000us", "0.00%", "0.000us", "0.000us", f"{ms * 1000:.3f}us", "1.00%",
                 f"{ms:.3f}ms", "1.000us", "12"]
        lines.append("  ".join(f"{c:>12}" for c in cells))
    return "\n".join(lines + [rule]) + "\n"


def run_report(paths, **options) -> list[dict]:
    out = io.StringIO()
    assert report.run(paths, "json", Console(file=out, width=200), **options) == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize("name, kind", sorted(KERNELS.items()))
def test_each_kernel_has_its_kind(name, kind):
    assert kind_of(name) == kind


def test_the_profile_view_tallies_each_table_per_layer_and_kind(tmp_path: Path):
    rng = random.Random(7)
    knobs = {"align": 256, "comm": "copy_engine", "comm_ctas_attn": 32}
    rows = [synthetic.row("no_comm", 4096, {}, median=6.0), synthetic.row("token_split", 4096, knobs, median=6.3)]
    folder, forwards, layers, expected = tmp_path / "profile", 3, rows[0]["layers"], {}
    folder.mkdir()
    for r in rows:
        device = {name: rng.uniform(0.5, 40.0) for name in KERNELS} | {h: rng.uniform(50, 90) for h in HOST}
        name = profile_name(r["strategy"], r["tokens"], r["knobs"])
        (folder / f"{name}.txt").write_text(profiler_table(device, forwards))
        per_kind = {k: 0.0 for k in KIND_NAMES}
        for kernel, kind in KERNELS.items():
            per_kind[kind] += round(device[kernel] * 1000, 3) / 1000 / forwards / layers  # as the table prints it, in us
        expected[name] = per_kind
    records = run_report([synthetic.write(tmp_path / "r.jsonl", rows)], profile_dir=folder)
    assert [r["table"] for r in records] == ["no_comm-4096", "token_split-4096-align=256-comm=copy_engine-comm_ctas_attn=32"]
    for record, row in zip(records, rows):
        for kind, ms in expected[record["table"]].items():
            assert record[f"{kind}_ms"] == pytest.approx(ms, rel=1e-9), kind
        assert record["kernels_ms"] == pytest.approx(sum(expected[record["table"]].values()))
        assert record["timed_ms"] == row["ms"]


def test_profile_and_rounds_say_what_is_wrong(tmp_path: Path):
    rows = synthetic.write(tmp_path / "r.jsonl", [synthetic.row("baseline", 1024)])
    with pytest.raises(UserError, match="is not a folder"):
        report.run([rows], "json", Console(file=io.StringIO()), profile_dir=tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no table in .* matches a layer row"):
        report.run([rows], "json", Console(file=io.StringIO()), profile_dir=tmp_path / "empty")
    with pytest.raises(UserError, match="no rows timed interleaved"):
        report.run([rows], "json", Console(file=io.StringIO()), rounds=True)
    with pytest.raises(UserError, match="one view at a time"):
        report.run([rows], "json", Console(file=io.StringIO()), rounds=True, profile_dir=tmp_path)


def test_the_rounds_view_gives_each_batch_its_spread_and_widest_interval(tmp_path: Path):
    rng = random.Random(11)
    rows, expected = [], {}
    for tokens, rounds in ((1024, 41), (8192, 23)):
        pairing = f"run1/{tokens}"
        reference = [rng.uniform(0.9, 1.1) * tokens / 1000 for _ in range(rounds)]
        rows.append(synthetic.row("baseline", tokens, samples=reference, pairing=pairing))
        sds, widths = [], []
        for strategy in ("token_split", "iso", "fused_norm"):
            samples = [t * rng.uniform(0.9, 1.0) for t in reference]
            row = synthetic.row(strategy, tokens, {"comm": "nccl"}, samples=samples, pairing=pairing)
            row["speedup"], width = 1.05, rng.uniform(0.001, 0.01)
            row["speedup_ci"] = [1.05 * (1 - width), 1.05 * (1 + width)]
            rows.append(row)
            sds.append(statistics.pstdev(math.log(a / b) for a, b in zip(reference, samples)))
            widths.append(width)
        expected[tokens] = (rounds, statistics.median(sds), max(widths))
    rng.shuffle(rows)  # the view finds each batch's reference wherever its row is
    records = run_report([synthetic.write(tmp_path / "r.jsonl", rows)], rounds=True)
    assert [r["tokens"] for r in records] == [1024, 8192]
    for record in records:
        rounds, sd, widest = expected[record["tokens"]]
        assert (record["rounds"], record["candidates"]) == (rounds, 3)
        assert record["median_sd"] == pytest.approx(sd, rel=1e-9)
        assert record["widest_ci"] == pytest.approx(widest, rel=1e-9)
