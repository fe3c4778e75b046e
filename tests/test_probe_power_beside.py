"""tests/probes/power_beside.py's parts that need no GPU: the conditions and flags it accepts, the
rounds' orders, which units and clock samples a window counts, the pairing of each round's
conditions with the GEMMs alone, and the host loop that keeps its lanes fed (on a simulated
device whose units take a known time)."""

from __future__ import annotations

import json
import random
import statistics
import time

import pytest

from tests.probes import power_beside as pb
from tests.probes.clock_sampler import POWER_CAP, ClockSampler, window_means


def test_conditions_are_taken_in_the_order_named_and_need_the_gemms_alone(rng):
    names = list(pb.CONDITIONS)
    for _ in range(20):
        chosen = rng.sample(names, rng.randint(1, len(names)))
        needs_base = any(pb.CONDITIONS[n].gemm for n in chosen) and pb.BASE not in chosen
        if needs_base:
            with pytest.raises(ValueError, match="--conditions: .*'gemm'"):
                pb.parse_conditions(",".join(chosen))
            chosen.append(pb.BASE)
        assert [c.name for c in pb.parse_conditions(" , ".join(chosen))] == chosen
    bogus = "".join(rng.choices("xyzq", k=6))
    with pytest.raises(ValueError, match=f"unknown '{bogus}'; choose from gemm"):
        pb.parse_conditions(f"gemm,{bogus}")
    with pytest.raises(ValueError, match="twice"):
        pb.parse_conditions("gemm,local,gemm")
    with pytest.raises(ValueError, match="empty list"):
        pb.parse_conditions(" , ")
    assert [c.name for c in pb.parse_conditions("peer_push,local")] == ["peer_push", "local"]  # no GEMMs: no pairing
    assert {c.copies for c in pb.CONDITIONS.values()} == {None, *pb.COPIES}
    assert [c.name for c in pb.parse_conditions(pb.DEFAULT_CONDITIONS)][0] == pb.BASE


def test_shapes_round_trip_and_bad_ones_name_the_flag(rng):
    shapes = [tuple(rng.randint(1, 40000) for _ in range(3)) for _ in range(rng.randint(1, 4))]
    assert pb.parse_shapes(";".join(",".join(map(str, s)) for s in shapes)) == shapes
    for bad in ("1,2", "1,2,x", "0,4,4", "", "1,2,3,4", "4,4,-4"):
        with pytest.raises(ValueError, match="--shapes"):
            pb.parse_shapes(bad)


def test_each_round_runs_every_condition_once_in_a_fresh_order(rng):
    names = [f"c{i}" for i in range(rng.randint(4, 7))]
    seed = rng.randrange(2**32)
    orders = pb.round_orders(names, 10, random.Random(seed))
    assert len(orders) == 10 and all(sorted(o) == sorted(names) for o in orders)
    assert len({tuple(o) for o in orders}) > 1  # 10 identical shuffles of 4+ names: odds below 1e-13
    assert pb.round_orders(names, 10, random.Random(seed)) == orders  # --seed repeats a run's orders
    assert names == [f"c{i}" for i in range(len(names))]  # the caller's list is left as it was


def test_a_window_counts_the_units_completed_inside_it(rng):
    for _ in range(50):
        seen = sorted(rng.uniform(0, 10) for _ in range(rng.randint(0, 30)))
        t0 = rng.uniform(-1, 10)
        t1 = t0 + rng.uniform(0, 5)
        inside = [i for i, t in enumerate(seen) if t0 <= t <= t1]
        got = pb.span_in_window(seen, t0, t1)
        assert got == ((inside[0], inside[-1]) if len(inside) >= 2 else None)
        if got:
            assert all(t0 <= seen[i] <= t1 for i in got) and (got[0] == 0 or seen[got[0] - 1] < t0)


