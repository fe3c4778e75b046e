"""report/twins.py (`report --profile`'s lines under a point whose `comm: none` twin was profiled,
and tests/checks/twin_stretch.py, the same per rank) on synthetic graph-replay timelines: a point
whose GEMMs are lengthened by planted amounts beside planted transfer-path kernels, against a twin that runs the
same compute kernels (in another order, so a match by name alone pairs the wrong ones). Fresh
random durations; the stretch, the GEMM time by what ran beside it and the order counts are known
by construction."""

from __future__ import annotations

import io
import json
import random
import re
import statistics

import pytest
from rich.console import Console

from overlapbench import report
from overlapbench.report import twins
from overlapbench.timing import timeline
from overlapbench.tuning.results import profile_name
from tests import synthetic
from tests.checks import twin_stretch
from tests.test_exposed import ATTENTION, GEMM, MAIN, NCCL, NORM, PEER_COPY, SIDE, Planned, timeline_of
from tests.test_report_diagnostics import profiler_table

COMM = 13
BARRIER = "c10d::symmetric_memory::barrier_kernel(unsigned long)"  # one CTA: not an order
SIDE_NORM = "_add_norm_kernel"  # the copy-engine path's norm: compute to exposed.py, absent from the twin
POINT, TWIN = "token_split-512-comm=copy_engine-2layers", "token_split-512-comm=none-2layers"


def write(tmp_path, name: str, kernels: list[Planned], replays: int, rng: random.Random) -> None:
    data = timeline_of(kernels, rng) | {"replays": replays, "rank": 0, "world": 1}
    timeline.write(data, tmp_path / timeline.file_name(name, replay=True))


def planted(rng: random.Random):
    """The twin's compute kernels (base durations) and the point: the same kernels, each lengthened
    by its stretch, laid one after another on MAIN with transfer-path kernels beside them."""
    base = {n: rng.randrange(100, 400) for n in ("norm", "a", "b", "c", "d", "attn")}
    grow = {n: rng.randrange(1, 60) for n in base}
    flops = dict(zip("abcd", rng.sample(range(1, 64), 4)))
    what = {"norm": (NORM, 0), "attn": (ATTENTION, 0)} | {g: (GEMM, 2 * flops[g] * 8192**2) for g in "abcd"}
    twin = [Planned(what[n][0], MAIN, 0, base[n], what[n][1]) for n in base]
    order = rng.sample(["norm", "attn"], 2) + ["d", "c", "b", "a"]  # the twin runs the GEMMs in reverse
    at = 0
    for n in order:
        twin[list(base).index(n)].start, at = at, at + base[n] + rng.randrange(5, 30)
    point, starts, at = [], {}, 0
    for n in base:  # kernels well apart: a side kernel overlaps only the GEMM planned beside it
        starts[n] = at
        point.append(Planned(what[n][0], MAIN, at, base[n] + grow[n], what[n][1]))
        at += base[n] + grow[n] + rng.randrange(60, 120)
    dur = {n: base[n] + grow[n] for n in base}
    early, fused_in = rng.randrange(1, 40), rng.randrange(10, dur["a"] - 10)
    point.append(Planned(NCCL, SIDE, starts["a"] - early, early + fused_in))  # starts first, ends inside A
    copy0, copy_len = rng.randrange(0, 20), rng.randrange(40, dur["b"] - 30)
    point.append(Planned(PEER_COPY, COMM, starts["b"] + copy0, copy_len))  # a copy inside B ...
    norm_len = rng.randrange(5, copy_len - 10)
    point.append(Planned(SIDE_NORM, SIDE, starts["b"] + copy0 + 5, norm_len))  # ... and an SM kernel inside it
    point.append(Planned(BARRIER, COMM + 1, starts["b"] + copy0 + 6, rng.randrange(1, norm_len - 1)))  # no order
    late = rng.randrange(20, dur["c"] - 20)
    point.append(Planned(NCCL, SIDE, starts["c"] + late, dur["c"] - late + rng.randrange(5, 50)))  # 20+ us into C
    soon = rng.randrange(1, 20)
    soon_len = rng.randrange(5, dur["d"] - soon - 5)
    point.append(Planned(NCCL, SIDE, starts["d"] + soon, soon_len))  # under 20 us into D, ends inside it
    beside = {"SM transfer kernel": (fused_in + norm_len + dur["c"] - late + soon_len),
              "copies only": copy_len - norm_len}
    beside["nothing"] = sum(dur[g] for g in "abcd") - sum(beside.values())
    return twin, point, base, grow, beside


