"""Selection: noise-aware, simplest on ties, never no_comm; ranges merged and covering 1..max."""

from __future__ import annotations

import dataclasses
import random

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from overlapbench import tuned
from overlapbench.errors import UserError
from overlapbench.tuning import analysis, batches, tune
from overlapbench.tuning.analysis import Measured
from tests import synthetic


def measured(*rows: dict) -> list[Measured]:
    return [Measured.of(r, "synthetic.jsonl") for r in rows]


def shifted(samples: list[float], factor: float, rng: random.Random) -> list[float]:
    """The same distribution, scaled: a challenger indistinguishable from `samples` but for `factor`."""
    out = [s * factor for s in samples]
    rng.shuffle(out)
    return out


def quiet() -> Console:
    return Console(quiet=True)


# -- choosing at one token count -----------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_an_advantage_inside_the_noise_keeps_baseline(seed):
    rng = random.Random(seed)
    base = synthetic.draw(1.0, 0.05, rng)
    rows = measured(
        synthetic.row("baseline", 2048, samples=base),
        synthetic.row("token_split", 2048, samples=shifted(base, 0.995, rng)),
    )
    assert rows[1].ms < rows[0].ms  # faster by its median: only the noise says no
    p = tune.pick(rows)
    assert p.chosen.strategy == "baseline"
    assert p.gain is None
    assert "within noise" in p.why


@pytest.mark.parametrize("seed", range(5))
def test_a_clearly_faster_strategy_is_chosen(seed):
    rng = random.Random(seed)
    rows = measured(
        synthetic.row("baseline", 2048, samples=synthetic.draw(1.0, 0.01, rng)),
        synthetic.row("token_split", 2048, {"split_offset": 128}, samples=synthetic.draw(0.93, 0.01, rng)),
    )
    p = tune.pick(rows)
    assert p.chosen.strategy == "token_split" and p.chosen.knobs == {"split_offset": 128}
    assert p.gain.method == "rank-sum"
    assert 1.0 < p.gain.lo < p.gain.speedup < p.gain.hi
    assert p.why.startswith("1.07") and p.why.endswith("over baseline, beats noise")


@pytest.mark.parametrize("seed", range(3))
def test_ties_go_to_the_simpler_strategy(seed):
    rng = random.Random(seed)
    fused = synthetic.draw(0.9, 0.02, rng)
    rows = measured(
        synthetic.row("token_split", 2048, samples=shifted(fused, 0.997, rng)),  # faster, inside the noise
        synthetic.row("baseline", 2048, samples=synthetic.draw(1.0, 0.01, rng)),
        synthetic.row("fused_norm", 2048, samples=fused),
    )
    assert rows[0].ms < rows[2].ms
    assert tune.pick(rows).chosen.strategy == "fused_norm"
    assert tune.pick(list(reversed(rows))).chosen.strategy == "fused_norm"


def test_simplicity_order_puts_unknown_names_last():
    builtins = ["flash_agrs", "async_tp", "sp_baseline", "iso", "token_split", "fused_norm", "baseline"]
    assert sorted(builtins, key=tune.simplicity) == builtins[::-1]
    ordered = sorted(["zeta", "flash_agrs", "alpha", "baseline", "iso"], key=tune.simplicity)
    assert ordered == ["baseline", "iso", "flash_agrs", "alpha", "zeta"]


def test_no_comm_is_never_chosen():
    rng = random.Random(7)
    rows = measured(
        synthetic.row("baseline", 1024, samples=synthetic.draw(1.0, 0.01, rng)),
        synthetic.row("no_comm", 1024, {}, samples=synthetic.draw(0.5, 0.01, rng)),
        synthetic.row("fused_norm", 1024, samples=synthetic.draw(0.9, 0.01, rng)),
    )
    assert tune.pick(rows).chosen.strategy == "fused_norm"
    assert tune.pick(rows[:2]).chosen.strategy == "baseline"


def test_the_reference_is_baseline_with_default_knobs():
    rng = random.Random(3)
    default = synthetic.row("baseline", 1024, samples=synthetic.draw(1.0, 0.01, rng))
    few_ctas = synthetic.row("baseline", 1024, {"nccl_max_ctas": 8}, samples=synthetic.draw(0.9, 0.01, rng))
    rows = measured(few_ctas, default)
    assert analysis.reference(rows) is rows[1]
    p = tune.pick(rows)
    assert p.chosen is rows[0] and p.reference is rows[1]  # a knob of baseline can win, beyond noise
    assert "over baseline" in p.why
    only_tuned = measured(few_ctas, synthetic.row("baseline", 1024, {"nccl_max_ctas": 16}, median=1.2))
    assert analysis.reference(only_tuned).knobs == {"nccl_max_ctas": 8}  # no default: the fastest baseline


