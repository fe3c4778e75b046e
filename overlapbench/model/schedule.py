"""A layer strategy's schedule as data: which pieces run on which lane, in which order, and
what each reduction sends. The real run executes it (`layer.forward_stack`, `split.SplitForward`)
and `overlapbench predict` simulates it (predict/timeline.py), so the two cannot drift apart.

A stack is a list of tasks. Each task computes a block (attention or MLP) of one chunk's rows,
or reduces that block's partial sum, on a lane: `main` (the compute stream) or `side` (the
high-priority communication stream). Lanes run their tasks in list order, and one data rule
orders the lanes against each other: a task waits for the previous task of its chunk (a
reduction needs the partial its compute produced; the next compute needs the normed rows that
reduction produced). `previous_of_chunk` is that rule, once.

No torch here: `predict` and spec validation read plans without building anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAIN, SIDE = "main", "side"
ATTENTION, MLP = "attention", "mlp"
COMPUTE, REDUCE = "compute", "reduce"


@dataclass(frozen=True)
class Task:
    work: str  # COMPUTE a block's partial sum, or REDUCE it (all-reduce, residual add, RMSNorm)
    block: str  # ATTENTION or MLP
    layer: int
    chunk: int  # index into the plan's chunks
    lane: str  # MAIN or SIDE


def serial(layers: int) -> list[Task]:
    """The plain TP layer (vLLM, Megatron): compute, then its blocking reduction, on one lane."""
    return [Task(work, block, i, 0, MAIN) for i in range(layers) for block in (ATTENTION, MLP) for work in (COMPUTE, REDUCE)]


def split(layers: int, chunks: int) -> list[Task]:
    """TokenWeave's pipeline over `chunks` chunks: each compute on the main lane, then its
    reduction on the side lane, beside the next chunk's compute (the last chunk's MLP reduction
    beside the next layer's first attention); only the stack's last reduction is exposed."""
    return [Task(work, block, i, k, lane)
            for i in range(layers) for block in (ATTENTION, MLP) for k in range(chunks)
            for work, lane in ((COMPUTE, MAIN), (REDUCE, SIDE))]


def behind_next_compute(tasks: list[Task]) -> list[Task]:
    """The same tasks with each reduction listed after the compute that follows it (the stack's
    last reduction stays last): each lane's order and the data rule are unchanged, only which of
    the two is issued first. The run issues that compute first and has the reduction wait for its
    first GEMM (`gated_by`), so the GEMM takes the SMs before the transfer's kernels ask for any."""
    out = list(tasks)
    j = 0
    while j + 1 < len(out):
        if out[j].work == REDUCE and out[j + 1].work == COMPUTE:
            out[j], out[j + 1] = out[j + 1], out[j]
            j += 2
        else:
            j += 1
    return out


def gated_by(tasks: list[Task]) -> list[int | None]:
    """For each reduction listed right after another chunk's compute (behind_next_compute), that
    compute's index: the reduction waits for its first GEMM; None for every other task."""
    return [j - 1 if task.work == REDUCE and j > 0 and tasks[j - 1].work == COMPUTE and tasks[j - 1].chunk != task.chunk
            else None for j, task in enumerate(tasks)]


def previous_of_chunk(tasks: list[Task]) -> list[int | None]:
    """For each task, the index of the task it waits for beyond its lane's order: the previous
    task of the same chunk (None for a chunk's first task)."""
    last: dict[int, int] = {}
    out: list[int | None] = []
    for j, task in enumerate(tasks):
        out.append(last.get(task.chunk))
        last[task.chunk] = j
    return out


@dataclass(frozen=True)
class Transfer:
    """What one reduction sends, in the comm table's terms: an all-reduce `path` (comm/paths.py:
    nccl, nccl_symm, symm_one_shot, symm_two_shot, fused_norm, copy_engine_norm; a `comm` knob
    value's is its method's, overlap/comm_methods.py) on `ctas` CTAs
    ('default': the path's own choice), or None for no communication (a bound); `norm`: a
    separate residual add + RMSNorm kernel follows on the same lane (the fused paths do it inside);
    `unpriced`: why no comm path prices this reduction yet (`predict` skips the point, saying so)."""

    path: str | None
    ctas: int | str | None = None
    norm: bool = True
    unpriced: str | None = None


@dataclass(frozen=True)
class Rows:
    """Rows [begin, end) of the flattened batch (decode tokens first, then the sequences back to
    back): token_split's chunks, and the whole batch."""

    begin: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class SequenceParts:
    """iso's chunk `part` (0: the decode tokens and every sequence's first `prefixes[i]` tokens,
    1: the rest), in iso's layout."""

    prefixes: tuple[int, ...]
    part: int
    size: int


@dataclass(frozen=True)
class LayerPlan:
    """A layer strategy's description at one batch: its chunks (in schedule order), its lane
    schedule, and what the reductions after attention and after the MLP send."""

    chunks: tuple[Rows | SequenceParts, ...]
    after_attention: Transfer
    after_mlp: Transfer
    pipelined: bool = field(default=False)  # split's schedule over the chunks, else serial (one chunk)

    def tasks(self, layers: int) -> list[Task]:
        return split(layers, len(self.chunks)) if self.pipelined else serial(layers)

    def transfer(self, block: str) -> Transfer:
        return self.after_attention if block == ATTENTION else self.after_mlp


@dataclass(frozen=True)
class Batch:
    """What a plan depends on: the prefill sequences, a mixed batch's decode tokens and their
    context (0, 0 for none), the model shape and the TP degree (balanced cuts count FLOPs)."""

    seq_lens: tuple[int, ...]
    decode: tuple[int, int]
    shape: object  # models.ModelShape
    tp: int

    @property
    def tokens(self) -> int:
        return sum(self.seq_lens) + self.decode[0]

    @classmethod
    def of(cls, seq_lens, decode, shape, tp: int) -> Batch:
        """From a spec point's or a build's decode tokens (anything with `tokens` and `context`;
        None for a prefill-only batch)."""
        return cls(tuple(seq_lens), (0, 0) if decode is None else (decode.tokens, decode.context), shape, tp)
