"""Several stack depths in one run (`layers: [4, 8]`): the spec's list and its errors, the
footprint at each depth, tune never pooling depths (in one file or two), report's plot drawing the
deepest depth alone, and report's per-added-layer section, whose marginals are checked against
stacks of known per-layer cost and known ends. predict's: tests/test_predict_depths.py."""

from __future__ import annotations

import io
import random
import re

import pytest
from rich.console import Console

from overlapbench import report, tuned
from overlapbench.errors import UserError
from overlapbench.run import footprint
from overlapbench.specs import spec
from overlapbench.tuning import analysis, tune
from tests import synthetic
from tests.distributed import overlapbench

GOOD = {"name": "t", "model": "tiny", "tp": 2, "tokens": [16, 33], "strategies": ["baseline", "no_comm"]}


def parse(layers, **more) -> spec.SweepSpec:
    return spec.from_dict(GOOD | {"layers": layers} | more, "file", cuda=False)


# -- the spec --------------------------------------------------------------------------------------


def test_a_list_of_depths_times_each_batch_at_each_beside_its_own_reference():
    points = parse([3, 2]).points(2, cuda=False)
    assert [(p.tokens, p.layers, p.strategy) for p in points] == [
        (16, 3, "baseline"), (16, 3, "no_comm"), (16, 2, "baseline"), (16, 2, "no_comm"),
        (33, 3, "baseline"), (33, 3, "no_comm"), (33, 2, "baseline"), (33, 2, "no_comm")]
    assert len({p.workload_key for p in points}) == 4  # a paired batch per (batch, depth)
    assert len({p.key() for p in points}) == 8
    # an int spec's points, and so its rows' keys, are those of the same depth in a list
    one = parse(2).points(2, cuda=False)
    assert parse(2).layers == 2 and [p.key() for p in one] == [p.key() for p in points if p.layers == 2]
    assert parse([5]).depths == (5,) and {p.layers for p in parse([5]).points(2, cuda=False)} == {5}


def test_a_micro_workload_is_one_gemm_whatever_the_depths():
    micro = parse([2, 4], workload="gemm_ag", gemm={"n": 64, "k": 32}, strategies=["sp_baseline"])
    assert {p.layers for p in micro.points(2, cuda=False)} == {1}


@pytest.mark.parametrize("layers, field", [
    ([], "layers: an empty list"),
    ([4, 4], "layers: 4 appears twice"),
    ([4, 0], "layers[1]: must be a positive integer"),
    ([4, "8"], "layers[1]: must be a positive integer"),
    ([True], "layers[0]: must be a positive integer"),
    ([-2, 4], "layers[0]: must be a positive integer"),
    ("lots", "layers: must be a positive integer"),
    (2.5, "layers: must be a positive integer"),
    ({"a": 1}, "layers: must be a positive integer"),
])
def test_bad_depths_name_the_field_in_one_line(layers, field):
    with pytest.raises(UserError) as info:
        parse(layers)
    message = str(info.value)
    assert message.startswith(field) and "\n" not in message, message
    with pytest.raises(UserError) as info:  # set in a device section, named as written there
        spec.from_dict(GOOD | {"cpu": {"layers": layers}}, "file", cuda=False)
    assert str(info.value).startswith(f"cpu.{field}")


def test_the_footprint_counts_each_point_at_its_depth_and_the_deepest_stack():
    both = parse([2, 5])
    size = footprint.estimate(both, both.points(2, False), cuda=False)
    alone = {n: footprint.estimate(parse(n), parse(n).points(2, False), cuda=False) for n in (2, 5)}
    assert size.weights_bytes == alone[5].weights_bytes > alone[2].weights_bytes
    assert size.tflop == pytest.approx(alone[2].tflop + alone[5].tflop)
    assert size.points == alone[2].points + alone[5].points