def test_without_samples_p10_p90_ranges_decide():
    rng = random.Random(11)
    base = synthetic.row("baseline", 1024, samples=synthetic.draw(1.0, 0.02, rng), keep_samples=False)
    near = synthetic.row("fused_norm", 1024, samples=synthetic.draw(0.98, 0.02, rng), keep_samples=False)
    far = synthetic.row("fused_norm", 1024, samples=synthetic.draw(0.85, 0.01, rng), keep_samples=False)
    assert near["samples_ms"] is None and near["p90_ms"] > base["p10_ms"]  # overlapping ranges
    g = tune.gain(*measured(near, base))
    assert g.method == "p10/p90" and not g.beats()
    assert g.lo == pytest.approx(base["p10_ms"] / near["p90_ms"])
    assert tune.pick(measured(base, near)).chosen.strategy == "baseline"
    assert tune.pick(measured(base, far)).chosen.strategy == "fused_norm"


def test_the_interval_is_reproducible():
    rng = random.Random(5)
    a, b = measured(synthetic.row("baseline", 64, samples=synthetic.draw(1.0, 0.03, rng)),
                    synthetic.row("iso", 64, samples=synthetic.draw(0.97, 0.03, rng)))
    assert tune.gain(b, a) == tune.gain(b, a)


def test_no_baseline_means_no_pick():
    assert tune.pick(measured(synthetic.row("token_split", 64), synthetic.row("no_comm", 64, {}))) is None




# -- ranges --------------------------------------------------------------------------------


def fake_pick(tokens: int, strategy: str, knobs: dict | None = None) -> tune.Pick:
    chosen, ref = measured(synthetic.row(strategy, tokens, knobs), synthetic.row("baseline", tokens))
    return tune.Pick(tokens, chosen, ref, None, "synthetic")


def spans_of(choices: dict[int, str]) -> list[tuple[int, int, str]]:
    return [(s.lo, s.hi, s.picks[0].chosen.strategy) for s in tune.merge([fake_pick(t, c) for t, c in choices.items()])]


def test_equal_neighbours_merge_and_boundaries_sit_at_the_geometric_midpoint():
    spans = spans_of({512: "baseline", 256: "baseline", 1024: "token_split", 2048: "token_split", 4096: "baseline"})
    assert spans == [(1, 724, "baseline"), (725, 2896, "token_split"), (2897, 4096, "baseline")]


def test_same_strategy_with_other_knobs_is_another_range():
    picks = [fake_pick(1024, "token_split", {"split_offset": 0}), fake_pick(2048, "token_split", {"split_offset": 256})]
    assert [(s.lo, s.hi) for s in tune.merge(picks)] == [(1, 1448), (1449, 2048)]


def test_a_single_point_covers_one_to_itself():
    assert spans_of({3000: "iso"}) == [(1, 3000, "iso")]


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.integers(1, 1 << 20), st.sampled_from(["baseline", "fused_norm", "iso"]), min_size=1, max_size=12))
def test_ranges_are_sorted_contiguous_and_keep_every_measured_choice(choices):
    spans = spans_of(choices)
    assert spans[0][0] == 1 and spans[-1][1] == max(choices)
    for (lo, hi, _), (next_lo, _, _) in zip(spans, spans[1:]):
        assert lo <= hi and next_lo == hi + 1
    for (_, _, a), (_, _, b) in zip(spans, spans[1:]):
        assert a != b  # equal neighbours would have merged
    for tokens, strategy in choices.items():
        assert [s for lo, hi, s in spans if lo <= tokens <= hi] == [strategy]


@given(st.integers(1, 1 << 24), st.integers(1, 1 << 24))
def test_the_boundary_lies_between_the_two_points(a, b):
    a, b = min(a, b), max(a, b)
    if a < b:
        assert a <= tune.boundary(a, b) < b


# -- the command: stores in, YAML out ------------------------------------------------------


