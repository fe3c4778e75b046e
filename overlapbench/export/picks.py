"""What every engine's export shares: a tuned config's ranges as engine-neutral picks, the
sizes an engine's byte thresholds are written in, and the export itself (files, header, warnings)
and how it is written.

An engine sees a batch's token count and our kernels only by analogy, so each pick gets a `kind`
that names the mechanism, not our implementation: `nccl` (NCCL all-reduce, then add + RMSNorm),
`nccl_symm` (NCCL's symmetric kernels on registered windows), `one_shot` / `two_shot` (PyTorch's
symmetric-memory all-reduce), `fused_norm` (one all-reduce + add + RMSNorm kernel), `token_split`
(TokenWeave), `iso`, and the sequence-parallel family `sp_baseline`, `async_tp`, `flash_agrs`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from overlapbench.comm.sizes import DTYPE_BYTES
from overlapbench.errors import UserError
from overlapbench.overlap import comm_methods
from overlapbench.tuned import Rule, TunedConfig, write_atomic

if TYPE_CHECKING:
    from overlapbench.tuning.analysis import Measured

MIB = 1 << 20
SP_FAMILY = ("sp_baseline", "async_tp", "flash_agrs")
ALLREDUCE = ("nccl", "one_shot", "two_shot")  # baseline's `allreduce` knob: NCCL, PyTorch symmetric memory
# Compute capability by device name (the name a sweep's rows carry): engines key their tables by it.
CAPABILITY = {"H100": 90, "H200": 90, "H800": 90, "H20": 90, "GH200": 90, "B200": 100, "GB200": 100, "B300": 103}


@dataclass(frozen=True)
class Pick:
    """One tuned rule: batches of lo..hi tokens run `strategy` with `knobs`; `kind` is its mechanism."""

    lo: int
    hi: int
    strategy: str
    knobs: dict
    kind: str

    def text(self) -> str:
        knobs = " ".join(f"{k}={v}" for k, v in self.knobs.items() if v not in (None, "default"))
        return f"{self.lo}..{self.hi} tokens: {self.strategy}{' ' + knobs if knobs else ''}"


def kind_of(strategy: str, knobs: dict) -> str:
    """The mechanism a strategy and its knobs run (see the module docstring): baseline's all-reduce,
    fused_norm's communication method (its record's engine kind, overlap/comm_methods.py), else
    the strategy."""
    if strategy == "baseline":
        allreduce = knobs.get("allreduce") or "nccl"
        if allreduce not in ALLREDUCE:
            raise UserError(f"baseline knob allreduce: {allreduce!r} has no engine counterpart here "
                            f"({' | '.join(ALLREDUCE)})")
        if allreduce == "nccl":
            return comm_methods.get("nccl_symm" if knobs.get("nccl_symm") else "nccl").engine_kind
        return allreduce
    if strategy == "fused_norm":
        return comm_methods.get(knobs.get("comm", "fused")).engine_kind
    return strategy


def picks(config: TunedConfig) -> list[Pick]:
    return [pick_of(rule) for rule in config.rules]


def pick_of(rule: Rule) -> Pick:
    return Pick(rule.lo, rule.hi, rule.strategy, dict(rule.knobs), kind_of(rule.strategy, rule.knobs))


def dtype_bytes(config: TunedConfig) -> int:
    if config.dtype not in DTYPE_BYTES:
        raise UserError(f"dtype: {config.dtype!r} has no byte size known here ({', '.join(DTYPE_BYTES)})")
    return DTYPE_BYTES[config.dtype]


def hidden(config: TunedConfig) -> int:
    value = config.shape.get("hidden")
    if not isinstance(value, int) or value < 1:
        raise UserError(f"shape.hidden: must be a positive integer to size the all-reduce, got {value!r}")
    return value




def capability(device: str) -> int | None:
    """The compute capability (90 for Hopper) of a device name such as 'NVIDIA H200', or None."""
    words = device.replace("NVIDIA", "").replace("-", " ").split()
    return next((CAPABILITY[w] for w in words if w in CAPABILITY), None)


class EngineModel:
    """What every engine's Model (export/choice.Model) knows of its tuned config: the release, the
    GPU's compute capability (None: not one whose tables were read), TP, the bytes of one row of
    the all-reduce; its default setting, the engine's `setting` with no argument; and its default
    step cap, from the engine's facts (`step_cap_tokens` on the GPUs named in `step_cap_devices`)."""

    setting: type  # the engine's Setting: Setting() is what it runs by default
    step_cap_tokens: int | None = None  # the most tokens one step holds by default (None: not read)
    step_cap_devices: tuple[str, ...] = ()  # the GPUs that cap applies to, by a word of the rows' device name

    def __init__(self, config: TunedConfig, version: str | None = None):
        self.config, self.version, self.tp = config, version, config.tp
        self.cap = capability(config.device)
        self.row_bytes = hidden(config) * dtype_bytes(config)

    def default(self):
        return self.setting()

    def step_cap(self) -> int | None:
        """The most tokens one step holds by default on this GPU (None: not recorded for it)."""
        words = self.config.device.replace("-", " ").split()
        return self.step_cap_tokens if any(w in self.step_cap_devices for w in words) else None