def test_the_footprint_counts_the_fp32_truth_where_the_deepest_stack_is_checked_against_it():
    shallow, deep = parse([4, 8], dtype="bf16"), parse([4, 16], dtype="bf16")  # TP=2: 16 and 32 rank-layers
    per_layer = lambda s: footprint.estimate(s, s.points(2, False), cuda=False).weights_bytes / max(s.depths)
    assert per_layer(deep) == pytest.approx(1.5 * per_layer(shallow))  # the truth's copy beside the stack


# -- rows at two depths ----------------------------------------------------------------------------

# Stack times T(L) = per_layer * L + ends (ms): the split hides more per layer but ends worse.
TRUE = {"baseline": (1.0, 0.4), "token_split": (0.8, 0.6), "no_comm": (0.7, 0.1)}
SPLIT = {"comm": "copy_engine", "comm_ctas_attn": 32, "comm_ctas_mlp": 32}
TOKENS = 16384


def stack_ms(strategy: str, layers: int, truth: dict = TRUE) -> float:
    per_layer, ends = truth[strategy]
    return per_layer * layers + ends


def paired_rows(depths=(4, 8), rounds: int = 20, seed: int = 7, truth=TRUE, tokens: int = TOKENS) -> list[dict]:
    """Each depth timed as one paired batch: per round a drift shared by all, and noise of each."""
    rng = random.Random(seed)
    rows = []
    for layers in depths:
        drift = [1 + rng.gauss(0, 0.01) for _ in range(rounds)]
        for strategy, (per_layer, ends) in truth.items():
            ms = (per_layer * layers + ends) / layers
            samples = [ms * d * (1 + rng.gauss(0, 0.002)) for d in drift]
            knobs = SPLIT if strategy == "token_split" else None
            rows.append(synthetic.row(strategy, tokens, knobs, samples=samples, layers=layers,
                                      pairing=f"run1/{tokens}/{layers}"))
    return rows


def test_the_marginals_are_per_added_layer_not_per_layer_of_a_stack(tmp_path):
    store = analysis.read([synthetic.write(tmp_path / "r.jsonl", paired_rows())])
    (group, points), = report.steady.steady(store.measured).items()
    (point,), = [points]
    assert (point.low, point.high, point.label) == (4, 8, str(TOKENS))
    by = {mg.m.strategy: mg for mg in point.marginals}
    assert by["baseline"].ms == pytest.approx(1.0, rel=0.02)
    assert by["token_split"].ms == pytest.approx(0.8, rel=0.02)
    assert by["no_comm"].ms == pytest.approx(0.7, rel=0.02)
    split = by["token_split"]
    # 1.25x per added layer; the stacks' own speedups (1.16x at 4 layers, 1.2x at 8) are not it
    assert split.speedup.value == pytest.approx(1.25, rel=0.01)
    assert split.hidden.value == pytest.approx(2 / 3, rel=0.02)
    assert split.speedup.interval[0] < 1.25 < split.speedup.interval[1] < 1.35
    assert split.hidden.interval[0] < 2 / 3 < split.hidden.interval[1]
    assert by["baseline"].speedup == report.steady.Estimate(1.0, None)
    assert by["no_comm"].hidden is None


def test_a_figure_without_an_interval_at_its_level_shows_none(tmp_path):
    """Rows with three samples each: too few for the rank-sum interval of the baseline's two
    depths at the Bonferroni level, so the figures stand alone."""
    rows = paired_rows(rounds=3)
    for r in rows:
        r["pairing"] = r["round_ids"] = None
    store = analysis.read([synthetic.write(tmp_path / "r.jsonl", rows)])
    (points,) = report.steady.steady(store.measured).values()
    split = next(mg for mg in points[0].marginals if mg.m.strategy == "token_split")
    assert split.speedup.value == pytest.approx(1.25, rel=0.03) and split.speedup.interval is None


