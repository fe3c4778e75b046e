"""What a compute piece is called (`sweep --pieces` writes it, `predict` looks it up), and which
pieces a spec's points need: free of torch, so `predict` runs anywhere."""

from __future__ import annotations

import json

from overlapbench import strategies
from overlapbench.model.schedule import Batch, LayerPlan, Rows, SequenceParts

WORKLOAD = "piece"


def chunk_key(chunk: Rows | SequenceParts) -> dict:
    if isinstance(chunk, Rows):
        return {"rows": [chunk.begin, chunk.end]}
    return {"prefixes": list(chunk.prefixes), "part": chunk.part}


def piece_key(piece: str, rows: int, chunk: Rows | SequenceParts | None = None, kv: bool = False) -> str:
    """A piece's identity within a batch: what `predict` looks up."""
    what = {"piece": piece, "rows": rows}
    if piece == "attention":
        what |= {"chunk": chunk_key(chunk), "kv": kv}
    return json.dumps(what, sort_keys=True)


def chain_key(plan: LayerPlan, tokens: int, layers: int) -> str:
    """The whole stack of a plan with its communication removed (its compute and norms on their
    lanes), timed in context: what the isolated pieces are scaled to (estimate.py)."""
    return json.dumps({"piece": "chain", "rows": tokens, "layers": layers, "pipelined": plan.pipelined,
                       "chunks": [chunk_key(c) for c in plan.chunks]}, sort_keys=True)


def batch_of(point) -> Batch:
    return Batch.of(point.batch, point.decode, point.shape, point.tp)


def wanted_pieces(points) -> dict[str, tuple]:
    """piece key -> (piece, rows, chunk, kv) over the plans of the points of one batch (a chain:
    ('chain', tokens, the plan's chunks, whether it pipelines))."""
    wanted: dict[str, tuple] = {}
    for point in points:
        plan = strategies.get(point.strategy).plan(point.knobs, batch_of(point))
        if plan is None:
            continue
        for chunk in plan.chunks:
            wanted.setdefault(piece_key("attention", chunk.size, chunk, plan.pipelined),
                              ("attention", chunk.size, chunk, plan.pipelined))
            for piece in ("mlp", "norm"):
                wanted.setdefault(piece_key(piece, chunk.size), (piece, chunk.size, None, False))
        wanted.setdefault(chain_key(plan, point.tokens, point.layers), ("chain", point.tokens, plan.chunks, plan.pipelined))
    tokens = points[0].tokens
    wanted.setdefault(piece_key("entry", tokens), ("entry", tokens, None, False))
    return wanted
