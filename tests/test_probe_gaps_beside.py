"""tests/probes/gaps_beside.py's parts that need no GPU: the pass's GEMMs and the flags it accepts,
the gap's length for a gap fraction, what a window's passes say (the GEMMs timed without the gaps),
the pairing of each round's gap fractions with the passes back to back, and the host loop feeding
passes and gaps (on a simulated device whose passes and gaps take a known time)."""

from __future__ import annotations

import json
import statistics
import time

import pytest

from tests.probes import gaps_beside as gb
from tests.probes.clock_sampler import window_means
from tests.probes.power_beside import Lane, hold


def test_the_default_pass_is_one_rank_of_the_llama3_70b_tp4_layer(rng):
    tokens = rng.randint(1, 40000)
    got = gb.parse_shapes(gb.DEFAULT_SHAPES, tokens)
    assert [(g.name, g.mkn) for g in got] == [("qkv", (tokens, 8192, 2560)), ("attn_out", (tokens, 2048, 8192)),
                                              ("gate_up", (tokens, 8192, 14336)), ("down", (tokens, 7168, 8192))]
    assert sum(g.flops for g in got) == 2 * tokens * 8192 * (2560 + 2048 + 14336 + 7168)


def test_shapes_by_name_or_mkn_and_bad_ones_name_the_flag(rng):
    tokens = rng.randint(1, 40000)
    named = gb.layer_gemms(tokens)
    for _ in range(20):
        parts, want = [], []
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.5:
                names = rng.choices(list(named), k=rng.randint(1, 3))
                parts.append(" , ".join(names))
                want += [named[n].mkn for n in names]
            else:
                mkn = tuple(rng.randint(1, 40000) for _ in range(3))
                parts.append(",".join(map(str, mkn)))
                want.append(mkn)
        assert [g.mkn for g in gb.parse_shapes(";".join(parts), tokens)] == want
    bogus = "".join(rng.choices("xyzq", k=6))
    with pytest.raises(ValueError, match=f"--shapes: unknown '{bogus}'; choose from qkv, attn_out, gate_up, down"):
        gb.parse_shapes(f"qkv,{bogus}", tokens)
    for bad in ("1,2", "0,4,4", "4,4,-4", "1,2,3,4"):
        with pytest.raises(ValueError, match=f"--shapes: '{bad}' is not 'm,k,n' of positive integers"):
            gb.parse_shapes(bad, tokens)
    for bad in ("", " ; ", ","):
        with pytest.raises(ValueError, match="names no GEMM"):
            gb.parse_shapes(bad, tokens)


def test_gap_fractions_are_taken_in_the_order_named_with_back_to_back_among_them(rng):
    for _ in range(20):
        gaps = [0.0] + [round(rng.uniform(0.01, 0.99), 3) for _ in range(rng.randint(0, 5))]
        gaps = list(dict.fromkeys(gaps))
        rng.shuffle(gaps)
        assert gb.parse_gaps(" , ".join(map(str, gaps))) == gaps
    for bad in ("1.5", "1", "-0.1", "0,1"):
        with pytest.raises(ValueError, match=r"--gaps: .* outside \[0, 1\)"):
            gb.parse_gaps(bad)
    with pytest.raises(ValueError, match="--gaps: .* twice"):
        gb.parse_gaps("0,0.2,0.20")
    with pytest.raises(ValueError, match="--gaps: .* lacks 0"):
        gb.parse_gaps(f"{rng.uniform(0.01, 0.9):.3f},0.5")
    for bad in ("0,x", "", " , "):
        with pytest.raises(ValueError, match="--gaps: "):
            gb.parse_gaps(bad)


