"""The compute's loss beside a transfer as paired rounds (comm/paired_loss.py): it recovers the loss
where the clocks drift and the two-harness loss does not; its row fields, and those of the pass's
extra beside one call where the rounds timed it; predict prefers it over the two-harness loss; a
beside case's key names its measurement, so `--resume` measures rows made before again. Fresh
random inputs."""

from __future__ import annotations

import json
import math
import random
import statistics

import pytest

from overlapbench.comm import paths
from overlapbench.comm.cases import BESIDE_MEASURE
from overlapbench.comm.paired_loss import GEMM, LAYER, PairedLoss, compute_loss, loss_of, one_call_fields, paired_fields
from overlapbench.comm.run import RunInfo, make_row
from overlapbench.predict.contention import Contention
from overlapbench.tuning.results import ResultStore, read_rows
from tests.test_comm_beside_layer import _layer_row, parse
from tests.test_predict_comm import comm_row
from tests.test_predict_layer_contention import layer_row

NOISE = 0.003  # each timed pass off its clock's time by at most this share


def _simulated(rng: random.Random, loss: float, rounds: int, drift: float) -> tuple[float, PairedLoss]:
    """A pass of `alone` ms slowed by `loss` beside the transfer, timed in `rounds` rounds under a
    clock that wanders by up to `drift` from round to round (both passes of a round meet the same
    clock), each pass off by up to NOISE."""
    alone = rng.uniform(0.3, 60)
    phase, period = rng.uniform(0, 2 * math.pi), rng.uniform(3, 12)
    clock = [1 + drift * math.sin(2 * math.pi * r / period + phase) for r in range(rounds)]
    noisy = lambda ms: ms * rng.uniform(1 - NOISE, 1 + NOISE)
    return alone, PairedLoss(tuple(noisy(alone * c) for c in clock), tuple(noisy(alone / (1 - loss) * c) for c in clock))


def test_the_paired_loss_recovers_the_loss_where_the_two_harness_one_is_biased():
    rng = random.Random()
    loss, rounds = rng.uniform(0.0, 0.3), rng.randrange(10, 40)
    alone, paired = _simulated(rng, loss, rounds, drift=rng.uniform(0.0, 0.01))
    # the pass timed alone by its own harness, from an idle device: its clock runs 4-11% slower
    harness_alone = alone * (1 + rng.uniform(0.04, 0.11))
    two_harness = compute_loss(harness_alone, statistics.median(paired.beside_ms))
    bound = (1 - loss) * ((1 + NOISE) / (1 - NOISE) - 1)  # the most one round's noise moves its loss
    assert abs(paired.loss() - loss) <= bound
    assert two_harness < loss - 0.015  # biased: reads the two harnesses' clocks, not the transfer
    # a wider drift from round to round moves both passes of a round alike
    _, wandering = _simulated(rng, loss, rounds, drift=rng.uniform(0.05, 0.15))
    assert abs(wandering.loss() - loss) <= bound


def test_the_fields_are_the_rounds_trimmed_mean_with_its_interval():
    rng = random.Random()
    rounds = rng.randrange(3, 30)
    alone = tuple(rng.uniform(0.5, 5) for _ in range(rounds))
    beside = tuple(a * rng.uniform(0.97, 1.5) for a in alone)
    paired = PairedLoss(alone, beside)
    for prefix in (LAYER, GEMM):
        fields = paired.fields(prefix)
        assert tuple(fields) == paired_fields(prefix)
        losses = [1 - a / b for a, b in zip(alone, beside)]
        assert fields[f"{prefix}_loss_paired_samples"] == pytest.approx(losses, abs=1e-6)
        cut = int(rounds * 0.1) if rounds > 2 else 0
        kept = sorted(losses)[cut:rounds - cut]
        assert fields[f"{prefix}_loss_paired"] == pytest.approx(statistics.fmean(kept))
        lo, hi = fields[f"{prefix}_loss_paired_ci"]
        assert lo <= fields[f"{prefix}_loss_paired"] <= hi and hi > lo
        assert fields[f"{prefix}_ms_alone_paired"] == pytest.approx(statistics.median(alone))
        assert all(math.isfinite(v) for v in (fields[f"{prefix}_loss_paired"], lo, hi))
    with pytest.raises(ValueError, match="round by round"):
        PairedLoss(alone, beside[:-1])


