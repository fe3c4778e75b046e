"""`token_split` (TokenWeave): cut the flattened batch once; each half's reduction hides under
the other half's compute. Only the cuts live here; the schedule is in split.py.

Where to cut: TokenWeave's aligned half-way point (plus `split_offset`), a fraction of the tokens
(`split_ratio`), or `balanced`: equal FLOPs per chunk, causal attention counted
(overlap/balance.py), which moves the cut past the middle of a long prompt. `chunks` > 2
cuts the batch in that many pieces (equal tokens, or equal FLOPs with `balanced`): each chunk's
reduction then hides under the next chunk's compute, and the stack's exposed tail (the last
chunk's MLP reduction) is 1/chunks of the batch.
"""

from __future__ import annotations

import math

from overlapbench.errors import UserError
from overlapbench.model.schedule import Batch, LayerPlan, Rows
from overlapbench.overlap.balance import balanced_rows
from overlapbench.overlap.comm_methods import CTA_BUDGETED, listed
from overlapbench.strategies import register
from overlapbench.strategies.base import Knob, SplitStrategy
from overlapbench.strategies.knobs import (
    AFTER_NEXT_GEMM,
    ALIGN,
    CHUNKS,
    COMM,
    COPY_ENGINE_KNOBS,
    GEMM_CARVEOUT,
    NCCL_MAX_CTAS,
    REDUCE_START,
    comm_ctas,
)


def split_point(tokens: int, align: int, offset: int = 0, ratio: float | None = None) -> int:
    """Rows of the first half.

    Default (TokenWeave): round tokens up to a multiple of `align`, halve, add `offset`.
    With `ratio`: ratio * tokens rounded to a multiple of `align`. Either way the cut must
    leave both halves non-empty; where alignment cannot, the unaligned cut is used.
    """
    if tokens < 2:
        raise UserError(f"token_split: {tokens} token(s) cannot be split in two")
    if ratio is None:
        cut = math.ceil(tokens / align) * align // 2 + offset
        if not 0 < cut < tokens:
            cut = tokens // 2 + offset
    else:
        cut = round(ratio * tokens / align) * align
        if not 0 < cut < tokens:
            cut = min(max(round(ratio * tokens), 1), tokens - 1)
    if not 0 < cut < tokens:
        raise UserError(f"token_split: the cut at {cut} leaves a half empty for {tokens} tokens; use a smaller split_offset")
    return cut


def aligned_cuts(tokens: int, align: int, targets: list[float]) -> list[int]:
    """The rows where each chunk ends but the last: every target rounded to a multiple of
    `align`, or, where that would leave a chunk empty, to the nearest row, moved just enough to
    keep every chunk non-empty."""
    if tokens < len(targets) + 1:
        raise UserError(f"token_split: {tokens} token(s) cannot be cut into {len(targets) + 1} chunks; use fewer chunks")
    cuts = [round(t / align) * align for t in targets]
    if all(lo < hi for lo, hi in zip([0, *cuts], [*cuts, tokens])):
        return cuts
    cuts, last = [], 0
    for k, t in enumerate(targets):
        last = min(max(round(t), last + 1), tokens - (len(targets) - k))
        cuts.append(last)
    return cuts


def cut_rows(batch: Batch, knobs: dict) -> list[int]:
    """The rows where each chunk but the last ends, in the flattened batch."""
    tokens, chunks, ratio = batch.tokens, knobs.get("chunks", CHUNKS.default), knobs["split_ratio"]
    if ratio == "balanced":
        return aligned_cuts(tokens, knobs["align"], balanced_rows(batch.shape, batch.tp, batch.seq_lens, batch.decode, chunks))
    if chunks == 2:
        return [split_point(tokens, knobs["align"], knobs["split_offset"], ratio)]
    return aligned_cuts(tokens, knobs["align"], [tokens * k / chunks for k in range(1, chunks)])


@register
class TokenSplit(SplitStrategy):
    name = "token_split"
    simplicity = 20
    summary = ("TokenWeave: the batch's tokens cut in two (or `chunks` pieces); each chunk's all-reduce+norm "
               "overlaps the next chunk's compute")
    knobs = (
        ALIGN,
        Knob("split_offset", int, 0, "tokens added to the aligned half-way cut", bounds=(-16384, 16384)),
        Knob("split_ratio", float, None,
             "cut at this fraction of the tokens instead (alternative to split_offset), or 'balanced': "
             "equal FLOPs in every chunk, causal attention counted (with chunks > 2: the only alternative "
             "to equal tokens)",
             choices=("balanced",), bounds=(0.05, 0.95), optional=True),
        COMM,
        comm_ctas("comm_ctas_attn", f"after attention (comm={listed(CTA_BUDGETED)})"),
        comm_ctas("comm_ctas_mlp", f"after the MLP (comm={listed(CTA_BUDGETED)})"),
        NCCL_MAX_CTAS,
        CHUNKS,
        GEMM_CARVEOUT,
        REDUCE_START,
        *COPY_ENGINE_KNOBS,
    )

    cta_knobs = ("comm_ctas_attn", "comm_ctas_mlp")

    @classmethod
    def check_combination(cls, knobs, where):
        ratio, offset = knobs["split_ratio"], knobs["split_offset"]
        if ratio is not None and offset != 0:
            raise UserError(f"{where}: split_ratio and split_offset are alternatives; set one of them")
        if knobs["chunks"] > 2 and offset != 0:
            raise UserError(f"{where}: split_offset moves the one cut of 2 chunks; with chunks > 2 leave it out")
        if knobs["chunks"] > 2 and ratio not in (None, "balanced"):
            raise UserError(f"{where}: a split_ratio fraction makes 2 chunks; with chunks > 2 use "
                            f"split_ratio: balanced or leave it out (equal tokens)")
        super().check_combination(knobs, where)

    @classmethod
    def plan(cls, knobs, batch):
        ends = [0, *cut_rows(batch, knobs), batch.tokens]
        return LayerPlan(tuple(Rows(lo, hi) for lo, hi in zip(ends, ends[1:])),
                         *cls.transfers(knobs, knobs["comm_ctas_attn"], knobs["comm_ctas_mlp"]), pipelined=True)

    @classmethod
    def build(cls, ctx, knobs):
        from overlapbench.model.chunks import layout
        from overlapbench.overlap.comm_methods import for_split
        from overlapbench.overlap.split import SplitPlan, split_step

        # rows of the flattened batch: the decode tokens, then the sequences
        chunks, _ = layout(cls.plan(knobs, ctx.batch).chunks, ctx.seq_lens, ctx.runtime.device, ctx.decode)
        plan = SplitPlan(chunks, gemm_carveout=knobs.get("gemm_carveout", 0),
                         after_next_gemm=knobs.get("reduce_start") == AFTER_NEXT_GEMM)
        return split_step(ctx, plan, for_split(ctx, knobs))