def test_clock_samples_are_attributed_to_a_window_by_their_time(rng):
    samples = []
    t = 0.0
    for _ in range(rng.randint(200, 400)):
        t += rng.uniform(0.003, 0.007)
        reasons = rng.choice([None, 0, POWER_CAP, POWER_CAP | 0x1, 0x20])
        samples.append((t, rng.uniform(1200, 1980), rng.uniform(300, 700), reasons))
    t0, t1 = rng.uniform(0, t / 2), rng.uniform(t / 2, t)
    inside = [s for s in samples if t0 <= s[0] <= t1]
    got = window_means(samples, t0, t1)
    assert got["samples"] == len(inside)
    assert got["sm_mhz"] == pytest.approx(statistics.fmean(s[1] for s in inside))
    assert got["sm_mhz_min"] == min(s[1] for s in inside)
    assert got["power_w"] == pytest.approx(statistics.fmean(s[2] for s in inside))
    said = [s[3] for s in inside if s[3] is not None]
    assert got["power_capped"] == pytest.approx(sum(r & POWER_CAP > 0 for r in said) / len(said))
    assert window_means(samples, t + 1, t + 2) == {"sm_mhz": None, "sm_mhz_min": None, "power_w": None,
                                                   "power_capped": None, "samples": 0}
    assert window_means([(1.0, 1500.0, 400.0, None)], 0, 2)["power_capped"] is None  # no reasons given


def _rounds_on_a_drifting_card(rng, truth: dict[str, float], count: int, skip: tuple = ()) -> list[dict]:
    """Per round, each condition's window on a card whose speed and clock drift from round to
    round: the same factor for every condition of a round, a little noise on each."""
    rounds = []
    for r in range(count):
        drift = rng.uniform(0.8, 1.2)
        rounds.append({name: {"gemm_tflops": 680 * drift * (1 + ratio) * rng.uniform(0.9995, 1.0005),
                              "sm_mhz": 1700 * drift * (1 + ratio / 2), "power_w": rng.uniform(600, 700),
                              "peer_power_w": rng.uniform(100, 200), "power_capped": 1.0, "copy_gbps": None,
                              "starved": {} if rng.random() < 0.8 else {"gemm": 1}}
                       for name, ratio in truth.items() if (r, name) not in skip})
    return rounds


def test_pairing_by_round_cancels_the_cards_drift(rng):
    truth = {pb.BASE: 0.0, "gemm+peer_pull": -rng.uniform(0.005, 0.04), "gemm+local": -rng.uniform(0.0, 0.02)}
    rounds = _rounds_on_a_drifting_card(rng, truth, 8, skip={(3, "gemm+local")})
    rows = {r["condition"]: r for r in pb.summarize(rounds, list(truth))}
    for name, ratio in truth.items():
        tflops = [r[name]["gemm_tflops"] for r in rounds if name in r]
        assert rows[name]["rounds"] == len(tflops)
        assert rows[name]["gemm_tflops"]["median"] == statistics.median(tflops)
        assert rows[name]["gemm_tflops"]["min"] == min(tflops) and rows[name]["gemm_tflops"]["max"] == max(tflops)
        assert rows[name]["starved_windows"] == sum(1 for r in rounds if name in r and r[name]["starved"])
        if name == pb.BASE:
            assert "gemm_tflops_vs_alone" not in rows[name]
            continue
        vs = rows[name]["gemm_tflops_vs_alone"]
        assert len(vs["rounds"]) == len(tflops)  # the round that lacks it is skipped, not paired across rounds
        assert vs["median"] == pytest.approx(ratio, abs=2e-3)  # the drift (up to 40%) cancels
        assert rows[name]["sm_mhz_vs_alone"]["median"] == pytest.approx(ratio / 2, abs=1e-9)
        assert vs["min"] <= vs["median"] <= vs["max"]


def test_paired_ratios_skip_rounds_without_both(rng):
    a, b = rng.uniform(1, 2), rng.uniform(1, 2)
    rounds = [{"gemm": {"x": a}, "c": {"x": b}}, {"c": {"x": b}}, {"gemm": {"x": a}}, {"gemm": {"x": None}, "c": {"x": b}}]
    assert pb.paired_ratios(rounds, "c", "x") == [pytest.approx(b / a)]


def test_the_table_has_a_line_per_condition_with_its_paired_change(rng):
    truth = {pb.BASE: 0.0, "gemm+peer_push": -rng.uniform(0.01, 0.05)}
    rounds = _rounds_on_a_drifting_card(rng, truth, 5)
    for r in rounds:
        r["peer_push"] = {"copy_gbps": rng.uniform(300, 400), "sm_mhz": 1980.0, "power_w": 200.0}
    rows = pb.summarize(rounds, [*truth, "peer_push"])
    lines = pb.table(rows)
    assert len(lines) == 4 and lines[0].startswith("condition")
    push = next(line for line in lines if line.startswith("gemm+peer_push "))
    assert f"{rows[1]['gemm_tflops_vs_alone']['median']:+.2%}" in push
    alone = next(line for line in lines if line.startswith("peer_push "))
    assert f"{statistics.median(r['peer_push']['copy_gbps'] for r in rounds):.0f}" in alone
    json.dumps(rows)  # the rows go to JSON lines as they are


