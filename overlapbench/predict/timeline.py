"""A schedule's tasks (model/schedule.py) played out on two lanes, with contention.

Each task is a list of phases. A compute task is one compute phase; a reduction is a transfer
phase (the all-reduce, or the fused kernel that also adds and normalizes), then, where its
transfer leaves it, a norm phase. Lanes run their tasks in order; a task starts when its lane is
free and the previous task of its chunk has finished (schedule.previous_of_chunk: the same rule
the real run's Lanes obeys with CUDA events).

Contention, while phases of both lanes run at once (from `comm --beside-gemm`):
- a compute phase runs at (1 - gemm_loss) of its speed while a transfer runs beside it, where
  gemm_loss is the GEMMs' throughput loss measured beside that transfer's path, CTAs and size;
- a transfer runs at 1 / stretch of its speed while compute runs beside it (stretch 1: as alone).
Norm phases are small and neither slow nor are slowed.
"""

from __future__ import annotations

from dataclasses import dataclass

from overlapbench.model.schedule import Task, previous_of_chunk

COMPUTE, TRANSFER, NORM = "compute", "transfer", "norm"


@dataclass
class Phase:
    kind: str  # COMPUTE, TRANSFER or NORM
    ms: float  # alone
    gemm_loss: float = 0.0  # TRANSFER: what it takes from compute beside it
    stretch: float = 1.0  # TRANSFER: how much slower it runs beside compute
    in_layer_ms: float = 0.0  # TRANSFER: of `ms`, the measured extra of a blocking all-reduce in the layer


@dataclass
class Played:
    """The schedule's makespan, and how much of it one lane ran alone (exposed)."""

    ms: float
    compute_ms: float  # the compute phases' time alone, summed
    exposed_ms: float  # time with only a transfer or norm running (nothing computing)


def play(tasks: list[Task], phases: list[list[Phase]]) -> Played:
    """Simulate the tasks (phases[j]: task j's phases) to the end; event by event."""
    before = previous_of_chunk(tasks)
    lanes: dict[str, list[int]] = {}
    for j, task in enumerate(tasks):
        lanes.setdefault(task.lane, []).append(j)
    head = {lane: 0 for lane in lanes}  # index into the lane's task list
    phase = {j: 0 for j in range(len(tasks))}
    left = {j: phases[j][0].ms if phases[j] else 0.0 for j in range(len(tasks))}
    finished: dict[int, float] = {}
    now, exposed = 0.0, 0.0

    def current(lane: str) -> int | None:
        if head[lane] >= len(lanes[lane]):
            return None
        j = lanes[lane][head[lane]]
        ready = before[j] is None or before[j] in finished
        return j if ready else None

    while len(finished) < len(tasks):
        running = [j for j in (current(lane) for lane in lanes) if j is not None]
        if not running:
            raise ValueError("schedule deadlock: no task can start (a chunk waits for a task later on its own lane)")
        kinds = {j: phases[j][phase[j]].kind if phases[j] else NORM for j in running}
        computing = any(k == COMPUTE for k in kinds.values())
        transfers = [phases[j][phase[j]] for j in running if kinds[j] == TRANSFER]
        loss = max((p.gemm_loss for p in transfers), default=0.0)
        rate = {}
        for j in running:
            if kinds[j] == COMPUTE:
                rate[j] = 1.0 - loss
            elif kinds[j] == TRANSFER and computing:
                rate[j] = 1.0 / phases[j][phase[j]].stretch
            else:
                rate[j] = 1.0
        step = min(left[j] / rate[j] for j in running)
        now += step
        if not computing:
            exposed += step
        for j in running:
            left[j] -= step * rate[j]
            if left[j] <= 1e-12:
                phase[j] += 1
                if phase[j] < len(phases[j]):
                    left[j] = phases[j][phase[j]].ms
                else:
                    finished[j] = now
                    head[tasks[j].lane] += 1
    compute = sum(p.ms for ps in phases for p in ps if p.kind == COMPUTE)
    return Played(now, compute, exposed)
