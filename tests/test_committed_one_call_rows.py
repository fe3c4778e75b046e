"""The first committed rows of `comm --beside-layer` with the one-call window (4x H200 at bfff1d7,
results/h200x4/bfff1d7/) hold what the window writes, by the checks tests/test_comm_beside_layer_gpu.py
makes on a run of its own: every ok case has the pass's extra beside one call, inside its
interval, made of one value per round of the paired loss's rounds (the trimmed mean of its samples),
and the call's own time there is a time, slowed and not lost. `predict --transfer-beside one-call`
and tests/checks/transfer_charge.py read these rows."""

from __future__ import annotations

import json
import math

import pytest

from overlapbench.comm.paired_loss import LAYER, LEVEL, one_call_fields, paired_fields
from overlapbench.timing.intervals import trimmed_mean_interval
from tests import figures as f

ONE_CALL_MEASURE = 3  # comm/cases.py's BESIDE_MEASURE when these rows were made: the one-call window, no pair window
STORES = [f"results/h200x4/bfff1d7/comm-beside-layer-{model}.jsonl" for model in ("llama3-70b", "llama3-8b")]


@pytest.fixture(scope="module", params=STORES)
def ok_rows(request) -> list[dict]:
    rows = [r for r in f.rows(request.param) if r["status"] == "ok"]
    assert rows, request.param
    return rows


def test_every_case_holds_the_extra_beside_one_call_inside_its_interval(ok_rows):
    extra, ci, samples, op_ms = one_call_fields(LAYER)
    for row in ok_rows:
        assert json.loads(row["key"])["beside_measure"] == ONE_CALL_MEASURE, row["key"]
        lo, hi = row[ci]
        assert all(math.isfinite(v) for v in (row[extra], lo, hi, *row[samples])), row["strategy"]
        assert lo <= row[extra] <= hi
        assert row["ms"] < row[op_ms] < 50 * row["ms"]  # the call beside the pass: slowed, not lost


def test_the_extra_is_the_trimmed_mean_of_one_sample_per_paired_round(ok_rows):
    extra, _, samples, _ = one_call_fields(LAYER)
    loss_samples = paired_fields(LAYER)[2]
    for row in ok_rows:
        assert len(row[samples]) == len(row[loss_samples]) >= 3
        again, _ = trimmed_mean_interval(row[samples], LEVEL)
        assert row[extra] == pytest.approx(again, abs=1e-5)
