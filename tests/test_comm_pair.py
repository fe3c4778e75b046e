"""The pair window of `comm --beside-layer` (comm/pair.py): each round's pair with the call less the
same pair with the chain's add + norm in its place, per block, the row fields made of them, and the
interleaved rounds on a simulated device whose clock drifts, where the paired extra comes out as
set. Random inputs; the GPU path (five captured graphs on two ranks) is
tests/test_comm_beside_layer_gpu.py."""

from __future__ import annotations

import random
import statistics

import pytest

from overlapbench.comm.in_layer import MIN_ROUNDS, SPAN_MS  # the pair window's rounds are the in-layer term's
from overlapbench.comm.pair import (
    ATTENTION,
    BLOCKS,
    FIELDS,
    GRAPHS,
    MLP,
    Pairs,
    extra_field,
    time_pairs,
)
from overlapbench.timing.interleave import Timed, repetitions
from tests.test_comm_in_layer import _trimmed_mean
from tests.test_interleave import DriftingDevice


def _rounds(rng: random.Random, n: int) -> tuple[dict[str, list[float]], dict[str, list[float]], list[float]]:
    """n rounds: per block, (the pairs with the call, with the add + norm) with a known extra in each; the call alone."""
    pairs, extras = {}, {}
    for block in BLOCKS:
        norm = [rng.uniform(0.1, 20) for _ in range(n)]
        extras[block] = [rng.uniform(-0.02, 0.4) for _ in range(n)]
        pairs[block] = ([a + e for a, e in zip(norm, extras[block])], norm)
    return pairs, extras, [rng.uniform(0.05, 3) for _ in range(n)]


def _made(pairs, ops, replays: int = 1, graphs: bool = True) -> Pairs:
    return Pairs(*map(tuple, (*pairs[ATTENTION], *pairs[MLP], ops)), replays=replays, graphs=graphs)


def test_each_round_gives_the_pair_less_the_pair_with_the_add_and_norm_and_the_fields_hold_them():
    rng = random.Random()
    n = rng.randrange(1, 40)
    pairs, extras, ops = _rounds(rng, n)
    found = _made(pairs, ops, rng.randrange(1, 30), rng.random() < 0.5)
    fields = found.fields()
    assert set(fields) == set(FIELDS)
    for block in BLOCKS:
        assert found.extras(block) == pytest.approx(extras[block])
        assert fields[extra_field(block)] == pytest.approx(_trimmed_mean(extras[block]))
        assert fields[f"pair_{block}_extra_samples_ms"] == pytest.approx(extras[block], abs=1e-6)
        lo, hi = fields[f"pair_{block}_extra_ci_ms"]
        assert lo <= fields[extra_field(block)] <= hi and (n < 3 or lo < hi)
        assert fields[f"pair_{block}_ms"] == statistics.median(pairs[block][0])
        assert fields[f"pair_{block}_norm_ms"] == statistics.median(pairs[block][1])
    assert fields["pair_op_ms"] == statistics.median(ops)
    assert (fields["pair_rounds"], fields["pair_replays"], fields["pair_graphs"]) == (n, found.replays, found.graphs)


def test_rounds_are_paired_by_their_ids_and_only_those_all_five_took_part_in():
    rng = random.Random()
    ids = sorted(rng.sample(range(100), 14))
    pairs, extras, ops = _rounds(rng, 14)
    series = [pairs[ATTENTION][0], pairs[ATTENTION][1], pairs[MLP][0], pairs[MLP][1], ops]
    dropped = rng.sample(range(14), 5)  # a round missing from each graph's samples
    timed = []
    for which, values in enumerate(series):
        keep = [k for k in range(14) if k != dropped[which]]
        rng.shuffle(keep)  # out of order: pairing goes by id
        timed.append(Timed([values[k] for k in keep], [ids[k] for k in keep], len(keep)))
    found = Pairs.from_rounds(timed, replays=2, graphs=True)
    common = [k for k in range(14) if k not in dropped]
    for block in BLOCKS:
        assert found.extras(block) == pytest.approx([extras[block][k] for k in common])
    assert found.op_ms == tuple(ops[k] for k in common)


@pytest.mark.parametrize("lengths", [(0, 0, 0, 0, 0), (3, 3, 2, 3, 3), (4, 4, 4, 4, 5)])
def test_rounds_of_unequal_counts_or_none_are_refused(lengths):
    rng = random.Random()
    with pytest.raises(ValueError, match="pair rounds"):
        Pairs(*(tuple(rng.uniform(1, 2) for _ in range(n)) for n in lengths), replays=1, graphs=True)


@pytest.mark.parametrize("drift", [0.05, -0.05])
def test_interleaved_rounds_recover_each_blocks_extra_on_a_drifting_device(drift):
    """The clock drifts by 5% a second; the two pairs of a block meet the same clock in a round, so
    each block's extra comes out as set, and every graph is replayed as often."""
    rng = random.Random()
    attention, mlp = rng.uniform(1, 4), rng.uniform(3, 9)
    extra = {ATTENTION: rng.uniform(0.02, 0.2), MLP: rng.uniform(0.02, 0.2)}
    device = DriftingDevice(drift, noise=0.001, seed=rng.randrange(1000))
    runs = [device.candidate("pair_attention", attention + extra[ATTENTION]), device.candidate("norm_attention", attention),
            device.candidate("pair_mlp", mlp + extra[MLP]), device.candidate("norm_mlp", mlp),
            device.candidate("op", rng.uniform(0.1, 1))]
    iters = rng.randrange(1, 25)
    found = time_pairs(runs, mlp + extra[MLP], iters, device).fields()
    assert found["pair_rounds"] == max(iters, MIN_ROUNDS)
    assert found["pair_replays"] == repetitions(SPAN_MS, mlp + extra[MLP])
    for block in BLOCKS:
        assert found[extra_field(block)] == pytest.approx(extra[block], abs=0.03)
    replayed = [name for kind, name in device.log if kind == "run"]
    assert len({replayed.count(name) for name in GRAPHS}) == 1
