"""tests/probes/allreduce_power.py's parts that need no GPU: the loads and the bytes each
all-reduce carries, the flags it accepts, and what a load's windows say (the ranks' power over
rounds, an all-reduce's idle equivalence against the idle gap of its round and rank)."""

from __future__ import annotations

import statistics

import pytest

from tests.probes import allreduce_power as ap


def test_an_all_reduce_carries_the_layers_whole_activation(rng):
    tokens = rng.randint(1, 40000)
    assert ap.message_bytes(tokens) == tokens * 8192 * 2  # llama3-70b's hidden, bf16: at any TP
    assert ap.loads([tokens, 7]) == ["sleep", "gemm", f"ar-{tokens}", "ar-7"]
    assert ap.parse_tokens(f" {tokens}, 7") == [tokens, 7]


def test_idle_equivalence_follows_the_power_cap_balance(rng):
    cap, sleep = rng.uniform(500, 800), rng.uniform(80, 250)
    assert ap.idle_equivalence(cap, sleep, sleep) == pytest.approx(1.0)
    assert ap.idle_equivalence(cap, cap, sleep) == pytest.approx(0.0)
    load = rng.uniform(sleep, cap)
    share = rng.uniform(0.05, 0.3)
    # a share s at the load's power leaves the compute what a share e * s of idle gap leaves
    compute_beside_load = (cap - share * load) / (1 - share)
    e = ap.idle_equivalence(cap, load, sleep)
    idle = e * share
    compute_beside_idle = (cap - idle * sleep) / (1 - idle)
    assert compute_beside_idle == pytest.approx(compute_beside_load, rel=0.05)
    assert ap.idle_equivalence(cap, load, cap) is None


def test_a_load_is_summed_up_over_rounds_and_ranks(rng):
    cap, world, rounds = 700.0, rng.choice([2, 4]), rng.randint(2, 5)
    names = ap.loads([1024, 32768])
    power = {"sleep": 150.0, "gemm": 695.0, "ar-1024": 300.0, "ar-32768": 480.0}
    windows = [{n: [{"power_w": power[n] + rng.uniform(-5, 5), "sm_mhz": rng.uniform(1400, 1980),
                     "power_capped": 1.0 if n == "gemm" else 0.0, "rate": rng.uniform(100, 300)} for _ in range(world)]
                for n in names} for _ in range(rounds)]
    rows = {r["load"]: r for r in ap.summarize(windows, names, cap)}
    for n in names:
        means = [statistics.fmean(x["power_w"] for x in w[n]) for w in windows]
        assert rows[n]["power_w"]["median"] == pytest.approx(statistics.median(means))
        assert rows[n]["rounds"] == rounds
    for n in ("ar-1024", "ar-32768"):
        each = rows[n]["idle_equivalence"]["each"]
        assert len(each) == rounds * world
        expected = [(cap - a["power_w"]) / (cap - s["power_w"]) for w in windows for a, s in zip(w[n], w["sleep"])]
        assert each == pytest.approx(expected)
    assert rows["ar-1024"]["idle_equivalence"]["median"] > rows["ar-32768"]["idle_equivalence"]["median"]
    assert "idle_equivalence" not in rows["gemm"]
    text = "\n".join(ap.table(list(rows.values()), cap))
    assert "ar-32768" in text and f"cap {cap:.0f} W" in text


def test_bad_flags_end_in_one_line_and_write_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OUT", raising=False)
    out = ["--out", str(tmp_path / "out")]
    cases = [([*out, "--tokens", "1024,x"], "--tokens: '1024,x' is not"), ([*out, "--tokens", "8,8"], "--tokens: '8,8' names"),
             ([*out, "--tokens", "0"], "--tokens: '0' is not"), ([*out, "--rounds", "0"], "--rounds: 0 is below 1"),
             ([*out, "--gemm-tokens", "0"], "--gemm-tokens: 0 is below 1"),
             ([*out, "--measure-s", "0"], "--measure-s: 0.0 is not above 0"),
             ([*out, "--settle-s", "-1"], "--settle-s: -1.0 is negative"), ([], "--out: no folder given")]
    for flags, message in cases:
        with pytest.raises(SystemExit) as stop:
            ap.main(flags)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"allreduce_power: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_without_torchrun_it_says_how_to_launch_it(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(SystemExit) as stop:
        ap.main(["--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "torch.distributed.run" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_host_bound_window_is_counted_and_left_out_of_the_idle_equivalence(rng):
    """A window whose host loop let a queue run empty mixes the all-reduce's power with idle time
    (2x H200, 552cfa4: the 1K all-reduce's lane sized by NCCL's first call starved in 22% of its
    units and read 195 W); it is flagged, and the idle equivalence comes from the other windows."""
    cap, world = 700.0, 2
    names = ap.loads([1024])
    starved_round = rng.randrange(3)

    def window(name: str, r: int) -> list[dict]:
        units = rng.randint(2000, 30000)
        hungry = name == "ar-1024" and r == starved_round
        power = {"sleep": 130.0, "gemm": 693.0, "ar-1024": 195.0 if hungry else 330.0}[name]
        return [{"power_w": power + rng.uniform(-2, 2), "units": units,
                 "starved": round(units * rng.uniform(0.05, 0.3)) if hungry else rng.randint(0, units // 200)}
                for _ in range(world)]

    rounds = [{n: window(n, r) for n in names} for r in range(3)]
    row = {r["load"]: r for r in ap.summarize(rounds, names, cap)}["ar-1024"]
    assert row["host_bound"] == 1 and row["rounds"] == 3
    kept = [(cap - a["power_w"]) / (cap - s["power_w"])
            for r, w in enumerate(rounds) if r != starved_round for a, s in zip(w["ar-1024"], w["sleep"])]
    assert row["idle_equivalence"]["each"] == pytest.approx(kept)
    line = next(x for x in ap.table([row], cap) if x.startswith("ar-1024"))
    assert line.split()[-1] == "1"


def test_a_committed_file_is_summed_up_again_from_its_windows(tmp_path, rng):
    """summarize_file reads back what main wrote: the setup row, the windows by round, and gives
    summarize's rows for them (here a file written as main writes one, with random powers)."""
    import json

    cap, tokens = 700.0, [2048, 8192]
    names = ap.loads(tokens)
    # an idle rank draws least: the loads between it and the cap, so the idle gap's balance
    # (the denominator) is never within the windows' noise of zero
    sleep = rng.uniform(80, 250)
    power = {n: rng.uniform(sleep, cap - 10) for n in names} | {"sleep": sleep}
    lines = [{"kind": "setup", "tokens": tokens, "cap_w": [cap, cap + 5]}]
    for r in range(3):
        for position, n in enumerate(rng.sample(names, len(names))):
            lines.append({"kind": "window", "load": n, "round": r, "position": position,
                          "ranks": [{"power_w": power[n] + rng.uniform(-1, 1), "units": 1000, "starved": 0}] * 2})
    path = tmp_path / "allreduce_power.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows, got_cap = ap.summarize_file(path)
    assert got_cap == cap and [r["load"] for r in rows] == names
    by = {r["load"]: r for r in rows}
    expected = (cap - power["ar-8192"]) / (cap - power["sleep"])
    assert by["ar-8192"]["idle_equivalence"]["median"] == pytest.approx(expected, abs=0.01)