def test_a_gap_is_the_share_g_of_the_period(rng):
    for _ in range(100):
        g, pass_ms, per_ms = rng.uniform(0.001, 0.95), rng.uniform(0.1, 50), rng.uniform(1e5, 3e6)
        gap = gb.gap_ms(g, pass_ms)
        assert gap / (pass_ms + gap) == pytest.approx(g, rel=1e-12)
        assert gap == pytest.approx(g / (1 - g) * pass_ms, rel=1e-12)
        assert gb.gap_cycles(g, pass_ms, per_ms) == round(gap * per_ms)
        assert gb.gap_cycles(0.0, pass_ms, per_ms) == 0 and gb.gap_ms(0.0, pass_ms) == 0
    assert gb.gap_ms(0.2, 10.0) == pytest.approx(2.5) and gb.gap_ms(0.5, 4.0) == pytest.approx(4.0)


class Event:
    """A CUDA event's stand-in at device time `t` (s): completes when the host's clock passes it."""

    def __init__(self, t: float) -> None:
        self.t = t

    def query(self) -> bool:
        return time.perf_counter() >= self.t

    def synchronize(self) -> None:
        time.sleep(max(0.0, self.t - time.perf_counter()))

    def elapsed_time(self, other: Event) -> float:
        return (other.t - self.t) * 1e3


def _fabricated_lane(rng) -> tuple[Lane, list[tuple], list[tuple[float, float, float]]]:
    """A lane of completed passes, each (GEMM s, gap s, idle s before it), at device times from 0."""
    lane, spans, units, t = Lane("gap", lambda: None, None, 0.0), [], [], 0.0
    for _ in range(rng.randint(5, 40)):
        unit = (rng.uniform(0.008, 0.012), rng.uniform(0.0, 0.005), rng.choice([0.0, 0.0, 0.0, rng.uniform(0, 0.003)]))
        start = t + unit[2]
        spans.append((Event(start), Event(start + unit[0])))
        t = start + unit[0] + unit[1]
        lane.events.append(Event(t))
        lane.seen.append(t + rng.uniform(0, 2e-4))
        units.append(unit)
    return lane, spans, units


def test_a_window_times_the_gemms_of_the_passes_completed_inside_it_not_the_gaps(rng):
    for _ in range(30):
        lane, spans, units = _fabricated_lane(rng)
        flops = rng.uniform(1e12, 1e13)
        t0 = rng.uniform(-0.05, lane.seen[-1] / 2)
        t1 = t0 + rng.uniform(0.03, lane.seen[-1])
        inside = [i for i, t in enumerate(lane.seen) if t0 <= t <= t1]
        got = gb.gemm_window(lane, spans, t0, t1, flops)
        if len(inside) < 2:
            assert set(got.values()) == {None}
            continue
        i, j = inside[0], inside[-1]
        timed = units[i + 1:j + 1]  # those that ran after the first one seen inside
        gemm_s = sum(u[0] for u in timed)
        assert got["passes"] == j - i == len(timed)
        assert got["gemm_tflops"] == pytest.approx(len(timed) * flops / gemm_s / 1e12, rel=1e-9)
        assert got["pass_ms"] == pytest.approx(gemm_s / len(timed) * 1e3, rel=1e-9)
        assert got["gap_ms"] == pytest.approx(statistics.fmean(u[1] for u in timed) * 1e3, rel=1e-6, abs=1e-9)
        period_s = sum(sum(u) for u in timed)  # the idle before a pass (host starved) counts as gap
        assert got["period_ms"] == pytest.approx(period_s / len(timed) * 1e3, rel=1e-9)
        assert got["gap_share"] == pytest.approx(1 - gemm_s / period_s, rel=1e-6, abs=1e-9)
        assert got["host_span"] == (lane.seen[i], lane.seen[j])


