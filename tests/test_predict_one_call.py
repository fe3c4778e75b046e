"""`predict --transfer-beside one-call`: the beside-layer rows' extra beside one call
(`compute_one_call_extra_ms`) read per path and budget, interpolated in log(bytes), and charged to
a split's compute exactly per transfer, the transfer slowed as `auto` slows it; where the rows lack
the extra, `auto`'s charge with a note. Synthetic rows with random values."""

from __future__ import annotations

import math
import random

import pytest

from overlapbench import strategies
from overlapbench.predict import estimate
from overlapbench.predict.contention import ONE_CALL_EXTRA, ONE_CALL_OP, Contention
from overlapbench.predict.estimate import AUTO, ONE_CALL, TRANSFER_BESIDE
from overlapbench.predict.notes import MEASURED, SUBSTITUTED
from overlapbench.run import piece_keys
from tests.test_predict_comm import SIZES
from tests.test_predict_estimate import _at, _inputs, _predict
from tests.test_predict_layer_contention import layer_row

ROW_SIZES = (1 << 16, 1 << 20, 1 << 24)


def _with_extra(row: dict, extra: float) -> dict:
    return row | {ONE_CALL_EXTRA: extra}


def test_the_extra_is_read_per_path_and_budget_and_interpolated_in_log_bytes():
    """The median of the rows at a size, linear in log(bytes) between sizes, held outside them; the
    nearest budget holding it where the one asked has none (said); None for a path whose rows lack
    it; another layer's rows not read."""
    rng = random.Random()
    sizes = SIZES[::2]
    truth = {b: sorted(rng.uniform(-0.005, 0.2) for _ in range(3)) for b in sizes}  # three rows a size: the median
    row = lambda path, ctas, b, **kw: layer_row(path, ctas, b, rng.uniform(0.05, 1), rng.uniform(0.02, 0.4),
                                               rng.uniform(1.05, 3), rng.uniform(0.005, 0.05), **kw)
    rows = [_with_extra(row("nccl_symm", 16, b), e) for b in sizes for e in rng.sample(truth[b], 3)]
    rows += [row("nccl_symm", 32, b) for b in sizes]  # another budget, made before the one-call window
    rows += [row("fused_norm", 16, b) for b in sizes]
    rows += [_with_extra(row("fused_norm", 16, b, model="llama3-8b"), 9.0) for b in sizes]
    contention = Contention.from_rows(rows, "rows", model="llama3-70b", tp=2)
    for b, extras in truth.items():
        extra, notes = contention.one_call("nccl_symm", 16, b)
        assert extra == pytest.approx(extras[1])
        assert [n.kind for n in notes] == [MEASURED]
        assert notes[0].text == (f"nccl_symm 16 CTAs: {extras[1] * 1e3:+.1f} us taken from llama3-70b TP=2's layer "
                                 f"pass beside one call")
    for lo, hi in zip(sizes, sizes[1:]):
        between = int(lo * (hi / lo) ** rng.uniform(0.05, 0.95))
        w = math.log(between / lo) / math.log(hi / lo)  # the share of the way in log(bytes)
        want = (1 - w) * truth[lo][1] + w * truth[hi][1]
        assert contention.one_call("nccl_symm", 16, between)[0] == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert contention.one_call("nccl_symm", 16, sizes[0] // 4)[0] == pytest.approx(truth[sizes[0]][1])
    assert contention.one_call("nccl_symm", 16, sizes[-1] * 4)[0] == pytest.approx(truth[sizes[-1]][1])
    extra, notes = contention.one_call("nccl_symm", 32, sizes[0])
    assert extra == pytest.approx(truth[sizes[0]][1]) and notes[0].kind == SUBSTITUTED
    assert notes[0].text == "nccl_symm 32 CTAs not measured: 16 used"
    assert contention.one_call("fused_norm", 16, sizes[0]) is None
    assert contention.one_call("symm_two_shot", None, sizes[0]) is None
    assert not Contention.from_rows([row("nccl_symm", 16, b) for b in sizes], "rows").one_call_extras


def _transfers(point) -> int:
    """A split's transfers over its layers: each chunk's reduction after attention and after the MLP."""
    plan = strategies.get(point.strategy).plan(point.knobs, piece_keys.batch_of(point))
    return 2 * len(plan.chunks) * point.layers


@pytest.mark.parametrize("path, ctas, comm", [("nccl", "default", "nccl"), ("copy_engine_norm", 16, "copy_engine")])
def test_a_split_pays_the_extra_per_transfer_beside_its_compute(path, ctas, comm):
    """Transfers that end inside the compute beside them (the inputs' compute is 10x longer): each
    but the last (no compute runs beside it) costs the split the rows' extra, whatever loss the
    rows measured; with an extra of 0 and a loss of 0 the split is `auto`'s, the transfer slowed
    as `auto` slows it (the rows' stretch for an SM path, none for a copy-engine one)."""
    rng = random.Random()
    seed, stretch = rng.randrange(1000), rng.uniform(1.05, 3.0)
    point = _at(4096, "token_split", comm)
    inputs = _inputs(seed, comm_ms=0.05)
    transfer_ms = inputs.comm.time_ms(path, ctas, 2048 * 64 * 2, hidden=64).ms
    extra = rng.uniform(0.05, 0.85) * transfer_ms * (1.0 if path == "copy_engine_norm" else stretch)  # loss < 0.9

    def predicted(mode: str, loss: float, one_call: float | None):
        rows = [layer_row(path, ctas, b, 1.0, loss, stretch, 0.0) for b in ROW_SIZES]
        inputs = _inputs(seed, comm_ms=0.05)
        inputs.contention, inputs.stretch = Contention.from_rows(
            [r if one_call is None else _with_extra(r, one_call) for r in rows], "rows", model="predicted", tp=2), mode
        return _predict(point, inputs)

    charged = predicted(ONE_CALL, rng.uniform(0.05, 0.5), extra)
    free = predicted(ONE_CALL, rng.uniform(0.05, 0.5), 0.0)
    assert charged.ms - free.ms == pytest.approx(extra * (_transfers(point) - 1) / point.layers, rel=1e-6)
    assert free.ms == pytest.approx(predicted(AUTO, 0.0, None).ms, rel=1e-9)
    assert any(n.kind == MEASURED and "taken from llama3-70b TP=2's layer pass beside one call" in n.text
               for n in charged.notes)
    assert not any("taking nothing" in n.text for n in charged.notes)


def test_without_the_extra_one_call_charges_what_auto_does_and_says_so():
    rng = random.Random()
    seed, loss, stretch = rng.randrange(1000), rng.uniform(0.05, 0.4), rng.uniform(1.05, 3.0)
    rows = [layer_row("nccl", "default", b, 1.0, loss, stretch, 0.0) for b in ROW_SIZES]
    found = {}
    for mode in (AUTO, ONE_CALL):
        inputs = _inputs(seed, comm_ms=0.05)
        inputs.contention, inputs.stretch = Contention.from_rows(rows, "rows", model="predicted", tp=2), mode
        found[mode] = _predict(_at(4096, "token_split", "nccl"), inputs)
    assert found[ONE_CALL].ms == pytest.approx(found[AUTO].ms, rel=1e-12)
    said = [n for n in found[ONE_CALL].notes if n.kind == SUBSTITUTED]
    assert [n.text for n in said] == [f"nccl: no extra beside one call in the beside-layer rows (`{ONE_CALL_EXTRA}`): "
                                      f"charged as --transfer-beside auto charges it"]
    assert not any("beside one call" in n.text for n in found[AUTO].notes)
    assert ONE_CALL in TRANSFER_BESIDE


def test_the_transfer_is_slowed_as_one_call_was_where_the_rows_time_it():
    """Rows holding the one call's own time beside the pass (`compute_one_call_op_ms`): its stretch
    (that time over the row's time alone) is looked up per size, and a split's transfer runs that
    slow, a copy-engine one too (which `auto` runs as alone): with no extra and no loss, one-call
    predicts what `measured` does with the rows' stretch set to the one call's."""
    rng = random.Random()
    seed, stretch = rng.randrange(1000), rng.uniform(1.5, 4.0)
    path, ctas, comm = "copy_engine_norm", 16, "copy_engine"
    point = _at(4096, "token_split", comm)

    def rows(beside_stretch: float, op_stretch: float | None) -> list[dict]:
        made = [layer_row(path, ctas, b, 1.0, 0.0, beside_stretch, 0.0) for b in ROW_SIZES]
        return [_with_extra(r, 0.0) | ({} if op_stretch is None else {ONE_CALL_OP: op_stretch * r["ms"]}) for r in made]

    def predicted(mode: str, found: list[dict]):
        inputs = _inputs(seed, comm_ms=4.0)  # transfers longer than the compute beside them: any stretch shows
        inputs.contention, inputs.stretch = Contention.from_rows(found, "rows", model="predicted", tp=2), mode
        return _predict(point, inputs)

    held = Contention.from_rows(rows(1.0, stretch), "rows", model="llama3-70b", tp=2)
    for b in ROW_SIZES:
        assert held.one_call_stretch(path, ctas, b)[0] == pytest.approx(stretch)
    assert Contention.from_rows(rows(1.0, None), "rows", model="llama3-70b", tp=2).one_call_stretch(path, ctas, 1 << 20) is None
    slowed = predicted(ONE_CALL, rows(rng.uniform(1.0, 1.2), stretch))
    assert slowed.ms == pytest.approx(predicted(estimate.MEASURED, rows(stretch, None)).ms, rel=1e-9)
    assert slowed.ms > predicted(ONE_CALL, rows(1.0, None)).ms  # as alone without the call's own time
    assert any("one call stretched" in n.text for n in slowed.notes)