@pytest.mark.parametrize("seed", range(4))
def test_the_stretch_what_ran_beside_and_the_order_are_the_planted_ones(tmp_path, seed, capsys):
    rng = random.Random()  # fresh
    twin, point, base, grow, beside = planted(rng)
    replays = rng.randrange(1, 4)
    write(tmp_path, POINT, point, replays, rng)
    write(tmp_path, TWIN, twin, replays, rng)
    per_layer_ms = replays * 2 * 1e3
    got = twins.compare(twin_stretch.load(tmp_path, POINT, 0), twin_stretch.load(tmp_path, TWIN, 0), 2)

    want = {"gemm": sum(grow[g] for g in "abcd"), "attention": grow["attn"], "other": grow["norm"]}
    assert got.stretch == pytest.approx({k: v / per_layer_ms for k, v in want.items()}, abs=1e-9)
    assert got.gemm_median_pct == pytest.approx(statistics.median(100 * grow[g] / base[g] for g in "abcd"))
    assert (got.matched, got.unmatched) == (6, 0)
    assert got.beside == pytest.approx({k: v / per_layer_ms for k, v in beside.items()}, abs=1e-9)
    orders = {k: [round(s, 6) for s in v] for k, v in got.orders.items()}  # times pass through ns
    assert orders == {"transfer first": [grow["a"]], "< 20 us after": [grow["d"]], ">= 20 us into": [grow["c"]]}
    ends = [(k.start, k.start + k.dur) for k in point]
    assert got.wall[0] == pytest.approx((max(e for _, e in ends) - min(s for s, _ in ends)) / per_layer_ms)
    assert got.wall[1] == pytest.approx((max(k.start + k.dur for k in twin)) / per_layer_ms)

    assert twin_stretch.main([str(tmp_path), POINT, TWIN, "--ranks", "all"]) == 0
    assert "rank 0" in capsys.readouterr().out


def test_a_missing_timeline_or_layer_count_is_one_line_and_exit_2(tmp_path, capsys):
    assert twin_stretch.main([str(tmp_path), POINT, TWIN]) == 2
    assert twin_stretch.main([str(tmp_path), "token_split-512", TWIN]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "POINT/TWIN" in err[0] and "--layers" in err[1]


def test_report_profile_says_what_the_transfers_cost_the_compute_against_the_twin(tmp_path):
    """A sweep's rows with the copy-engine split, its `comm: none` twin (other CTA and copy-engine
    knobs: a twin differs from its point in the transfer path only) and a split with another cut
    (no twin of it): the report's lines and record under the point are the planted stretch."""
    rng = random.Random()  # fresh
    twin, point, base, grow, beside = planted(rng)
    replays = rng.randrange(1, 4)
    split = {"align": 256, "split_offset": 0}
    rows = [synthetic.row("no_comm", 512, {}, layers=2),
            synthetic.row("token_split", 512, split | {"comm": "copy_engine", "comm_ctas_attn": 32, "comm_ctas_mlp": 32,
                                                       "ce_out": "kernel"}, layers=2),
            synthetic.row("token_split", 512, split | {"comm": "none"}, layers=2),
            synthetic.row("token_split", 512, {"align": 256, "split_offset": 64, "comm": "fused"}, layers=2)]
    folder = tmp_path / "profile"
    folder.mkdir()
    names = [profile_name(r["strategy"], r["tokens"], r["knobs"], None, 2) for r in rows]
    for name in names:
        (folder / f"{name}.txt").write_text(profiler_table({GEMM: rng.uniform(1, 9), NCCL: rng.uniform(0.1, 2)}, 2))
    for name, kernels in ((names[1], point), (names[2], twin), (names[3], point)):
        write(folder, name, kernels, replays, rng)
    results = synthetic.write(tmp_path / "r.jsonl", rows)
    out = io.StringIO()
    assert report.run([results], "table", Console(file=out, width=400), profile_dir=folder) == 0
    text = out.getvalue().splitlines()
    per_layer_ms = replays * 2 * 1e3
    at = next(i for i, t in enumerate(text) if t.startswith(names[1]))
    want = {"gemm": sum(grow[g] for g in "abcd"), "attention": grow["attn"], "other": grow["norm"]}
    line = next((t for t in text[at:at + 8] if t.startswith("  against its comm: none twin: wall ")), None)
    assert line is not None, "\n".join(text[at:at + 8])
    # printed to 3 places: a planted stretch of an odd number of us over 2 ms sits on a rounding tie
    printed = re.search(r"compute kernels longer by gemm (\S+), attention (\S+), other (\S+) ", line)
    assert printed, line
    got_ms = dict(zip(("gemm", "attention", "other"), map(float, printed.groups())))
    assert got_ms == pytest.approx({k: v / per_layer_ms for k, v in want.items()}, abs=5e-4 + 1e-9), line
    other = next(i for i, t in enumerate(text) if t.startswith(names[3]))
    assert not any("comm: none twin" in t for t in text[other:other + 6])  # another cut: no twin
    records = {r["table"]: r for r in json.loads(_report(results, folder, "json"))}
    got = records[names[1]]["against_twin"]
    assert got["twin"] == names[2] and got["matched"] == 6
    gemm = sum(beside.values())
    assert got["gemm_beside_ms"] == pytest.approx({k: v / per_layer_ms for k, v in beside.items()}, abs=1e-9)
    assert got["orders"]["transfer first"] == {"count": 1, "gemm_stretch_median_us": pytest.approx(grow["a"])}
    assert gemm > 0 and "against_twin" not in records[names[3]] and "against_twin" not in records[names[0]]


def _report(results, folder, fmt: str) -> str:
    out = io.StringIO()
    assert report.run([results], fmt, Console(file=out, width=400), profile_dir=folder) == 0
    return out.getvalue()