def run_report(path, fmt: str = "table") -> str:
    out = io.StringIO()
    assert report.run([path], fmt, Console(file=out, width=200)) == 0
    return out.getvalue()


def test_report_adds_the_section_in_table_and_markdown(tmp_path):
    path = synthetic.write(tmp_path / "r.jsonl", paired_rows())
    table = run_report(path)
    assert f"{TOKENS} (4 layers)" in table and f"{TOKENS} (8 layers)" in table  # the overview's points, named
    section = table[table.index("per added layer (steady state), 4 -> 8 layers"):]
    line = next(x for x in section.splitlines() if "token_split" in x)
    speedup, lo, hi = map(float, re.search(r"(\d\.\d{3})x \[(\d\.\d{3})x, (\d\.\d{3})x\]", line).groups())
    assert speedup == pytest.approx(1.25, rel=0.01) and lo < 1.25 < hi
    assert int(re.search(r"(\d+)% \[", line).group(1)) == pytest.approx(67, abs=2) and "comm=copy_engine" in section
    markdown = run_report(path, "markdown")
    assert "## per added layer (steady state)" in markdown and "| tokens | setting | ms/layer |" in markdown


def test_one_depth_reads_as_it_always_has(tmp_path):
    rows = [r for r in paired_rows() if r["layers"] == 8]
    path = synthetic.write(tmp_path / "r.jsonl", rows)
    for fmt in ("table", "markdown"):
        text = run_report(path, fmt)
        assert "per added layer" not in text and "layers)" not in text
    store = analysis.read([path])
    assert not any(m.depth_named for m in store.measured) and not report.steady.steady(store.measured)


def test_sensitivity_shows_a_grid_per_depth_against_that_depths_baseline(tmp_path):
    path = synthetic.write(tmp_path / "r.jsonl", paired_rows())
    grids, records, _ = report.sensitivity.sensitivity_view(analysis.read([path]), "token_split", TOKENS)
    assert [g.title.endswith(f"at {TOKENS} tokens ({n} layers)") for n, g in zip((4, 8), grids)] == [True, True]
    speedups = {r["layers"]: r["speedup"] for r in records}
    for layers in (4, 8):
        assert speedups[layers] == pytest.approx(stack_ms("baseline", layers) / stack_ms("token_split", layers), rel=0.01)


# -- plot ------------------------------------------------------------------------------------------


def random_truth(rng: random.Random) -> dict:
    """Per strategy (ms per layer, ms of the stack's ends): ends large enough that a point's ms
    per layer at 4 layers is a few percent above its ms at 8."""
    return {s: (per_layer := rng.uniform(0.5, 1.5), rng.uniform(0.3, 0.6) * per_layer)
            for s in ("baseline", "token_split", "no_comm")}


def test_the_plot_draws_the_deepest_depth_alone_each_speedup_over_its_own_baseline(tmp_path):
    """Rows at 4 and 8 layers at three token counts, and at a fourth through 4 layers only:
    each line holds the 8-layer points once each (a point timed only shallower is left out),
    their ms and speedups those of the 8-layer cells, and the title names the depth."""
    from overlapbench.report import overview, plot

    rng = random.Random()
    truth, counts = random_truth(rng), (1024, 4096, 16384)
    rows = [r for t in counts for r in paired_rows(truth=truth, tokens=t, seed=rng.randrange(1 << 30))]
    rows += paired_rows(depths=(4,), truth=truth, tokens=2048, seed=rng.randrange(1 << 30))
    store = analysis.read([synthetic.write(tmp_path / "r.jsonl", rows)])
    ((group, points),) = overview.overview(store).items()
    deep = {t: points[f"{t} (8 layers)"] for t in counts}
    for metric in ("ms", "speedup"):
        drawn, depth = plot.lines(points, metric)
        assert depth == 8 and plot.title(group, depth) == f"{group.label()} (8 layers)"
        assert sorted(line.strategy for line in drawn) == sorted(truth)
        for line in drawn:
            assert line.xs == counts
            assert line.ys == tuple(c[line.strategy].m.ms if metric == "ms" else c[line.strategy].speedup
                                    for c in deep.values())
            stack = stack_ms(line.strategy, 8, truth)
            expected = stack / 8 if metric == "ms" else stack_ms("baseline", 8, truth) / stack
            assert line.ys == pytest.approx((expected,) * len(counts), rel=0.01)
        axes = Recorder()  # what the panel asks of matplotlib's axes, without matplotlib
        plot._panel(axes, group, points, metric)
        assert [(args[:2], kw["label"]) for name, args, kw in axes.calls if name == "plot"] == [
            ((line.xs, line.ys), f"{line.strategy} (bound)" if line.bound else line.strategy) for line in drawn]
        assert ("set_title", (f"{group.label()} (8 layers)",), {}) in axes.calls


