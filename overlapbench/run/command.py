"""`overlapbench sweep`: the options, the checks and the re-launch under torchrun, and the run on
each rank (the spec's points, then its `comm:` section, into one store)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from overlapbench import printing
from overlapbench.errors import UserError

if TYPE_CHECKING:
    from overlapbench.distributed.runtime import Runtime
    from overlapbench.specs.spec import SweepSpec
    from overlapbench.tuning.results import ResultStore

# The embedded default spec ships inside the package (a copy of sweeps/quick.yaml), so an
# installed overlapbench runs it from any folder.
QUICK_SPEC = Path(__file__).resolve().parents[1] / "specs" / "quick.yaml"


@dataclass(kw_only=True)
class Options:
    """Measure every strategy x knob setting x batch of a spec; append one row per point.

    Under torchrun it runs as launched (any number of nodes); started plainly it re-launches
    itself on the spec's tp GPUs (`tp: auto`: all local GPUs; 2 gloo processes on CPU), after
    checking that the spec fits the machine (memory, on CPU its size, on GPUs what other processes hold: see --force).
    Every point is checked against baseline's output before it is timed. Stopped (Ctrl-C,
    SIGTERM, SIGHUP), it keeps the finished rows and ends every process it started.
    """

    spec: Annotated[Path | None, typer.Argument(metavar="SPEC.yaml", help="Sweep spec (YAML). Default: the built-in demo (a copy of sweeps/quick.yaml).")] = None
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Results file (.jsonl). Default: the spec's 'output', else a new results/{name}-{time}.jsonl.")] = None
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted sweep (the --output file, else the newest results/{name}-*.jsonl): skip points already done.")] = False
    nproc: Annotated[int | None, typer.Option("--nproc", help="Processes to launch when not under torchrun. Default: the spec's tp (refused where this machine has fewer GPUs); tp: auto takes all local GPUs; on CPU 2 processes, or the spec's tp where it is 1.")] = None
    profile: Annotated[Path | None, typer.Option("--profile", help="Also profile each point: its kernel table and one forward's kernel timeline into this folder (needs CUDA GPUs; read with report --profile).")] = None
    force: Annotated[bool, typer.Option("--force", help="Run even when a check before the launch refuses: a spec estimated to need more host memory than this machine has, a GPU-sized spec (no cpu: section) on a machine without GPUs, or one that would fit a GPU but not what other processes leave free on it.")] = False
    pieces: Annotated[bool, typer.Option("--pieces", help="Instead: time the compute pieces of one TP=--tp rank's layer on one GPU (what `overlapbench predict --compute` reads).")] = False
    tp: Annotated[int | None, typer.Option("--tp", help="With --pieces: the TP degree whose shard is timed. Default: the spec's.")] = None


def main(options: Options) -> int:
    """Under torchrun: this rank's part (`work`). Started plainly: the checks before a launch
    (the spec, its footprint, the GPUs' other processes), then the re-launch; its exit code."""
    from overlapbench.launch import launch
    from overlapbench.run import footprint
    from overlapbench.specs import spec as spec_mod
    from overlapbench.tuning.results import held_for_launch, kept

    o = options
    path = o.spec or QUICK_SPEC
    if o.profile is not None and launch.local_gpus() == 0:
        raise UserError("--profile: profiles GPU kernels and needs CUDA GPUs; drop --profile on this machine")
    if launch.under_torchrun():
        launch.as_worker()
        loaded = spec_mod.load(path, cuda=launch.local_gpus() > 0)
        if o.pieces:
            from overlapbench.run import pieces

            pieces.run(loaded, o.output, o.tp)
            return 0
        out = o.output or loaded.output_path(o.resume)
        if o.profile is not None:
            o.profile.mkdir(parents=True, exist_ok=True)
        try:
            work(loaded, out, o.resume, o.profile)
        except KeyboardInterrupt:
            raise launch.Interrupted(interrupted(o.spec, out)) from None
        return 0
    if o.nproc is not None and o.nproc < 1:
        raise UserError(f"--nproc: must be at least 1, got {o.nproc}")
    if o.pieces:
        return launch_pieces(path, o.output, o.tp)
    cuda = launch.local_gpus() > 0
    loaded = spec_mod.load(path, cuda=cuda)
    try:
        world = o.nproc or launch.default_nproc(loaded.tp)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
    warning = launch.oversubscription(world)
    if warning:
        _warn(warning)
    points = loaded.points(world, cuda=cuda)  # validates tp against the world size
    size = footprint.estimate(loaded, points, cuda)
    if not o.force:
        try:
            warning = footprint.check(loaded, size, world, cuda, launch.gpu_memory_bytes())
        except UserError as e:
            raise UserError(f"{path}: {e}") from None
        if warning:
            _warn(warning)
    out = o.output or loaded.output_path(o.resume)
    memory = f"this run needs about {printing.gib(size.memory_bytes)} per process, {world} processes"
    with held_for_launch(out, o.resume, loaded.name) as done:  # a second run into `out` is refused from here on
        if done and all(p.key() in done for p in points) and loaded.comm is None:
            printing.console().print(f"{out}: every point of {loaded.name} ({len(points)}) is done already; nothing to run",
                                     soft_wrap=True)
            return 0
        sharing = launch.gpu_sharing_check(world, size.memory_bytes, o.force)
        if sharing:
            _warn(sharing)
        args = ["sweep", str(path), "--output", str(out)] + (["--resume"] if o.resume else [])
        args += ["--profile", str(o.profile)] if o.profile is not None else []
        try:
            code, what = launch.run_into(out, args, world, memory)
        except launch.Interrupted as stop:
            raise launch.Interrupted(interrupted(o.spec, out, stop)) from None
    if code and what is not None:
        rows = kept(out, f"`overlapbench sweep{_named(o.spec)} --output {out} --resume` skips them")
        printing.console(stderr=True).print(printing.styled(("sweep failed:", "bold red"), f" {what} {rows[0].upper()}{rows[1:]}."),
                                            soft_wrap=True)
    return code


def launch_pieces(path: Path, output: Path | None, tp: int | None) -> int:
    """`sweep --pieces`: one process on one GPU times the shard layer's pieces (pieces.py); its
    exit code."""
    from overlapbench.launch import launch
    from overlapbench.specs import spec as spec_mod
    from overlapbench.tuning.results import held_for_launch

    if launch.local_gpus() == 0:
        raise UserError("--pieces: times one rank's compute on a GPU, and this machine has none; run it on one GPU")
    loaded = spec_mod.load(path, cuda=True)
    tp = tp or (loaded.tp if isinstance(loaded.tp, int) else None)
    if tp is None or tp < 1:
        raise UserError("--tp: give the TP degree whose shard to time (the spec says tp: auto)")
    loaded.check_tp(tp)
    out = output or Path("results") / f"{loaded.name}-pieces-tp{tp}.jsonl"
    with held_for_launch(out, False, loaded.name):  # a second run into `out` is refused from here on
        sharing = launch.gpu_sharing_check(1, None, False)
        if sharing:
            printing.console(stderr=True).print(f"warning: {sharing}")
        code, what = launch.run_into(out, ["sweep", str(path), "--pieces", "--tp", str(tp), "--output", str(out)], 1)
    if what is not None:
        printing.console(stderr=True).print(f"sweep --pieces failed: {what}")
    return code


def work(spec: SweepSpec, output: Path, resume: bool, profile_dir: Path | None = None) -> int:
    """The sweep on this rank: the spec's points (run/sweep.py), then its `comm:` section, into
    one store; the rows written. The runtime is closed however the sweep ends (session), so NCCL
    windows never outlive their communicators."""
    from overlapbench.launch import environment
    from overlapbench.launch.session import session
    from overlapbench.launch.watchdog import Watchdog, interrupt_on_sigterm
    from overlapbench.run import sweep
    from overlapbench.timing import peak
    from overlapbench.tuning import results

    with session(spec.measure.timeout_s, nccl_tuning_log=spec.comm is not None) as rt:  # comm rows: NCCL's kernel
        interrupt_on_sigterm()
        watchdog = Watchdog(spec.measure.timeout_s, rt.rank)
        console = printing.console(quiet=rt.rank != 0)
        env = environment.run_environment(rt) | {"peak": peak.dense_peak(rt.device)}  # rows' peak_frac: against it
        points = spec.points(rt.world_size, rt.is_cuda)
        store, done, run_id = results.open_on_ranks(output, resume, rt.rank, spec.name)
        todo = [p for p in points if p.key() not in done]
        if done:
            console.print(f"resuming {output}: {len(points) - len(todo)} of {len(points)} points already done")
        console.print(sweep.header(spec, len(todo), rt, output))
        try:
            written = sweep.measure_points(rt, spec, todo, max(p.tokens for p in points), store, run_id, env, watchdog,
                                           profile_dir)
            if spec.comm is not None:  # the study's collective microbenchmarks, into the same store
                written += comm_section(rt, spec, store, done, run_id, env, console)
        finally:
            if store is not None:
                store.close()
        console.print(printing.styled((f"wrote {written} rows to {output}", "bold"), f" (run {run_id})"))
        return written


def comm_section(rt: Runtime, spec: SweepSpec, store: ResultStore | None, done: set[str], run_id: str, env: dict,
                 console) -> int:
    """A study's `comm:` section, after its layer points, into the same store; rows written."""
    from overlapbench.comm.paths import make_cases
    from overlapbench.comm.run import RunInfo, run_cases

    bench = spec.comm
    dtype = spec.resolved_dtype(rt.is_cuda)
    cases = make_cases(bench, rt.world_size, rt.backend, dtype, bench.hidden or spec.shape.hidden, len(env["hosts"]),
                       windows=rt.nccl_windows_unavailable())
    m = spec.measure
    info = RunInfo(spec.name, run_id, env, m.warmup, m.iters, m.graphs)
    console.print(f"comm: {len(cases)} collective cases")
    rows = run_cases(rt, cases, info, store, done, console)
    return len(rows) if store is not None else 0


def _warn(text: str) -> None:
    printing.console(stderr=True).print(printing.styled(("warning:", "bold yellow"), f" {text}"), soft_wrap=True)


def interrupted(spec: Path | None, out: Path, stop: Exception | None = None) -> str:
    """What a stopped sweep says: its rows, how to go on, the processes that had to be killed."""
    from overlapbench.launch import launch
    from overlapbench.tuning.results import kept

    return launch.stopped(kept(out, f"continue with: overlapbench sweep{_named(spec)} --output {out} --resume"),
                          stop or launch.Interrupted())


def _named(spec: Path | None) -> str:
    """The spec as the command line named it (nothing for the built-in demo)."""
    return "" if spec is None else f" {spec}"
