"""`predict` from the inputs users have: an nccl-tests table predicts what it covers and skips the
rest with the reason; tables of other world sizes are rescaled and combined; cut-off or gappy
tables are flagged; the terminal's summary says what was extrapolated, interpolated, substituted,
rescaled, assumed or skipped. On synthetic tables with random shapes."""

from __future__ import annotations

import random

import pytest

from overlapbench.comm.sizes import busbw
from overlapbench.errors import UserError
from overlapbench.predict import comm_inputs
from overlapbench.predict.comm_table import CommTable
from overlapbench.predict.command import predict
from overlapbench.predict.notes import EXTRAPOLATED, FLAGGED, INTERPOLATED, RESCALED, SKIPPED, SUBSTITUTED, Note
from overlapbench.predict.summary import Summary
from overlapbench.specs import spec as spec_mod
from overlapbench.tuning.results import read_rows
from tests.test_predict_comm import SIZES, comm_row, write
from tests.test_predict_estimate import SPEC, _inputs

HEADER = "# nThread 1 nGpus 1 minBytes {lo} maxBytes {hi} step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1\n"


def nccl_tests(world: int, times: dict[int, float], header_max: int | None = None, closed: bool = True) -> str:
    """all_reduce_perf's text for `world` ranks: out-of-place times (ms) per size."""
    sizes = sorted(times)
    text = HEADER.format(lo=sizes[0], hi=header_max or sizes[-1])
    text += "".join(f"#  Rank {r:2d} Group  0 Pid {100 + r} on node device {r} [0x{r}] NVIDIA H100 80GB HBM3\n"
                    for r in range(world))
    for b in sizes:
        us = times[b] * 1e3
        text += f"  {b:>12} {b // 2:>12}  bfloat16  sum  -1  {us:9.3f}  1.00  1.00  0  {us:9.3f}  1.00  1.00  0\n"
    return text + ("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 100.0\n" if closed else "")


def ring(rng: random.Random, world: int) -> dict[int, float]:
    latency, gbps = rng.uniform(0.01, 0.04), rng.uniform(100, 400)
    return {b: round(latency + busbw_time(b, gbps, world), 6) for b in SIZES}


def busbw_time(nbytes: int, gbps: float, world: int) -> float:
    return nbytes * 2 * (world - 1) / world / (gbps * 1e9) * 1e3


SPEC_PATHS = SPEC | {"strategies": {"baseline": [{"nccl_max_ctas": "default"}, {"nccl_symm": True, "nccl_max_ctas": 16}],
                                    "no_comm": {}, "token_split": [{"comm": "nccl"}, {"comm": "nccl_symm"},
                                                                   {"comm": "copy_engine"}]}}


def _spec():
    return spec_mod.from_dict(SPEC_PATHS, "predicted", cuda=True)


def test_an_nccl_tests_table_predicts_what_it_covers_and_skips_the_rest(tmp_path):
    rng = random.Random()
    text = tmp_path / "all_reduce_perf.txt"
    text.write_text(nccl_tests(2, ring(rng, 2)))
    table = comm_inputs.table_at(2, [text], None)
    inputs = _inputs(rng.randrange(100))
    inputs.comm = table
    out, summary = tmp_path / "p.jsonl", Summary()
    predict(_spec(), 2, inputs, out, error=0.03, summary=summary)
    rows = read_rows(out)
    skipped = [r for r in rows if r["status"] == "skipped"]
    sent = {r["strategy"] + str(r["knobs"].get("comm") or r["knobs"].get("nccl_symm")) for r in skipped}
    assert sent == {"baselineTrue", "token_splitnccl_symm", "token_splitcopy_engine"}
    assert all(r["status"] == "ok" and r["speedup"] for r in rows if r not in skipped)
    assert {r["error"].split(" rows")[0] for r in skipped} == {"no 'nccl_symm'", "no 'copy_engine_norm'"}
    assert all("(it holds nccl)" in r["error"] and "overlapbench comm --paths" in r["error"] for r in skipped)
    lines = summary.lines()
    assert lines[0] == f"{len(rows)} points: {len(rows) - len(skipped)} predicted, {len(skipped)} skipped"
    said = next(x for x in lines if x.startswith(f"{SKIPPED}: "))
    assert "no 'nccl_symm' rows" in said and "no 'copy_engine_norm' rows" in said and "(4 points)" in said


