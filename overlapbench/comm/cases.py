"""A case: one collective on one path with one CTA budget at one size: what one row measures."""

from __future__ import annotations

import json
from dataclasses import dataclass

from overlapbench.comm.in_layer import SPAN_MS
from overlapbench.comm.sizes import DTYPE_BYTES
from overlapbench.distributed.nccl_windows import layout

# What a case timed beside compute measures, in its key: 4 (the compute's loss also paired in the
# same rounds, its extra beside one call: comm/paired_loss.py; and, beside the layer, each block's
# pair with one call: comm/pair.py); keys with 3 (no pair window; the first rows with it, of
# b537586, 4ee8794 and cc4fbeb, say 3 too), 2 (no one-call window) or without it are of rows made
# before, which `--resume` measures again.
BESIDE_MEASURE = 4

# --beside-layer's rows by default: the studies' chunks (512-16K) and batches (1K-32K).
DEFAULT_LAYER_TOKENS = (512, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclass(frozen=True)
class BesideLayer:
    """`comm --beside-layer`: the compute a case is timed beside, one rank's shard of `model`'s
    decoder layer at TP=`tp` (its attention, then its MLP) on as many rows as the case's all-reduce
    carries (bytes / (hidden x dtype bytes)): the pairing of a token split, whose reduction of one
    chunk runs beside the next chunk's compute."""

    model: str  # a preset of model/models.py
    tp: int
    hidden: int  # the model's: a case's bytes are rows x hidden x dtype bytes
    # The in-layer term's and the pair window's rounds (comm/in_layer.py): each graph untimed for
    # settle_ms before each span of span_ms. 0 and 20: the graphs of a round share one clock, which
    # at a power cap is none of theirs (docs/timing.md, "Each choice at its own clock").
    settle_ms: float = 0.0
    span_ms: float = SPAN_MS

    def label(self) -> str:
        """The layer in a case's key; the windows' timing where it is not the default, so that rows
        timed otherwise are other cases (--resume does not take one for the other)."""
        windows = (self.settle_ms, self.span_ms) != (0.0, SPAN_MS)
        return f"{self.model} tp={self.tp}" + (f" settle_ms={self.settle_ms:g} span_ms={self.span_ms:g}" if windows else "")

    def rows(self, nbytes: int, dtype: str) -> int:
        """The rows of the layer beside an all-reduce of `nbytes`."""
        return nbytes // (self.hidden * DTYPE_BYTES[dtype])


@dataclass(frozen=True)
class Case:
    """One collective on one path with one CTA budget at one size."""

    op: str
    path: str  # as selected (`nccl` also names gloo on CPU; `strategy` is what rows record)
    backend: str  # nccl | gloo
    ctas: int | str | None  # NCCL max_ctas ("default" or int), the fused kernel's grid, or None
    size: int  # bytes asked for on the ladder
    count: int  # elements of the larger buffer (nccl-tests' count), whole units of the path
    dtype: str
    hidden: int | None = None  # fused_norm: the count is rows x hidden
    seed: int = 0  # makes the inputs fresh per case
    skip: str | None = None  # why this case cannot run here
    buffer: str | None = None  # the run's symmetric allocation its path uses (paths.CommPath.buffer)
    beside_gemm: bool = False  # also timed beside a GEMM stream (comm.contention)
    beside_layer: BesideLayer | None = None  # also timed beside the layer's own kernels (comm.beside_layer)
    chunks: int | None = None  # copy_engine_norm: its own rows cut into this many chunks; None: by size
    window: bool = False  # its buffers lie in a registered NCCL window (paths.CommPath.window)

    @property
    def nbytes(self) -> int:
        return self.count * DTYPE_BYTES[self.dtype]

    @property
    def rows(self) -> int | None:
        return self.count // self.hidden if self.hidden else None

    def tensor_counts(self, world: int) -> tuple[int, ...]:
        """Elements of its output (in place for all-reduce), then of its input."""
        if self.op == "all_reduce":
            return (self.count,)
        shard = self.count // world
        return (self.count, shard) if self.op == "all_gather" else (shard, self.count)

    def window_regions(self, world: int) -> tuple[list[int], int]:
        """Where its output and input start in its NCCL window, and the elements it needs there."""
        return layout(self.tensor_counts(world), DTYPE_BYTES[self.dtype])

    @property
    def strategy(self) -> str:
        return "gloo" if self.path == "nccl" and self.backend == "gloo" else self.path

    def key(self) -> str:
        """Identity in a results file (what `--resume` matches on): sizes that round to the same
        bytes are one case; sizes below one unit stay apart by the size asked for."""
        key = {"workload": "comm", "op": self.op, "strategy": self.strategy, "ctas": self.ctas,
               "bytes": self.nbytes, "below_unit": None if self.count else self.size,
               "dtype": self.dtype, "hidden": self.hidden}
        if self.beside_gemm:  # only then: the key of a run without it does not name it
            key["beside_gemm"] = True
        if self.beside_layer is not None:  # likewise
            key["beside_layer"] = self.beside_layer.label()
        if self.beside_gemm or self.beside_layer is not None:
            key["beside_measure"] = BESIDE_MEASURE
        if self.chunks is not None:  # likewise
            key["chunks"] = self.chunks
        return json.dumps(key, sort_keys=True)

