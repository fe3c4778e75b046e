"""token_split's long-prompt knobs: `split_ratio: balanced` (equal FLOPs per chunk,
causal attention counted) and `chunks` > 2 (the split schedule pipelined over N chunks).

The cuts are checked against a row-by-row count of the FLOPs, the chunks against the layout they
must cover, and the forward against the single-process reference on gloo: odd token counts,
several sequences, decode tokens, 2 and 4 ranks; and a schedule that drops a chunk's reduction
is caught."""

from __future__ import annotations

import pytest
import torch

from overlapbench import strategies
from overlapbench.errors import UserError
from overlapbench.model import flops
from overlapbench.model.chunks import build_decode_cache, rope_positions, token_range
from overlapbench.model.layer import reference_forward
from overlapbench.model.models import PRESETS, ModelShape, preset
from overlapbench.overlap.balance import balanced_ratio, balanced_rows, layer_flops, leading_flops
from overlapbench.strategies.token_split import aligned_cuts, split_point
from tests import distributed

SHAPE = PRESETS["tiny"]
WIDE = ModelShape(hidden=64, ffn=128, heads=8, kv_heads=4, head_dim=8)  # divisible by tp=4
LAYERS = 2
TOKEN_SPLIT = strategies.get("token_split")


def _row_costs(shape: ModelShape, tp: int, seq_lens: tuple[int, ...], decode: tuple[int, int]) -> list[int]:
    """Each row's FLOPs, one by one: a decode row's context + 1 keys, a prefill row's p + 1."""
    g, a = layer_flops(shape, tp)
    rows = [g + a * (decode[1] + 1)] * decode[0]
    for n in seq_lens:
        rows += [g + a * (p + 1) for p in range(n)]
    return rows


BATCHES = [((37,), (0, 0)), ((24, 13, 5), (0, 0)), ((29,), (7, 40)), ((3, 61, 1), (5, 9)), ((1,), (9, 300))]


@pytest.mark.parametrize("seq_lens, decode", BATCHES)
def test_leading_flops_add_the_rows_and_the_whole_is_the_layers(seq_lens, decode):
    costs = _row_costs(SHAPE, 2, seq_lens, decode)
    for rows in range(len(costs) + 1):
        assert leading_flops(SHAPE, 2, seq_lens, decode, rows) == sum(costs[:rows])
    assert sum(costs) == flops.layer_flops(SHAPE, 2, seq_lens, decode if decode[0] else None)


@pytest.mark.parametrize("chunks", [2, 3, 4, 7])
@pytest.mark.parametrize("seq_lens, decode", BATCHES)
def test_balanced_rows_are_the_nearest_to_equal_flops(seq_lens, decode, chunks):
    costs = _row_costs(SHAPE, 2, seq_lens, decode)
    whole, prefix = sum(costs), [sum(costs[:r]) for r in range(len(costs) + 1)]
    cuts = balanced_rows(SHAPE, 2, seq_lens, decode, chunks)
    assert len(cuts) == chunks - 1
    for k, cut in enumerate(cuts, start=1):
        target = whole * k / chunks
        best = min(abs(p - target) for p in prefix)
        assert abs(prefix[cut] - target) == best, (k, cut)


def test_a_balanced_cut_of_one_long_prompt_is_isos_and_past_the_middle():
    """One sequence: token_split's balanced cut is iso's (the same cost model); at 32K tokens of
    llama3-70b (TP=2) it moves 1545 rows past the middle, and the second half's attention pairs
    are 3x the first's."""
    shape = preset("llama3-70b")
    for tokens in (2048, 32768, 65536):
        (cut,) = balanced_rows(shape, 2, (tokens,), (0, 0), 2)
        assert abs(cut - balanced_ratio(shape, 2, (tokens,)) * tokens) <= 1
    assert balanced_rows(shape, 2, (32768,), (0, 0), 2) == [18313]
    first, second = flops.segment_pairs(0, 16384), flops.segment_pairs(16384, 16384)
    assert abs(second / first - 3) < 1e-3


@pytest.mark.parametrize("tokens, align, targets", [(37, 8, [12.3, 24.6]), (1001, 64, [250.0, 500.5, 750.75]),
                                                    (5, 256, [1.2, 2.5, 3.9]), (4, 1, [0.2, 0.4, 3.9])])
def test_aligned_cuts_leave_no_chunk_empty(tokens, align, targets):
    cuts = aligned_cuts(tokens, align, targets)
    ends = [0, *cuts, tokens]
    assert all(lo < hi for lo, hi in zip(ends, ends[1:])), cuts
    rounded = [0, *[round(t / align) * align for t in targets], tokens]
    if all(lo < hi for lo, hi in zip(rounded, rounded[1:])):
        assert cuts == rounded[1:-1]
    else:  # unaligned: each cut as near its target as the others allow
        assert all(abs(c - t) <= len(targets) for c, t in zip(cuts, targets))


