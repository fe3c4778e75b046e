"""What an engine runs for the TP all-reduce at one token count (`Path`), and the row of ours that
stands for it (`stand_in`): the time an export and the engine's default are judged by.

A stand-in is one of our settings: `fused_norm` (the setting tune settles on there) for a fused
all-reduce + RMSNorm; the reference `baseline` (NCCL, default knobs) for NCCL; `baseline
allreduce=two_shot` for PyTorch's two-shot symmetric-memory all-reduce (the same op); the faster
`baseline allreduce=one_shot|two_shot` row for an engine's own peer-memory kernel (FlashInfer's,
vLLM's or SGLang's custom all-reduce: not our kernel, the nearest we have); `baseline
nccl_symm=true` for NCCL's symmetric kernels. An engine autotuning among several paths stands at
the fastest of their stand-ins. Where none of our rows runs what the engine runs (PyTorch's
multimem all-reduce, one-shot kernels fused with the norm), there is no stand-in and no number.
"""

from __future__ import annotations

from dataclasses import dataclass

from overlapbench.tuning import analysis, tune
from overlapbench.tuning.analysis import Measured

SYMM = ("one_shot", "two_shot")


@dataclass(frozen=True)
class Path:
    """What an engine runs at one token count, in its words; `kinds`: the stand-in kinds (one, or
    the candidates an autotuner picks among: the fastest stands), empty where none of our rows
    runs it (`why` says what it runs); `needs_multicast`: the path turns itself off on a host
    without NVLink multicast (the engine then runs another)."""

    text: str
    kinds: tuple[str, ...]
    why: str = ""
    needs_multicast: bool = False

    @property
    def kind(self) -> str | None:
        return self.kinds[0] if len(self.kinds) == 1 else None


def stand_in(path: Path, rows: list[Measured]) -> Measured | None:
    """Our row for an engine's path at one batch: the fastest of its kinds' rows (see the module docstring)."""
    found = [m for kind in path.kinds if (m := _row(kind, rows)) is not None]
    return min(found, key=lambda m: m.ms) if found else None


def _row(kind: str, rows: list[Measured]) -> Measured | None:
    if kind == "nccl":
        ref = analysis.reference(rows)
        return ref if ref is not None and ref.strategy == "baseline" and analysis.default_knobs(ref.knobs) else None
    if kind in ("symm", *SYMM):
        allowed = SYMM if kind == "symm" else (kind,)
        symm = [m for m in rows if m.strategy == "baseline" and m.knobs.get("allreduce") in allowed and m.checked]
        return min(symm, key=lambda m: m.ms) if symm else None
    if kind == "nccl_symm":  # NCCL's own CTA count, as an engine runs it: no nccl_max_ctas cap
        symm = [m for m in rows if m.strategy == "baseline" and m.knobs.get("nccl_symm") and m.checked
                and analysis.default_knobs({k: v for k, v in m.knobs.items() if k != "nccl_symm"})]
        return min(symm, key=lambda m: m.ms) if symm else None
    if kind == "fused_norm":
        fused = [m for m in rows if m.strategy == "fused_norm" and m.knobs.get("comm", "fused") == "fused"]
        return tune.settled_per_strategy(fused).get("fused_norm")
    if kind.startswith("fused_norm@"):
        ctas = int(kind.partition("@")[2])
        return next((m for m in rows if m.strategy == "fused_norm" and m.checked and m.knobs.get("comm_ctas") == ctas
                     and m.knobs.get("comm", "fused") == "fused"), None)
    raise ValueError(f"unknown stand-in kind {kind!r}")


MISSING = {"symm": "rows hold no symmetric-memory all-reduce (baseline allreduce=one_shot/two_shot)",
           "two_shot": "rows hold no baseline allreduce=two_shot", "one_shot": "rows hold no baseline allreduce=one_shot",
           "nccl": "rows hold no baseline at default knobs", "fused_norm": "rows hold no fused_norm",
           "nccl_symm": "rows hold no baseline nccl_symm=true at NCCL's own CTA count"}


def missing(path: Path) -> str:
    """Why a path has no number: what it runs that no row of ours runs, or which row is missing."""
    if not path.kinds:
        return path.why or "no row of ours runs it"
    return "; ".join(MISSING.get(k, f"rows hold no {k}") for k in path.kinds)
