"""`predict --transfer-beside pair`: the beside-layer rows' pair extras (`pair_attention_extra_ms`,
`pair_mlp_extra_ms`) read per path, budget and block, interpolated in log(bytes), and charged to
each of a split's transfers by the block the split runs beside it (the next compute on the main
lane); the stack's last reduction as fast as alone; where the rows lack the pair, `auto`'s charge
with a note. Synthetic rows with random values."""

from __future__ import annotations

import math
import random

import pytest

from overlapbench import strategies
from overlapbench.comm.pair import ATTENTION, BLOCKS, MLP, extra_field
from overlapbench.model.schedule import COMPUTE, REDUCE, Transfer
from overlapbench.predict.contention import Contention
from overlapbench.predict.estimate import AUTO, PAIR, TRANSFER_BESIDE, _beside_compute_tasks, _pair
from overlapbench.predict.notes import MEASURED, SUBSTITUTED
from overlapbench.run import piece_keys
from tests.test_predict_comm import SIZES
from tests.test_predict_estimate import _at, _inputs, _predict
from tests.test_predict_layer_contention import layer_row

ROW_SIZES = (1 << 16, 1 << 20, 1 << 24)


def _with_pairs(row: dict, attention: float, mlp: float) -> dict:
    return row | {extra_field(ATTENTION): attention, extra_field(MLP): mlp}


def test_the_pair_extras_are_read_per_path_budget_and_block_and_interpolated_in_log_bytes():
    rng = random.Random()
    sizes = SIZES[::2]
    truth = {block: {b: sorted(rng.uniform(-0.005, 0.3) for _ in range(3)) for b in sizes} for block in BLOCKS}
    row = lambda path, ctas, b, **kw: layer_row(path, ctas, b, rng.uniform(0.05, 1), rng.uniform(0.02, 0.4),
                                               rng.uniform(1.05, 3), rng.uniform(0.005, 0.05), **kw)
    rows = [_with_pairs(row("copy_engine_norm", 32, b), truth[ATTENTION][b][i], truth[MLP][b][i])
            for b in sizes for i in rng.sample(range(3), 3)]
    rows += [row("fused_norm", 16, b) for b in sizes]  # made before the pair window
    rows += [_with_pairs(row("fused_norm", 16, b, model="llama3-8b"), 9.0, 9.0) for b in sizes]  # another layer
    contention = Contention.from_rows(rows, "rows", model="llama3-70b", tp=2)
    for block in BLOCKS:
        for b in sizes:
            extra, notes = contention.pair("copy_engine_norm", 32, b, block)
            assert extra == pytest.approx(truth[block][b][1])
            assert [n.kind for n in notes] == [MEASURED]
            assert notes[0].text == (f"copy_engine_norm 32 CTAs: {extra * 1e3:+.1f} us beyond llama3-70b TP=2's "
                                     f"{block} block released with one call")
        lo, hi = sizes[1], sizes[2]
        between = int(lo * (hi / lo) ** rng.uniform(0.05, 0.95))
        w = math.log(between / lo) / math.log(hi / lo)
        want = (1 - w) * truth[block][lo][1] + w * truth[block][hi][1]
        assert contention.pair("copy_engine_norm", 32, between, block)[0] == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert contention.pair("copy_engine_norm", 32, sizes[-1] * 4, block)[0] == pytest.approx(truth[block][sizes[-1]][1])
        extra, notes = contention.pair("copy_engine_norm", 16, sizes[0], block)
        assert extra == pytest.approx(truth[block][sizes[0]][1]) and notes[0].kind == SUBSTITUTED
        assert contention.pair("fused_norm", 16, sizes[0], block) is None
    assert not Contention.from_rows([row("nccl_symm", 16, b) for b in sizes], "rows").pair_extras


def test_each_reduction_runs_beside_the_next_compute_listed_and_the_last_beside_none():
    rng = random.Random()
    point = _at(4096, "token_split", "copy_engine")
    plan = strategies.get(point.strategy).plan(point.knobs, piece_keys.batch_of(point))
    layers = rng.randrange(1, 5)
    tasks = plan.tasks(layers)
    beside = _beside_compute_tasks(tasks)
    for j, task in enumerate(tasks):
        if task.work == COMPUTE:
            assert beside[j] is None
        elif j == len(tasks) - 1:
            assert beside[j] is None
        else:
            nxt = beside[j]
            assert tasks[nxt].work == COMPUTE and nxt > j
            assert all(tasks[k].work == REDUCE for k in range(j + 1, nxt))
    blocks = [tasks[b].block for b in beside if b is not None]  # 2 chunks: A's attention transfer beside B's attention, ...
    assert blocks.count(ATTENTION) == 2 * layers - 1 and blocks.count(MLP) == 2 * layers


def _predicted(point, seed: int, mode: str, attention: float | None, mlp: float | None, comm_ms: float = 0.05):
    path, ctas = "copy_engine_norm", 16
    rows = [layer_row(path, ctas, b, 1.0, 0.3, 2.0, 0.0) for b in ROW_SIZES]
    if attention is not None:
        rows = [_with_pairs(r, attention, mlp) for r in rows]
    inputs = _inputs(seed, comm_ms=comm_ms)
    inputs.contention, inputs.stretch = Contention.from_rows(rows, "rows", model="predicted", tp=2), mode
    return _predict(point, inputs), inputs


