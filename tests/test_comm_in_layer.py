"""The in-layer term of `comm --beside-layer` (comm/in_layer.py): each round's paired difference,
the row fields made of them, and the interleaved rounds on a simulated device whose clock drifts,
where the paired term recovers the true extra and two harnesses timed apart do not. Random
inputs; the GPU path (three captured graphs on two ranks) is tests/test_comm_beside_layer_gpu.py."""

from __future__ import annotations

import random
import statistics

import pytest

from overlapbench.comm.in_layer import (
    FIELDS,
    INLINE,
    MIN_ROUNDS,
    OPS,
    PASS,
    SPAN_MS,
    TERM,
    InLayer,
    extra_per_all_reduce,
    time_paired,
)
from overlapbench.timing.interleave import Timed, repetitions
from tests.test_interleave import DriftingDevice, PowerCappedDevice


def _trimmed_mean(values: list[float]) -> float:
    """A tenth cut from each tail (none below 3 values), the rest averaged: written out here."""
    xs = sorted(values)
    cut = int(len(xs) * 0.1) if len(xs) > 2 else 0
    kept = xs[cut:len(xs) - cut]
    return sum(kept) / len(kept)


def _rounds(rng: random.Random, n: int) -> tuple[list[float], list[float], list[float], list[float]]:
    """n rounds of (in line, pass, all-reduces) with a known extra per all-reduce in each."""
    passes = [rng.uniform(1, 40) for _ in range(n)]
    ops = [rng.uniform(0.05, 3) for _ in range(n)]
    extras = [rng.uniform(-0.02, 0.3) for _ in range(n)]
    inline = [p + o + 2 * e for p, o, e in zip(passes, ops, extras)]
    return inline, passes, ops, extras


def test_each_round_gives_in_line_less_the_pass_less_the_all_reduces_per_all_reduce():
    rng = random.Random()
    n = rng.randrange(1, 40)
    inline, passes, ops, extras = _rounds(rng, n)
    found = InLayer(tuple(inline), tuple(passes), tuple(ops), replays=rng.randrange(1, 30), graphs=rng.random() < 0.5)
    assert found.extras() == pytest.approx(extras)
    i = rng.randrange(n)
    assert extra_per_all_reduce(inline[i], passes[i], ops[i]) == pytest.approx(extras[i])
    fields = found.fields()
    assert set(fields) == set(FIELDS)
    assert fields[TERM] == pytest.approx(_trimmed_mean(extras))
    assert fields["in_layer_extra_samples_ms"] == pytest.approx(extras, abs=1e-6)
    lo, hi = fields["in_layer_extra_ci_ms"]
    assert lo <= fields[TERM] <= hi and (n < 3 or lo < hi)
    assert fields["in_layer_inline_ms"] == statistics.median(inline)
    assert fields["in_layer_pass_ms"] == statistics.median(passes)
    assert fields["in_layer_ops_ms"] == statistics.median(ops)
    assert (fields["in_layer_rounds"], fields["in_layer_replays"], fields["in_layer_graphs"]) == (
        n, found.replays, found.graphs)


def test_a_stray_round_does_not_move_the_term_as_it_moves_a_mean():
    rng = random.Random()
    inline, passes, ops, extras = _rounds(rng, 20)
    inline[rng.randrange(20)] += 50.0  # one round with a hiccup of 50 ms
    term = InLayer(tuple(inline), tuple(passes), tuple(ops), 1, True).fields()[TERM]
    assert min(extras) <= term <= max(extras)
    assert statistics.fmean(InLayer(tuple(inline), tuple(passes), tuple(ops), 1, True).extras()) > max(extras) + 1


def test_rounds_are_paired_by_their_ids_and_only_those_all_three_took_part_in():
    rng = random.Random()
    ids = sorted(rng.sample(range(100), 12))
    inline, passes, ops, extras = _rounds(rng, 12)
    dropped = rng.sample(range(12), 3)  # rounds missing from one graph's samples each
    timed = []
    for which, values in ((INLINE, inline), (PASS, passes), (OPS, ops)):
        keep = [k for k in range(12) if k != dropped[which]]
        rng.shuffle(keep)  # out of order: pairing goes by id
        timed.append(Timed([values[k] for k in keep], [ids[k] for k in keep], len(keep)))
    found = InLayer.from_rounds(timed, replays=3, graphs=True)
    common = [k for k in range(12) if k not in dropped]
    assert found.extras() == pytest.approx([extras[k] for k in common])
    assert found.pass_ms == tuple(passes[k] for k in common)


@pytest.mark.parametrize("lengths", [(0, 0, 0), (3, 2, 3), (4, 4, 5)])
def test_rounds_of_unequal_counts_or_none_are_refused(lengths):
    rng = random.Random()
    inline, passes, ops = ([rng.uniform(1, 2) for _ in range(n)] for n in lengths)
    with pytest.raises(ValueError, match="in-layer rounds"):
        InLayer(tuple(inline), tuple(passes), tuple(ops), 1, True)


