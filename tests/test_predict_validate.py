"""tests/checks/predict_validate.py: validation.md is what it writes today from the committed
inputs; inputs of another device kind are refused; what is missing names its device call, as
tests/checks/README.md lists it."""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
from pathlib import Path

import pytest

from overlapbench.predict.estimate import ONE_CALL, PAIR
from overlapbench.predict.in_layer_choice import MEASURED_IN_LAYER, NO_IN_LAYER
from overlapbench.tuning.results import SCHEMA
from tests.checks import predict_validate as pv
from tests.checks import predict_validation as pvn

ROOT = Path(__file__).parents[1]


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_every_device_call_is_in_the_checks_readme_as_it_runs():
    readme = (ROOT / "tests/checks/README.md").read_text()
    for kind, command in pv.CALLS.values():
        assert f"| `{kind}` | `{command}` |" in readme, command
    needed = {n.call for studies in pv.STUDIES.values() for s in studies for n in pv._needs(s)} - {None}
    assert needed <= set(pv.CALLS)


@pytest.mark.parametrize("device", sorted(pv.STUDIES))
def test_the_committed_validation_is_todays_output(device):
    committed = ROOT / f"results/predicted-{device}/validation.md"
    if not committed.exists():
        pytest.skip(f"no committed {device} validation on this branch")
    with pv.tempfile.TemporaryDirectory() as rows:
        outcomes = pv.validate(device, Path(rows))
    flag = "" if device == "h100" else f" --out results/predicted-{device}"
    assert pv.report(device, outcomes) == committed.read_text(), (
        f"results/predicted-{device}/validation.md is not what `python tests/checks/predict_validate.py --device "
        f"{device}{flag}` writes today: run it again")


@pytest.mark.parametrize("paired", [False, True])
def test_a_study_whose_rows_carry_the_paired_term_is_also_validated_charging_it(tmp_path, monkeypatch, paired):
    """The default prediction (predict's defaults: the in-layer term and the pairs) always; a
    second with `--in-layer none` where the contention rows used carry the paired term, labelled
    so in the table and sections, from the same inputs (rows without the pairs: no prediction
    without them)."""
    rng = random.Random()
    study = next(s for s in pv.STUDIES["h200"] if s.tp == 2)
    contention = ROOT / study.contention_found().found()
    rows = [json.loads(line) for line in contention.read_text().splitlines() if line.strip()]
    assert any(r.get(pv.IN_LAYER_TERM) is not None for r in rows)
    for name in ("results", "sweeps"):  # the committed inputs, beside the rows written here
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.setattr(pv, "ROOT", tmp_path)
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "m" / f"{rng.randrange(1 << 24):06x}"
    folder.mkdir(parents=True)
    if not paired:  # the same rows as the two-harness measurement left them
        rows = [{k: v for k, v in r.items() if not k.startswith("in_layer_")} | {"inline_extra_ms": rng.uniform(0, 1)}
                for r in rows]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    need = pv.Need("beside-layer rows", "m/*/rows.jsonl", required=False, current=pv.IN_LAYER)
    study = pv.Study(study.device, study.model, study.tp, study.spec, study.pieces, study.tables, (need,), study.measured)
    variants = study.variants()
    assert [v.in_layer for v in variants] == ([MEASURED_IN_LAYER, NO_IN_LAYER] if paired else [MEASURED_IN_LAYER])
    assert {v.transfer_beside for v in variants} == {PAIR}  # no rows hold the extra beside one call, nor the pairs
    predicted = tmp_path / "predicted"
    predicted.mkdir()
    outcomes = [pv.run(study, predicted, v) for v in variants]
    table = [line for line in pv.report("h200", outcomes).splitlines() if line.startswith(f"| {study.title}")]
    assert len(table) == len(variants) * len(study.measured)
    sections = len(study.measured)  # a line per measured file, the default's first
    assert [", with --in-layer none" in line for line in table] == [False] * sections + [True] * sections * paired
    if paired:
        charged, plain = (o.sections[0][2] for o in outcomes)
        assert plain["points"] and len(plain["points"]) == len(charged["points"])
        assert any(a["predicted"] != b["predicted"] for a, b in zip(plain["points"], charged["points"]))
        assert outcomes[0].summary[-1].startswith("in-layer term: measured beside")
        assert outcomes[1].summary[-1].startswith("in-layer term: not charged")
    else:  # asked for, but the rows' term is of the measurement before the paired rounds: not used
        assert outcomes[0].summary[-1].startswith("in-layer term: none (the ")


def test_the_committed_diagnostic_is_todays_output():
    committed = Path("results/predicted-h100/diagnostic-tp4-h200-rows.md")
    if not (ROOT / committed).exists():
        pytest.skip("no committed diagnostic on this branch")
    with pv.tempfile.TemporaryDirectory() as rows:
        outcomes = [pv.run(pv._diagnostic(m), Path(rows)) for m in ("llama3-70b", "llama3-8b")]
    assert pv.report("h100", outcomes, diagnostic=committed) == (ROOT / committed).read_text(), (
        f"{committed} is not what `python tests/checks/predict_validate.py --diagnostic {committed}` writes today")