def two_range_store(path, rng):
    rows = []
    for tokens, speed in ((256, 1.0), (1024, 1.0), (4096, 0.92), (16384, 0.93)):
        rows.append(synthetic.row("baseline", tokens, samples=synthetic.draw(tokens / 1000, 0.01, rng)))
        rows.append(synthetic.row("token_split", tokens, {"split_offset": 128},
                                  samples=synthetic.draw(tokens / 1000 * speed, 0.01, rng)))
        rows.append(synthetic.row("no_comm", tokens, {}, samples=synthetic.draw(tokens / 1000 * 0.8, 0.01, rng)))
    return synthetic.write(path, rows)


def test_run_writes_one_valid_yaml_per_group(tmp_path):
    rng = random.Random(1)
    store = two_range_store(tmp_path / "a.jsonl", rng)
    synthetic.append(store, [synthetic.row("baseline", 512, samples=synthetic.draw(0.5, 0.01, rng), model="llama3-70b")])
    written = tune.run([store], tmp_path / "tuned", quiet())
    assert sorted(p.name for p in written) == ["llama3-70b-tp2-nvidia-h200-bf16.yaml", "llama3-8b-tp2-nvidia-h200-bf16.yaml"]
    assert sorted(p.name for p in (tmp_path / "tuned").iterdir()) == sorted(p.name for p in written)  # no temp files left
    cfg = tuned.load(tmp_path / "tuned" / "llama3-8b-tp2-nvidia-h200-bf16.yaml")
    assert [(r.lo, r.hi, r.strategy) for r in cfg.rules] == [(1, 2048, "baseline"), (2049, 16384, "token_split")]
    assert cfg.rules[1].knobs == {"split_offset": 128}
    assert cfg.rules[1].speedup > 1.05 and cfg.rules[0].speedup == 1.0
    assert cfg.rules[1].extra["measured"] == [4096, 16384]
    assert (cfg.device, cfg.world_size, cfg.tp, cfg.model, cfg.dtype) == ("NVIDIA H200", 2, 2, "llama3-8b", "bf16")
    assert cfg.shape["hidden"] == 4096
    assert cfg.extra["provenance"]["sources"] == [str(store)]
    assert cfg.extra["provenance"]["run_ids"] == ["run1"]
    raw = yaml.safe_load((tmp_path / "tuned" / "llama3-8b-tp2-nvidia-h200-bf16.yaml").read_text())
    assert list(raw)[:8] == ["schema", "device", "world_size", "tp", "model", "shape", "dtype", "rules"]
    assert raw["schema"] == "overlapbench/tuned-v1"


def test_run_explains_each_choice(tmp_path):
    console = Console(record=True, width=200)
    tune.run([two_range_store(tmp_path / "a.jsonl", random.Random(2))], tmp_path / "out", console)
    text = console.export_text()
    assert "4096" in text and "over baseline, beats noise" in text and "baseline kept" in text


def test_failed_rows_are_ignored(tmp_path):
    rng = random.Random(4)
    rows = [
        synthetic.row("baseline", 1024, samples=synthetic.draw(1.0, 0.01, rng)),
        synthetic.failed("token_split", 1024),
        synthetic.row("fused_norm", 1024, samples=synthetic.draw(0.5, 0.01, rng), status="failed", error="wrong result"),
        synthetic.row("iso", 1024, status="skipped"),
    ]
    (path,) = tune.run([synthetic.write(tmp_path / "s.jsonl", rows)], tmp_path / "out", quiet())
    assert [r.strategy for r in tuned.load(path).rules] == ["baseline"]


@pytest.mark.parametrize("order", ["failed_then_ok", "ok_then_failed"])
def test_the_last_row_per_point_wins(tmp_path, order):
    rng = random.Random(6)
    fast = synthetic.row("token_split", 1024, samples=synthetic.draw(0.8, 0.01, rng))
    broken = synthetic.failed("token_split", 1024)
    assert fast["key"] == broken["key"]
    rows = [synthetic.row("baseline", 1024, samples=synthetic.draw(1.0, 0.01, rng))]
    rows += [broken, fast] if order == "failed_then_ok" else [fast, broken]
    (path,) = tune.run([synthetic.write(tmp_path / "s.jsonl", rows)], tmp_path / "out", quiet())
    assert tuned.load(path).rules[0].strategy == ("token_split" if order == "failed_then_ok" else "baseline")


