"""The pieces `sweep --pieces` times: the ones the spec's plans need, each once per batch, and
each computing what the layer computes for those rows (on CPU, float32)."""

from __future__ import annotations

import json

import torch

from overlapbench.run.piece_keys import wanted_pieces
from overlapbench.run.pieces import BatchPieces
from overlapbench.specs import spec as spec_mod

SPEC = {
    "name": "pieces", "shape": {"hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2, "head_dim": 16},
    "tp": 2, "layers": 2, "dtype": "fp32", "tokens": [37],
    "strategies": {"baseline": {}, "no_comm": {}, "token_split": [{"comm": "none", "align": 1}, {"comm": "nccl", "align": 1}],
                   "iso": {"comm": "none", "split_ratio": 0.5, "align": 1}},
}


def _points(tp=2):
    return spec_mod.from_dict(SPEC | {"tp": tp}, "pieces", cuda=False).points(tp, cuda=False)


def test_each_piece_is_wanted_once_per_batch():
    wanted = wanted_pieces(_points())
    kinds = sorted(json.loads(k)["piece"] for k in wanted)
    # whole batch (no KV buffer) + token_split's 2 chunks + iso's 2 parts; mlp and norm per distinct row count
    rows = {w[1] for w in wanted.values() if w[0] == "mlp"}
    assert kinds.count("attention") == 5
    assert kinds.count("mlp") == kinds.count("norm") == len(rows)
    assert kinds.count("entry") == 1
    assert 37 in rows


def test_a_piece_computes_the_layers_rows():
    from overlapbench.model.layer import attention_partial
    from overlapbench.run.pieces import _chunk

    point = _points()[0]
    from overlapbench.distributed.runtime import Runtime

    pieces = BatchPieces(point, Runtime(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo"))
    wanted = wanted_pieces(_points())
    for piece, rows, chunk, kv in wanted.values():
        if piece != "attention" or kv:
            continue
        pieces.out.normal_()
        pieces.run(piece, rows, chunk, kv)()
        c = _chunk(chunk, point.batch, pieces.device, None)
        expected = attention_partial(pieces.stack, 0, pieces.normed[c.rows], c, pieces.rope, None)
        torch.testing.assert_close(pieces.out[c.rows], expected)
    assert pieces.x.abs().sum() > 0 and pieces.kv.k.abs().sum() > 0  # random operands, never zeros


def test_a_chain_runs_the_plan_with_its_communication_removed():
    """Each plan's chain is the real executor over the shard's stack: the pipelined chains (the
    split's and iso's lanes, norms only) compute what the serial one does."""
    from overlapbench.distributed.runtime import Runtime

    points = _points()
    rt = Runtime(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    pieces = BatchPieces(points[0], rt)
    chains = {key: what for key, what in wanted_pieces(points).items() if what[0] == "chain"}
    assert len(chains) == 3  # serial, token_split's cut, iso's parts
    outputs = [pieces.run(*what)().clone() for what in chains.values()]
    for out in outputs[1:]:
        torch.testing.assert_close(out, outputs[0], rtol=1e-4, atol=1e-4)
    assert outputs[0].abs().sum() > 0


def test_pieces_are_timed_in_the_sweeps_rounds(monkeypatch):
    """Every piece gets one sample per round, ROUNDS of them after the warm-up, and a piece that
    does more work measures slower (on CPU, by the wall clock)."""
    from overlapbench.run import pieces
    from overlapbench.timing.bench import WallClock

    monkeypatch.setattr(pieces, "WARMUP_S", 0.01)
    a, b = torch.randn(64, 64), torch.randn(256, 256)
    small, large = (lambda: a @ a), (lambda: [b @ b for _ in range(4)])
    samples = pieces.time_in_rounds([small, large], [0.01, 1.0], WallClock())
    assert [len(s) for s in samples] == [pieces.ROUNDS, pieces.ROUNDS]
    assert sorted(samples[1])[pieces.ROUNDS // 2] > sorted(samples[0])[pieces.ROUNDS // 2]


def test_chains_are_timed_each_at_its_own_clock_where_the_spec_settles(monkeypatch):
    """Where the spec settles each choice, a chain is settled before each of its CHAIN_ROUNDS spans
    (its run called more often than a span alone calls it) while the pieces keep their shared
    rounds; where it does not, the chains are timed with the pieces. On CPU, by the wall clock."""
    from overlapbench.run import pieces
    from overlapbench.specs.spec_sections import Measure
    from overlapbench.timing import interleave
    from overlapbench.timing.bench import WallClock

    monkeypatch.setattr(pieces, "WARMUP_S", 0.0)
    a, b = torch.randn(64, 64), torch.randn(128, 128)
    calls = {"piece": 0, "chain": 0}

    def counted(key, fn):
        def run():
            calls[key] += 1
            return fn()
        return run

    runs = {"piece": counted("piece", lambda: a @ a), "chain": counted("chain", lambda: [b @ b for _ in range(3)])}
    estimates = {"piece": 0.05, "chain": 0.2}
    settled = Measure(settle_ms=2.0, span_ms=1.0)
    samples = pieces.time_batch(runs, estimates, {"chain"}, pieces.own_clock(settled), WallClock())
    assert len(samples["piece"]) == pieces.ROUNDS and len(samples["chain"]) == pieces.CHAIN_ROUNDS
    per_round = interleave.settling(2.0, 0.2) + interleave.repetitions(1.0, 0.2)
    assert calls["chain"] == pieces.CHAIN_ROUNDS * per_round and per_round > interleave.repetitions(1.0, 0.2)
    assert pieces.own_clock(settled) == {"settle_ms": 2.0, "span_ms": 1.0}

    calls.update(piece=0, chain=0)
    shared = Measure(settle_ms=0.0, span_ms=1.0)
    samples = pieces.time_batch(runs, estimates, {"chain"}, pieces.own_clock(shared), WallClock())
    assert len(samples["chain"]) == len(samples["piece"]) == pieces.ROUNDS and calls["chain"] == pieces.ROUNDS
    assert pieces.own_clock(shared) is None