def test_inputs_of_another_device_are_refused_and_missing_ones_named(tmp_path):
    rng = random.Random()
    rows = tmp_path / "rows.jsonl"
    names = ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    rng.shuffle(names)
    rows.write_text("".join(json.dumps({"schema": SCHEMA, "device": d, "time": "2026-01-01"}) + "\n" for d in names))
    said = pv._other_device("h100", [rows])
    assert said and "NVIDIA H200" in said and "H100 80GB" not in said
    study = next(s for s in pv.STUDIES["h200"] if s.model == "llama3-70b" and s.tp == 4)
    missing = pv.Need("pieces", "results/no-such-machine/*/pieces.jsonl", "h200-pieces")
    outcome = pv.run(pv.Study(study.device, study.model, study.tp, study.spec, missing, study.tables, study.contention,
                              study.measured), tmp_path)
    assert outcome.missing[0] == missing and not outcome.sections
    assert all(not n.required for n in outcome.missing[1:])  # what it would run without: named too
    kind, command = pv.CALLS["h200-pieces"]
    assert pv.missing_lines([outcome])[0] == f"- on `{kind}`: `{command}`; makes h200 llama3-70b TP=4: pieces"


def test_the_newest_match_of_a_pattern_is_used(tmp_path, monkeypatch):
    monkeypatch.setattr(pv, "ROOT", tmp_path)
    times = random.sample(range(10, 60), 3)
    for i, minute in enumerate(times):
        folder = tmp_path / f"m/{i}"
        folder.mkdir(parents=True)
        (folder / "comm.jsonl").write_text(json.dumps({"time": f"2026-01-01T00:{minute}:00"}) + "\n")
    newest = times.index(max(times))
    assert pv.Need("table", "m/*/comm.jsonl").found() == Path(f"m/{newest}/comm.jsonl")
    assert pv.Need("table", "m/*/none.jsonl").found() is None


