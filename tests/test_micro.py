"""Micro workloads (one GEMM with its all-gather or reduce-scatter): spec parsing, the unsharded
reference, and the SP strategies and the sweep's point loop on them (2 gloo processes, fp32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from overlapbench.errors import UserError
from overlapbench.overlap.sp_schedule import ShardLayout
from overlapbench.run import micro
from overlapbench.specs import spec
from overlapbench.tuning.rows import Gemm, Point
from tests import distributed

SWEEPS = Path(__file__).resolve().parent.parent / "sweeps"


def _spec(**overrides) -> dict:
    data = {
        "name": "m", "model": "tiny", "tp": 2, "workload": "gemm_ag", "gemm": {"n": 96, "k": 64},
        "tokens": [37, 64], "strategies": {"sp_baseline": {}, "flash_agrs": {"order": ["ring", "local_first_last"]}},
    }
    return {k: v for k, v in (data | overrides).items() if v is not None}


# ---------------------------------------------------------------------------------------------
# Spec


def test_micro_points_carry_the_workload_and_the_gemm():
    points = spec.from_dict(_spec(layers=4), "m", cuda=False).points(2, cuda=False)
    assert len(points) == 2 * 3
    for p in points:
        assert p.workload == "gemm_ag" and p.gemm == Gemm(n=96, k=64)
        assert p.layers == 1  # one GEMM per point: time per "layer" is time per GEMM
        assert json.loads(p.key())["gemm"] == {"n": 96, "k": 64}
    other = spec.from_dict(_spec(gemm={"n": 96, "k": 32}), "m", cuda=False).points(2, cuda=False)
    assert {p.key() for p in points}.isdisjoint(p.key() for p in other)  # n, k tell points apart


def test_layer_points_keep_their_keys():
    data = {"name": "l", "model": "tiny", "tokens": [16], "strategies": ["baseline"]}
    (point,) = spec.from_dict(data, "l", cuda=False).points(2, cuda=False)
    assert point.workload == "layer" and point.gemm is None and "gemm" not in json.loads(point.key())


def test_the_cpu_section_overrides_the_gemm():
    data = _spec(gemm={"n": 28672, "k": 8192}, cpu={"gemm": {"n": 32, "k": 16}})
    assert spec.from_dict(data, "m", cuda=False).gemm == Gemm(32, 16)
    assert spec.from_dict(data, "m", cuda=True).gemm == Gemm(28672, 8192)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"gemm": None}, "gemm: the gemm_ag workload needs"),
        ({"gemm": {"n": 8}}, "gemm.k: missing"),
        ({"gemm": {"n": 8, "k": 8, "m": 4}}, "gemm.m: unknown key"),
        ({"gemm": {"n": 0, "k": 8}}, "gemm.n: must be a positive integer"),
        ({"workload": "layer"}, "gemm: only for the micro workloads"),
        ({"workload": "gemm_ar"}, "workload: 'gemm_ar' is not one of"),
        ({"strategies": ["baseline", "sp_baseline"]}, "strategies.baseline: does not run the gemm_ag workload"),
    ],
)
def test_bad_micro_specs_fail_with_the_field(overrides, message):
    with pytest.raises(UserError, match=message):
        spec.from_dict(_spec(**overrides), "m", cuda=False)


@pytest.mark.parametrize("name", [
    "sp-llama3-70b-tp2", "sp-llama3-8b-tp2",
    "micro-gemm-ag-llama3-70b-tp2", "micro-gemm-rs-llama3-70b-tp2",
    "micro-gemm-ag-llama3-8b-tp2", "micro-gemm-rs-llama3-8b-tp2",
])
def test_shipped_sp_specs_load(name):
    for cuda in (True, False):
        s = spec.load(SWEEPS / f"{name}.yaml", cuda)
        points = s.points(2, cuda)
        assert points and all(p.workload == s.workload for p in points)
        assert (s.workload == "layer") == name.startswith("sp-")
        assert len(points) <= 64  # device time is scarce
        if s.gemm is not None:  # a micro GEMM is one of the model's per-rank GEMMs at TP=2
            m, tp = s.shape, 2
            per_rank = {
                "gemm_ag": {((m.heads + 2 * m.kv_heads) * m.head_dim // tp, m.hidden), (2 * m.ffn // tp, m.hidden)},
                "gemm_rs": {(m.hidden, m.heads * m.head_dim // tp), (m.hidden, m.ffn // tp)},
            }[s.workload]
            assert (s.gemm.n, s.gemm.k) in per_rank or not cuda


# ---------------------------------------------------------------------------------------------
# The reference


@pytest.mark.parametrize("workload", micro.WORKLOADS)
@pytest.mark.parametrize("m, world", [(37, 2), (5, 4), (64, 2)])
def test_reference_is_the_unsharded_gemm(workload, m, world):
    n, k, seed = 24, 16, 3
    layout = ShardLayout(m, world)
    operands = [micro.operand(workload, m, k, world, r, seed, torch.float32, "cpu") for r in range(world)]
    weights = [micro.weight(workload, n, k, r, seed, torch.float32, "cpu") for r in range(world)]
    refs = micro.reference(workload, m, n, k, world, seed)
    assert len({w.sum().item() for w in weights}) == world  # every rank has its own B
    if workload == "gemm_ag":
        assert all(o.shape == (layout.shard, k) for o in operands)
        a = torch.cat(operands)
        assert not a[m:].any() and a[:m].std() > 0.5  # padding rows are zeros, the rest random
        for ref, w in zip(refs, weights):
            torch.testing.assert_close(ref, a[:m] @ w.t())
    else:
        assert all(o.shape == (layout.padded, k) and not o[m:].any() for o in operands)
        total = sum(o[:m] @ w.t() for o, w in zip(operands, weights))
        for ref in refs:
            torch.testing.assert_close(ref, total)
    assert refs[0].shape == (m, n) and refs[0].abs().mean() > 0.1


# ---------------------------------------------------------------------------------------------
# On gloo processes

N, K = 40, 24
CASES = [
    (workload, m, strategy, knobs)
    for workload in micro.WORKLOADS
    for m in (37, 3)
    for strategy, knobs in [
        ("sp_baseline", {}),
        ("flash_agrs", {}),
        ("flash_agrs", {"order": "ring", "chunks_per_rank": 2}),
        ("flash_agrs", {"chunks_per_rank": 4}),
    ]
]


def _rank_micro(rank: int, world: int, cases: list):
    from overlapbench import strategies
    from overlapbench.distributed import runtime
    from overlapbench.run import sweep
    from overlapbench.run.workload import build_workload

    rt = runtime.init(timeout_s=60)
    outs = []
    for workload, m, strategy, knobs in cases:
        point = Point("m", "tiny", None, world, "fp32", 1, 0, (m,), strategy, knobs, workload, Gemm(N, K))
        ctx, x = micro.build(rt, point, torch.float32, max_tokens=64)
        cls = strategies.get(strategy)
        step = cls.build(ctx, cls.check_knobs(knobs, strategy))
        outs.append([step.to_full(step.forward(x)).clone() for _ in range(2)])
    # One point through the sweep's loop: sp_baseline's reference, the check, the timing.
    s = spec.from_dict(_spec(gemm={"n": N, "k": K}, tokens=[37], measure={"warmup": 0, "iters": 2}), "m", cuda=False)
    point = next(p for p in s.points(world, cuda=False) if p.strategy == "flash_agrs")
    work = build_workload(rt, point, {}, max_tokens=37)
    return outs, sweep.measure_point(rt, point, work, s)


@pytest.mark.slow
def test_sp_strategies_compute_the_micro_reference():
    results = distributed.run(_rank_micro, CASES)
    failures = []
    for i, (workload, m, strategy, knobs) in enumerate(CASES):
        refs = micro.reference(workload, m, N, K, 2, seed=0)
        for rank, (outs, _) in enumerate(results):
            for out in outs[i]:
                err = distributed.rel_err(out, refs[rank])
                if not err < 1e-5:
                    failures.append(f"{workload} m={m} {strategy} {knobs} rank {rank}: rel err {err:.2e}")
    assert not failures, "\n".join(failures)
    for _, row in results:
        assert row["status"] == "ok" and row["rel_err"] < 1e-5 and len(row["samples_ms"]) == 2, row


# ---------------------------------------------------------------------------------------------
# End to end: the command line sweeps a micro spec, then reports it


@pytest.mark.slow
def test_a_micro_sweep_writes_its_gemm_and_reports_over_sp_baseline(tmp_path: Path):
    import yaml

    from overlapbench.tuning.results import read_rows

    path, out = tmp_path / "m.yaml", tmp_path / "m.jsonl"
    path.write_text(yaml.safe_dump(_spec(workload="gemm_rs", tokens=[37], measure={"warmup": 1, "iters": 3})))
    swept = distributed.overlapbench("sweep", str(path), "--output", str(out))
    assert swept.returncode == 0, swept.stderr[-2000:]
    rows = read_rows(out)
    assert [r["status"] for r in rows] == ["ok"] * 3
    assert all(r["gemm"] == {"n": 96, "k": 64} and r["workload"] == "gemm_rs" for r in rows)
    report = distributed.overlapbench("report", str(out), "--format", "json")
    assert report.returncode == 0, report.stderr[-2000:]
    records = json.loads(report.stdout)
    flash = next(r for r in records if r["strategy"] == "flash_agrs")
    reference = next(r for r in records if r["strategy"] == "sp_baseline")
    assert flash["gemm"] == {"n": 96, "k": 64} and flash["workload"] == "gemm_rs"
    assert flash["speedup"] == pytest.approx(reference["ms"] / flash["ms"], rel=1e-3)