def _graphs(device: DriftingDevice, pass_ms: float, ops_ms: float, extra_ms: float):
    return [device.candidate("inline", pass_ms + ops_ms + 2 * extra_ms), device.candidate("pass", pass_ms),
            device.candidate("ops", ops_ms)]


def _two_harnesses(device: DriftingDevice, pass_ms: float, ops_ms: float, extra_ms: float, seconds: float) -> float:
    """The term as two harnesses take it: the pass timed for `seconds`, then the in-line pass for
    as long (the all-reduces' time known exactly)."""
    inline, one_pass, _ = _graphs(device, pass_ms, ops_ms, extra_ms)
    per = []
    for run in (one_pass, inline):
        n = max(1, int(seconds * 1e3 / pass_ms))
        start = device.mark()
        for _ in range(n):
            run()
        per.append(device.elapsed_ms(start, device.mark()) / n)
    return extra_per_all_reduce(per[1], per[0], ops_ms)


@pytest.mark.parametrize("drift", [0.05, -0.05])
def test_paired_rounds_recover_the_extra_on_a_drifting_device_where_two_harnesses_do_not(drift):
    """The clock slows (or speeds up) with the device's own time, by 5% a second: timed one after
    the other, the pass and the in-line pass meet different clocks, and their difference holds a
    share of the pass; in the same rounds, they meet the same clock."""
    rng = random.Random()
    pass_ms, ops_ms, extra_ms = rng.uniform(5, 12), rng.uniform(0.2, 1.0), rng.uniform(0.02, 0.1)
    apart = _two_harnesses(DriftingDevice(drift, noise=0.001, seed=rng.randrange(1000)), pass_ms, ops_ms, extra_ms, 1.0)
    assert abs(apart - extra_ms) > 0.1  # the drift over a second, times half the pass

    device = DriftingDevice(drift, noise=0.001, seed=rng.randrange(1000))
    iters = rng.randrange(MIN_ROUNDS, 25)
    per_replay = pass_ms + ops_ms + 2 * extra_ms
    found = time_paired(_graphs(device, pass_ms, ops_ms, extra_ms), per_replay, iters, device)
    fields = found.fields()
    assert fields["in_layer_rounds"] == iters and fields["in_layer_replays"] == repetitions(SPAN_MS, per_replay)
    assert fields[TERM] == pytest.approx(extra_ms, abs=0.03)
    runs = [name for kind, name in device.log if kind == "run"]
    assert runs.count("inline") == runs.count("pass") == runs.count("ops")  # as many replays of each


def test_fewer_iters_than_the_minimum_still_time_the_minimum_rounds():
    rng = random.Random()
    device = DriftingDevice(0.0, noise=0.001, seed=rng.randrange(1000))
    found = time_paired(_graphs(device, 2.0, 0.3, 0.05), 2.4, rng.randrange(1, MIN_ROUNDS), device)
    assert len(found.extras()) == MIN_ROUNDS


def test_settled_rounds_give_the_in_line_pass_its_own_clock_where_shared_ones_do_not():
    """At a power cap the in-line pass, whose SMs idle through its all-reduces (a draw below the
    cap), runs its compute faster than the pass does back to back: at their own clocks its extra is
    below zero. In 2 ms spans with no settling the three graphs share one clock and the extra reads
    what the all-reduces cost at that clock; each graph settled for 10x the clock's time constant
    (counted in its own replays), each is timed at its own and the extra is the one they show alone."""
    rng = random.Random()
    tau, boost = rng.uniform(20.0, 60.0), rng.uniform(0.8, 1.2)
    pass_ms, ops_ms, extra_ms = rng.uniform(4, 8), rng.uniform(0.5, 1.5), rng.uniform(0.02, 0.08)
    inline_ms = pass_ms + ops_ms + 2 * extra_ms
    power = {"inline": 0.8, "pass": 1.0, "ops": 0.3}
    model = PowerCappedDevice(tau, boost, seed=0)
    own = extra_per_all_reduce(model.own_clock_ms(inline_ms, power["inline"]), model.own_clock_ms(pass_ms, power["pass"]),
                               model.own_clock_ms(ops_ms, power["ops"]))
    assert own < 0, "at their own clocks the in-line pass gains more than its all-reduces cost"

    def term(settle_ms: float) -> float:
        device = PowerCappedDevice(tau, boost, seed=rng.randrange(1 << 30))
        graphs = [device.candidate(n, ms, power[n]) for n, ms in (("inline", inline_ms), ("pass", pass_ms), ("ops", ops_ms))]
        return time_paired(graphs, inline_ms, 12, device, span_ms=2.0, settle_ms=settle_ms,
                           own_replay_ms=[inline_ms, pass_ms, ops_ms]).fields()[TERM]

    assert term(settle_ms=10 * tau) == pytest.approx(own, abs=0.002 * pass_ms)
    assert term(settle_ms=0.0) > 0 > own  # shared: the extra reads as a cost