class Recorder:
    """Stands for matplotlib's Axes: records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str):
        return lambda *args, **kw: self.calls.append((name, args, kw))


def test_the_plot_of_one_depth_names_none(tmp_path):
    from overlapbench.report import overview, plot

    rows = paired_rows(depths=(8,), truth=random_truth(random.Random()))
    ((group, points),) = overview.overview(analysis.read([synthetic.write(tmp_path / "r.jsonl", rows)])).items()
    drawn, depth = plot.lines(points, "ms")
    assert depth is None and plot.title(group, depth) == group.label() and all(line.xs == (TOKENS,) for line in drawn)


# -- tune ------------------------------------------------------------------------------------------


def test_tune_judges_each_depth_apart_and_keeps_the_baseline_where_they_disagree(tmp_path):
    """At 4 layers the split wins by 10% per layer, at 8 it loses by 1%. Pooled, its 4-layer row
    would beat the faster 8-layer baseline by 5% and be picked; judged per depth, they disagree."""
    rng = random.Random(11)
    rows = []
    for layers, base, split in ((4, 1.10, 1.00), (8, 1.05, 1.06)):
        drift = [1 + rng.gauss(0, 0.005) for _ in range(20)]
        for strategy, ms, knobs in (("baseline", base, None), ("token_split", split, SPLIT)):
            samples = [ms * d * (1 + rng.gauss(0, 0.002)) for d in drift]
            rows.append(synthetic.row(strategy, TOKENS, knobs, samples=samples, layers=layers, pairing=f"p/{layers}"))
    store = analysis.read([synthetic.write(tmp_path / "r.jsonl", rows)])
    (points,) = analysis.by_point(store.measured).values()
    chosen = tune.pick(points[TOKENS])
    assert chosen.chosen.strategy == "baseline" and "batches disagree" in chosen.why
    assert "(4 layers): token_split" in chosen.why and "(8 layers): baseline" in chosen.why
    agreeing = analysis.read([synthetic.write(tmp_path / "a.jsonl", paired_rows())])
    (points,) = analysis.by_point(agreeing.measured).values()
    pick = tune.pick(points[TOKENS])
    assert pick.chosen.strategy == "token_split" and pick.chosen.layers == 4  # each depth picked it
    (written,) = tune.run([tmp_path / "a.jsonl"], tmp_path / "tuned", Console(file=io.StringIO()))
    assert "token_split" in written.read_text()


def depth_rows(verdicts: dict, rng: random.Random) -> list[dict]:
    """Per (tokens, layers) a paired batch of the baseline and the split: the split faster by
    5-15% where the verdict is True, slower by 1-5% where it is False (20 rounds, 0.5% drift)."""
    rows = []
    for (tokens, layers), wins in verdicts.items():
        base = rng.uniform(0.5, 2.0)
        split = base / rng.uniform(1.05, 1.15) if wins else base * rng.uniform(1.01, 1.05)
        drift = [1 + rng.gauss(0, 0.005) for _ in range(20)]
        for strategy, ms, knobs in (("baseline", base, None), ("token_split", split, SPLIT)):
            samples = [ms * d * (1 + rng.gauss(0, 0.002)) for d in drift]
            rows.append(synthetic.row(strategy, tokens, knobs, samples=samples, layers=layers,
                                      pairing=f"p/{tokens}/{layers}"))
    return rows


def test_tune_writes_a_setting_only_where_every_depth_chose_it_whichever_files_hold_them(tmp_path):
    """At 1024 tokens both depths pick the split, at 4096 only the 4-layer batch does, at 16384
    neither. The config: the split up to 1024 (its figures the 4-layer batch's, `layers` says
    so), the baseline from there, the disagreement said; the same whether the depths come in one
    file or in two (rows of two depths never replace each other)."""
    rng = random.Random()
    verdicts = {(1024, 4): True, (1024, 8): True, (4096, 4): True, (4096, 8): False,
                (16384, 4): False, (16384, 8): False}
    rows = depth_rows(verdicts, rng)
    one = synthetic.write(tmp_path / "both.jsonl", rows)
    apart = [synthetic.write(tmp_path / f"l{n}.jsonl", [r for r in rows if r["layers"] == n]) for n in (8, 4)]
    configs = []
    for paths, out in (([one], "one"), (apart, "apart")):
        assert len(analysis.read(paths).measured) == len(rows)
        (written,) = tune.run(paths, tmp_path / out, Console(file=io.StringIO()))
        configs.append(tuned.load(written))
    first, second = configs
    assert [r.as_dict() | {"why": None} for r in first.rules] == [r.as_dict() | {"why": None} for r in second.rules]
    split, kept = first.rules
    assert (split.lo, split.strategy, split.extra["measured"], split.extra["layers"]) == (1, "token_split", [1024], 4)
    at_4 = next(r for r in rows if (r["tokens"], r["layers"], r["strategy"]) == (1024, 4, "token_split"))
    assert split.ms == pytest.approx(at_4["ms"], rel=1e-4)
    assert "[1024] (4 layers): " in split.extra["why"] and "[1024] (8 layers): " in split.extra["why"]
    assert (kept.strategy, kept.extra["measured"], kept.hi) == ("baseline", [4096, 16384], 16384)
    assert "4096: batches disagree ([4096] (4 layers): token_split" in kept.extra["why"]
    assert "[4096] (8 layers): baseline" in kept.extra["why"]
    # each depth alone would have picked the split at 4096 (4 layers) or not (8 layers)
    for layers, strategy in ((4, "token_split"), (8, "baseline")):
        (alone,) = tune.run([apart[(8, 4).index(layers)]], tmp_path / f"alone{layers}", Console(file=io.StringIO()))
        rule = tuned.load(alone).choose(4096).rule
        assert rule.strategy == strategy and "layers" not in rule.extra


# -- the committed studies -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["steady-llama3-70b-tp2", "steady-llama3-8b-tp2"])
def test_the_steady_studies_run_on_cpu_at_toy_size(tmp_path, name):
    """Their cpu: sections on 2 gloo processes: rows at both depths (the copy-engine settings
    skipped, with the reason), and report's per-layer section."""
    out = tmp_path / "r.jsonl"
    done = overlapbench("sweep", f"sweeps/{name}.yaml", "--output", str(out))
    assert done.returncode == 0, done.stderr
    rows = analysis.read([out]).rows
    assert {r["layers"] for r in rows if r["status"] == "ok"} == {1, 2}
    assert {r["strategy"] for r in rows if r["status"] == "ok"} == {"baseline", "no_comm", "token_split"}
    assert all("needs CUDA" in r["error"] for r in rows if r["status"] == "skipped")
    shown = overlapbench("report", str(out))
    assert shown.returncode == 0 and "per added layer (steady state), 1 -> 2 layers" in shown.stdout, shown.stdout
