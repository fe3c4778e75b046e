"""measure.check: points checked against the fp32 truth where bf16 rounding between two correct
schedules grows past a fixed tolerance (TP >= 8, MoE top-k flips, deep stacks)."""

from __future__ import annotations

import pytest
import torch

from overlapbench.errors import UserError
from overlapbench.run.workload import FLOOR_FACTOR, Workload
from overlapbench.specs.spec_sections import Measure
from overlapbench.tuning.results import read_rows
from tests import distributed


def test_auto_checks_against_fp32_at_tp8_for_moe_and_deep_stacks_in_half_precision():
    auto = Measure()
    assert auto.checks_against_fp32(8, False, "bf16", 1) and auto.checks_against_fp32(2, True, "fp16", 1)
    assert not auto.checks_against_fp32(4, False, "bf16", 4) and not auto.checks_against_fp32(8, True, "fp32", 80)
    # rounding drifts with ranks x layers: TP=2 through 8 layers stays on baseline, TP=4 through 8 does not
    assert not auto.checks_against_fp32(2, False, "bf16", 8) and auto.checks_against_fp32(4, False, "bf16", 8)
    assert auto.checks_against_fp32(2, False, "bf16", 16) and not auto.checks_against_fp32(1, False, "bf16", 16)
    assert Measure(check="fp32").checks_against_fp32(2, False, "bf16", 1)
    assert not Measure(check="baseline").checks_against_fp32(8, True, "bf16", 80)
    with pytest.raises(UserError, match="measure.check"):
        Measure(check="exact")


def test_an_output_may_be_twice_as_far_from_the_truth_as_the_reference_and_no_further():
    g = torch.Generator().manual_seed(torch.seed() % (1 << 31))
    truth = torch.randn(64, 32, generator=g)
    noise = lambda: torch.randn(truth.shape, generator=g) * 0.01 * truth.norm() / truth.numel() ** 0.5
    reference = truth + noise()
    floor = (reference - truth).norm().item() / truth.norm().item()
    work = Workload(None, None, reference, None, truth, floor)
    near, far = truth + 1.3 * noise(), truth + 3.0 * noise()
    err, tol = work.local_check(near, 1e-9)
    assert tol == pytest.approx(FLOOR_FACTOR * floor) and err <= tol
    err, tol = work.local_check(far, 1e-9)
    assert err > tol
    assert work.local_check(far, 1.0)[1] == 1.0  # never tighter than the tolerance asked for
    plain = Workload(None, None, reference, None)
    assert plain.local_check(reference, 1e-2) == (0.0, 1e-2)  # no truth: against the reference


SPEC = """
name: check-fp32
model: tiny
layers: 2
dtype: bf16
tokens: [29]
strategies:
  baseline: {}
  no_comm: {}
  token_split: {align: 8}
measure: {warmup: 1, iters: 2, timeout_s: 60, check: fp32}
"""


@pytest.mark.slow
def test_a_bf16_sweep_checked_against_the_fp32_truth(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "r.jsonl"
    done = distributed.overlapbench("sweep", str(spec), "--output", str(out))
    assert done.returncode == 0, done.stderr
    rows = {r["strategy"]: r for r in read_rows(out)}
    assert {r["status"] for r in rows.values()} == {"ok"} and {r["check"] for r in rows.values()} == {"fp32"}
    floor = rows["baseline"]["rel_err"]
    assert 1e-4 < floor < 2e-2  # bf16 against its own fp32 arithmetic: rounding, not zero
    split = rows["token_split"]
    assert split["tolerance"] == pytest.approx(max(1e-2, FLOOR_FACTOR * floor)) and split["rel_err"] <= split["tolerance"]
    assert rows["no_comm"]["rel_err"] is None  # a bound is not checked


def test_rel_err_summed_over_slices_equals_the_whole_tensor_norm(monkeypatch):
    from overlapbench.timing import measure

    g = torch.Generator().manual_seed(torch.seed() % (1 << 31))
    ref = torch.randn(37, 53, generator=g).bfloat16()
    out = (ref.float() + 0.02 * torch.randn(37, 53, generator=g)).bfloat16()
    whole = (torch.linalg.vector_norm(out.float() - ref.float()) / torch.linalg.vector_norm(ref.float())).item()
    monkeypatch.setattr(measure, "REL_ERR_CHUNK", 97)  # slices that cut rows, the last one short
    assert measure.rel_err(out, ref) == pytest.approx(whole, rel=1e-5)
    out[3, 7] = float("nan")
    assert measure.rel_err(out, ref) == float("inf")
    with pytest.raises(ValueError, match="shape"):
        measure.rel_err(out[:-1], ref)


DEEP = """
name: check-auto-deep
model: tiny
tp: 1
layers: [2, 17]
dtype: bf16
tokens: [29]
strategies:
  baseline: {}
  token_split: {align: 8}
measure: {warmup: 1, iters: 2, timeout_s: 60}
"""


@pytest.mark.slow
def test_auto_checks_a_stack_past_the_rounded_depth_against_the_truth_and_a_shallow_one_against_baseline(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(DEEP)  # tp 1: 2 layers within ROUNDED_STACK, 17 past it
    out = tmp_path / "r.jsonl"
    done = distributed.overlapbench("sweep", str(spec), "--output", str(out))
    assert done.returncode == 0, done.stderr
    rows = {(r["strategy"], r["layers"]): r for r in read_rows(out)}
    assert {r["status"] for r in rows.values()} == {"ok"}
    assert {layers: r["check"] for (_, layers), r in rows.items()} == {2: "baseline", 17: "fp32"}
    assert rows["baseline", 2]["rel_err"] is None  # the reference against itself: not checked
    assert 0 < rows["baseline", 17]["rel_err"] < 2e-2  # against the truth: its rounding
    assert rows["token_split", 17]["tolerance"] >= 1e-2
