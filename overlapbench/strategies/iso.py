"""`iso` (ISO): cut every prefill sequence at the same fraction; chunk 1 holds the prefixes,
chunk 2 the suffixes, whose attention reads the prefixes' keys and values (lower-right causal
mask; overlapbench/model/attention.py). The KV buffer follows chunk 1's layout, so every suffix's
prefix attention is one ragged call (model/chunks.prefix_suffix). The overlap schedule is split.py's;
only the cut lives here.

A mixed batch's decode tokens are not cut: they go whole into chunk 1, at its front, where they
are in the batch (decode tokens first), so for one prefill sequence the layout stays the batch's
own (no row permutation), and their attention over their caches lands in the chunk whose
prefill rows attend to fewer keys (chunk 2's suffixes also read the prefixes). `balanced`
counts them in chunk 1.

`split_ratio: balanced` picks the fraction that gives both chunks the same FLOPs
(overlap/balance.py, which token_split's `balanced` cut shares).
"""

from __future__ import annotations

from overlapbench.errors import UserError
from overlapbench.model.schedule import LayerPlan, SequenceParts
from overlapbench.overlap.balance import balanced_ratio
from overlapbench.overlap.comm_methods import CTA_BUDGETED, listed
from overlapbench.strategies import register
from overlapbench.strategies.base import Knob, SplitStrategy
from overlapbench.strategies.knobs import (
    AFTER_NEXT_GEMM,
    COMM,
    COPY_ENGINE_KNOBS,
    GEMM_CARVEOUT,
    NCCL_MAX_CTAS,
    REDUCE_START,
    comm_ctas,
)

ALIGN = Knob("align", int, 64, "round each sequence's cut to a multiple of this many tokens", bounds=(1, 4096))
SPLIT_RATIO = Knob(
    "split_ratio", float, "balanced",
    "fraction of every sequence in chunk 1, or 'balanced': equal FLOPs in both chunks",
    choices=("balanced",), bounds=(0.05, 0.95),
)


def cuts(seq_lens: tuple[int, ...], ratio: float, align: int) -> list[int]:
    """Prefix length of each sequence: ratio * length rounded to `align`, kept inside (0, length)
    (unaligned where alignment cannot); a 1-token sequence stays whole in chunk 1."""
    out = []
    for n in seq_lens:
        if n < 2:
            out.append(n)
            continue
        c = round(ratio * n / align) * align
        if not 0 < c < n:
            c = min(max(round(ratio * n), 1), n - 1)
        out.append(c)
    return out


@register
class Iso(SplitStrategy):
    name = "iso"
    simplicity = 30
    summary = ("ISO: every sequence cut in two chunks; chunk 2 attends to chunk 1's KV; "
               "one chunk's all-reduce overlaps the other's compute")
    knobs = (SPLIT_RATIO, ALIGN, COMM, comm_ctas("comm_ctas", f"(comm={listed(CTA_BUDGETED)})"), NCCL_MAX_CTAS, GEMM_CARVEOUT,
             REDUCE_START, *COPY_ENGINE_KNOBS)

    cta_knobs = ("comm_ctas",)

    @classmethod
    def plan(cls, knobs, batch):
        if not batch.seq_lens:
            raise UserError("iso: cuts prefill sequences, and this batch has none (decode tokens only); use token_split")
        if batch.tokens < 2:
            raise UserError("iso: a single token cannot be split")
        ratio = knobs["split_ratio"]
        if ratio == "balanced":
            ratio = balanced_ratio(batch.shape, batch.tp, batch.seq_lens, batch.decode)
        prefixes = tuple(cuts(batch.seq_lens, ratio, knobs["align"]))
        first = batch.decode[0] + sum(prefixes)
        parts = (SequenceParts(prefixes, 0, first), SequenceParts(prefixes, 1, batch.tokens - first))
        return LayerPlan(parts, *cls.transfers(knobs, knobs["comm_ctas"], knobs["comm_ctas"]), pipelined=True)

    @classmethod
    def build(cls, ctx, knobs):
        from overlapbench.model.chunks import layout
        from overlapbench.overlap.comm_methods import for_split
        from overlapbench.overlap.split import SplitPlan, split_step

        parts, order = layout(cls.plan(knobs, ctx.batch).chunks, ctx.seq_lens, ctx.runtime.device, ctx.decode)
        cta = {"comm_ctas_attn": knobs["comm_ctas"], "comm_ctas_mlp": knobs["comm_ctas"]}
        plan = SplitPlan(parts, order, knobs.get("gemm_carveout", 0), knobs.get("reduce_start") == AFTER_NEXT_GEMM)
        return split_step(ctx, plan, for_split(ctx, knobs | cta))
