"""`token_split` (TokenWeave): cut the flattened batch once; each half's reduction hides under
the other half's compute. Only the cut lives here; the schedule is in split.py."""

from __future__ import annotations

import math

from overlapbench.errors import UserError
from overlapbench.knobs import ALIGN, COMM, NCCL_MAX_CTAS, comm_ctas
from overlapbench.strategies import register
from overlapbench.strategies.base import Knob, SplitStrategy


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


@register
class TokenSplit(SplitStrategy):
    name = "token_split"
    simplicity = 20
    summary = "TokenWeave: the batch's tokens cut in two; each half's all-reduce+norm overlaps the other half's compute"
    knobs = (
        ALIGN,
        Knob("split_offset", int, 0, "tokens added to the aligned half-way cut", bounds=(-16384, 16384)),
        Knob("split_ratio", float, None, "cut at this fraction of the tokens instead (alternative to split_offset)",
             bounds=(0.05, 0.95), optional=True),
        COMM,
        comm_ctas("comm_ctas_attn", "after attention (comm=fused, copy_engine or nccl_symm)"),
        comm_ctas("comm_ctas_mlp", "after the MLP (comm=fused, copy_engine or nccl_symm)"),
        NCCL_MAX_CTAS,
    )

    cta_knobs = ("comm_ctas_attn", "comm_ctas_mlp")

    @classmethod
    def check_combination(cls, knobs, where):
        if knobs["split_ratio"] is not None and knobs["split_offset"] != 0:
            raise UserError(f"{where}: split_ratio and split_offset are alternatives; set one of them")
        super().check_combination(knobs, where)

    @classmethod
    def build(cls, ctx, knobs):
        from overlapbench.chunks import token_range
        from overlapbench.overlap import reducers
        from overlapbench.overlap.split import SplitPlan, split_step

        tokens, device = ctx.tokens, ctx.runtime.device
        cut = split_point(tokens, knobs["align"], knobs["split_offset"], knobs["split_ratio"])
        seq_lens, decode = ctx.seq_lens, ctx.decode  # rows: the decode tokens, then the sequences
        plan = SplitPlan(token_range(seq_lens, 0, cut, device, decode), token_range(seq_lens, cut, tokens, device, decode))
        return split_step(ctx, plan, reducers.for_split(ctx, knobs))