def test_a_later_file_overrides_an_earlier_one(tmp_path):
    rng = random.Random(9)
    base = synthetic.row("baseline", 1024, samples=synthetic.draw(1.0, 0.01, rng))
    old = synthetic.write(tmp_path / "old.jsonl", [base, synthetic.row("iso", 1024, samples=synthetic.draw(0.8, 0.01, rng))])
    new = synthetic.write(tmp_path / "new.jsonl", [synthetic.row("iso", 1024, samples=synthetic.draw(1.1, 0.01, rng))])
    (path,) = tune.run([old, new], tmp_path / "out", quiet())
    assert tuned.load(path).rules[0].strategy == "baseline"
    (path,) = tune.run([new, old], tmp_path / "out", quiet())
    assert tuned.load(path).rules[0].strategy == "iso"


def test_a_store_without_ok_layer_rows_is_a_user_error(tmp_path):
    good = two_range_store(tmp_path / "good.jsonl", random.Random(0))
    not_ok = [synthetic.failed("baseline", 1024), synthetic.row("iso", 1024, status="skipped")]
    bad = synthetic.write(tmp_path / "bad.jsonl", not_ok)
    with pytest.raises(UserError, match=r"bad\.jsonl: no ok rows.*1 failed, 1 skipped"):
        tune.run([good, bad], tmp_path / "out", quiet())
    assert not (tmp_path / "out").exists()


def test_token_counts_without_baseline_are_left_out(tmp_path):
    rng = random.Random(8)
    rows = [synthetic.row("baseline", 1024, samples=synthetic.draw(1.0, 0.01, rng)),
            synthetic.row("token_split", 4096, samples=synthetic.draw(3.0, 0.01, rng))]
    console = Console(record=True, width=200)
    (path,) = tune.run([synthetic.write(tmp_path / "s.jsonl", rows)], tmp_path / "out", console)
    assert tuned.load(path).max_tokens == 1024
    assert "no baseline row at 4096" in console.export_text()
    only = synthetic.write(tmp_path / "only.jsonl", rows[1:])
    with pytest.raises(UserError, match="baseline"):
        tune.run([only], tmp_path / "out2", quiet())


def test_groups_that_would_share_a_file_name_get_a_hash():
    a, b = measured(synthetic.row("baseline", 64), synthetic.row("baseline", 64, tp=4))
    c = Measured.of(synthetic.row("baseline", 64) | {"shape": dict(synthetic.row("baseline", 64)["shape"], ffn=1)}, "x")
    names = tune.file_names([a.group, b.group, c.group])
    assert names[b.group] == "llama3-8b-tp4-nvidia-h200-bf16.yaml"
    assert names[a.group] != names[c.group] and names[a.group].startswith("llama3-8b-tp2-nvidia-h200-bf16-")


def test_a_bound_setting_of_a_strategy_is_never_chosen():
    """A split with comm=none is fast and not a correct result: never the best of its strategy."""
    rng = random.Random(7)
    rows = [
        synthetic.row("baseline", 4096, median=1.0, rng=rng),
        synthetic.row("token_split", 4096, {"comm": "none"}, median=0.7, rng=rng) | {"checked": False},
        synthetic.row("token_split", 4096, {"comm": "nccl"}, median=0.99, rng=rng),
    ]
    best = analysis.best_per_strategy(measured(*rows))
    assert best["token_split"].knobs == {"comm": "nccl"}


def test_batches_of_equal_size_are_never_compared_with_each_other():
    """One sequence of 4096 and four of 1024 are different workloads: a strategy measured on
    one is not faster than baseline measured on the other, and they must agree to be chosen."""
    rng = random.Random(11)
    single, several = {"batch": (4096,)}, {"batch": (1024, 1024, 1024, 1024)}
    rows = measured(
        synthetic.row("baseline", 4096, median=1.0, rng=rng, **single),
        synthetic.row("token_split", 4096, median=0.9, rng=rng, **single),
        synthetic.row("baseline", 4096, median=0.5, rng=rng, **several),  # a cheaper workload
        synthetic.row("token_split", 4096, median=0.6, rng=rng, **several),
    )
    choice = tune.pick(rows)
    assert choice.chosen.strategy == "baseline" and "batches disagree" in choice.why
    agreeing = measured(
        synthetic.row("baseline", 4096, median=1.0, rng=rng, **single),
        synthetic.row("token_split", 4096, median=0.9, rng=rng, **single),
        synthetic.row("baseline", 4096, median=0.5, rng=rng, **several),
        synthetic.row("token_split", 4096, median=0.45, rng=rng, **several),
    )
    assert tune.pick(agreeing).chosen.strategy == "token_split"