@dataclass(frozen=True)
class Engine:
    """One engine an export is written for, declared by its module (export/engines.py lists them):
    the name `--engine` takes, how it is judged, and the picks it runs. The command, `--defaults`
    and the command line's choices read these records."""

    name: str  # --engine's value (any case)
    title: str  # how the files and warnings name it
    export: Callable[[TunedConfig, list[Measured], str, str | None], Export]  # (config, rows, source, release)
    model: Callable[[TunedConfig, str | None], Any]  # what its code runs at a release: choice.py and --defaults read it
    runs: tuple[str, ...]  # the pick kinds (kind_of) it can run; every other kind has a reason in `cannot`
    cannot: Callable[[Pick, str | None], str | None]  # (pick, release) -> why the engine cannot run it, or None
    judged: bool = True  # its export is judged from the rows against its defaults (TokenWeave's file is not)

    def why_not(self, pick: Pick, version: str | None = None) -> str | None:
        """Why the engine does not run `pick`, None where it can: its module's reason, or, for a
        kind its record does not know (a strategy added after it), that it is not exported."""
        why = self.cannot(pick, version)
        if why is None and pick.kind not in self.runs:
            return (f"{self.title}'s export knows no counterpart of {pick.kind} (overlapbench/export/{self.name}.py says "
                    f"which picks {self.title} runs): not exported")
        return why


@dataclass
class Export:
    """What one engine reads for one tuned config: files (name -> text), the header every file
    carries (what the engine cannot express, which kernels stand for which), and warnings (our
    picks it cannot follow)."""

    engine: str
    version: str | None
    source: str  # the tuned config it came from
    files: dict[str, str] = field(default_factory=dict)
    header: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    choice: Any = None  # choice.Choice where the setting was judged from the rows

    def notes(self) -> list[str]:
        return [*self.header, *(f"WARNING: {w}" for w in self.warnings)]


def comment(lines: list[str], mark: str = "#") -> str:
    return "".join(f"{mark} {line}".rstrip() + "\n" for line in lines)


def provenance(config: TunedConfig, source: str, engine: str, version: str | None) -> list[str]:
    """The header's first lines: which config, which machine and shape, which engine version."""
    shape = f"hidden {config.shape.get('hidden')}, {config.dtype}"
    engine_text = engine + (f" {version}" if version else "")
    return [
        f"overlapbench export for {engine_text}, from {source}",
        f"tuned on {config.device}, TP={config.tp} (world {config.world_size}), {config.model} ({shape})",
        "picks: " + "; ".join(p.text() for p in picks(config)),
    ]


def write(export: Export, out_dir: Path) -> list[Path]:
    """Each file atomically (never half a file), shell scripts executable; a UserError naming
    --out if it cannot."""
    written = []
    for name, text in export.files.items():
        try:
            path = write_atomic(Path(out_dir) / name, text)
            if name.endswith(".sh"):
                path.chmod(0o755)
            written.append(path)
        except OSError as e:
            raise UserError(f"--out: cannot write {Path(out_dir) / name} ({e.strerror or e}); choose another --out") from None
    return written
