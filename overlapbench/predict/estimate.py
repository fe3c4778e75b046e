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
from overlapbench.predict import piece_keys
from overlapbench.predict.timeline import COMPUTE as COMPUTE_PHASE
from overlapbench.predict.timeline import NORM, TRANSFER, Phase, Played, play
from overlapbench.tuning.results import read_rows


@dataclass
class ComputePieces:
    """The pieces `sweep --pieces` timed: (prefill sequences, (decode tokens, context) or None,
    piece key) -> median ms, with where they came from."""

    ms: dict[tuple, float]
    device: str
    tp: int
    sources: list[str] = field(default_factory=list)
    runs: set[str] = field(default_factory=set)

    @classmethod
    def load(cls, paths: list[Path]) -> ComputePieces:
        table, devices, tps, runs = {}, set(), set(), set()
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
        if not table:
            raise UserError(f"--compute: {', '.join(map(str, paths))} holds no piece rows; make them with "
                            f"`overlapbench sweep SPEC --pieces --tp K` on one GPU")
        if len(devices) > 1 or len(tps) > 1:
            raise UserError(f"--compute: the piece rows mix devices {sorted(devices)} or TP degrees {sorted(tps)}; "
                            f"give the rows of one device and one TP")
        return cls(table, devices.pop(), tps.pop(), [str(p) for p in paths], runs)

    def find(self, batch: Batch, key: str) -> float | None:
        return self.ms.get((tuple(batch.seq_lens), batch.decode if batch.decode[0] else None, key))

    def get(self, batch: Batch, key: str) -> float:
        found = self.find(batch, key)
        if found is None:
            what = json.loads(key)
            raise UserError(f"--compute: no piece row for {what['piece']} of {what['rows']} rows at batch "
                            f"{list(batch.seq_lens)}; time the spec's pieces: `overlapbench sweep SPEC --pieces --tp {batch.tp}`")
        return found


@dataclass
class Inputs:
    """What a prediction is made from: compute pieces, a comm table, contention, the transfer
    model (`stretch`: 'alone' runs transfers beside compute as fast as alone; 'measured' slows
    them by the beside-GEMM table's stretch)."""

    compute: ComputePieces
    comm: object  # predict.comm_table.CommTable
    contention: object | None  # predict.contention.Contention
    stretch: str = "alone"


@dataclass
class Estimate:
    ms: float  # per layer
    played: Played
    notes: list[str]
    in_context: float = 1.0  # the chain's time over the isolated pieces' (compute scaled by it)


def estimate(strategy: str, knobs: dict, batch: Batch, layers: int, dtype: str, inputs: Inputs) -> Estimate | None:
    """The point's time per layer, or None where its strategy gives no plan."""
    plan = strategies.get(strategy).plan(knobs, batch)
    if plan is None:
        return None
    notes: list[str] = []
    tasks = plan.tasks(layers)
    phases = [_phases(plan, task, batch, dtype, inputs, notes) for task in tasks]
    entry = inputs.compute.get(batch, piece_keys.piece_key("entry", batch.tokens))
    scale = _in_context(plan, tasks, phases, entry, batch, layers, inputs, notes)
    phases = [[p if p.kind == TRANSFER else replace(p, ms=p.ms * scale) for p in ps] for ps in phases]
    played = play(tasks, phases)
    return Estimate((played.ms + entry * scale) / layers, played, sorted(set(notes)), scale)


def _in_context(plan: LayerPlan, tasks, phases, entry: float, batch: Batch, layers: int, inputs: Inputs,
                notes: list[str]) -> float:
    """How much slower the plan's compute ran in context (its chain: the stack with the
    communication removed) than its isolated pieces played on the same lanes: every compute and
    norm phase is scaled by it. 1 where the pieces have no chain row (noted)."""
    chain = inputs.compute.find(batch, piece_keys.chain_key(plan, batch.tokens, layers))
    if chain is None:
        notes.append("no chain row for this plan: the isolated pieces are used as they are")
        return 1.0
    alone = play(tasks, [[p for p in ps if p.kind != TRANSFER] for ps in phases]).ms + entry
    return chain / alone


def _phases(plan: LayerPlan, task, batch: Batch, dtype: str, inputs: Inputs, notes: list[str]) -> list[Phase]:
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
        if found.note:
            notes.append(found.note)
        loss, stretch = 0.0, 1.0
        if inputs.contention is not None and plan.pipelined:
            beside = inputs.contention.at(transfer.path, transfer.ctas, nbytes)
            if beside.note:
                notes.append(beside.note)
            loss = beside.gemm_loss
            stretch = beside.transfer_stretch if inputs.stretch == "measured" else 1.0
        out.append(Phase(TRANSFER, found.ms, max(0.0, min(loss, 0.9)), max(1.0, stretch)))
    if transfer.norm:
        out.append(Phase(NORM, inputs.compute.get(batch, piece_keys.piece_key("norm", chunk.size))))
    return out
