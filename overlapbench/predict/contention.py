"""What a transfer and the GEMMs beside it cost each other, from `comm --beside-gemm` rows: the
fraction of GEMM throughput the transfer takes while it runs (`gemm_loss`), and how much longer
the transfer takes than alone (`transfer_stretch` = beside_ms / ms).

Overlap is not max(compute, comm): both sides slow down. How a prediction charges these two
numbers is the simulator's choice; this module only looks them up, and says what it assumed
where the rows lack a point.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from overlapbench.errors import UserError
from overlapbench.predict.comm_table import Ctas, is_beside, nearest_budget, one_world_size, point_key
from overlapbench.tuning.results import read_rows

BudgetKey = tuple[str, Ctas]  # (path, ctas)


@dataclass(frozen=True)
class ContentionLookup:
    gemm_loss: float  # 1 - GEMM TFLOP/s beside / alone, while the transfer runs
    transfer_stretch: float  # the transfer's time beside the GEMMs / alone
    note: str | None = None  # what was assumed, where the rows lack the point asked for


@dataclass
class Contention:
    """Measured pairs per (path, ctas): [(bytes, gemm_loss, transfer_stretch)] sorted by bytes.
    Rows of several `hidden` (per-row paths) at one size are pooled: the GEMM stream beside them
    is the same."""

    entries: dict[BudgetKey, list[tuple[int, float, float]]]
    world_size: int
    source: str = ""

    @classmethod
    def read(cls, paths: Iterable[str | Path]) -> Contention:
        """The beside-GEMM rows of `comm` result stores."""
        names = [str(p) for p in paths]
        return cls.from_rows([row for name in names for row in read_rows(name)], source=", ".join(names))

    @classmethod
    def from_rows(cls, rows: list[dict], source: str = "comm rows") -> Contention:
        measured: dict[BudgetKey, dict[int, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
        worlds = set()
        for row in rows:
            if not _beside_all_reduce(row):
                continue
            path, ctas, _ = point_key(row)
            measured[(path, ctas)][row["bytes"]].append((row["gemm_loss"], row["beside_ms"] / row["ms"]))
            worlds.add(row.get("world_size"))
        if not measured:
            raise UserError(f"{source}: no ok all_reduce rows timed beside a GEMM stream; "
                            f"run `overlapbench comm --beside-gemm` for them")
        world = one_world_size(worlds, f"{source}: beside-GEMM rows", "give one world size")
        entries = {key: [(b, statistics.median(v[0] for v in pairs), statistics.median(v[1] for v in pairs))
                         for b, pairs in sorted(by_size.items())] for key, by_size in measured.items()}
        return cls(entries, world, source)

    def mean_loss(self) -> float:
        """The mean GEMM loss over every measured point: the default assumption for a path not measured."""
        return statistics.fmean(loss for points in self.entries.values() for _, loss, _ in points)

    def at(self, path: str, ctas: Ctas, nbytes: int, assumed_loss: float | None = None,
           assumed_stretch: float = 1.0) -> ContentionLookup:
        """Both numbers for one transfer: interpolated in log(bytes) between measured sizes, the
        nearest measured size's outside them. A budget not measured: the path's nearest; a path not
        measured: the assumption given (by default the mean loss of all rows, no stretch)."""
        if nbytes < 1:
            raise ValueError(f"a transfer of {nbytes} bytes")
        budgets = [c for p, c in self.entries if p == path]
        if not budgets:
            loss = self.mean_loss() if assumed_loss is None else assumed_loss
            why = "the mean of all measured rows" if assumed_loss is None else "as given"
            return ContentionLookup(loss, assumed_stretch, f"{path} not measured beside GEMMs: GEMM loss {loss:.1%} "
                                                           f"({why}), transfer stretch {assumed_stretch:g} assumed")
        used, note = nearest_budget(ctas, budgets, path)
        loss, stretch = _interpolated(self.entries[(path, used)], nbytes)
        return ContentionLookup(loss, stretch, note)


def _beside_all_reduce(row: dict) -> bool:
    return (row.get("workload") == "comm" and row.get("op") == "all_reduce" and row.get("status") == "ok"
            and is_beside(row) and row.get("beside_ms") and row.get("ms") and row.get("gemm_loss") is not None
            and row.get("bytes"))


def _interpolated(points: list[tuple[int, float, float]], nbytes: int) -> tuple[float, float]:
    """Linear in log(bytes), clamped to the measured range."""
    if nbytes <= points[0][0]:
        return points[0][1], points[0][2]
    if nbytes >= points[-1][0]:
        return points[-1][1], points[-1][2]
    i = bisect.bisect_left([b for b, _, _ in points], nbytes)  # points[i - 1] < nbytes <= points[i]
    (b0, l0, s0), (b1, l1, s1) = points[i - 1], points[i]
    w = math.log(nbytes / b0) / math.log(b1 / b0)
    return (1 - w) * l0 + w * l1, (1 - w) * s0 + w * s1
