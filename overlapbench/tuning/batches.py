"""What a measured batch is made of, as tune and report read it: its prefill sequence lengths and,
for a mixed batch, its decode tokens (tokens, context), and the depth of the stack it went through.
Batches of equal size but different make-up are different workloads, as is one batch at two
depths, so rows are split by composition before any comparison. No torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar


class Composed(Protocol):
    """A measured row as far as its batch goes (analysis.Measured)."""

    tokens: int
    batch: tuple[int, ...]  # prefill sequence lengths
    decode: tuple[int, int] | None  # decode (tokens, context)
    layers: int | None  # the stack's depth
    depth_named: bool  # named in text: the rows' group holds several depths

    @property
    def composition(self) -> tuple: ...


M = TypeVar("M", bound=Composed)


def decode_of(row: dict) -> tuple[int, int] | None:
    """A row's decode tokens as (tokens, context); None for prefill-only batches and older rows."""
    decode = row.get("decode")
    return (int(decode["tokens"]), int(decode["context"])) if decode else None


def by_batch(rows: Iterable[M]) -> dict[tuple, list[M]]:
    """Rows at one token count split by batch composition: different batches of equal size (one
    sequence of 8192 tokens, two of 4096, or 7936 prefill tokens and 256 decode tokens) are
    different workloads, never compared with each other; so is one batch through stacks of
    different depths. Prefill-only batches first, each batch's depths in order."""
    out: dict[tuple, list[M]] = {}
    for m in rows:
        out.setdefault(m.composition, []).append(m)
    order = lambda item: (item[0][1] is not None, len(item[0][0]), item[0][0], item[0][1] or (0, 0), item[0][2] or 0)
    return dict(sorted(out.items(), key=order))


def depth_text(m: Composed) -> str:
    """` (8 layers)` where the rows' group holds several depths, else nothing."""
    return f" ({m.layers} layers)" if m.depth_named and m.layers is not None else ""


def batch_text(m: Composed) -> str:
    """The composition in words: `[2048]`, `[2048]+256 decode@4096`, `[2048] (8 layers)`."""
    decode = f"+{m.decode[0]} decode@{m.decode[1]}" if m.decode else ""
    return f"{list(m.batch)}{decode}{depth_text(m)}"


def batch_label(m: Composed) -> str:
    """A point's name in tables: the token count, with the composition where that is not one
    sequence, and the depth where the group holds several: `16384 (8 layers)`."""
    if len(m.batch) == 1 and m.decode is None:
        return f"{m.tokens}{depth_text(m)}"
    return f"{m.tokens} {batch_text(m)}"
