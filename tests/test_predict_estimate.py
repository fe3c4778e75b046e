"""A point's prediction from synthetic pieces and a synthetic comm table: the arithmetic of the
serial and pipelined plans, the in-context scaling, and rows that `tune` and `report` read."""

from __future__ import annotations

import dataclasses
import io
import random

import pytest
from rich.console import Console

from overlapbench import strategies
from overlapbench.predict.comm_table import CommTable
from overlapbench.predict.estimate import ComputePieces, Inputs, estimate
from overlapbench.run import piece_keys
from overlapbench.specs import spec as spec_mod

SPEC = {
    "name": "predicted", "shape": {"hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2, "head_dim": 16},
    "tp": 2, "layers": 3, "dtype": "bf16", "tokens": [512, 4096],
    "strategies": {"baseline": {}, "no_comm": {}, "fused_norm": {"comm": "copy_engine", "comm_ctas": 16},
                   "token_split": [{"comm": "nccl"}, {"comm": "none"},
                                   {"comm": "copy_engine", "comm_ctas_attn": 16, "comm_ctas_mlp": 16}]},
}


def _points():
    return spec_mod.from_dict(SPEC, "predicted", cuda=True).points(2, cuda=True)


def _inputs(seed: int, scale: float = 1.0, comm_ms: float = 0.05) -> Inputs:
    """Random piece times (ms per row, so bigger pieces cost more); chains `scale` times the
    isolated pieces' serial sum; all-reduce time linear in bytes from `comm_ms` at 1 MiB (NCCL's
    ring, and the copy-engine path on 16 CTAs at the spec's hidden)."""
    rng = random.Random(seed)
    per_row = {"attention": rng.uniform(1e-4, 3e-4), "mlp": rng.uniform(3e-4, 6e-4), "norm": rng.uniform(1e-6, 1e-5),
               "entry": rng.uniform(1e-6, 1e-5)}
    table: dict = {}
    for points in ([p for p in _points() if p.tokens == t] for t in (512, 4096)):
        tokens, batch = points[0].tokens, piece_keys.batch_of(points[0])
        for key, (piece, rows, _, _) in piece_keys.wanted_pieces(points).items():
            if piece != "chain":
                table[((tokens,), None, key)] = per_row[piece] * rows
        for plan in (strategies.get(p.strategy).plan(p.knobs, batch) for p in points):
            alone = sum((per_row["attention"] + per_row["mlp"] + 2 * per_row["norm"]) * c.size for c in plan.chunks)
            table[((tokens,), None, piece_keys.chain_key(plan, tokens, 3))] = (3 * alone + per_row["entry"] * tokens) * scale
    compute = ComputePieces(table, "GPU", 2)
    sizes = [1 << 16, 1 << 20, 1 << 24]
    linear = [(b, comm_ms * b / (1 << 20)) for b in sizes]
    comm = CommTable({("nccl", "default", None): linear, ("copy_engine_norm", 16, SPEC["shape"]["hidden"]): linear},
                     2, "GPU", "synthetic")
    return Inputs(compute, comm, None)


def _at(tokens: int, strategy: str, comm: str | None = None):
    return next(p for p in _points() if p.tokens == tokens and p.strategy == strategy
                and (comm is None or p.knobs.get("comm") == comm))


def _predict(point, inputs):
    return estimate(point.strategy, point.knobs, piece_keys.batch_of(point), point.layers, point.dtype, inputs)


@pytest.mark.parametrize("seed", [1, 2])
def test_serial_plans_add_their_transfers_to_the_chain(seed):
    scale = random.Random(seed).uniform(1.02, 1.1)
    inputs = _inputs(seed, scale)
    for tokens in (512, 4096):
        free = _predict(_at(tokens, "no_comm"), inputs)
        base = _predict(_at(tokens, "baseline"), inputs)
        transfer = inputs.comm.time_ms("nccl", "default", tokens * 64 * 2).ms
        assert free.in_context == pytest.approx(scale)
        assert base.ms == pytest.approx(free.ms + 2 * transfer)


@pytest.mark.parametrize("seed", [4, 5])
def test_a_fused_path_pays_its_norm_once(seed):
    """The chain runs every reduction's add + norm (its LocalReducer), and the copy-engine path's
    transfer does its own: the in-context scale compares the chain with the same work, so the
    norm is in the transfer's time only, not again through the scale."""
    rng = random.Random(seed)
    scale, comm_ms = rng.uniform(1.02, 1.1), rng.uniform(0.01, 0.1)
    inputs = _inputs(seed, scale, comm_ms)
    for tokens in (512, 4096):
        point = _at(tokens, "fused_norm")
        free = _predict(_at(tokens, "no_comm"), inputs)
        fused = _predict(point, inputs)
        norm = inputs.compute.get(piece_keys.batch_of(point), piece_keys.piece_key("norm", tokens))
        transfer = inputs.comm.time_ms("copy_engine_norm", 16, tokens * 64 * 2, hidden=64).ms
        assert fused.in_context == pytest.approx(scale)
        assert fused.ms == pytest.approx(free.ms - 2 * norm * scale + 2 * transfer)


def test_a_split_hides_its_transfers_under_long_compute():
    inputs = _inputs(3, comm_ms=0.001)  # tiny transfers: all but the last hide
    for tokens in (512, 4096):
        bound = _predict(_at(tokens, "token_split", "none"), inputs)
        split = _predict(_at(tokens, "token_split", "nccl"), inputs)
        last = inputs.comm.time_ms("nccl", "default", (tokens - tokens // 2) * 64 * 2).ms
        assert split.ms == pytest.approx(bound.ms + last / 3, rel=1e-6)


def test_predicted_rows_feed_tune_and_report(tmp_path):
    from overlapbench.predict.command import predict
    from overlapbench.report.command import run as report
    from overlapbench.tuning import tune
    from overlapbench.tuning.results import read_rows

    out = tmp_path / "predicted.jsonl"
    written = predict(spec_mod.from_dict(SPEC, "predicted", cuda=True), 2, _inputs(4), out, error=0.02)
    rows = read_rows(out)
    assert written == len(rows) == len(_points())
    assert {r["timing"] for r in rows} == {"predicted"} and all(r["device"] == "GPU (predicted)" for r in rows)
    assert all(r["speedup_ci"][0] < r["speedup"] < r["speedup_ci"][1] for r in rows if r["strategy"] != "baseline")
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all(r[k] is None for r in ok for k in ("p10_ms", "p90_ms", "iqr_ms", "cv"))  # nothing was measured
    assert all(r["predicted"]["error"] == 0.02 for r in ok)
    console = Console(file=io.StringIO(), width=120)
    assert tune.run([out], tmp_path / "tuned", console)
    report([out], "markdown", Console(file=io.StringIO(), width=120))


def test_the_command_refuses_what_it_cannot_use_in_one_line(tmp_path):
    """No pieces, a table of another world size, an output that holds rows: one line each, exit 2,
    the output untouched."""
    import subprocess
    import sys

    from overlapbench.predict.command import predict

    spec = tmp_path / "spec.yaml"
    import yaml

    spec.write_text(yaml.safe_dump(SPEC))
    out = tmp_path / "kept.jsonl"
    predict(spec_mod.from_dict(SPEC, "predicted", cuda=True), 2, _inputs(6), out, error=0.02)
    before = out.read_text()
    comm = tmp_path / "nccl.txt"
    comm.write_text("#  Rank  0 Group  0 Pid 1 on host device  0 [0x1] NVIDIA H100\n"
                    "#  Rank  1 Group  0 Pid 2 on host device  1 [0x2] NVIDIA H100\n"
                    "     1048576   262144  float  sum  -1  20.0  52.4  52.4  0  19.0  55.2  55.2  0\n")
    cases = [(["--compute", str(tmp_path / "none.jsonl")], "--compute"),
             (["--tp", "4"], "tp: 4"), (["--compute", str(out), "-o", str(out)], "--output")]
    for extra, field in cases:
        args = [sys.executable, "-m", "overlapbench", "predict", str(spec), "--tp", "2", "--comm", str(comm), *extra]
        done = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and field in done.stderr, done.stderr
    assert out.read_text() == before


def test_a_point_with_gemm_carveout_is_a_skipped_row_naming_the_knob(tmp_path):
    """The pieces are timed with every SM: a split that leaves SMs free to its transfers is not
    predicted as if the knob did nothing, but skipped, saying which knob and why; its setting
    without the knob is predicted as ever, and the batch's speedups stand."""
    from overlapbench.predict.command import predict
    from overlapbench.predict.estimate import Skip
    from overlapbench.predict.summary import Summary
    from overlapbench.tuning.results import read_rows

    rng = random.Random()
    carveout = rng.randrange(1, 65)
    comm = rng.choice(["nccl", "copy_engine"])
    setting = {"comm": comm} | ({"comm_ctas_attn": 16, "comm_ctas_mlp": 16} if comm == "copy_engine" else {})
    spec = SPEC | {"strategies": SPEC["strategies"] | {"token_split": [setting, setting | {"gemm_carveout": carveout}]}}
    loaded = spec_mod.from_dict(spec, "predicted", cuda=True)
    inputs = _inputs(rng.randrange(100))
    out, summary = tmp_path / "predicted.jsonl", Summary()
    predict(loaded, 2, inputs, out, summary=summary)
    rows = [r for r in read_rows(out) if r["strategy"] == "token_split"]
    carved = [r for r in rows if r["knobs"].get("gemm_carveout")]
    plain = [r for r in rows if not r["knobs"].get("gemm_carveout")]
    assert len(carved) == len(plain) == 2  # one per token count
    assert all(r["status"] == "skipped" and r["error"].startswith(f"gemm_carveout={carveout} is not predicted: ")
               and "timed with every SM" in r["error"] for r in carved)
    assert all(r["status"] == "ok" and r["speedup"] for r in plain)
    assert summary.points - summary.ok == 2 and not summary.no_speedup
    point = next(p for p in loaded.points(2, cuda=True) if p.knobs.get("gemm_carveout"))
    assert isinstance(_predict(point, inputs), Skip)
    at_default = dataclasses.replace(point, knobs=point.knobs | {"gemm_carveout": 0})
    assert not isinstance(_predict(at_default, inputs), Skip)  # at its default the knob is nothing to model


def test_a_copy_engine_point_with_ce_chunks_is_a_skipped_row_naming_the_knob(tmp_path):
    """The copy-engine rows are timed at the kernel's own piece count and a plan's transfers carry
    none: a set `ce_chunks` is skipped with the reason; `auto` is predicted as ever."""
    from overlapbench.predict.command import predict
    from overlapbench.predict.summary import Summary
    from overlapbench.tuning.results import read_rows

    rng = random.Random()
    pieces = rng.randrange(1, 17)
    setting = {"comm": "copy_engine", "comm_ctas_attn": 16, "comm_ctas_mlp": 16}
    spec = SPEC | {"strategies": SPEC["strategies"] | {"token_split": [setting, setting | {"ce_chunks": pieces}]}}
    out, summary = tmp_path / "predicted.jsonl", Summary()
    predict(spec_mod.from_dict(spec, "predicted", cuda=True), 2, _inputs(rng.randrange(100)), out, summary=summary)
    rows = [r for r in read_rows(out) if r["strategy"] == "token_split"]
    cut = [r for r in rows if "ce_chunks" in r["knobs"]]
    assert len(cut) == 2 and all(r["status"] == "skipped" and r["error"].startswith(f"ce_chunks={pieces} is not predicted: ")
                                 for r in cut)
    assert all(r["status"] == "ok" for r in rows if "ce_chunks" not in r["knobs"])