def test_another_world_size_is_rescaled_by_the_measured_ring_and_combined_per_path(tmp_path):
    rng = random.Random()
    world = rng.choice([4, 8])
    big = ring(rng, world)
    text = tmp_path / "nccl8.txt"
    text.write_text(nccl_tests(world, big))
    ours = {(p, c): {b: rng.uniform(0.01, 0.03) + b / rng.uniform(1e8, 4e8) for b in SIZES}
            for p, c in (("nccl", "default"), ("nccl_symm", 16), ("copy_engine_norm", 32))}
    rows = [comm_row(p, c, b, ms) for (p, c), times in ours.items() for b, ms in times.items()]
    table = comm_inputs.table_at(world, [text, write(tmp_path / "ours.jsonl", rows)], None)
    top = SIZES[-1]
    factor = big[top] / ours[("nccl", "default")][top]
    assert table.world_size == world and table.paths() == ["copy_engine_norm", "nccl", "nccl_symm"]
    for b in SIZES:
        assert table.time_ms("nccl", "default", b).ms == pytest.approx(big[b])  # as the `world` GPUs measured it
        assert table.time_ms("nccl_symm", 16, b).ms == pytest.approx(ours[("nccl_symm", 16)][b] * factor)
    kinds = {n.kind: n.text for n in table.notes}
    assert f"rescaled to {world} ranks by x{factor:.3g}: nccl's time at 128M in {text}" in kinds[RESCALED]
    assert kinds[SUBSTITUTED] == (f"copy_engine_norm, nccl_symm: from {tmp_path / 'ours.jsonl'}, rescaled: no table "
                                  f"of {world} ranks holds them")
    gbps = rng.uniform(200, 400)
    by_busbw = comm_inputs.table_at(world, [write(tmp_path / "only.jsonl", rows)], gbps)
    at = by_busbw.time_ms("nccl", "default", 1 << 30).ms
    assert busbw("all_reduce", 1 << 30, at / 1e3, world) == pytest.approx(gbps)


def test_what_cannot_be_rescaled_is_one_line_naming_the_fix(tmp_path):
    rng = random.Random()
    ours = write(tmp_path / "ours.jsonl", [comm_row("nccl", "default", b, 0.1 + b / 1e8) for b in SIZES])
    symm = write(tmp_path / "symm.jsonl", [comm_row("nccl_symm", 16, b, 0.1 + b / 1e8, world=4) for b in SIZES])
    text = tmp_path / "t.txt"
    text.write_text(nccl_tests(8, ring(rng, 8)))
    cases = [(lambda: comm_inputs.table_at(4, [ours], None), "--comm: no table of 4 ranks"),
             (lambda: comm_inputs.table_at(2, [ours], 300.0), "--busbw: every --comm table is of 2 ranks already"),
             (lambda: comm_inputs.table_at(4, [ours, symm], None), "no 'nccl' rows in both it and the 4-rank table"),
             (lambda: comm_inputs.table_at(8, [], None), "--comm: no all-reduce table given")]
    for call, message in cases:
        with pytest.raises(UserError, match=message) as e:
            call()
        assert "\n" not in str(e.value)
    assert comm_inputs.table_at(8, [text, ours], None).world_size == 8