def test_a_windows_clock_and_power_come_from_the_samples_over_its_passes(rng):
    lane, spans, _ = _fabricated_lane(rng)
    lane.starved = rng.randint(0, 3)
    samples = [(t, rng.uniform(1300, 1980), rng.uniform(300, 700), rng.choice([None, 0, 0x4]))
               for t in sorted(rng.uniform(-0.1, lane.seen[-1] + 0.1) for _ in range(300))]
    t0, t1 = -1.0, lane.seen[-1] + 1.0
    row = gb.window_row(0.2, lane, spans, t0, t1, samples, 1e12)
    want = window_means(samples, lane.seen[0], lane.seen[-1])  # the passes' span, not the window's
    assert row["kind"] == "window" and row["gap"] == 0.2 and "host_span" not in row
    assert (row["sm_mhz"], row["power_w"], row["samples"]) == (want["sm_mhz"], want["power_w"], want["samples"])
    assert row["units"] == len(lane.events) and row["starved"] == lane.starved
    empty = gb.window_row(0.2, lane, spans, t1, t1 + 1, samples, 1e12)
    assert empty["gemm_tflops"] is None and empty["samples"] == 0
    json.dumps(row)


def _rounds_on_a_drifting_card(rng, truth: dict[float, float], count: int, skip: tuple = ()) -> list[dict]:
    """Per round, each gap fraction's window on a card whose speed, clock and power drift from round
    to round: the same factor for every gap fraction of a round, a little noise on each."""
    rounds = []
    for r in range(count):
        drift = rng.uniform(0.8, 1.2)
        rounds.append({g: {"gemm_tflops": 650 * drift * (1 + gain) * rng.uniform(0.9995, 1.0005),
                           "pass_ms": rng.uniform(9, 11), "gap_share": g * rng.uniform(0.9, 1.1),
                           "sm_mhz": 1420 * drift * (1 + gain / 2), "power_w": 690 * drift * (1 - gain),
                           "power_capped": rng.uniform(0.1, 1.0), "starved": 0 if rng.random() < 0.8 else rng.randint(1, 9)}
                       for g, gain in truth.items() if (r, g) not in skip})
    return rounds


def test_each_gap_is_paired_with_back_to_back_in_its_round_so_the_drift_cancels(rng):
    truth = {0.0: 0.0, 0.1: rng.uniform(0.002, 0.02), 0.3: rng.uniform(0.02, 0.06), 0.2: rng.uniform(-0.01, 0.03)}
    count = rng.randint(4, 9)
    rounds = _rounds_on_a_drifting_card(rng, truth, count, skip={(1, 0.2), (2, 0.0)})
    rows = {r["gap"]: r for r in gb.summarize(rounds, list(truth))}
    assert list(rows) == list(truth)
    for g, gain in truth.items():
        mine = [r[g] for r in rounds if g in r]
        row = rows[g]
        assert row["kind"] == "condition" and row["rounds"] == len(mine)
        for key in ("gemm_tflops", "pass_ms", "gap_share", "sm_mhz", "power_w", "power_capped"):
            xs = [w[key] for w in mine]
            assert row[key]["median"] == statistics.median(xs) and (row[key]["min"], row[key]["max"]) == (min(xs), max(xs))
        assert row["starved_windows"] == sum(1 for w in mine if w["starved"])
        if g == gb.BASE:
            assert not any(k.endswith("_vs_back_to_back") for k in row)
            continue
        both = [r for r in rounds if g in r and gb.BASE in r]
        vs = row["gemm_tflops_vs_back_to_back"]
        assert vs["rounds"] == pytest.approx([r[g]["gemm_tflops"] / r[gb.BASE]["gemm_tflops"] for r in both])
        assert len(vs["rounds"]) == len(both) < count  # rounds lacking either are skipped, not paired across rounds
        assert vs["median"] == pytest.approx(gain, abs=2e-3)  # the drift (up to 40%) cancels
        assert vs["min"] <= vs["median"] <= vs["max"]
        assert row["sm_mhz_vs_back_to_back"]["median"] == pytest.approx(gain / 2, abs=1e-9)
        assert row["power_w_vs_back_to_back"]["median"] == pytest.approx(-gain, abs=1e-9)
    json.dumps(list(rows.values()))  # the rows go to JSON lines as they are