def drifting(median: float, n: int, rng: random.Random, phi: float = 0.95, cv: float = 0.03) -> list[float]:
    """Per-iteration times whose noise wanders slowly (AR(1)), as unlocked GPU clocks make it."""
    out, x = [], 0.0
    scale = cv * (1 - phi * phi) ** 0.5
    for _ in range(n):
        x = phi * x + rng.gauss(0, scale)
        out.append(median * (1 + x))
    return out


def test_drifting_samples_widen_the_interval():
    """Neighbouring iterations are correlated; the interval must not pretend they are not."""
    rng = random.Random(5)
    base, fast = drifting(1.0, 60, rng), drifting(0.99, 60, rng)
    ordered = tune.gain(*measured(synthetic.row("token_split", 4096, samples=fast),
                                  synthetic.row("baseline", 4096, samples=base)))
    shuffled_fast, shuffled_base = fast[:], base[:]
    rng.shuffle(shuffled_fast), rng.shuffle(shuffled_base)
    independent = tune.gain(*measured(synthetic.row("token_split", 4096, samples=shuffled_fast),
                                      synthetic.row("baseline", 4096, samples=shuffled_base)))
    assert ordered.hi - ordered.lo > 1.5 * (independent.hi - independent.lo)


# -- paired rows: timed interleaved, in the same rounds ------------------------------------


def common_drift(n: int, rng: random.Random, cv: float = 0.03) -> list[float]:
    """What the clock does to every candidate of a round alike: a few percent, round to round."""
    return [1 + rng.gauss(0, cv) for _ in range(n)]


def paired_rows(ratio: float, rng: random.Random, pairing: str | None = "run1/0", n: int = 12, strategy: str = "token_split"):
    """baseline and a challenger `ratio` times its time, per round; the drift is common to both
    in each round, the rest of the noise 0.1%."""
    drift = common_drift(n, rng)
    base = [d * (1 + rng.gauss(0, 0.001)) for d in drift]
    challenger = [d * ratio * (1 + rng.gauss(0, 0.001)) for d in drift]
    return measured(synthetic.row("baseline", 4096, samples=base, pairing=pairing),
                    synthetic.row(strategy, 4096, samples=challenger, pairing=pairing))


@pytest.mark.parametrize("seed", range(4))
def test_paired_rows_decide_on_the_ratio_in_the_same_rounds(seed):
    base, split = paired_rows(0.98, random.Random(seed))
    g = tune.gain(split, base)
    assert g.method == "paired" and g.lo > 1.0 + tune.MIN_GAIN and g.hi - g.lo < 0.01
    assert g.speedup == pytest.approx(1 / 0.98, rel=0.003)
    p = tune.pick([base, split])
    assert p.chosen is split and p.speedup == g.speedup
    # The same numbers without the pairing: the drift between rounds hides the 2%.
    base, split = paired_rows(0.98, random.Random(seed), pairing=None)
    assert tune.gain(split, base).method == "rank-sum" and tune.pick([base, split]).chosen is base


@pytest.mark.parametrize("seed", range(4))
def test_a_gain_beyond_the_noise_but_under_min_gain_keeps_the_simpler_choice(seed):
    base, split = paired_rows(0.995, random.Random(seed))  # 0.5% faster, measured to +-0.1%
    g = tune.gain(split, base)
    assert 1.0 < g.lo and g.hi < 1.0 + tune.MIN_GAIN
    assert tune.pick([base, split]).chosen is base
    assert tune.pick([base, split], min_gain=0.0).chosen is split  # `tune --min-gain 0`: any gain beyond the noise


def test_rows_of_different_pairings_are_not_paired():
    rng = random.Random(9)
    (base, _), (_, split) = paired_rows(0.99, rng, "run1/0"), paired_rows(0.99, rng, "run2/0")
    assert analysis.paired_ratios(base, split) is None and tune.gain(split, base).method == "rank-sum"


