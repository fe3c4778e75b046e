"""What a sweep measures: its batches (prefill sequence lengths, and a mixed batch's decode
tokens) as the spec gives them; each batch through the stack with one strategy and one knob
setting is a `Point` (tuning/rows.py), one measurement and its row. No torch at import."""

from __future__ import annotations

from overlapbench.errors import UserError, positive_int, reject_unknown_keys, shown
from overlapbench.tuning.rows import Decode


def _mixed(batch: dict, where: str) -> tuple[tuple[int, ...], Decode]:
    """`{prefill: [lengths], decode: N, context: C}`: prefill may be empty or absent (decode only)."""
    reject_unknown_keys(batch, ("prefill", "decode", "context"), where)
    prefill = batch.get("prefill") or []
    if isinstance(prefill, int) and not isinstance(prefill, bool):
        prefill = [prefill]
    if not isinstance(prefill, list):
        raise UserError(f"{where}.prefill: must be a list of sequence lengths, got {shown(prefill)}")
    lengths = tuple(positive_int(n, f"{where}.prefill[{j}]") for j, n in enumerate(prefill))
    for name in ("decode", "context"):
        if name not in batch:
            raise UserError(f"{where}.{name}: missing; a mixed batch is {{prefill: [2048], decode: 256, context: 4096}}")
    return lengths, Decode(positive_int(batch["decode"], f"{where}.decode"), positive_int(batch["context"], f"{where}.context"))


def parse_batches(data: dict) -> tuple[tuple[tuple[int, ...], ...], tuple[Decode | None, ...]]:
    """Each batch's prefill sequence lengths, and its decode tokens (None: prefill only)."""
    batches: list[tuple[tuple[int, ...], Decode | None]] = []
    tokens = data.get("tokens", [])
    scalar = not isinstance(tokens, list)
    for i, n in enumerate([tokens] if scalar else tokens):
        batches.append(((positive_int(n, "tokens" if scalar else f"tokens[{i}]"),), None))
    raw = data.get("batches", [])
    if not isinstance(raw, list):
        raise UserError("batches: must be a list of batches, each a list of sequence lengths or {prefill, decode, context}")
    for i, batch in enumerate(raw):
        if isinstance(batch, int) and not isinstance(batch, bool):
            batch = [batch]
        if isinstance(batch, dict):
            batches.append(_mixed(batch, f"batches[{i}]"))
            continue
        if not isinstance(batch, list) or not batch:
            raise UserError(f"batches[{i}]: must be a non-empty list of sequence lengths, "
                            "or {prefill: [...], decode: N, context: C}")
        lengths = tuple(positive_int(n, f"batches[{i}][{j}]") for j, n in enumerate(batch))
        batches.append((lengths, None))
    if not batches:
        raise UserError("tokens: no batches; give 'tokens: [1024, ...]' or 'batches: [[512, 512], ...]'")
    if len(set(batches)) != len(batches):
        dup = next(b for b in batches if batches.count(b) > 1)
        shown = list(dup[0]) if dup[1] is None else {"prefill": list(dup[0]), **dup[1].as_dict()}
        raise UserError(f"tokens: the batch {shown} appears twice; remove the duplicate")
    return tuple(b for b, _ in batches), tuple(d for _, d in batches)