def test_a_split_pays_each_transfers_pair_extra_by_the_block_beside_it():
    """Transfers far shorter than the compute beside them (a copy-engine path: no norm after the
    transfer): with extras of 0 the split is `auto`'s (nothing exposed but the last transfer);
    with extras, each transfer but the last costs its block's extra, the attention's 2L - 1
    times and the MLP's 2L times over L layers."""
    rng = random.Random()
    seed = rng.randrange(1000)
    point = _at(4096, "token_split", "copy_engine")
    attention, mlp = rng.uniform(0.001, 0.05), rng.uniform(0.001, 0.05)
    free, _ = _predicted(point, seed, PAIR, 0.0, 0.0)
    charged, _ = _predicted(point, seed, PAIR, attention, mlp)
    auto, _ = _predicted(point, seed, AUTO, None, None)
    assert free.ms == pytest.approx(auto.ms, rel=1e-9)
    layers = point.layers
    want = ((2 * layers - 1) * attention + 2 * layers * mlp) / layers
    assert charged.ms - free.ms == pytest.approx(want, rel=1e-6)  # the extras as measured, not scaled
    assert any(n.kind == MEASURED and "released with one call" in n.text for n in charged.notes)
    assert not any("taking nothing" in n.text for n in charged.notes)


def test_a_transfer_longer_than_its_pair_runs_as_alone_and_without_the_pair_auto_is_charged():
    rng = random.Random()
    seed = rng.randrange(1000)
    point = _at(4096, "token_split", "copy_engine")
    long_free, _ = _predicted(point, seed, PAIR, 0.0, 0.0, comm_ms=40.0)  # transfers outlast any block
    long_auto, _ = _predicted(point, seed, AUTO, None, None, comm_ms=40.0)
    assert long_free.ms == pytest.approx(long_auto.ms, rel=1e-9)
    without, _ = _predicted(point, seed, PAIR, None, None)
    auto, _ = _predicted(point, seed, AUTO, None, None)
    assert without.ms == pytest.approx(auto.ms, rel=1e-12)
    said = [n.text for n in without.notes if n.kind == SUBSTITUTED]
    assert said and all(text.startswith("copy_engine_norm: no pair beside the ") for text in said)
    assert {f"`{extra_field(b)}`" in " ".join(said) for b in BLOCKS} == {True}
    assert PAIR in TRANSFER_BESIDE


class _OnePair:
    """A contention whose rows hold one pair extra for every path, budget, size and block."""

    def __init__(self, extra: float) -> None:
        self.extra = extra

    def pair(self, path, ctas, nbytes, block):
        return self.extra, []


def test_the_compute_loses_the_extra_less_the_calls_own_time_beyond_its_block():
    """A call shorter than its block: the block ends the whole extra later (the pair's end); a
    call longer than its block: the extra's part that is the call's own excess over the block is
    the call's tail, which the next compute runs beside, so only the rest slows the block. The
    transfer lasts the block + the extra either way (at least its time alone)."""
    rng = random.Random()
    transfer = Transfer("copy_engine_norm", 32)
    block = rng.uniform(0.1, 2.0)
    slowed = rng.uniform(0.001, 0.3) * block
    for alone in (rng.uniform(0.2, 0.9) * block, rng.uniform(1.1, 3.0) * block):
        tail = max(0.0, alone - block)
        extra = tail + slowed
        loss, stretch = _pair(transfer, 1 << 20, alone, (ATTENTION, block), _OnePair(extra), [])
        assert block / (1 - loss) - block == pytest.approx(slowed, rel=1e-9)  # the block's own delay
        assert alone * stretch == pytest.approx(max(alone, block + extra), rel=1e-12)
    loss, stretch = _pair(transfer, 1 << 20, 3 * block, (ATTENTION, block), _OnePair(rng.uniform(0.0, 1.5) * block), [])
    assert loss == 0 and stretch == 1  # a call alone longer than the block and its extra: its own time only


def test_the_summary_says_which_paths_were_charged_their_pairs():
    """predict's summary line on a split's transfers: the paths whose pairs the rows hold, under
    pair; auto's charge said where the rows hold none, or under another mode."""
    from overlapbench.predict.command import _transfers_said

    rng = random.Random()
    rows = [layer_row("copy_engine_norm", 32, b, 1.0, 0.1, 2.0, 0.0) for b in ROW_SIZES]
    rows += [layer_row("nccl_symm", 16, b, 1.0, 0.1, 2.0, 0.0) for b in ROW_SIZES]
    paired = [_with_pairs(r, rng.uniform(0, 0.1), rng.uniform(0, 0.1)) if r["strategy"] == "copy_engine_norm" else r
              for r in rows]
    inputs = _inputs(rng.randrange(1000))
    inputs.contention, inputs.stretch = Contention.from_rows(paired, "rows", model="llama3-70b", tp=2), PAIR
    assert _transfers_said(inputs) == ("their pairs (--transfer-beside pair), measured beside llama3-70b TP=2's layer "
                                       "for copy_engine_norm 32; other paths as --transfer-beside auto charges them")
    inputs.contention = Contention.from_rows(rows, "rows", model="llama3-70b", tp=2)
    assert _transfers_said(inputs).startswith("as --transfer-beside auto charges them: the rows hold no pair")
    inputs.stretch = AUTO
    assert _transfers_said(inputs) == "as --transfer-beside auto charges them"
