"""`predict` of a spec with several stack depths (`layers: [2, 4]`): each row carries its depth,
its times are per layer of that depth, its speedup is over the same depth's predicted baseline,
the summary counts every (batch, depth); pieces the spec's plans need but the --compute rows lack
are one line naming them and the command that times them, with nothing written."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import yaml

from overlapbench import strategies
from overlapbench.predict.comm_table import CommTable
from overlapbench.predict.command import predict
from overlapbench.predict.estimate import ComputePieces, Inputs
from overlapbench.predict.summary import Summary
from overlapbench.run import piece_keys
from overlapbench.specs import spec as spec_mod
from overlapbench.tuning.results import read_rows
from tests.test_predict_estimate import SPEC

DEPTHS = (2, 4)
DEPTH_SPEC = SPEC | {"layers": list(DEPTHS)}
HIDDEN = SPEC["shape"]["hidden"]


def points():
    return spec_mod.from_dict(DEPTH_SPEC, "predicted", cuda=True).points(2, cuda=True)


def inputs(rng: random.Random, paths=("nccl", "copy_engine_norm")) -> tuple[Inputs, dict]:
    """Random piece times (ms per row); each plan's chain at each depth its isolated pieces' serial
    sum times a random factor of that depth (so a depth's per-layer time is its own); all-reduce
    time linear in bytes. Returns the inputs and the chains: (tokens, depth, chain key) -> ms."""
    per_row = {"attention": rng.uniform(1e-4, 3e-4), "mlp": rng.uniform(3e-4, 6e-4),
               "norm": rng.uniform(1e-6, 1e-5), "entry": rng.uniform(1e-4, 3e-4)}
    table, chains = {}, {}
    for tokens in SPEC["tokens"]:
        at = [p for p in points() if p.tokens == tokens]
        for key, (piece, rows, _, _) in piece_keys.wanted_pieces(at).items():
            if piece != "chain":
                table[((tokens,), None, key)] = per_row[piece] * rows
        for layers in DEPTHS:
            scale = rng.uniform(1.0, 1.2)
            for p in (p for p in at if p.layers == layers):
                plan = strategies.get(p.strategy).plan(p.knobs, piece_keys.batch_of(p))
                alone = sum((per_row["attention"] + per_row["mlp"] + 2 * per_row["norm"]) * c.size for c in plan.chunks)
                key = piece_keys.chain_key(plan, tokens, layers)
                table[((tokens,), None, key)] = (layers * alone + per_row["entry"] * tokens) * scale
                chains[(tokens, layers, p.strategy, p.knobs.get("comm"))] = table[((tokens,), None, key)]
    ms_per_mib = rng.uniform(0.02, 0.08)
    linear = [(b, ms_per_mib * b / (1 << 20)) for b in (1 << 16, 1 << 20, 1 << 24)]
    known = {"nccl": ("nccl", "default", None), "copy_engine_norm": ("copy_engine_norm", 16, HIDDEN)}
    comm = CommTable({known[p]: linear for p in paths}, 2, "GPU", "synthetic")
    return Inputs(ComputePieces(table, "GPU", 2), comm, None), chains


def test_each_depth_is_predicted_per_layer_against_its_own_baseline(tmp_path):
    rng = random.Random()
    given, chains = inputs(rng)
    out, summary = tmp_path / "p.jsonl", Summary()
    written = predict(spec_mod.from_dict(DEPTH_SPEC, "predicted", cuda=True), 2, given, out, summary=summary)
    rows = read_rows(out)
    assert written == len(rows) == len(points()) and {r["status"] for r in rows} == {"ok"}
    assert sorted((r["tokens"], r["layers"]) for r in rows) == sorted((p.tokens, p.layers) for p in points())
    at = {(r["tokens"], r["layers"], r["strategy"], r["knobs"].get("comm")): r for r in rows}
    for tokens in SPEC["tokens"]:
        transfer = given.comm.time_ms("nccl", "default", tokens * HIDDEN * 2).ms
        for layers in DEPTHS:
            free, base = at[(tokens, layers, "no_comm", None)], at[(tokens, layers, "baseline", None)]
            # the chain of this depth over this depth's layers; two blocking all-reduces per layer
            assert free["ms"] == pytest.approx(chains[(tokens, layers, "no_comm", None)] / layers, rel=1e-6)
            assert base["ms"] == pytest.approx(free["ms"] + 2 * transfer, rel=1e-6)
            exposed = base["predicted"]["exposed_ms"] - free["predicted"]["exposed_ms"]  # the norms' cancel
            assert exposed == pytest.approx(2 * transfer, rel=1e-3)
            for row in (r for key, r in at.items() if key[:2] == (tokens, layers)):
                assert row["speedup"] == pytest.approx(base["ms"] / row["ms"], rel=1e-5)
        # the depths differ (their chains' factors and the entry over their depth), so a speedup
        # over the other depth's baseline would show
        assert at[(tokens, 2, "baseline", None)]["ms"] != pytest.approx(at[(tokens, 4, "baseline", None)]["ms"], rel=1e-4)
    n = len(rows)
    assert summary.lines()[0] == f"{n} points: {n} predicted, 0 skipped"


def test_a_baseline_not_predicted_is_counted_per_batch_and_depth(tmp_path):
    """No NCCL rows: the baseline of every (token count, depth) is skipped, and the summary counts
    those batches, not the token counts."""
    given, _ = inputs(random.Random(), paths=("copy_engine_norm",))
    summary = Summary()
    predict(spec_mod.from_dict(DEPTH_SPEC, "predicted", cuda=True), 2, given, tmp_path / "p.jsonl", summary=summary)
    batches = len(SPEC["tokens"]) * len(DEPTHS)
    assert summary.no_speedup == batches
    assert f"no speedups in {batches} batches (their default baseline was skipped)" in summary.lines()[0]


def test_pieces_of_another_spec_are_one_line_naming_the_piece_and_the_command(tmp_path):
    """Pieces timed for the spec at one token count only: the other's are missing. One line on
    stderr naming the piece, the point and `sweep SPEC --pieces`, exit 2, no rows written."""
    given, _ = inputs(random.Random())
    kept = min(SPEC["tokens"])
    pieces = tmp_path / "pieces.jsonl"
    rows = [{"schema": "overlapbench/result-v1", "run_id": "r", "spec": "other", "key": key, "status": "ok",
             "workload": piece_keys.WORKLOAD, "batch": list(batch), "decode": None, "device": "GPU", "tp": 2, "ms": ms}
            for (batch, _, key), ms in given.compute.ms.items() if batch == (kept,)]
    pieces.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = tmp_path / "depths.yaml"
    spec.write_text(yaml.safe_dump(DEPTH_SPEC))
    comm = tmp_path / "nccl.txt"
    comm.write_text("#  Rank  0 Group  0 Pid 1 on host device  0 [0x1] NVIDIA H100\n"
                    "#  Rank  1 Group  0 Pid 2 on host device  1 [0x2] NVIDIA H100\n"
                    "     1048576   262144  float  sum  -1  20.0  52.4  52.4  0  19.0  55.2  55.2  0\n")
    out = tmp_path / "p.jsonl"
    done = subprocess.run([sys.executable, "-m", "overlapbench", "predict", str(spec), "--tp", "2", "--comm", str(comm),
                           "--compute", str(pieces), "-o", str(out)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    missing = max(SPEC["tokens"])
    assert "--compute: no piece row for " in line and f"at batch [{missing}]" in line, line
    assert "(timed for spec other)" in line and f"`overlapbench sweep {spec} --pieces --tp 2`" in line, line
    assert "predict's default --compute" in line and not out.exists()