def test_too_few_tokens_for_the_chunks_is_a_user_error():
    with pytest.raises(UserError, match="3 token.*4 chunks"):
        aligned_cuts(3, 1, [0.75, 1.5, 2.25])


def _cuts(knobs: dict, seq_lens, decode=None, shape=SHAPE) -> list[int]:
    """The cuts of the strategy's own plan (what build runs and predict simulates)."""
    from overlapbench.model.schedule import Batch

    mixed = (0, 0) if decode is None else (decode.tokens, decode.context)
    plan = TOKEN_SPLIT.plan(TOKEN_SPLIT.check_knobs(knobs, "token_split"), Batch(tuple(seq_lens), mixed, shape, 2))
    return [c.end for c in plan.chunks[:-1]]


def test_two_chunks_cut_where_they_always_did():
    for tokens in (2, 37, 1000, 32768):
        assert _cuts({}, (tokens,)) == [split_point(tokens, 256)]
        assert _cuts({"split_ratio": 0.3, "align": 8}, (tokens,)) == [split_point(tokens, 8, 0, 0.3)]
        if tokens > 2:
            assert _cuts({"split_offset": 1, "align": 1}, (tokens,)) == [split_point(tokens, 1, 1)]


def test_more_chunks_cut_equal_tokens_or_equal_flops():
    assert _cuts({"chunks": 4, "align": 1}, (37,)) == [9, 18, 28]
    assert _cuts({"chunks": 4, "align": 64}, (32768,)) == [8192, 16384, 24576]
    balanced = _cuts({"chunks": 4, "align": 1, "split_ratio": "balanced"}, (24, 13, 5))
    assert balanced == balanced_rows(SHAPE, 2, (24, 13, 5), (0, 0), 4)
    # llama3-70b at 32K: FLOPs quarters at rows 9836, 18313, 25876, rounded to 256
    llama = preset("llama3-70b")
    assert _cuts({"chunks": 4, "align": 256, "split_ratio": "balanced"}, (32768,), shape=llama) == [9728, 18432, 25856]


def test_the_chunks_knob_is_sparse_and_its_alternatives_are_refused():
    assert "chunks" not in TOKEN_SPLIT.check_knobs({}, "token_split")
    assert "chunks" not in TOKEN_SPLIT.check_knobs({"chunks": 2}, "token_split")
    assert TOKEN_SPLIT.check_knobs({"chunks": 3}, "token_split")["chunks"] == 3
    assert TOKEN_SPLIT.check_knobs({"split_ratio": "balanced"}, "token_split")["split_ratio"] == "balanced"
    with pytest.raises(UserError, match="chunks > 2"):
        TOKEN_SPLIT.check_knobs({"chunks": 3, "split_ratio": 0.3}, "t")
    with pytest.raises(UserError, match="chunks > 2"):
        TOKEN_SPLIT.check_knobs({"chunks": 3, "split_offset": 8}, "t")
    with pytest.raises(UserError, match="chunks"):
        TOKEN_SPLIT.check_knobs({"chunks": 1}, "t")
    with pytest.raises(UserError, match="split_ratio"):
        TOKEN_SPLIT.check_knobs({"split_ratio": "halves"}, "t")


def test_the_chunks_cover_every_row_once_and_continue_their_sequences():
    seq_lens = (24, 13, 5)
    starts = {0: 0, 24: 1, 37: 2}  # a sequence's KV-buffer row -> the sequence
    ends = [0, *_cuts({"chunks": 5, "align": 1}, seq_lens), sum(seq_lens)]
    seen = []
    for lo, hi in zip(ends, ends[1:]):
        chunk = token_range(seq_lens, lo, hi, "cpu")
        assert (chunk.begin, chunk.end) == (lo, hi)
        for s in chunk.segments:
            seen += [(starts[s.kv_row], p) for p in range(s.start, s.start + s.length)]
            assert s.seq_len == seq_lens[starts[s.kv_row]]
    assert seen == [(i, p) for i, n in enumerate(seq_lens) for p in range(n)]  # in order: each chunk continues


def test_a_plan_with_a_gap_or_one_chunk_is_refused():
    from overlapbench.overlap.split import SplitPlan

    with pytest.raises(ValueError, match="back to back"):
        SplitPlan((token_range((10,), 0, 4, "cpu"), token_range((10,), 5, 10, "cpu")))
    with pytest.raises(ValueError, match="2 or more"):
        SplitPlan((token_range((10,), 0, 10, "cpu"),))


