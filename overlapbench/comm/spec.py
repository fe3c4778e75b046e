"""What `overlapbench comm` measures: the ops, paths, sizes and CTA budgets, from its options or
from a study's `comm:` section (which the sweep runs after the layer points, into the same store),
validated in one place. No torch at import."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from overlapbench.comm.paths import DEFAULT_PATHS as COMM_DEFAULT_PATHS
from overlapbench.comm.paths import OPS as COMM_OPS
from overlapbench.comm.paths import PATHS as COMM_PATHS
from overlapbench.comm.paths import PATHS_BY_OP
from overlapbench.comm.sizes import comm_sizes
from overlapbench.distributed import DEFAULT
from overlapbench.errors import UserError, listed, named, positive_int, reject_unknown_keys


@dataclass(frozen=True)
class CommSpec:
    """Collective microbenchmarks: what `overlapbench comm` runs, or a study after its layer
    points, into the same results file."""

    ops: tuple[str, ...]
    paths: tuple[str, ...]
    sizes: tuple[int, ...]  # bytes
    nccl_max_ctas: tuple  # NCCL CTA budgets: "default" or ints
    comm_ctas: tuple[int, ...]  # the fused kernel's CTA budgets
    hidden: int | None = None  # fused_norm measures rows x hidden; None: the study's hidden

    KEYS = ("ops", "paths", "sizes", "nccl_max_ctas", "comm_ctas", "hidden")
    DEFAULT_NCCL_MAX_CTAS = (DEFAULT, 4, 8, 16, 32)
    DEFAULT_COMM_CTAS = (1, 2, 4, 8, 16, 32, 64)

    @classmethod
    def build(cls, *, ops: Any, paths: Any, sizes: tuple[int, ...], nccl_max_ctas: Any, comm_ctas: Any,
              hidden: Any, name: Callable[[str], str]) -> CommSpec:
        """Validated; `name(field)` is how an error names a field (comm.ops in a spec, --ops on
        the command line)."""
        from overlapbench.strategies.knobs import NCCL_MAX_CTAS
        from overlapbench.strategies.knobs import comm_ctas as comm_ctas_knob

        ops, paths = named(ops, COMM_OPS, name("ops")), named(paths, COMM_PATHS, name("paths"))
        if not any(p in paths for op in ops for p in PATHS_BY_OP[op]):
            runs = "; ".join(f"{op}: {', '.join(PATHS_BY_OP[op])}" for op in ops)
            raise UserError(f"{name('paths')}: none of {', '.join(paths)} runs the chosen ops ({runs})")
        budget = comm_ctas_knob("comm_ctas", "")
        nccl = tuple(NCCL_MAX_CTAS.check(v, name("nccl_max_ctas")) for v in listed(nccl_max_ctas, name("nccl_max_ctas")))
        fused = tuple(budget.check(v, name("comm_ctas")) for v in listed(comm_ctas, name("comm_ctas")))
        if hidden is not None:
            positive_int(hidden, name("hidden"))
        return cls(ops, paths, tuple(sizes), nccl, fused, hidden)

    @classmethod
    def from_yaml(cls, data: Any, cuda: bool) -> CommSpec:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise UserError(f"comm: must be a mapping with any of {', '.join(cls.KEYS)} ({{}} for the defaults)")
        reject_unknown_keys(data, cls.KEYS, "comm")
        return cls.build(
            ops=data.get("ops", COMM_OPS), paths=data.get("paths", COMM_DEFAULT_PATHS),
            sizes=comm_sizes(data.get("sizes"), cuda, "comm.sizes"),
            nccl_max_ctas=data.get("nccl_max_ctas", cls.DEFAULT_NCCL_MAX_CTAS),
            comm_ctas=data.get("comm_ctas", cls.DEFAULT_COMM_CTAS), hidden=data.get("hidden"),
            name=lambda field: f"comm.{field}",
        )