def test_the_table_has_a_line_per_gap_with_its_paired_change(rng):
    truth = {0.0: 0.0, 0.1: rng.uniform(0.005, 0.03), 0.25: rng.uniform(0.01, 0.06)}
    rows = gb.summarize(_rounds_on_a_drifting_card(rng, truth, 5), list(truth))
    lines = gb.table(rows)
    assert len(lines) == 1 + len(truth) and "GEMM TFLOP/s" in lines[0] and "vs back to back" in lines[0]
    for line, row in zip(lines[1:], rows):
        assert line.split()[0] == f"{row['gap']:.2f}"
        assert f"{row['gemm_tflops']['median']:.1f}" in line and f"{row['sm_mhz']['median']:.0f}" in line
        if row["gap"]:
            vs = row["gemm_tflops_vs_back_to_back"]
            assert f"{vs['median']:+.2%}" in line and f"[{vs['min']:+.2%}, {vs['max']:+.2%}]" in line


class SimulatedDevice:
    """One stream: a pass takes `pass_s`, the _sleep after it `gap_s`, from when it is queued or the
    stream's last work ends; the events around the pass and after the gap at those times."""

    def __init__(self, pass_s: float, gap_s: float) -> None:
        self.pass_s, self.gap_s, self.end, self.spans = pass_s, gap_s, 0.0, []

    def enqueue(self) -> None:
        start = max(self.end, time.perf_counter())
        self.spans.append((Event(start), Event(start + self.pass_s)))
        self.end = start + self.pass_s + self.gap_s

    def mark(self, stream) -> Event:
        return Event(self.end)


def test_the_host_loop_keeps_passes_and_gaps_queued_and_times_the_passes_alone(rng):
    g, pass_s = rng.choice([0.0, 0.1, 0.2, 0.3]), rng.uniform(0.004, 0.006)
    device = SimulatedDevice(pass_s, gb.gap_ms(g, pass_s * 1e3) / 1e3)
    flops = rng.uniform(1e12, 1e13)
    lane = Lane("gap", device.enqueue, None, flops, depth=10)
    t0, t1 = hold([lane], 0.05, 0.3, mark=device.mark)
    got = gb.gemm_window(lane, device.spans, t0, t1, flops)
    assert lane.starved == 0, "10 passes queued on a 2-core host: the stream never ran dry"
    assert got["gemm_tflops"] == pytest.approx(flops / pass_s / 1e12, rel=1e-6)  # the gaps not counted
    assert got["gap_share"] == pytest.approx(g, abs=1e-6)
    assert got["passes"] * pass_s / (1 - g) == pytest.approx(0.3, abs=0.05)


def test_bad_flags_end_in_one_line_and_write_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OUT", raising=False)
    out = ["--out", str(tmp_path / "out")]
    cases = [([*out, "--gaps", "1.5"], "--gaps: 1.5 outside [0, 1)"), ([*out, "--gaps", "0,-0.2"], "--gaps: -0.2 outside"),
             (["--gaps", "1.5"], "--gaps: 1.5 outside [0, 1)"), ([*out, "--gaps", "0.1,0.2"], "--gaps: '0.1,0.2' lacks 0"),
             ([*out, "--shapes", "qkv,nope"], "--shapes: unknown 'nope'"), ([*out, "--shapes", "8,8"], "--shapes: '8,8'"),
             ([*out, "--rounds", "0"], "--rounds: 0 is below 1"), ([*out, "--tokens", "-3"], "--tokens: -3 is below 1"),
             ([*out, "--measure-s", "0"], "--measure-s: 0.0 is not above 0"),
             ([*out, "--settle-s", "-1"], "--settle-s: -1.0 is negative"),
             ([*out, "--warmup-s", "-0.5"], "--warmup-s: -0.5 is negative"),
             ([*out, "--ahead-ms", "-2"], "--ahead-ms: -2.0 is not above 0"), ([], "--out: no folder given")]
    for flags, message in cases:
        with pytest.raises(SystemExit) as stop:
            gb.main(flags)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gaps_beside: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