def test_the_one_call_fields_are_the_rounds_trimmed_mean_extra_with_its_interval():
    """Each round's pass beside one call less its pass alone (ms), their tenth-trimmed mean and its
    interval, which moves with the extras (a constant added to every pass beside one call moves
    it by that constant); the loss's fields are as without the one-call window; none written
    without it; a count of passes beside one call other than the rounds' refused."""
    rng = random.Random()
    rounds = rng.randrange(3, 30)
    alone = tuple(rng.uniform(0.5, 5) for _ in range(rounds))
    beside = tuple(a * rng.uniform(0.97, 1.5) for a in alone)
    one_call = tuple(a + rng.uniform(-0.02, 0.3) for a in alone)
    op = tuple(rng.uniform(0.01, 0.4) for _ in range(rounds))  # the call's own time beside each pass
    shift = rng.uniform(-0.1, 0.1)
    for prefix in (LAYER, GEMM):
        extra, ci, samples, op_ms = one_call_fields(prefix)
        assert (extra, ci, samples, op_ms) == (f"{prefix}_one_call_extra_ms", f"{prefix}_one_call_extra_ci_ms",
                                               f"{prefix}_one_call_extra_samples_ms", f"{prefix}_one_call_op_ms")
        fields = PairedLoss(alone, beside, one_call, op).fields(prefix)
        without = PairedLoss(alone, beside).fields(prefix)
        assert tuple(fields) == paired_fields(prefix) + one_call_fields(prefix) and tuple(without) == paired_fields(prefix)
        assert all(fields[k] == without[k] for k in paired_fields(prefix))
        extras = [o - a for a, o in zip(alone, one_call)]
        assert fields[samples] == pytest.approx(extras, abs=1e-6)
        cut = int(rounds * 0.1) if rounds > 2 else 0
        assert fields[extra] == pytest.approx(statistics.fmean(sorted(extras)[cut:rounds - cut]))
        lo, hi = fields[ci]
        assert lo <= fields[extra] <= hi and hi > lo and all(math.isfinite(v) for v in (lo, hi))
        assert fields[op_ms] == pytest.approx(statistics.median(op))
        moved = PairedLoss(alone, beside, tuple(o + shift for o in one_call), op).fields(prefix)
        assert moved[extra] == pytest.approx(fields[extra] + shift)
        assert moved[ci] == pytest.approx([lo + shift, hi + shift])
    with pytest.raises(ValueError, match="beside one call"):
        PairedLoss(alone, beside, one_call[:-1], op[:-1])
    with pytest.raises(ValueError, match="beside one call"):
        PairedLoss(alone, beside, one_call + (1.0,), op + (0.1,))
    with pytest.raises(ValueError, match="times of the call"):
        PairedLoss(alone, beside, one_call, op[:-1])


def test_a_beside_gemm_row_holds_the_gemms_paired_loss():
    rng = random.Random()
    case = paths.make_cases(parse(beside_layer="llama3-8b", tokens="512", paths="nccl_symm").bench(cuda=True), world=2,
                            backend="nccl", dtype="bf16", hidden=4096, beside_gemm=True)[0]
    alone = tuple(rng.uniform(1, 3) for _ in range(rng.randrange(2, 12)))
    paired = PairedLoss(alone, tuple(a * rng.uniform(1, 1.4) for a in alone),
                        tuple(a + rng.uniform(0, 0.2) for a in alone), tuple(rng.uniform(0.1, 0.5) for _ in alone)).fields(GEMM)
    result = {"status": "ok", "ms": 0.1, "beside_ms": 0.2, "gemm_loss": rng.uniform(0, 0.3), **paired}
    env = {"world_size": 2, "device": "Test GPU", "backend": "nccl", "git": "abc"}
    row = make_row(case, result, RunInfo("comm", "r1", env, 3, 10, True))
    assert all(row[k] == paired[k] for k in paired_fields(GEMM) + one_call_fields(GEMM))
    assert "compute_loss_paired" not in row and "compute_one_call_extra_ms" not in row
    assert loss_of(row, GEMM) == paired["gemm_loss_paired"] != row["gemm_loss"]


def test_predict_prefers_the_paired_loss_and_reads_rows_made_before():
    rng = random.Random()
    nbytes = 4096 * 16384
    old, paired = rng.uniform(-0.05, 0.3), rng.uniform(0.0, 0.3)
    stretch = rng.uniform(1.05, 3.0)
    made_before = layer_row("nccl_symm", 16, nbytes, rng.uniform(0.05, 1), old, stretch, 0.01)
    made_now = made_before | {"compute_loss_paired": paired}
    assert loss_of(made_before, LAYER) == old and loss_of(made_now, LAYER) == paired
    for row, want in ((made_before, old), (made_now, paired)):
        got = Contention.from_rows([row], "rows", model="llama3-70b", tp=2).at("nccl_symm", 16, nbytes)
        assert got.gemm_loss == pytest.approx(want) and got.transfer_stretch == pytest.approx(stretch)
    gemm = comm_row("nccl", 16, nbytes, 1.0, beside=(old, stretch))
    for row, want in ((gemm, old), (gemm | {"gemm_loss_paired": paired}, paired)):
        assert Contention.from_rows([row], "rows").at("nccl", 16, nbytes).gemm_loss == pytest.approx(want)


def test_resume_measures_beside_rows_made_before_again(tmp_path):
    rng = random.Random()
    row, _ = _layer_row(rng, rng.choice([512, 2048]))
    key = json.loads(row["key"])
    opts = parse(beside_layer="llama3-8b", tokens="512", paths="nccl_symm")
    gemm_case, plain = (paths.make_cases(opts.bench(cuda=True), world=2, backend="nccl", dtype="bf16", hidden=4096,
                                         beside_gemm=gemm)[0] for gemm in (True, False))
    assert key["beside_measure"] == BESIDE_MEASURE == json.loads(gemm_case.key())["beside_measure"]
    assert "beside_measure" not in json.loads(plain.key()), "a plain case's key does not name it"
    old = row | {"key": json.dumps({k: v for k, v in key.items() if k != "beside_measure"}, sort_keys=True),
                 "run_id": "before"}  # as rows made before keyed the case
    for rows in ([old], [old, row]):
        store = ResultStore(tmp_path / f"c{len(rows)}.jsonl")
        store.open(resume=False, study="comm")
        for one in rows:
            store.append(one)
        store.close()
        again = ResultStore(tmp_path / f"c{len(rows)}.jsonl")
        done = again.open(resume=True, study="comm")
        again.close()
        assert old["key"] in done and (row["key"] in done) == (len(rows) == 2)
    back = read_rows(tmp_path / "c1.jsonl")[0]  # a row made before still reads, and predict takes its loss
    assert back["compute_loss"] == pytest.approx(row["compute_loss"])
    got = Contention.from_rows([back | {k: None for k in paired_fields(LAYER)}], "rows").at(back["strategy"], 16, back["bytes"])
    assert got.gemm_loss == pytest.approx(row["compute_loss"])