# ---------------------------------------------------------------------------------------------
# The forward on gloo against the single-process reference


def _rank_forward(rank, world, knobs, seq_lens, decode, shape, drop_chunk):
    from overlapbench.distributed import runtime
    from overlapbench.model.rope import RopeTable
    from overlapbench.model.weights import build_stack, random_input
    from overlapbench.overlap.split import SplitForward
    from overlapbench.timing.step import BuildContext

    if drop_chunk is not None:  # a wrong schedule: one chunk's reductions never run
        reduce = SplitForward._reduce

        def dropping(self, task, partial):
            if task.chunk != drop_chunk:
                reduce(self, task, partial)
            else:  # what a 2-chunk loop left over: the rows normed without their reduction
                self.normed[self.plan.chunks[task.chunk].rows] = partial
        SplitForward._reduce = dropping
    rt = runtime.init(timeout_s=60)
    stack = build_stack(shape, LAYERS, world, rank, torch.float32, rt.device, 0)
    cache = build_decode_cache(shape, LAYERS, world, rank, *decode, torch.float32, rt.device, 0) if decode[0] else None
    tokens = sum(seq_lens) + decode[0]
    ctx = BuildContext(rt, stack, seq_lens, RopeTable(shape, rope_positions(seq_lens, cache), rt.device), tokens, cache)
    step = TOKEN_SPLIT.build(ctx, TOKEN_SPLIT.check_knobs(knobs, "token_split"))
    x = random_input(tokens, shape.hidden, 0, torch.float32, rt.device)
    first = step.to_full(step.forward(x)).clone()
    second = step.to_full(step.forward(x)).clone()  # re-runnable (graphs replay it)
    return first, second, len(step.forward.plan.chunks) if hasattr(step.forward, "plan") else None


def _errors(knobs, seq_lens, decode=(0, 0), shape=SHAPE, world=2, drop_chunk=None) -> list[float]:
    ref = reference_forward(shape, LAYERS, world, seq_lens, seed=0, decode=decode if decode[0] else None)
    errs = []
    for first, second, _ in distributed.run(_rank_forward, knobs, seq_lens, decode, shape, drop_chunk, world=world):
        errs += [(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item() for out in (first, second)]
    return errs


CASES = [
    ({"chunks": 3, "align": 1}, (37,), (0, 0), 2),  # odd tokens, cuts inside one sequence
    ({"chunks": 4, "align": 8}, (24, 13, 5), (0, 0), 2),  # several sequences, cuts at their seams and inside
    ({"chunks": 5, "align": 1, "split_ratio": "balanced"}, (29, 14), (0, 0), 2),
    ({"split_ratio": "balanced", "align": 1}, (61,), (0, 0), 2),  # 2 chunks, balanced cut past the middle
    ({"chunks": 3, "align": 1}, (29,), (7, 40), 2),  # decode tokens: the first cut among them
    ({"chunks": 4, "align": 1, "split_ratio": "balanced"}, (3, 19), (9, 20), 2),
    ({"chunks": 3, "align": 4, "split_ratio": "balanced"}, (29, 14), (0, 0), 4),
    ({"chunks": 4, "align": 1}, (23,), (6, 12), 4),
]


@pytest.mark.slow
@pytest.mark.parametrize("knobs, seq_lens, decode, world", CASES)
def test_more_chunks_and_balanced_cuts_match_the_reference(knobs, seq_lens, decode, world):
    shape = WIDE if world == 4 else SHAPE
    for err in _errors(knobs, seq_lens, decode, shape, world):
        assert err < 1e-5, f"token_split {knobs} {seq_lens} + {decode} on {world}: rel err {err:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("knobs, seq_lens, decode, shape", [
    ({"chunks": 3, "align": 1}, (), (13, 21), SHAPE),  # decode tokens only: every cut among them
    ({"chunks": 4, "align": 1, "split_ratio": "balanced"}, (37,), (11, 23), PRESETS["tiny-moe"]),  # experts' FLOPs
])
def test_more_chunks_of_decode_tokens_and_of_a_moe_stack(knobs, seq_lens, decode, shape):
    for err in _errors(knobs, seq_lens, decode, shape):
        assert err < 1e-4, f"token_split {knobs} {seq_lens} + {decode}: rel err {err:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("drop_chunk", [2, 3])
def test_a_schedule_that_drops_a_chunks_reduction_is_caught(drop_chunk):
    """The check can fail: a schedule that reduces only the first two chunks (a two-chunk loop
    over more chunks) is far from the reference."""
    errs = _errors({"chunks": 4, "align": 1}, (24, 13, 5), drop_chunk=drop_chunk)
    assert min(errs) > 1e-3, errs