@pytest.mark.parametrize("paired", [False, True])
def test_beside_layer_rows_without_the_paired_term_are_listed_to_make_again(tmp_path, monkeypatch, paired):
    """A committed beside-layer file whose ok rows all lack `in_layer_extra_ms` (the two-harness
    measurement before it) is still found and used, and `--missing` lists its device call to make
    it again; one with the term is current."""
    monkeypatch.setattr(pv, "ROOT", tmp_path)
    rng = random.Random()
    folder = tmp_path / "m" / f"{rng.randrange(1 << 24):06x}"
    folder.mkdir(parents=True)
    term = {"in_layer_extra_ms": rng.uniform(-0.01, 0.05)} if paired else {"inline_extra_ms": rng.uniform(0, 1)}
    rows = [{"schema": SCHEMA, "time": "2026-01-01T00:00:00", "status": "ok", **term} for _ in range(rng.randrange(1, 5))]
    rows.append({"schema": SCHEMA, "time": "2026-01-01T00:00:00", "status": "failed"})
    (folder / "comm-beside-layer-x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    need = pv.Need("beside-layer rows", "m/*/comm-beside-layer-x.jsonl", "h100x2-layer", required=False,
                   current=pv.IN_LAYER)
    study = next(s for s in pv.STUDIES["h100"] if s.tp == 2)
    study = pv.Study(study.device, study.model, study.tp, study.spec, study.pieces, study.tables, (need,), ())
    assert need.found() is not None and need.outdated() is not paired
    outcome = pv._wanted(study)
    assert need not in outcome.missing and (need in outcome.outdated) is not paired
    lines = [line for line in pv.missing_lines([outcome]) if "h100x2" in line or "nvidia-h100-x2" in line]
    if paired:
        assert not lines
    else:
        kind, command = pv.CALLS["h100x2-layer"]
        assert lines == [f"- on `{kind}`: `{command}`; makes h100 {study.title}: beside-layer rows again: "
                         f"{need.found()} lacks the in-layer term timed in paired rounds (`in_layer_extra_ms`)"]


@pytest.mark.parametrize("own_clock", [True, False])
@pytest.mark.parametrize("slower", ["every token count", "one token count", "none"])
def test_a_study_whose_compute_is_not_the_pieces_is_flagged(tmp_path, monkeypatch, slower, own_clock):
    """A synthetic study of the predicted rows, its `no_comm` ~20% slower than the pieces' chain at
    every token count or at one, is flagged in the summary and its section names both commits and
    clocks: the chains' clock the likely cause where the study timed each choice at its own clock
    and the pieces' chains shared rounds, else other code; one within 3% everywhere is not flagged."""
    rng = random.Random()
    # a TP=4 study whose required inputs are committed (one waits on rows a device call makes)
    study = rng.choice([s for s in pv.STUDIES["h200"] if s.tp == 4 and not any(n.required for n in pv._wanted(s).missing)])
    for name in ("results", "sweeps"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.setattr(pv, "ROOT", tmp_path)
    monkeypatch.chdir(tmp_path)
    predicted = tmp_path / "predicted"
    predicted.mkdir()
    pv.run(study, predicted)
    rows = [r for p in predicted.glob("*.jsonl") for r in pv.read_rows(p) if r["status"] == "ok"]
    tokens = sorted({r["tokens"] for r in rows})
    off = {"every token count": tokens, "one token count": [rng.choice(tokens)], "none": []}[slower]
    factor = {t: rng.uniform(1.17, 1.25) if t in off else rng.uniform(0.97, 1.03) for t in tokens}
    code = f"{rng.randrange(1 << 28):07x}"
    settle = rng.choice([100.0, 300.0]) if own_clock else 0.0
    measured = [r | {"git": code, "timing": "measured", "settle_ms": settle, "speedup": r["speedup"] * rng.uniform(0.97, 1.03),
                     "ms": r["ms"] * (factor[r["tokens"]] if r["strategy"] == "no_comm" else rng.uniform(0.9, 1.1))}
                for r in rows]
    folder = tmp_path / "m" / code
    folder.mkdir(parents=True)
    (folder / "study.jsonl").write_text("".join(json.dumps(r) + "\n" for r in measured))
    study = dataclasses.replace(study, measured=(("a synthetic study", (pv.Need("the study", f"m/{code}/study.jsonl"),)),),
                                inputs="", only=())
    outcome = pv.run(study, predicted)
    text = pv.report("h200", [outcome])
    (line,) = [line for line in text.splitlines() if line.startswith("| a synthetic study |")]
    cell = line.strip("|").split("|")[-1].strip()
    median = pvn.percent(statistics.median(factor.values()) - 1)
    assert cell.startswith(median)
    pieces_rows = [r for need in (study.pieces, *study.more_pieces) for r in pv.read_rows(ROOT / need.found())]
    pieces_code = ", ".join(sorted({r["git"] for r in pieces_rows}))
    chains_own_clock = all(r.get("settle_ms") for r in pieces_rows if r["piece"] == "chain")
    flagged = [s for s in text.splitlines() if s.startswith("⚠ These errors mix the model's with a compute difference")]
    if off:
        why = "chains in shared rounds" if own_clock and not chains_own_clock else "other code?"
        assert cell == f"{median} ⚠ ({why})"
        assert len(flagged) == 1 and f"at {len(off)} of {len(tokens)} token counts" in flagged[0]
        study_clock = "each choice at its own clock" if own_clock else "in shared spans"
        chains = "each at its own clock" if chains_own_clock else "in shared rounds"
        assert f"rows are of {code}, {study_clock}; the pieces' of {pieces_code}, their chains {chains})" in flagged[0]
    else:
        assert cell == median and not flagged


def test_a_study_whose_rows_carry_the_extra_beside_one_call_is_also_validated_charging_it(tmp_path, monkeypatch):
    """A prediction with `--transfer-beside one-call` beside the default where the contention rows
    used carry the extra beside one call (random, per row), labelled so, from the same inputs, its
    predictions moved by the charge."""
    rng = random.Random()
    study = next(s for s in pv.STUDIES["h200"] if s.tp == 2)
    contention = ROOT / study.contention_found().found()
    rows = [json.loads(line) for line in contention.read_text().splitlines() if line.strip()]
    rows = [r | {pv.ONE_CALL_EXTRA: rng.uniform(0.0, 0.05)} for r in rows]
    for name in ("results", "sweeps"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.setattr(pv, "ROOT", tmp_path)
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "m" / f"{rng.randrange(1 << 24):06x}"
    folder.mkdir(parents=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    need = pv.Need("beside-layer rows", "m/*/rows.jsonl", required=False, current=pv.IN_LAYER)
    study = pv.Study(study.device, study.model, study.tp, study.spec, study.pieces, study.tables, (need,), study.measured)
    variants = study.variants()
    assert variants[0] == pv.DEFAULT and variants[-1] == pv.Variant(in_layer=NO_IN_LAYER, transfer_beside=ONE_CALL)
    predicted = tmp_path / "predicted"
    predicted.mkdir()
    plain, one_call = (pv.run(study, predicted, v) for v in (variants[0], variants[-1]))
    table = [line for line in pv.report("h200", [plain, one_call]).splitlines() if line.startswith(f"| {study.title}")]
    sections = len(study.measured)
    assert [", with --in-layer none and --transfer-beside one-call" in line for line in table] == (
        [False] * sections + [True] * sections)
    a, b = plain.sections[0][2], one_call.sections[0][2]
    assert a["points"] and len(a["points"]) == len(b["points"])
    assert any(x["predicted"] != y["predicted"] for x, y in zip(a["points"], b["points"]))
