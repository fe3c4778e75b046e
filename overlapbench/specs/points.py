"""What a sweep measures: its batches (prefill sequence lengths, and a mixed batch's decode
tokens) as the spec gives them, and `Point`, one measurement: a batch through the stack with one
strategy and one knob setting. No torch at import."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from overlapbench.errors import UserError, reject_unknown_keys, shown
from overlapbench.model import models
from overlapbench.specs.spec_sections import positive_int


@dataclass(frozen=True)
class Gemm:
    """The GEMM of a micro workload: [M, K] @ [K, N], M being the tokens."""

    n: int
    k: int


@dataclass(frozen=True)
class Decode:
    """A mixed batch's decode tokens: `tokens` sequences, each decoding its next token after
    `context` cached ones."""

    tokens: int
    context: int

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Point:
    """One measurement: a batch through the stack with one strategy and one knob setting."""

    spec: str
    model: str
    shape: models.ModelShape
    tp: int
    dtype: str
    layers: int
    seed: int
    batch: tuple[int, ...]
    strategy: str
    knobs: dict
    workload: str = "layer"
    gemm: Gemm | None = None  # a micro workload's N and K
    decode: Decode | None = None  # a mixed batch's decode tokens (`batch`: its prefill sequences)

    @property
    def tokens(self) -> int:
        return sum(self.batch) + (self.decode.tokens if self.decode else 0)

    @property
    def workload_key(self) -> tuple:
        """Points sharing this key share weights, inputs and the baseline's reference output."""
        return (self.workload, self.gemm, self.shape, self.tp, self.dtype, self.layers, self.seed, self.batch,
                self.decode)

    def key(self) -> str:
        """Identity of the point in a results file (what `--resume` matches on)."""
        return json.dumps(
            {
                "workload": self.workload,
                **({"gemm": {"n": self.gemm.n, "k": self.gemm.k}} if self.gemm else {}),
                "shape": self.shape.as_dict(),
                "tp": self.tp,
                "dtype": self.dtype,
                "layers": self.layers,
                "seed": self.seed,
                "batch": list(self.batch),
                # only mixed batches carry it, so the keys of prefill-only points stay as they were
                **({"decode": self.decode.as_dict()} if self.decode else {}),
                "strategy": self.strategy,
                "knobs": self.knobs,
            },
            sort_keys=True,
        )


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
