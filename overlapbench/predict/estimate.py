"""A point's predicted time per layer: its strategy's plan (model/schedule.py), each task's
phases priced from the one-GPU pieces and the comm table, played out with contention
(timeline.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from overlapbench import strategies
from overlapbench.comm.sizes import DTYPE_BYTES
from overlapbench.errors import UserError
from overlapbench.model.schedule import ATTENTION, COMPUTE, Batch, LayerPlan
from overlapbench.overlap import comm_methods
from overlapbench.predict.comm_table import NotInTable
from overlapbench.predict.contention import LAYER, ONE_CALL_EXTRA, PAIR_EXTRA
from overlapbench.predict.in_layer_choice import MEASURED_IN_LAYER, NO_IN_LAYER
from overlapbench.predict.notes import ASSUMED, SKIPPED, SUBSTITUTED, Note
from overlapbench.predict.timeline import COMPUTE as COMPUTE_PHASE
from overlapbench.predict.timeline import NORM, TRANSFER, Phase, Played, play
from overlapbench.run import piece_keys
from overlapbench.strategies.knobs import CE_CHUNKS, GEMM_CARVEOUT, REDUCE_START
from overlapbench.tuning.results import read_rows
from overlapbench.tuning.settling import at_own_clock


@dataclass
class ComputePieces:
    """The pieces `sweep --pieces` timed: (prefill sequences, (decode tokens, context) or None,
    piece key) -> median ms, with where they came from."""

    ms: dict[tuple, float]
    device: str
    tp: int
    sources: list[str] = field(default_factory=list)
    runs: set[str] = field(default_factory=set)
    specs: set[str] = field(default_factory=set)  # the studies the pieces were timed for (their rows' `spec`)
    # whether a chain was timed in the shared rounds (no `settle_ms`: pieces before e36175a, or a
    # spec timed in shared spans), not at its own clock
    shared_chains: bool = False

    @classmethod
    def load(cls, paths: list[Path]) -> ComputePieces:
        table, devices, tps, runs, specs, shared_chains = {}, set(), set(), set(), set(), False
        for path in paths:
            if not Path(path).exists():
                raise UserError(f"--compute: {path}: no such file; time the pieces on one GPU with "
                                f"`overlapbench sweep SPEC --pieces --tp K -o {path}`")
            for row in read_rows(path):
                if row.get("workload") != piece_keys.WORKLOAD or row.get("status") != "ok":
                    continue
                decode = row.get("decode")
                table[(tuple(row["batch"]), (decode["tokens"], decode["context"]) if decode else None, row["key"])] = row["ms"]
                devices.add(row["device"])
                tps.add(row["tp"])
                runs.add(row["run_id"])
                specs.add(row.get("spec") or "")
                shared_chains |= row.get("piece") == "chain" and not at_own_clock(row)
        if not table:
            raise UserError(f"--compute: {', '.join(map(str, paths))} holds no piece rows; make them with "
                            f"`overlapbench sweep SPEC --pieces --tp K` on one GPU")
        if len(devices) > 1 or len(tps) > 1:
            raise UserError(f"--compute: the piece rows mix devices {sorted(devices)} or TP degrees {sorted(tps)}; "
                            f"give the rows of one device and one TP")
        return cls(table, devices.pop(), tps.pop(), [str(p) for p in paths], runs, specs - {""}, shared_chains)

    def find(self, batch: Batch, key: str) -> float | None:
        return self.ms.get((tuple(batch.seq_lens), batch.decode if batch.decode[0] else None, key))

    def get(self, batch: Batch, key: str) -> float:
        found = self.find(batch, key)
        if found is None:
            what = json.loads(key)
            raise MissingPiece(f"{what['piece']} of {what['rows']} rows at batch {list(batch.seq_lens)}", batch.tp)
        return found


class MissingPiece(UserError):
    """A piece a point's plan needs that the --compute rows lack (pieces timed for another spec,
    say: its chunk sizes differ). `predict` names the point and the spec to time."""

    def __init__(self, what: str, tp: int) -> None:
        self.what = what
        super().__init__(f"--compute: no piece row for {what}; time the spec's pieces: "
                         f"`overlapbench sweep SPEC --pieces --tp {tp}`")


# How a transfer beside compute runs (`--transfer-beside`): AUTO slows it by the stretch measured
# beside the layer (its own kernels) and runs it as fast as alone where only the beside-GEMM
# stretch exists (a persistent GEMM stream holds the SMs far longer than a layer: 2-12x, which
# made the TP=2 validation worse), except a copy-engine transfer (below), which it runs as fast
# as alone and charges the compute nothing for; ALONE never slows a transfer; MEASURED slows it
# by either stretch. ALONE and MEASURED charge every path the compute loss measured.
# ONE_CALL takes from the compute exactly the beside-layer rows' extra beside one call per
# transfer (`compute_one_call_extra_ms`: the layer's pass beside one call of the path, issued just
# before it as a split issues a reduction, less the pass alone, in the same rounds), the transfer
# slowed as that call was (`compute_one_call_op_ms` over the row's time alone; as AUTO slows it
# where the rows lack that): the transfer's loss is set so that loss x its time beside (alone x
# stretch) is the extra, which the compute pays in full where the transfer ends inside it. The
# loss the others charge is taken while the path's ops run back to back beside one pass, and the
# stretch in another window: their product over-charged the fused kernel 2-3x at llama3-8b TP=4
# 4K-16K where it fit nccl_symm (tests/checks/transfer_charge.py). Where the rows hold no extra
# for the path (rows made before that window), ONE_CALL charges what AUTO does, and says so.
# PAIR charges each transfer what the beside-layer rows' pair window measured for it: one call of
# the path and one block of the layer (the kind of block the split runs beside that transfer: the
# next compute on the main lane) released at once when the same block ends, as a split releases
# them, less the same pair with the residual add + RMSNorm in the call's place, which is what the
# split's chain (and so the in-context compute) ran there (`pair_{attention,mlp}_extra_ms`:
# comm/pair.py). The pair ends `extra` after the block would, so the transfer is played as lasting
# block + extra beside it (never shorter than alone) and the compute as losing
# extra / (block + extra) of its speed meanwhile: the two end together, extra after the block.
# The stack's last reduction, with no compute after it, runs as fast as alone. Where the rows hold
# no pair for the path, PAIR charges what AUTO does, and says so.
AUTO, ALONE, MEASURED, ONE_CALL, PAIR = "auto", "alone", "measured", "one-call", "pair"
TRANSFER_BESIDE = (AUTO, ALONE, MEASURED, ONE_CALL, PAIR)

# Paths whose bytes the copy engines move; their SM work is a few short kernels per call (one-CTA
# barriers, a few-CTA add + norm per chunk of rows), each of which waits for SMs until a kernel
# of the compute beside it ends (the layer's GEMMs and attention hold every SM to their end).
# Rows timed beside compute measure that waiting: `comm --beside-layer` issues the calls back to
# back beside a layer pass, and copy_engine_norm took 3.4-26x its time alone beside llama3-70b's
# TP=2 shard, more the more kernels a call has (32 CTAs: 3.4x with 1 chunk, 6.9x with 2, 9.4-24x
# with 4), 0.6-1 layer pass per call from 8K tokens. A split issues each reduction as the compute beside it
# starts: its kernels run at that compute's kernel boundaries and it ends inside it, the compute
# never waiting for it. So AUTO runs these transfers at their time alone and takes nothing from
# the compute: at 70B TP=2 1K-8K the studies' copy-engine splits measured 0.00-0.03 below the
# comm=none split, where the rows' stretch and loss put them 0.04-0.08 below (docs/predict.md).
# A copy engine's NVLink traffic does cost a power-capped compute beside it about 4.5% of its SM
# clock while it runs (tests/probes/power_beside.py on 4x and 2x H200); charged over the transfer's
# time alone, that loss, or the rows', moved the validation both ways (a pick lost on 2x H200 or
# 2x H100: tests/checks/copy_engine_charge.py, docs/predict.md, Why TP=4 misses), so AUTO charges
# nothing yet.
COPY_ENGINE_PATHS = frozenset(p for m in comm_methods.METHODS if m.chunked for p in m.paths)

# predict's defaults: the pairs from the beside-layer rows (where the rows lack a field, each says
# what it charged instead), and the in-layer term as the spec's timing asks (in_layer_choice.py).
# Against every H200 study with the pair rows timed in shared spans, the pairs and the term together
# gave the smallest worst errors at TP=2 and TP=4 and the most picks at TP=4 (docs/predict.md, The
# pair window); the Inputs below default to the plain model.
DEFAULT_TRANSFER_BESIDE = PAIR

# Knobs whose effect no input holds, one record each: (the knob, why). A point that sets one off
# its default is a skipped row naming it; predicted as if the knob did nothing, it would be a
# number for a setting that was never modelled.
UNMODELLED = (
    (GEMM_CARVEOUT, "the compute pieces are timed with every SM (`sweep --pieces`), so neither the GEMMs' "
                    "slowdown on fewer SMs nor what the SMs left free give the transfers is in the inputs"),
    (CE_CHUNKS, "a plan's transfers carry no piece count and the comm table's copy-engine rows are timed at the "
                "kernel's own count, so what fewer or more pieces change is not in the inputs"),
    (REDUCE_START, "the model starts each reduction when its partial is ready and charges contention as a "
                   "smooth loss; which kernel takes the SMs first, and what waiting for the next GEMM's end "
                   "changes, is not in the inputs"),
)


@dataclass
class Inputs:
    """What a prediction is made from: compute pieces, a comm table, contention (beside the
    layer or the GEMMs, and the in-layer term of blocking all-reduces), the transfer model
    (`stretch`: one of TRANSFER_BESIDE) and whether the in-layer term is charged (`in_layer`:
    one of in_layer_choice.CHARGED_IN_LAYER)."""

    compute: ComputePieces
    comm: object  # predict.comm_table.CommTable
    contention: object | None  # predict.contention.Contention
    stretch: str = AUTO
    in_layer: str = NO_IN_LAYER


@dataclass
class Estimate:
    ms: float  # per layer
    played: Played
    notes: list[Note]
    in_context: float = 1.0  # the chain's time over the isolated pieces' (compute scaled by it)
    in_layer_ms: float = 0.0  # the blocking all-reduces' measured extra in the layer, per layer (--in-layer measured)


@dataclass
class Skip:
    """A point not predicted, and why."""

    reason: str
    notes: list[Note] = field(default_factory=list)


def estimate(strategy: str, knobs: dict, batch: Batch, layers: int, dtype: str, inputs: Inputs) -> Estimate | Skip:
    """The point's time per layer, or why it is not predicted (it sets a knob no input models, its
    strategy gives no plan, a reduction no comm path prices yet, or the comm table lacks a path it
    sends)."""
    for knob, why in UNMODELLED:
        value = knobs.get(knob.name, knob.default)
        if value != knob.default:
            reason = f"{knob.name}={value} is not predicted: {why}; measure the point with `overlapbench sweep`"
            return Skip(reason, [Note(SKIPPED, reason)])
    plan = strategies.get(strategy).plan(knobs, batch)
    if plan is None:
        reason = f"{strategy} has no schedule to predict (its plan() gives none)"
        return Skip(reason, [Note(SKIPPED, reason)])
    unpriced = next((t.unpriced for t in (plan.after_attention, plan.after_mlp) if t.unpriced), None)
    if unpriced is not None:
        reason = f"{unpriced}; measure the point with `overlapbench sweep`"
        return Skip(reason, [Note(SKIPPED, reason)])
    notes: list[Note] = []
    tasks = plan.tasks(layers)
    computed = [_phases(plan, task, batch, dtype, inputs, notes) if task.work == COMPUTE else None for task in tasks]
    entry = inputs.compute.get(batch, piece_keys.piece_key("entry", batch.tokens))
    scale = _in_context(plan, tasks, computed, entry, batch, layers, inputs, notes)
    computed = [None if ps is None else _scaled(ps, scale) for ps in computed]
    beside = _beside_compute_tasks(tasks)
    try:  # each reduction priced with the compute beside it as it runs in context
        phases = [ps if ps is not None else
                  _scaled(_phases(plan, task, batch, dtype, inputs, notes, _block_beside(tasks, computed, beside[j])), scale)
                  for j, (task, ps) in enumerate(zip(tasks, computed))]
    except NotInTable as missing:
        reason = (f"no '{missing.path}' rows in the comm table (it holds {', '.join(inputs.comm.paths())}); add a table "
                  f"with them (`overlapbench comm --paths {missing.path}`; one of another world size is rescaled)")
        return Skip(reason, [Note(SKIPPED, reason)])
    extra = sum(p.in_layer_ms for ps in phases for p in ps if p.kind == TRANSFER)
    played = play(tasks, phases)
    unique = sorted(set(notes), key=lambda n: n.text)
    return Estimate((played.ms + entry * scale) / layers, played, unique, scale, extra / layers)


def _scaled(phases: list[Phase], scale: float) -> list[Phase]:
    """Compute and norm phases `scale` times as long (the in-context scale); transfers as they are."""
    return [p if p.kind == TRANSFER else replace(p, ms=p.ms * scale) for p in phases]


def _in_context(plan: LayerPlan, tasks, phases, entry: float, batch: Batch, layers: int, inputs: Inputs,
                notes: list[Note]) -> float:
    """How much slower the plan's compute ran in context (its chain: the stack with the
    communication removed) than its isolated pieces played on the same lanes, each reduction as
    the chain runs it (`_as_chained`): every compute and norm phase is scaled by it. 1 where the
    pieces have no chain row (noted). `phases`: the compute tasks' (a reduction's are not read)."""
    chain = inputs.compute.find(batch, piece_keys.chain_key(plan, batch.tokens, layers))
    if chain is None:
        notes.append(Note(ASSUMED, "no chain row for this plan: the isolated pieces are used as they are"))
        return 1.0
    alone = play(tasks, [_as_chained(plan, task, ps, batch, inputs) for task, ps in zip(tasks, phases)]).ms + entry
    return chain / alone


def _as_chained(plan: LayerPlan, task, phases: list[Phase], batch: Batch, inputs: Inputs) -> list[Phase]:
    """A task's pieces as the chain runs them: a compute task's compute; a reduction's residual
    add + RMSNorm (the chain's LocalReducer runs it on the reduction's lane for every path, also
    where the plan's transfer does it inside, as `fused_norm` and `copy_engine_norm` do), no
    transfer. So the chain is compared with the same work, and a fused path's norm, which its
    transfer's time already holds, is not charged again through the scale."""
    if task.work == COMPUTE:
        return phases
    rows = plan.chunks[task.chunk].size
    return [Phase(NORM, inputs.compute.get(batch, piece_keys.piece_key("norm", rows)))]


def _beside_compute_tasks(tasks) -> list[int | None]:
    """For each reduction, the compute task its transfer runs beside: the next compute listed
    after it (the main lane's next block, released with it); None for compute tasks and for the
    stack's last reduction."""
    out: list[int | None] = [None] * len(tasks)
    following = None
    for j in range(len(tasks) - 1, -1, -1):
        if tasks[j].work == COMPUTE:
            following = j
        else:
            out[j] = following
    return out


def _block_beside(tasks, computed: list, j: int | None) -> tuple[str, float] | None:
    """(the block, its ms in context) of compute task `j`, or None (nothing beside)."""
    return None if j is None else (tasks[j].block, sum(p.ms for p in computed[j]))


def _phases(plan: LayerPlan, task, batch: Batch, dtype: str, inputs: Inputs, notes: list[Note],
            beside_block: tuple[str, float] | None = None) -> list[Phase]:
    chunk = plan.chunks[task.chunk]
    if task.work == COMPUTE:
        key = (piece_keys.piece_key("attention", chunk.size, chunk, plan.pipelined) if task.block == ATTENTION
               else piece_keys.piece_key("mlp", chunk.size))
        return [Phase(COMPUTE_PHASE, inputs.compute.get(batch, key))]
    transfer = plan.transfer(task.block)
    out = []
    if transfer.path is not None:
        nbytes = chunk.size * batch.shape.hidden * DTYPE_BYTES[dtype]
        found = inputs.comm.time_ms(transfer.path, transfer.ctas, nbytes, hidden=batch.shape.hidden)
        notes += found.notes
        loss, stretch, extra = 0.0, 1.0, 0.0
        if inputs.contention is not None and plan.pipelined and inputs.stretch == ONE_CALL:
            loss, stretch = _one_call(transfer, nbytes, found.ms, inputs.contention, notes)
        elif inputs.contention is not None and plan.pipelined and inputs.stretch == PAIR:
            loss, stretch = _pair(transfer, nbytes, found.ms, beside_block, inputs.contention, notes)
        elif inputs.contention is not None and plan.pipelined:
            loss, stretch = _beside_compute(transfer.path, inputs.contention.at(transfer.path, transfer.ctas, nbytes),
                                            inputs.stretch, notes)
        elif inputs.contention is not None and inputs.in_layer == MEASURED_IN_LAYER:
            extra = _in_layer(transfer, nbytes, inputs, notes)
        out.append(Phase(TRANSFER, max(0.0, found.ms + extra), max(0.0, min(loss, 0.9)), max(1.0, stretch), extra))
    if transfer.norm:
        out.append(Phase(NORM, inputs.compute.get(batch, piece_keys.piece_key("norm", chunk.size))))
    return out


def _beside_compute(path: str, beside, mode: str, notes: list[Note]) -> tuple[float, float]:
    """What a split's transfer on `path` costs the compute beside it and how much slower it runs
    there, as `mode` (TRANSFER_BESIDE) charges the lookup `beside` (contention.ContentionLookup):
    (loss, stretch). Says in `notes` what was charged."""
    if mode == AUTO and path in COPY_ENGINE_PATHS:
        notes.append(Note(ASSUMED, f"{path} beside a split's compute: as fast as alone, taking nothing from it (its "
                                   f"kernels wait for the compute's; --transfer-beside measured charges the rows)"))
        return 0.0, 1.0
    notes += beside.notes
    slowed = mode == MEASURED or (mode == AUTO and beside.beside == LAYER)
    return beside.gemm_loss, beside.transfer_stretch if slowed else 1.0


def _one_call(transfer, nbytes: int, alone_ms: float, contention, notes: list[Note]) -> tuple[float, float]:
    """ONE_CALL's (loss, stretch) for a split's transfer of `nbytes` taking `alone_ms` alone: the
    stretch of one call beside the layer's pass where the rows hold it (else the one AUTO gives),
    and the loss whose product with the transfer's time beside the compute (alone x stretch) is the
    rows' extra beside one call; AUTO's pair where the rows lack the extra."""
    beside = contention.at(transfer.path, transfer.ctas, nbytes)
    found = contention.one_call(transfer.path, transfer.ctas, nbytes)
    if found is None:
        notes.append(Note(SUBSTITUTED, f"{transfer.path}: no extra beside one call in the beside-layer rows "
                                       f"(`{ONE_CALL_EXTRA}`): charged as --transfer-beside auto charges it"))
        return _beside_compute(transfer.path, beside, AUTO, notes)
    extra, said = found
    slowed = contention.one_call_stretch(transfer.path, transfer.ctas, nbytes)
    if slowed is not None:
        stretch, how = slowed
        stretch = max(1.0, stretch)
        notes += how
    elif transfer.path in COPY_ENGINE_PATHS:  # as AUTO runs it; AUTO's note (taking nothing) does not hold here
        stretch = 1.0
        notes.append(Note(ASSUMED, f"{transfer.path} beside a split's compute: as fast as alone (its kernels wait for "
                                   f"the compute's)"))
    else:
        _, stretch = _beside_compute(transfer.path, beside, AUTO, notes)
    notes += said
    return extra / (alone_ms * stretch), stretch


def _pair(transfer, nbytes: int, alone_ms: float, beside_block: tuple[str, float] | None, contention,
          notes: list[Note]) -> tuple[float, float]:
    """PAIR's (loss, stretch) for a split's transfer of `nbytes` taking `alone_ms` alone, beside
    `beside_block` ((block, its ms in context), or None: nothing beside): the transfer lasts the block
    + the rows' pair extra (at least its time alone); AUTO's pair where the rows hold no pair for
    the path. The compute loses what makes the block end that extra later, less the part of the
    extra that is the call's own time beyond the block's (a call longer than its block ends the
    pair after the block; the split's next compute runs beside that tail, not after it)."""
    if beside_block is None:
        return 0.0, 1.0
    block, block_ms = beside_block
    found = contention.pair(transfer.path, transfer.ctas, nbytes, block)
    if found is None:
        notes.append(Note(SUBSTITUTED, f"{transfer.path}: no pair beside the {block} block in the beside-layer rows "
                                       f"(`{PAIR_EXTRA[block]}`): charged as --transfer-beside auto charges it"))
        return _beside_compute(transfer.path, contention.at(transfer.path, transfer.ctas, nbytes), AUTO, notes)
    extra, said = found
    notes += said
    together = max(alone_ms, block_ms + extra)
    block_later = max(0.0, extra - max(0.0, alone_ms - block_ms))
    return block_later / (block_ms + block_later), together / alone_ms


def _in_layer(transfer, nbytes: int, inputs: Inputs, notes: list[Note]) -> float:
    """A blocking all-reduce's measured extra cost in line with the layer (ms), from the
    beside-layer rows; 0 where they lack the path (said where they hold others, or hold only
    rows of the measurement before the paired rounds)."""
    found = inputs.contention.in_layer(transfer.path, transfer.ctas, nbytes)
    if found is None:
        if inputs.contention.inline:
            notes.append(Note(ASSUMED, f"{transfer.path}: no in-layer term measured (beside-layer rows), 0 used"))
        elif inputs.contention.stale:
            notes.append(Note(ASSUMED, "no in-layer term: the beside-layer rows' was measured before the paired "
                                       "rounds and is not used (flagged), 0 used"))
        return 0.0
    extra, said = found
    notes += said
    return extra
