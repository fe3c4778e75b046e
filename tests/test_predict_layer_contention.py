"""predict's contention from `comm --beside-layer` rows: preferred over beside-GEMM rows per path,
both terms (the compute's loss, the transfer's stretch) charged to a split, except to a
copy-engine transfer under `auto`, and the in-layer term charged to every blocking all-reduce of
a serial plan under `--in-layer measured` (and to none by default). Synthetic rows with random
values."""

from __future__ import annotations

import json
import random

import pytest

from overlapbench.predict.contention import GEMM, LAYER, NONE, Contention
from overlapbench.predict.estimate import ALONE, AUTO, MEASURED
from overlapbench.predict.in_layer_choice import MEASURED_IN_LAYER, NO_IN_LAYER
from overlapbench.predict.notes import ASSUMED, FLAGGED, SUBSTITUTED
from overlapbench.predict.notes import MEASURED as MEASURED_NOTE
from tests.test_predict_comm import SIZES, comm_row
from tests.test_predict_estimate import _at, _inputs, _predict


def layer_row(path, ctas, nbytes, ms, loss, stretch, extra, model="llama3-70b", tp=2, world=2, paired=True) -> dict:
    """A beside-layer row; `paired`: its in-layer term timed in paired rounds (`in_layer_extra_ms`),
    else as rows were made before them (`inline_extra_ms`, which predict does not charge)."""
    row = comm_row(path, ctas, nbytes, ms, world=world)
    key = json.loads(row["key"]) | {"beside_layer": f"{model} tp={tp}"}
    term = {"in_layer_extra_ms": extra} if paired else {"inline_extra_ms": extra, "inline_ms": 1.0}
    return row | {"key": json.dumps(key, sort_keys=True), "beside_ms": ms * stretch, "compute_loss": loss,
                  **term, "beside_layer": {"model": model, "tp": tp, "tokens": nbytes // 16384}}


def _rows(rng: random.Random, sizes=SIZES[::2]):
    truth = {b: (rng.uniform(0.02, 0.4), rng.uniform(1.05, 3.0), rng.uniform(0.005, 0.05)) for b in sizes}
    layer = [layer_row("nccl_symm", 16, b, rng.uniform(0.05, 1), *truth[b]) for b in sizes]
    other = [layer_row("nccl_symm", 16, b, 1.0, 0.9, 9.0, 1.0, model="llama3-8b") for b in sizes]
    gemm = [comm_row(p, c, b, 1.0, beside=(rng.uniform(0.1, 0.2), rng.uniform(4, 12)))
            for p, c in (("nccl_symm", 16), ("fused_norm", 16)) for b in sizes]
    return truth, layer + other + gemm


def test_layer_rows_win_over_gemm_rows_per_path_and_say_what_they_are():
    rng = random.Random()
    truth, rows = _rows(rng)
    contention = Contention.from_rows(rows, "rows", model="llama3-70b", tp=2)
    assert contention.layer_of == ("llama3-70b", 2) and not contention.notes
    for b, (loss, stretch, extra) in truth.items():
        got = contention.at("nccl_symm", 16, b)
        assert (got.beside, got.gemm_loss, got.transfer_stretch) == (LAYER, pytest.approx(loss), pytest.approx(stretch))
        assert [n.kind for n in got.notes] == [MEASURED_NOTE] and "measured beside llama3-70b TP=2's layer" in got.note
        assert contention.in_layer("nccl_symm", 16, b)[0] == pytest.approx(extra)
    lo, hi = sorted(truth)[:2]
    middle = contention.in_layer("nccl_symm", 16, int((lo * hi) ** 0.5))[0]  # halfway in log(bytes)
    assert middle == pytest.approx((truth[lo][2] + truth[hi][2]) / 2, rel=1e-3)
    assert contention.in_layer("nccl_symm", 32, lo)[1][0].text == "nccl_symm 32 CTAs not measured: 16 used"
    fused = contention.at("fused_norm", 16, lo)
    assert fused.beside == GEMM and any(n.kind == SUBSTITUTED and "no rows beside the layer" in n.text for n in fused.notes)
    assert contention.in_layer("fused_norm", 16, lo) is None
    guess = contention.at("symm_two_shot", None, lo)
    mean = sum(v[0] for v in truth.values()) / len(truth)
    assert guess.beside == NONE and guess.gemm_loss == pytest.approx(mean) and guess.notes[0].kind == ASSUMED
    assert "not measured beside the layer" in guess.note
    assert "beside llama3-70b TP=2's layer for nccl_symm 16" in contention.described()


def test_a_point_timed_both_ways_takes_its_settled_rows_and_says_so():
    """Rows of one point (path, CTAs, bytes) timed at a shared clock and with each graph settled
    (`comm --settle-ms`): the settled ones give its terms; a point timed one way keeps its rows."""
    rng = random.Random()
    sizes = SIZES[::2]
    shared = [layer_row("nccl", None, b, rng.uniform(0.05, 1), rng.uniform(0.02, 0.4), rng.uniform(1.05, 3.0),
                        rng.uniform(0.005, 0.05)) for b in sizes]
    own_extras = {b: rng.uniform(-0.05, 0.0) for b in sizes[:2]}
    settled = [layer_row("nccl", None, b, rng.uniform(0.05, 1), rng.uniform(0.02, 0.4), rng.uniform(1.05, 3.0), extra)
               for b, extra in own_extras.items()]
    for row in settled:
        row["beside_layer"] |= {"settle_ms": 300.0, "span_ms": 200.0}
    rows = shared + settled
    rng.shuffle(rows)
    contention = Contention.from_rows(rows, "rows", model="llama3-70b", tp=2)
    for b in sizes:
        expected = own_extras.get(b, next(r["in_layer_extra_ms"] for r in shared if r["bytes"] == b))
        assert contention.in_layer("nccl", None, b)[0] == pytest.approx(expected)
    (note,) = contention.notes
    assert note.kind == SUBSTITUTED and note.text.startswith(f"{len(own_extras)} beside-layer point(s) timed both")
    assert not Contention.from_rows(shared, "rows", model="llama3-70b", tp=2).notes  # one way: nothing said


def test_another_layers_rows_are_used_with_a_note_where_the_predicted_ones_are_missing():
    rng = random.Random()
    _, rows = _rows(rng)
    contention = Contention.from_rows(rows, "rows", model="llama3-8b", tp=4)
    assert contention.layer_of == ("llama3-8b", 2)
    said = [n.text for n in contention.notes]
    assert "contention measured beside llama3-8b TP=2's layer, not llama3-8b TP=4's: used as it is" in said
    assert "contention measured on 2 ranks, predicting 4: used as it is" in said
    qwen = Contention.from_rows(rows, "rows", model="qwen3-32b", tp=2)
    assert qwen.layer_of == ("llama3-70b", 2) and "not qwen3-32b TP=2's" in qwen.notes[0].text


def _with_layer_rows(inputs, rng: random.Random, stretch: float = 1.0, extra: float = 0.0, layer: bool = True):
    """The synthetic inputs' nccl path measured beside the layer (or only beside GEMMs)."""
    sizes = [1 << 16, 1 << 20, 1 << 24]
    loss = rng.uniform(0.05, 0.3)
    if layer:
        rows = [layer_row("nccl", "default", b, 1.0, loss, stretch, extra) for b in sizes]
    else:
        rows = [comm_row("nccl", "default", b, 1.0, beside=(loss, stretch)) for b in sizes]
    inputs.contention = Contention.from_rows(rows, "rows", model="predicted", tp=2)
    return inputs


def test_a_serial_plan_pays_the_in_layer_term_per_blocking_all_reduce_where_asked():
    """`--in-layer measured`: each blocking all-reduce costs its table time plus the rows' term;
    `none` (the default): its table time alone, the rows' term read by nothing (no note)."""
    rng = random.Random()
    extra = rng.uniform(0.01, 0.05)
    inputs = _with_layer_rows(_inputs(rng.randrange(100)), rng, extra=extra)
    assert inputs.in_layer == NO_IN_LAYER
    for tokens in (512, 4096):
        transfer = inputs.comm.time_ms("nccl", "default", tokens * 64 * 2).ms
        inputs.in_layer = NO_IN_LAYER
        free, plain = _predict(_at(tokens, "no_comm"), inputs), _predict(_at(tokens, "baseline"), inputs)
        assert plain.ms == pytest.approx(free.ms + 2 * transfer) and plain.in_layer_ms == 0
        assert not any("blocking all-reduce" in n.text for n in plain.notes)
        inputs.in_layer = MEASURED_IN_LAYER
        base = _predict(_at(tokens, "baseline"), inputs)
        assert base.ms == pytest.approx(free.ms + 2 * (transfer + extra))
        assert base.in_layer_ms == pytest.approx(2 * extra) and free.in_layer_ms == 0
        assert any(f"{extra * 1e3:+.1f} us per blocking all-reduce" in n.text for n in base.notes)


@pytest.mark.parametrize("layer", [True, False])
def test_a_split_is_slowed_by_the_layer_stretch_unless_told_alone(layer):
    """auto: the stretch measured beside the layer slows a split's transfers; one measured beside
    GEMMs does not (alone); `measured` takes either."""
    rng = random.Random()
    stretch = rng.uniform(2, 4)
    seed = rng.randrange(100)
    timed = {}
    for mode in (AUTO, ALONE, MEASURED):
        inputs = _with_layer_rows(_inputs(seed, comm_ms=0.2), random.Random(seed), stretch=stretch, layer=layer)
        inputs.stretch = mode
        timed[mode] = _predict(_at(4096, "token_split", "nccl"), inputs).ms
    assert timed[MEASURED] > timed[ALONE] * 1.001
    assert timed[AUTO] == (pytest.approx(timed[MEASURED]) if layer else pytest.approx(timed[ALONE]))


def test_a_copy_engine_split_runs_as_alone_and_takes_nothing_under_auto():
    """auto: a copy-engine transfer beside a split's compute runs at its time alone and costs the
    compute nothing, whatever loss and stretch its rows measured (the prediction is the one made
    without contention); alone charges it the measured loss, measured the loss and the stretch; a
    serial plan on the copy engines still pays the in-layer term per blocking all-reduce (where
    asked: --in-layer measured)."""
    rng = random.Random()
    seed = rng.randrange(1000)
    loss, stretch, extra = rng.uniform(0.05, 0.3), rng.uniform(2, 12), rng.uniform(0.01, 0.05)
    rows = [layer_row("copy_engine_norm", 16, b, 1.0, loss, stretch, extra) for b in (1 << 16, 1 << 20, 1 << 24)]
    bare = _inputs(seed, comm_ms=0.2)
    split, serial = _at(4096, "token_split", "copy_engine"), _at(4096, "fused_norm")
    without = _predict(split, bare)
    found = {}
    for mode in (AUTO, ALONE, MEASURED):
        inputs = _inputs(seed, comm_ms=0.2)
        inputs.contention, inputs.stretch = Contention.from_rows(rows, "rows", model="predicted", tp=2), mode
        inputs.in_layer = MEASURED_IN_LAYER
        found[mode] = (_predict(split, inputs), _predict(serial, inputs))
    auto, in_line = found[AUTO]
    assert auto.ms == pytest.approx(without.ms) and auto.played.exposed_ms == pytest.approx(without.played.exposed_ms)
    assert any(n.kind == ASSUMED and "copy_engine_norm beside a split's compute: as fast as alone" in n.text
               for n in auto.notes)
    assert found[ALONE][0].ms > auto.ms * 1.0001 and found[MEASURED][0].ms > found[ALONE][0].ms * 1.0001
    assert not any("as fast as alone" in n.text for n in found[MEASURED][0].notes)
    assert in_line.ms == pytest.approx(_predict(serial, bare).ms + 2 * extra)
    assert in_line.in_layer_ms == pytest.approx(2 * extra)


def test_rows_of_the_two_harness_measurement_give_their_contention_but_not_their_in_layer_term():
    """Beside-layer rows made before the paired rounds: their loss and stretch are charged as
    ever, their in-layer term is not, even where asked for (a flagged note names the rows, their
    runs and why; each serial point says it charged none); where paired rows of a point are there
    too, theirs is the term."""
    rng = random.Random()
    sizes = [1 << 16, 1 << 20, 1 << 24]
    truth = {b: (rng.uniform(0.05, 0.3), rng.uniform(1.1, 3.0), rng.uniform(0.01, 0.05)) for b in sizes}
    old = [layer_row("nccl", "default", b, 1.0, *truth[b], paired=False) | {"run_id": "oldrun", "git": "abc1234"}
           for b in sizes]
    other_layer = [layer_row("nccl", "default", b, 1.0, 0.5, 5.0, 1.0, model="llama3-8b", paired=False) for b in sizes]
    contention = Contention.from_rows(old + other_layer, "rows", model="llama3-70b", tp=2)
    assert contention.stale == len(sizes) and not contention.inline
    assert not any(n.kind == FLAGGED for n in contention.notes)  # said only where the term is asked for
    flagged = [n.text for n in contention.in_layer_notes if n.kind == FLAGGED]
    assert len(flagged) == 1 and flagged[0].startswith(f"the in-layer term of {len(sizes)} beside-layer rows of "
                                                      f"llama3-70b TP=2 (runs oldrun, git abc1234) not used")
    assert "inline_extra_ms" in flagged[0] and "overlapbench comm --beside-layer llama3-70b" in flagged[0]
    assert f"the {len(sizes)} beside-layer rows' was measured before the paired rounds" in contention.in_layer_described()
    for b, (loss, stretch, _) in truth.items():
        got = contention.at("nccl", "default", b)
        assert (got.beside, got.gemm_loss, got.transfer_stretch) == (LAYER, pytest.approx(loss), pytest.approx(stretch))
        assert contention.in_layer("nccl", "default", b) is None

    seed = rng.randrange(100)
    bare, inputs = _inputs(seed), _inputs(seed)
    inputs.contention, inputs.in_layer = contention, MEASURED_IN_LAYER
    for tokens in (512, 4096):
        base = _predict(_at(tokens, "baseline"), inputs)
        assert base.ms == pytest.approx(_predict(_at(tokens, "baseline"), bare).ms) and base.in_layer_ms == 0
        assert any(n.kind == ASSUMED and "measured before the paired rounds and is not used" in n.text for n in base.notes)

    extra = rng.uniform(0.01, 0.05)
    new = [layer_row("nccl", "default", b, 1.0, *truth[b][:2], extra) for b in sizes[:2]]
    mixed = Contention.from_rows(old + new, "rows", model="llama3-70b", tp=2)
    assert mixed.stale == len(sizes) and mixed.in_layer("nccl", "default", sizes[0])[0] == pytest.approx(extra)
    assert mixed.in_layer("nccl", "default", sizes[-1])[0] == pytest.approx(extra)  # held at the largest paired size


@pytest.mark.parametrize("in_layer", [NO_IN_LAYER, MEASURED_IN_LAYER])
def test_each_row_records_the_in_layer_choice_and_the_summary_says_it_once(tmp_path, in_layer):
    """`predict`'s rows say whether their blocking all-reduces paid the measured in-layer term
    (`predicted.in_layer`), the summary says so in one line (naming `--in-layer measured` where it
    is not charged), and rows of the two-harness measurement are flagged only where it is."""
    from overlapbench.predict.command import predict
    from overlapbench.predict.summary import Summary
    from overlapbench.specs import spec as spec_mod
    from overlapbench.tuning.results import read_rows
    from tests.test_predict_estimate import SPEC

    rng = random.Random()
    extra = rng.uniform(0.01, 0.05)
    sizes = [1 << 16, 1 << 20, 1 << 24]
    paired = [layer_row("nccl", "default", b, 1.0, rng.uniform(0.05, 0.3), 1.5, extra) for b in sizes]
    old = [layer_row("copy_engine_norm", 16, b, 1.0, rng.uniform(0.05, 0.3), 1.5, extra, paired=False) for b in sizes]
    inputs = _inputs(rng.randrange(100))
    inputs.contention = Contention.from_rows(paired + old, "rows", model="predicted", tp=2)
    inputs.in_layer = in_layer
    out, summary = tmp_path / "p.jsonl", Summary()
    predict(spec_mod.from_dict(SPEC, "predicted", cuda=True), 2, inputs, out, error=0.02, summary=summary)
    rows = [r for r in read_rows(out) if r["status"] == "ok"]
    assert rows and all(r["predicted"]["in_layer"] == in_layer for r in rows)
    charged = [r for r in rows if r["predicted"].get("in_layer_ms")]
    said = [line for line in summary.lines() if line.startswith("in-layer term: ")]
    flagged = [line for line in summary.lines() if line.startswith("flagged: ")]
    assert len(said) == 1 and summary.lines()[-1] == said[0]
    if in_layer == NO_IN_LAYER:
        assert not charged and not flagged and "--in-layer measured" in said[0] and "not charged" in said[0]
    else:
        assert {r["strategy"] for r in charged} == {"baseline"}  # the nccl path's rows are paired; fused_norm's not
        assert all(r["predicted"]["in_layer_ms"] == pytest.approx(2 * extra, abs=1e-6) for r in charged)
        assert said[0].startswith("in-layer term: measured beside llama3-70b TP=2's layer for nccl default,")
        assert len(flagged) == 1 and "the in-layer term of 3 beside-layer rows" in flagged[0]


def test_the_copy_engine_charge_check_charges_a_loss_over_the_time_alone():
    """tests/checks/copy_engine_charge.py's variants go through predict's one loss term: the rows'
    loss over the transfer's time alone is `--transfer-beside alone`'s prediction, the power loss
    is the same with every row's loss set to it; each makes a copy-engine split slower than `auto`
    (which charges nothing) by at most that loss over its transfers' time alone."""
    from unittest import mock

    from overlapbench.predict import estimate
    from tests.checks import copy_engine_charge as check

    rng = random.Random()
    seed = rng.randrange(1000)
    power, sizes = rng.uniform(0.02, 0.2), (1 << 16, 1 << 20, 1 << 24)
    truth = {b: (rng.uniform(0.02, 0.3), rng.uniform(2, 12)) for b in sizes}
    split = _at(4096, "token_split", "copy_engine")

    def predicted(mode, loss_of=lambda b: truth[b][0]):
        rows = [layer_row("copy_engine_norm", 16, b, 1.0, loss_of(b), truth[b][1], 0.0) for b in sizes]
        inputs = _inputs(seed, comm_ms=0.2)
        inputs.contention, inputs.stretch = Contention.from_rows(rows, "rows", model="predicted", tp=2), mode
        return _predict(split, inputs)

    auto = predicted(AUTO)
    with mock.patch.object(estimate, "_beside_compute", check.charged(check.ROWS, power)):
        rows = predicted(AUTO)
    with mock.patch.object(estimate, "_beside_compute", check.charged(check.POWER_LOSS, power)):
        taxed = predicted(AUTO)
    assert rows.ms == pytest.approx(predicted(ALONE).ms)
    assert taxed.ms == pytest.approx(predicted(ALONE, lambda b: power).ms)
    transfers = _transfers_ms(split, _inputs(seed, comm_ms=0.2))
    for charged, most in ((rows, max(v[0] for v in truth.values())), (taxed, power)):
        assert auto.ms * 1.0001 < charged.ms <= auto.ms + most * transfers + 1e-9


def _transfers_ms(point, inputs) -> float:
    """A split's transfers' time alone per layer: each chunk's reduction after attention and after
    the MLP, from the comm table."""
    from overlapbench import strategies
    from overlapbench.comm.sizes import DTYPE_BYTES
    from overlapbench.run import piece_keys

    batch = piece_keys.batch_of(point)
    plan = strategies.get(point.strategy).plan(point.knobs, batch)
    return sum(inputs.comm.time_ms(t.path, t.ctas, c.size * batch.shape.hidden * DTYPE_BYTES[point.dtype],
                                   hidden=batch.shape.hidden).ms
               for c in plan.chunks for t in (plan.after_attention, plan.after_mlp))