def test_a_paired_tie_goes_to_the_simpler_strategy():
    rng = random.Random(4)
    drift = common_drift(12, rng)
    rows = [synthetic.row(s, 4096, samples=[d * f * (1 + rng.gauss(0, 0.001)) for d in drift], pairing="run1/0")
            for s, f in (("baseline", 1.0), ("fused_norm", 0.95), ("token_split", 0.9495))]
    p = tune.pick(measured(*rows))
    assert p.chosen.strategy == "fused_norm" and p.gain.method == "paired"


def test_a_resumed_row_keeps_its_speedup_over_the_reference_timed_beside_it(tmp_path):
    """A resumed sweep re-times baseline beside the lost point but does not write it again: the
    new row's pairing has no baseline row, so its own speedup and interval stand."""
    rng = random.Random(12)
    base, _ = paired_rows(0.99, rng, "run1/0")
    _, split = paired_rows(0.99, rng, "run2/0")
    split_row = synthetic.row("token_split", 4096, samples=list(split.samples), pairing="run2/0")
    split_row |= {"speedup": 1.0101, "speedup_ci": [1.008, 1.012]}
    (split,) = measured(split_row)
    g = tune.gain(split, base)
    assert (g.method, g.speedup, g.lo, g.hi) == ("paired", 1.0101, 1.008, 1.012)
    assert analysis.speedup(split, base) == 1.0101 and analysis.speedup_ci(split, base) == (1.008, 1.012)
    other_file = dataclasses.replace(split, source="other.jsonl")  # report --compare: never this way
    assert tune.gain(other_file, base).method == "rank-sum"


def test_a_knob_setting_within_the_noise_of_the_default_does_not_displace_it():
    """Two runs of the same code must pick the same knobs: a setting that is faster by less than
    the noise loses to the strategy's default setting; one faster beyond the noise wins."""
    from overlapbench import strategies

    defaults = strategies.get("flash_agrs").check_knobs({}, "flash_agrs")
    other = defaults | {"chunks_per_rank": 2}
    for factor, expected in ((0.999, defaults), (0.95, other)):
        rng = random.Random(5)
        drift = common_drift(30, rng)
        noisy = lambda f, rng=rng, drift=drift: [d * f * (1 + rng.gauss(0, 0.01)) for d in drift]
        rows = measured(synthetic.row("baseline", 4096, samples=noisy(1.0), pairing="run1/0"),
                        synthetic.row("flash_agrs", 4096, defaults, samples=noisy(0.9), pairing="run1/0"),
                        synthetic.row("flash_agrs", 4096, other, samples=noisy(0.9 * factor), pairing="run1/0"))
        assert analysis.best_per_strategy(rows)["flash_agrs"].knobs == other  # the fastest median, both times
        assert tune.settled_per_strategy(rows)["flash_agrs"].knobs == expected
        assert tune.pick(rows).chosen.knobs == expected


def test_mixed_compositions_of_equal_size_are_judged_apart():
    """A prefill of 4096 and a prefill of 3840 plus 256 decode tokens are both 4096 tokens but
    different workloads: each composition is judged on its own, and they must agree."""
    rng = random.Random(12)
    prefill, mixed = {}, {"decode": (256, 4096)}
    rows = measured(
        synthetic.row("baseline", 4096, median=1.0, rng=rng, **prefill),
        synthetic.row("token_split", 4096, median=0.9, rng=rng, **prefill),
        synthetic.row("baseline", 4096, median=1.4, rng=rng, **mixed),  # decode attention: costlier
        synthetic.row("token_split", 4096, median=1.5, rng=rng, **mixed),
    )
    assert [key for key in batches.by_batch(rows)] == [((4096,), None, 4), ((3840,), (256, 4096), 4)]  # 4 layers
    choice = tune.pick(rows)
    assert choice.chosen.strategy == "baseline" and "batches disagree" in choice.why
    assert "[3840]+256 decode@4096: baseline" in choice.why
    agreeing = measured(*(synthetic.row(s, 4096, median=m, rng=rng, **where) for s, m, where in (
        ("baseline", 1.0, prefill), ("token_split", 0.9, prefill), ("baseline", 1.4, mixed), ("token_split", 1.2, mixed))))
    assert tune.pick(agreeing).chosen.strategy == "token_split"


def test_old_rows_without_decode_read_as_prefill_only():
    row = synthetic.row("baseline", 2048)
    del row["decode"]
    (m,) = measured(row)
    assert m.decode is None and m.composition == ((2048,), None, 4) and batches.batch_label(m) == "2048"