class SimulatedDevice:
    """Units that run one after another on each stream, `unit_s` each, from when they are queued
    or the stream's last unit ends; an event completes when the host's clock passes its unit."""

    def __init__(self, unit_s: dict[str, float]) -> None:
        self.unit_s, self.end = unit_s, dict.fromkeys(unit_s, 0.0)

    def enqueue(self, stream: str):
        def run() -> None:
            self.end[stream] = max(self.end[stream], time.perf_counter()) + self.unit_s[stream]
        return run

    def mark(self, stream: str):
        device_end = self.end[stream]

        class Event:
            end = device_end

            def query(self) -> bool:
                return time.perf_counter() >= self.end

            def synchronize(self) -> None:
                time.sleep(max(0.0, self.end - time.perf_counter()))

            def elapsed_time(self, other) -> float:
                return (other.end - self.end) * 1e3

        return Event()


def test_the_host_loop_keeps_its_lanes_fed_and_times_their_units(rng):
    unit = {"gemm": rng.uniform(0.004, 0.006), "local": rng.uniform(0.001, 0.002)}
    work = {"gemm": rng.uniform(1e12, 1e13), "local": rng.uniform(1e8, 1e9)}
    device = SimulatedDevice(unit)
    lanes = [pb.Lane(name, device.enqueue(name), name, work[name], depth=10) for name in unit]
    t0, t1 = pb.hold(lanes, 0.05, 0.3, mark=device.mark)
    assert t1 - t0 == pytest.approx(0.3)
    for lane in lanes:
        assert lane.seen == sorted(lane.seen) and len(lane.events) == len(lane.seen)
        rate, span = pb.lane_rate(lane, t0, t1)
        assert lane.starved == 0, "10 units queued on a 2-core host: the lane never ran dry"
        assert rate == pytest.approx(work[lane.name] / unit[lane.name], rel=1e-6)  # back to back
        assert t0 <= span[0] < span[1] <= t1
        assert (span[1] - span[0]) == pytest.approx(0.3, abs=0.05)


def test_a_lane_that_runs_dry_is_counted(rng):
    device = SimulatedDevice({"local": rng.uniform(0.002, 0.004)})
    lane = pb.Lane("local", device.enqueue("local"), "local", 1.0, depth=1)
    pb.hold([lane], 0.0, 0.1, mark=device.mark)
    assert lane.starved >= len(lane.events) - 1 > 0  # one unit queued: each completion leaves it empty


def test_a_collective_lane_queues_what_even_asks_before_the_wait(rng):
    """Each rank's loop stops after its own count; `even` hears that count and its extra units
    are queued and waited for, so every rank can end with as many collectives queued."""
    device = SimulatedDevice({"ar": rng.uniform(0.002, 0.004)})
    lane = pb.Lane("ar", device.enqueue("ar"), "ar", 1.0, depth=3)
    heard, extra = [], rng.randint(1, 5)

    def even(it: pb.Lane) -> int:
        heard.append(it.enqueued)
        return extra

    pb.hold([lane], 0.0, 0.05, mark=device.mark, even=even)
    assert heard and heard[0] >= lane.depth, "even heard the loop's count"
    assert lane.enqueued == heard[0] + extra
    assert time.perf_counter() >= device.end["ar"], "the extra units were waited for"


def test_bad_flags_end_in_one_line_and_write_nothing(tmp_path, capsys):
    cases = [(["--conditions", "gemm,nope"], "--conditions: unknown 'nope'"),
             (["--conditions", "gemm+local"], "--conditions: the GEMM conditions are paired with 'gemm'"),
             (["--shapes", "8,8"], "--shapes: '8,8'"), (["--rounds", "0"], "--rounds: 0 is below 1"),
             (["--measure-s", "0"], "--measure-s: 0.0 is not above 0"), (["--settle-s", "-1"], "--settle-s: -1.0 is negative")]
    for flags, message in cases:
        with pytest.raises(SystemExit) as stop:
            pb.main(["--out", str(tmp_path / "out"), *flags])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"power_beside: {message}") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_the_sampler_without_a_gpu_says_why_and_takes_nothing():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the sampler samples")
    sampler = ClockSampler(0).start()
    time.sleep(0.02)
    sampler.stop()
    assert sampler.samples == [] and sampler.error
    assert sampler.between(0, time.perf_counter())["samples"] == 0
    assert sampler.power_limit_w() is None