def test_cut_off_and_gappy_tables_are_flagged_and_lookups_across_a_gap_say_so(tmp_path):
    rng = random.Random()
    times = ring(rng, 2)
    full = CommTable.from_nccl_tests(nccl_tests(2, times), source="full")
    assert not full.notes and not full.gaps()
    cut = dict(list(times.items())[:rng.randrange(2, 6)])
    flagged = CommTable.from_nccl_tests(nccl_tests(2, cut, header_max=SIZES[-1], closed=False), source="cut")
    said = [n.text for n in flagged.notes if n.kind == FLAGGED]
    assert any("no closing '# Avg bus bandwidth' line" in t for t in said)
    assert any(t.startswith("cut: its sizes stop at") and "where its header asked for up to 128M" in t for t in said)
    hole = rng.randrange(2, len(SIZES) - 2)
    gappy = {b: t for i, (b, t) in enumerate(times.items()) if i not in (hole, hole + 1)}
    file = tmp_path / "gappy.txt"
    file.write_text(nccl_tests(2, gappy))
    table = CommTable.read([file])
    lo, hi = SIZES[hole - 1], SIZES[hole + 2]
    assert [n.kind for n in table.notes] == [FLAGGED] and "has no sizes between" in table.notes[0].text
    inside = table.time_ms("nccl", "default", SIZES[hole])
    assert [n.kind for n in inside.notes] == [INTERPOLATED] and str(lo // 2**20) in inside.note
    assert table.time_ms("nccl", "default", lo).notes == () and table.time_ms("nccl", "default", hi).notes == ()
    assert [n.kind for n in table.time_ms("nccl", "default", 4 * SIZES[-1]).notes] == [EXTRAPOLATED]


def test_the_summary_counts_points_per_note_and_says_each_kind_once():
    rng = random.Random()
    summary = Summary(inputs=[Note(RESCALED, "table x rescaled"), Note(FLAGGED, "file cut off")])
    texts = [f"path{i} above 1G: extrapolated" for i in range(6)]
    counts = {}
    for _ in range(rng.randrange(20, 40)):
        chosen = rng.sample(texts, rng.randrange(0, 3))
        for t in chosen:
            counts[t] = counts.get(t, 0) + 1
        summary.add([Note(EXTRAPOLATED, t) for t in chosen] * 2, ok=True)  # a note repeated counts once per point
    summary.add([Note(SKIPPED, "no plan")], ok=False)
    lines = summary.lines()
    assert lines[0] == f"{summary.points} points: {summary.points - 1} predicted, 1 skipped"
    assert [x.split(":")[0] for x in lines[1:]] == [SKIPPED, EXTRAPOLATED, RESCALED, FLAGGED, "split transfers",
                                                  "contention", "in-layer term"]
    top = sorted(counts.items(), key=lambda kv: -kv[1])[0]
    assert f"{top[0]} ({top[1]} points)" in lines[2]
    assert lines[2].endswith(f"and {len(counts) - 4} more") == (len(counts) > 4)


def test_the_command_prints_the_summary_after_the_rows(tmp_path, monkeypatch):
    """`overlapbench predict` on the committed 2x H100 inputs, as a user runs it: the rows' path,
    then the summary (here nothing skipped, the contention beside the GEMM stream, no in-layer
    term by default for a spec that settles each choice, none measured where asked for); a bad
    --in-layer is one line, exit 2."""
    from typer.testing import CliRunner

    from overlapbench.cli import app
    from tests.results_readme import ROOT

    monkeypatch.chdir(ROOT)
    pieces = "results/h100x1/d604491/pieces-llama3-8b-tp2-tp2.jsonl"
    if not (ROOT / pieces).exists():
        pytest.skip("the committed pieces are not on this branch")
    out = tmp_path / "p.jsonl"
    result = CliRunner().invoke(app, ["predict", "sweeps/llama3-8b-tp2.yaml", "--tp", "2", "--compute", pieces,
                                      "--comm", "results/h100x2/cc10b27/comm.jsonl",
                                      "--comm", "results/h100x2/cc10b27/comm-beside.jsonl", "-o", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    rows = read_rows(out)
    assert lines[0] == f"wrote predicted rows to {out}" and lines[1] == f"{len(rows)} points: {len(rows)} predicted, 0 skipped"
    said = next(x for x in lines if x.startswith("substituted: "))  # no table at hidden 4096 given
    assert "fused_norm hidden 4096 not measured: 8192 used (12 points)" in said
    assert "copy_engine_norm hidden 4096 not measured: 8192 used (24 points)" in said
    assert lines[-2].startswith("contention: beside the GEMM stream for")
    flagged = next(x for x in lines if x.startswith("flagged: "))  # pieces of d604491: every chain in shared rounds
    assert "the pieces' chains were timed in shared rounds, where the spec settles each choice" in flagged
    assert lines[-1].startswith("in-layer term: not charged (--in-layer auto: the spec settles each choice for 300 ms "
                                "before timing it")
    assert {r["predicted"]["in_layer"] for r in rows} == {"none"}  # auto, for a spec timed at each choice's own clock
    again = tmp_path / "q.jsonl"
    asked = CliRunner().invoke(app, ["predict", "sweeps/llama3-8b-tp2.yaml", "--tp", "2", "--compute", pieces,
                                     "--comm", "results/h100x2/cc10b27/comm.jsonl",
                                     "--comm", "results/h100x2/cc10b27/comm-beside.jsonl", "-o", str(again),
                                     "--in-layer", "measured"])
    assert asked.exit_code == 0, asked.output
    assert asked.output.splitlines()[-1] == ("in-layer term: none (no --beside-layer rows): blocking all-reduces cost "
                                             "their time in the table")
    assert {r["predicted"]["in_layer"] for r in read_rows(again)} == {"measured"}
    assert [r["ms"] for r in read_rows(again)] == [r["ms"] for r in rows]  # beside-GEMM rows hold no term
    bad = "".join(random.choices("abcxyz", k=6))
    refused = CliRunner().invoke(app, ["predict", "sweeps/llama3-8b-tp2.yaml", "--tp", "2", "--compute", pieces,
                                       "--comm", "results/h100x2/cc10b27/comm.jsonl", "-o", str(tmp_path / "r.jsonl"),
                                       "--in-layer", bad])
    assert refused.exit_code == 2 and not (tmp_path / "r.jsonl").exists()
    assert refused.output.strip() == f"error: --in-layer: one of auto, none, measured, got '{bad}'"


def test_auto_charges_the_in_layer_term_only_where_the_spec_shares_one_clock(tmp_path, monkeypatch, rng):
    """`--in-layer auto` (the default) follows how `sweep` times the spec: a spec that settles each
    choice (measure.settle_ms > 0) is predicted as `--in-layer none`, one timed in shared spans
    (settle_ms 0) as `--in-layer measured`, whose blocking all-reduces pay the beside-layer rows'
    term (committed 2x H200 inputs: the term is above zero at 1K-8K tokens)."""
    import yaml
    from typer.testing import CliRunner

    from overlapbench.cli import app
    from overlapbench.predict.in_layer_choice import in_layer_for
    from tests.results_readme import ROOT

    assert in_layer_for("auto", 0) == "measured" and in_layer_for("auto", rng.uniform(1, 2000)) == "none"
    assert in_layer_for("none", 0) == "none" and in_layer_for("measured", rng.uniform(1, 2000)) == "measured"
    monkeypatch.chdir(ROOT)
    x2 = "results/h200x2"
    inputs = [f"{x2}/bbc1676/pieces-llama3-70b-tp2-tp2.jsonl", f"{x2}/bbc1676/comm.jsonl",
              f"{x2}/b7896f4/comm-beside-layer-llama3-70b.jsonl"]
    if not all((ROOT / p).exists() for p in inputs):
        pytest.skip("the committed 2x H200 inputs are not on this branch")
    spec = yaml.safe_load((ROOT / "sweeps/llama3-70b-tp2.yaml").read_text())
    spec["tokens"] = sorted(rng.sample([1024, 2048, 4096, 8192], 2))
    settled, shared = tmp_path / "settled.yaml", tmp_path / "shared.yaml"
    settled.write_text(yaml.safe_dump(spec))
    shared.write_text(yaml.safe_dump(spec | {"measure": spec["measure"] | {"settle_ms": 0}}))

    def predicted(path, *flags) -> dict:
        out = tmp_path / f"{path.stem}{''.join(flags)}.jsonl"
        result = CliRunner().invoke(app, ["predict", str(path), "--tp", "2", "--compute", inputs[0], "--comm", inputs[1],
                                          "--comm", inputs[2], "-o", str(out), *flags])
        assert result.exit_code == 0, result.output
        return {r["key"]: r for r in read_rows(out) if r["status"] == "ok"}

    auto_settled, auto_shared = predicted(settled), predicted(shared)
    none, measured = predicted(settled, "--in-layer", "none"), predicted(shared, "--in-layer", "measured")
    assert {r["predicted"]["in_layer"] for r in auto_settled.values()} == {"none"}
    assert {r["predicted"]["in_layer"] for r in auto_shared.values()} == {"measured"}
    assert {k: r["ms"] for k, r in auto_settled.items()} == {k: r["ms"] for k, r in none.items()}
    assert {k: r["ms"] for k, r in auto_shared.items()} == {k: r["ms"] for k, r in measured.items()}
    ring = {"nccl_max_ctas": "default"}  # the default baseline: NCCL's ring, whose in-layer term the rows hold
    plain = {r["tokens"]: r["ms"] for r in none.values() if r["strategy"] == "baseline" and r["knobs"] == ring}
    charged = {r["tokens"]: r["ms"] for r in auto_shared.values() if r["strategy"] == "baseline" and r["knobs"] == ring}
    assert sorted(plain) == sorted(charged) == spec["tokens"]
    for tokens, ms in plain.items():
        assert charged[tokens] > ms  # the term, charged where the spec shares one clock


def test_pieces_whose_chains_ran_at_their_own_clock_are_not_flagged(tmp_path, monkeypatch):
    """The committed pieces of 01cb04c timed each chain at its own clock (their rows' settle_ms): a
    spec that settles each choice predicted from them says nothing of the chains; the same spec
    predicted from pieces whose chains shared the rounds (d35db99's, the same layer code) says so."""
    from typer.testing import CliRunner

    from overlapbench.cli import app
    from tests.results_readme import ROOT

    monkeypatch.chdir(ROOT)
    said = {}
    for commit in ("01cb04c", "d35db99"):
        pieces = f"results/h200/{commit}/pieces-llama3-8b-tp2-tp2.jsonl"
        if not (ROOT / pieces).exists():
            pytest.skip("the committed pieces are not on this branch")
        result = CliRunner().invoke(app, ["predict", "sweeps/llama3-8b-tp2.yaml", "--tp", "2", "--compute", pieces,
                                          "--comm", "results/h200x2/bbc1676/comm.jsonl", "-o", str(tmp_path / f"{commit}.jsonl")])
        assert result.exit_code == 0, result.output
        said[commit] = any("chains were timed in shared rounds" in x for x in result.output.splitlines())
    assert said == {"01cb04c": False, "d35db99": True}
