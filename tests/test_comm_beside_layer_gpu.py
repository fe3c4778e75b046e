"""`comm --beside-layer` on 2 GPUs: every case's row holds the in-layer term timed in paired rounds
(comm/in_layer.py): the three graphs captured (the in-line pass, the pass, the two all-reduces),
the same rounds for each, the term the trimmed mean of the rounds' extras, inside its interval,
and the old two-harness fields not written; and the compute's loss paired in its own rounds
(comm/paired_loss.py), finite, inside its interval, its key naming the measurement, and the pass's
extra beside one call of the path timed in the same rounds, inside its interval; and each block's
pair with one call of the path (comm/pair.py). One run of two paths at two row counts of
llama3-8b (its TP=2 shard), shared by the tests."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from overlapbench.comm.cases import BESIDE_MEASURE
from overlapbench.comm.in_layer import FIELDS, MIN_ROUNDS, TERM, InLayer
from overlapbench.comm.pair import BLOCKS, extra_field
from overlapbench.comm.pair import FIELDS as PAIR_FIELDS
from overlapbench.comm.paired_loss import LAYER, PairedLoss, one_call_fields, paired_fields
from overlapbench.tuning.results import read_rows
from tests import distributed

pytestmark = distributed.two_gpus()
REPO = Path(__file__).resolve().parent.parent
TOKENS = (512, 4096)


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("beside-layer") / "comm.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "overlapbench", "comm", "--beside-layer", "llama3-8b", "--tokens",
         ",".join(map(str, TOKENS)), "--paths", "nccl,symm_two_shot", "--nccl-max-ctas", "default", "--iters", "3",
         "--warmup", "1", "--nproc", "2", "--format", "csv", "--output", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=os.environ | {"PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return read_rows(out)


def test_every_case_holds_the_paired_term_and_not_the_two_harness_one(rows):
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 2 * len(TOKENS), [(r["strategy"], r["status"], r.get("error")) for r in rows]
    for row in ok:
        assert all(name in row for name in FIELDS), row.keys()
        assert "inline_extra_ms" not in row and "inline_ms" not in row
        assert row["in_layer_graphs"] is True and row["in_layer_graph_error"] is None
        assert row["in_layer_rounds"] == MIN_ROUNDS == len(row["in_layer_extra_samples_ms"])  # --iters 3 < the minimum
        assert row["in_layer_replays"] >= 1
        lo, hi = row["in_layer_extra_ci_ms"]
        assert lo <= row[TERM] <= hi


def test_the_term_is_made_of_its_rounds_and_the_graphs_times_are_sane(rows):
    for row in (r for r in rows if r["status"] == "ok"):
        extras = row["in_layer_extra_samples_ms"]
        ones = tuple(1.0 for _ in extras)  # any rounds with these extras give the same term
        again = InLayer(tuple(2 + 2 * e for e in extras), ones, ones, 1, True).fields()[TERM]
        assert row[TERM] == pytest.approx(again, abs=1e-5)
        inline, alone, ops = row["in_layer_inline_ms"], row["in_layer_pass_ms"], row["in_layer_ops_ms"]
        assert inline > alone > 0 and ops > 0
        assert inline < 2 * (alone + ops)  # the in-line pass is the pass and its all-reduces, not two of them
        # the two all-reduces alone in the rounds: of the order of the case's own time, twice (timed
        # apart, in a graph of several; a graph of two adds its launch per replay)
        assert row["ms"] < ops < 6 * row["ms"]


def test_every_case_holds_the_paired_compute_loss(rows):
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok
    loss, ci, samples, alone = paired_fields(LAYER)
    for row in ok:
        assert json.loads(row["key"])["beside_measure"] == BESIDE_MEASURE
        assert all(row.get(name) is not None for name in paired_fields(LAYER)), row.keys()
        lo, hi = row[ci]
        assert all(math.isfinite(v) for v in (row[loss], lo, hi, row[alone], *row[samples]))
        assert lo <= row[loss] <= hi and -0.5 < row[loss] < 1
        assert len(row[samples]) == MIN_ROUNDS  # --iters 3 < the minimum
        ones = tuple(1.0 for _ in row[samples])  # any rounds with these losses give the same loss
        again = PairedLoss(ones, tuple(1 / (1 - x) for x in row[samples])).loss()
        assert row[loss] == pytest.approx(again, abs=1e-5)
        assert row[alone] > 0 and row["compute_loss"] is not None  # the two-harness loss still written


def test_every_case_holds_the_compute_extra_beside_one_call(rows):
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok
    extra, ci, samples, op_ms = one_call_fields(LAYER)
    for row in ok:
        assert all(row.get(name) is not None for name in one_call_fields(LAYER)), row.keys()
        lo, hi = row[ci]
        assert all(math.isfinite(v) for v in (row[extra], lo, hi, *row[samples]))
        assert 0 < row[op_ms] < 50 * row["ms"]  # the call beside the pass: slowed, not lost
        assert lo <= row[extra] <= hi
        assert len(row[samples]) == len(row[paired_fields(LAYER)[2]]) == MIN_ROUNDS  # one per round, the loss's rounds


def test_every_case_holds_each_blocks_pair_with_one_call(rows):
    """The pair window (comm/pair.py): five graphs captured, every round holding all five; each
    block's extra the trimmed mean of its rounds, inside its interval; the pair with the call no
    shorter than the pair with the add + norm less noise, and no longer than it and the call alone
    back to back, with room for the call's kernels waiting on the block's (the call beside compute
    runs slower than alone)."""
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok
    for row in ok:
        assert all(name in row for name in PAIR_FIELDS), row.keys()
        assert row["pair_graphs"] is True and row["pair_graph_error"] is None
        assert row["pair_rounds"] == MIN_ROUNDS and row["pair_replays"] >= 1
        assert 0 < row["pair_op_ms"] < 50 * row["ms"]
        for block in BLOCKS:
            extra, samples = row[extra_field(block)], row[f"pair_{block}_extra_samples_ms"]
            lo, hi = row[f"pair_{block}_extra_ci_ms"]
            assert len(samples) == MIN_ROUNDS and lo <= extra <= hi
            assert all(math.isfinite(v) for v in (extra, lo, hi, *samples))
            pair, norm = row[f"pair_{block}_ms"], row[f"pair_{block}_norm_ms"]
            assert norm > 0 and 0.9 * norm < pair < norm + 10 * row["pair_op_ms"]
