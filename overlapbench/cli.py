"""The command line: `overlapbench sweep | tune | export | report | strategies | models | env`.

No logic lives here: each command parses its options and calls one module. Long because every
command's options are declared here, one per line, as typer reads them.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import typer

from overlapbench import printing
from overlapbench.errors import UserError

app = typer.Typer(
    help="Benchmark and autotune compute/communication overlap for tensor-parallel LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # docstrings wrap as paragraphs
)
console = printing.console()
err_console = printing.console(stderr=True)

# The embedded default spec ships inside the package (a copy of sweeps/quick.yaml), so an
# installed overlapbench runs it from any folder.
QUICK_SPEC = Path(__file__).resolve().parent / "specs" / "quick.yaml"


def user_errors(fn):
    """Bad input ends the command with one line on stderr and exit code 2, no traceback;
    Ctrl-C with one line (what was kept, how to go on) and exit code 130."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from overlapbench.run import launch, launch_log

        try:
            return fn(*args, **kwargs)
        except UserError as e:
            if os.environ.get("RANK", "0") == "0":  # under torchrun, say it once
                err_console.print(printing.styled(("error:", "bold red"), f" {e}"), soft_wrap=True)
            raise typer.Exit(UserError.exit_code) from None
        except (launch.Interrupted, KeyboardInterrupt) as e:
            if os.environ.get("RANK", "0") == "0" and not launch.relaunched():  # the parent speaks for its workers
                try:
                    err_console.print(str(e) if isinstance(e, launch.Interrupted) and str(e) else "interrupted", soft_wrap=True)
                except OSError:  # the terminal is gone (a hang-up): nobody to tell
                    pass
            raise typer.Exit(launch_log.INTERRUPTED) from None

    return wrapper


@app.command()
@user_errors
def sweep(
    spec: Path | None = typer.Argument(None, metavar="SPEC.yaml", help="Sweep spec (YAML). Default: the built-in demo (a copy of sweeps/quick.yaml)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Results file (.jsonl). Default: the spec's 'output', else a new results/{name}-{time}.jsonl."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted sweep (the --output file, else the newest results/{name}-*.jsonl): skip points already done."),
    nproc: int | None = typer.Option(None, "--nproc", help="Processes to launch when not under torchrun. Default: all local GPUs, or 2 on CPU."),
    profile: Path | None = typer.Option(None, "--profile", help="Also profile each point: a kernel table per point into this folder (needs CUDA GPUs)."),
    force: bool = typer.Option(False, "--force", help="Run even when a check before the launch refuses: a spec estimated to need more host memory than this machine has, a GPU-sized spec (no cpu: section) on a machine without GPUs, or one that would fit a GPU but not what other processes leave free on it."),
    pieces: bool = typer.Option(False, "--pieces", help="Instead: time the compute pieces of one TP=--tp rank's layer on one GPU (what `overlapbench predict --compute` reads)."),
    tp: int | None = typer.Option(None, "--tp", help="With --pieces: the TP degree whose shard is timed. Default: the spec's."),
) -> None:
    """Measure every strategy x knob setting x batch of a spec; append one row per point.

    Under torchrun it runs as launched (any number of nodes); started plainly it re-launches
    itself on all local GPUs (or 2 gloo processes on CPU), after checking that the spec fits
    the machine (memory, on CPU its size, on GPUs what other processes hold: see --force).
    Every point is checked against baseline's output before it is timed. Stopped (Ctrl-C,
    SIGTERM, SIGHUP), it keeps the finished rows and ends every process it started.
    """
    from overlapbench.run import footprint, launch
    from overlapbench.specs import spec as spec_mod
    from overlapbench.tuning.results import held_for_launch, kept

    path = spec or QUICK_SPEC
    if profile is not None and launch.local_gpus() == 0:
        raise UserError("--profile: profiles GPU kernels and needs CUDA GPUs; drop --profile on this machine")
    if launch.under_torchrun():
        from overlapbench.run import sweep as sweep_mod

        launch.as_worker()
        loaded = spec_mod.load(path, cuda=launch.local_gpus() > 0)
        if pieces:
            from overlapbench.predict import pieces as pieces_mod

            pieces_mod.run(loaded, output, tp)
            return
        out = output or loaded.output_path(resume)
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
        try:
            sweep_mod.run(loaded, out, resume, profile)
        except KeyboardInterrupt:
            raise launch.Interrupted(_interrupted(spec, out)) from None
        return
    if nproc is not None and nproc < 1:
        raise UserError(f"--nproc: must be at least 1, got {nproc}")
    if pieces:
        from overlapbench.predict.command import launch_pieces

        return launch_pieces(path, output, tp)
    cuda = launch.local_gpus() > 0
    world = nproc or launch.default_nproc()
    warning = launch.oversubscription(world)
    if warning:
        _warn(warning)
    loaded = spec_mod.load(path, cuda=cuda)
    points = loaded.points(world, cuda=cuda)  # validates tp against the world size
    size = footprint.estimate(loaded, points, cuda)
    if not force:
        try:
            warning = footprint.check(loaded, size, world, cuda, launch.gpu_memory_bytes())
        except UserError as e:
            raise UserError(f"{path}: {e}") from None
        if warning:
            _warn(warning)
    out = output or loaded.output_path(resume)
    memory = f"this run needs about {footprint.gib(size.memory_bytes)} per process, {world} processes"
    with held_for_launch(out, resume, loaded.name) as done:  # a second run into `out` is refused from here on
        if done and all(p.key() in done for p in points) and loaded.comm is None:
            console.print(f"{out}: every point of {loaded.name} ({len(points)}) is done already; nothing to run", soft_wrap=True)
            return
        sharing = launch.gpu_sharing_check(world, size.memory_bytes, force)
        if sharing:
            _warn(sharing)
        args = ["sweep", str(path), "--output", str(out)] + (["--resume"] if resume else [])
        args += ["--profile", str(profile)] if profile is not None else []
        try:
            code, what = launch.run_into(out, args, world, memory)
        except launch.Interrupted as stop:
            raise launch.Interrupted(_interrupted(spec, out, stop)) from None
    if not code:
        return
    if what is not None:
        rows = kept(out, f"`overlapbench sweep{_named(spec)} --output {out} --resume` skips them")
        err_console.print(printing.styled(("sweep failed:", "bold red"), f" {what} {rows[0].upper()}{rows[1:]}."), soft_wrap=True)
    raise typer.Exit(code)


def _say(text: str) -> None:
    err_console.print(text, soft_wrap=True)


def _warn(text: str) -> None:
    err_console.print(printing.styled(("warning:", "bold yellow"), f" {text}"), soft_wrap=True)


def _interrupted(spec: Path | None, out: Path, stop: Exception | None = None) -> str:
    """What a stopped sweep says: its rows, how to go on, the processes that had to be killed."""
    from overlapbench.run import launch
    from overlapbench.tuning.results import kept

    return launch.stopped(kept(out, f"continue with: overlapbench sweep{_named(spec)} --output {out} --resume"),
                          stop or launch.Interrupted())


def _named(spec: Path | None) -> str:
    """The spec as the command line named it (nothing for the built-in demo)."""
    return "" if spec is None else f" {spec}"


@app.command()
@user_errors
def comm(
    min_bytes: str | None = typer.Option(None, "-b", "--min-bytes", help="Smallest size, bytes or with K/M/G (binary). Default: 1M on GPUs, 1K on CPU."),
    max_bytes: str | None = typer.Option(None, "-e", "--max-bytes", help="Largest size. Default: 1G on GPUs, 64K on CPU."),
    factor: int = typer.Option(2, "-f", "--factor", help="Each size is the previous one times this."),
    ops: str | None = typer.Option(None, "--ops", help="Comma list of all_reduce, all_gather, reduce_scatter. Default: all."),
    paths: str | None = typer.Option(None, "--paths", help="Comma list of nccl (gloo on CPU), symm_one_shot, symm_two_shot, fused_norm (the layer's fused kernel: v2 pull), fused_norm_push and fused_norm_pull_push (v2's other variants), fused_norm_v1, copy_engine, copy_engine_norm, nccl_symm (NCCL's symmetric kernels on registered windows, NCCL 2.27+). Default: all."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bf16 on GPUs, fp32 on CPU) | bf16 | fp16 | fp32."),
    nccl_max_ctas: str | None = typer.Option(None, "--nccl-max-ctas", help="NCCL CTA budgets (max_ctas; nccl_symm: exactly that many, min_ctas = max_ctas), 'default' or 1..64. Default: default,4,8,16,32."),
    comm_ctas: str | None = typer.Option(None, "--comm-ctas", help="CTA budgets of the fused all-reduce+RMSNorm kernel and of the copy-engine path's add+norm kernel. Default: 1,2,4,8,16,32,64."),
    hidden: int | None = typer.Option(None, "--hidden", help="fused_norm measures rows x hidden: a size becomes size / (hidden x dtype bytes) rows. Default: 8192 (with --beside-layer: the model's)."),
    iters: int = typer.Option(20, "--iters", help="Timed samples per size (small sizes repeat the op within a sample)."),
    warmup: int = typer.Option(5, "--warmup", help="Untimed samples first."),
    graphs: bool = typer.Option(True, "--graphs/--no-graphs", help="Time CUDA-graph replays (falls back to eager where capture fails)."),
    fmt: str = typer.Option("table", "--format", help="table | csv | json (to stdout; progress goes to stderr)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Results file (.jsonl). Default: results/comm-{device}-{world}.jsonl."),
    resume: bool = typer.Option(False, "--resume", help="Continue: skip the cases already in the results file."),
    nproc: int | None = typer.Option(None, "--nproc", help="Processes to launch when not under torchrun. Default: all local GPUs, or 2 on CPU."),
    ce_chunks: str | None = typer.Option(None, "--ce-chunks", help="copy_engine_norm: comma list of chunk counts its rows are cut into (1: the serial schedule) or auto (by size, as the layer). Default: auto."),
    beside_gemm: bool = typer.Option(False, "--beside-gemm", help="Also time each case while llama3-70b TP=2 MLP GEMMs (4096 tokens, bf16) run on another stream: the path's time and busbw beside them and the GEMMs' TFLOP/s loss. GPUs only."),
    beside_layer: str | None = typer.Option(None, "--beside-layer", metavar="MODEL", help="Also time each all-reduce beside one rank's shard of MODEL's layer (a preset: its attention, then its MLP, on the rows the all-reduce carries): the compute's loss, the transfer's stretch, and the all-reduce's extra cost in line with the layer. The sizes come from --tokens. GPUs only."),
    layer_tp: int | None = typer.Option(None, "--tp", help="With --beside-layer: the TP degree of the layer shard. Default: the world size."),
    tokens: str | None = typer.Option(None, "--tokens", help="With --beside-layer: comma list of the layer's row counts; each case's all-reduce carries that many rows (rows x hidden x 2 bytes). Default: 512,1024,...,32768."),
) -> None:
    """Collective microbenchmarks in nccl-tests' terms: size, count, type, time, algbw, busbw,
    #wrong, for NCCL under CTA budgets, symmetric-memory one-/two-shot all-reduce, the fused
    all-reduce + RMSNorm kernel, and a copy-engine all-gather. Each size is checked (#wrong,
    exact integer inputs) before it is timed; rows go to a results file like sweep's."""
    from overlapbench.comm import command as comm_mod

    opts = comm_mod.Options.parse(
        min_bytes=min_bytes, max_bytes=max_bytes, factor=factor, ops=ops, paths=paths, dtype=dtype,
        nccl_max_ctas=nccl_max_ctas, comm_ctas=comm_ctas, hidden=hidden, iters=iters, warmup=warmup,
        graphs=graphs, fmt=fmt, output=output, resume=resume, nproc=nproc, beside_gemm=beside_gemm,
        ce_chunks=ce_chunks, beside_layer=beside_layer, layer_tp=layer_tp, tokens=tokens,
    )
    code = comm_mod.main(opts, console, err_console)
    if code:
        raise typer.Exit(code)


@app.command()
@user_errors
def predict(
    spec: Path = typer.Argument(..., metavar="SPEC.yaml", help="The study to predict: every strategy, knob setting and batch of it."),
    tp: int = typer.Option(..., "--tp", help="The TP degree to predict."),
    comm: list[Path] = typer.Option(..., "--comm", metavar="TABLE", help="The all-reduce table: `overlapbench comm` rows (.jsonl; its --beside-layer or --beside-gemm rows give the contention), or nccl-tests all_reduce_perf output (.txt). Repeat for several files; tables of another world size are rescaled to --tp's (docs/predict.md)."),
    compute: list[Path] | None = typer.Option(None, "--compute", metavar="ROWS", help="The shard's compute pieces, timed on one GPU by `overlapbench sweep SPEC --pieces --tp K`. Default: results/{name}-pieces-tp{K}.jsonl."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Where the predicted rows go (.jsonl). Default: results/{name}-predicted-tp{K}.jsonl."),
    busbw: float | None = typer.Option(None, "--busbw", metavar="GB/S", help="Rescale the tables of other world sizes to this all-reduce bus bandwidth at 1 GiB at --tp's world size (a table measured on fewer GPUs, to predict more). Default: match them to a --tp table's NCCL ring."),
    transfer_beside: str = typer.Option("auto", "--transfer-beside", help="auto | alone | measured: a transfer beside compute runs as slowed as measured beside the layer (--beside-layer rows), as fast as alone where only --beside-gemm rows measured it, and a copy-engine one as fast as alone taking nothing from the compute (auto); always as fast as alone; or as slowed as either measured it."),
    error: float | None = typer.Option(None, "--error", metavar="ABS", help="The error of a predicted speedup, absolute: the rows' interval. Default: what the TP=2 validation supports (docs/predict.md)."),
) -> None:
    """Predict a study at TP=K from one GPU's compute pieces and a table of collectives: rows in
    the sweep's schema (timing "predicted"), which `tune` and `report` read as they are."""
    from overlapbench.predict import command as predict_mod

    out, summary = predict_mod.main(spec, tp, comm, compute, output, busbw, transfer_beside, error)
    console.print(f"wrote predicted rows to {out}", soft_wrap=True, highlight=False)
    for line in summary:
        console.print(line, soft_wrap=True, highlight=False, markup=False)


@app.command()
@user_errors
def tune(
    results: list[Path] | None = typer.Argument(None, metavar="RESULTS.jsonl", help="Results files, read in order (a later row for a point wins). Default: the newest in results/ holding a sweep's rows (layer or micro; not comm's)."),
    out_dir: Path = typer.Option(Path("results/tuned"), "--out-dir", help="Where the tuned YAMLs go."),
    min_gain: float = typer.Option(0.01, "--min-gain", metavar="FRACTION", help="How much faster, beyond the noise, a strategy must be to replace a simpler one (0.01: 1%; 0: any gain)."),
) -> None:
    """Choose the best strategy and knobs per token range; write one tuned YAML per
    (device, world size, tp, shape, dtype) of the layer workload (micro runs: see report). A
    strategy replaces a simpler one only if it is faster by --min-gain beyond the noise (95%
    interval of the speedup above 1 + min-gain; too few samples never replace); ties go to the
    simpler strategy. Each pick is also said against the fastest baseline setting (vs best)."""
    from overlapbench.specs.spec import WORKLOADS
    from overlapbench.tuning import results as results_mod
    from overlapbench.tuning import tune as tune_mod

    paths = [results_mod.given_or_newest(p, WORKLOADS, _say) for p in results or [None]]
    for path in paths:
        kinds = results_mod.workloads_in(path)
        if kinds and not kinds & set(WORKLOADS):
            raise UserError(f"{path}: holds {'/'.join(sorted(kinds))} rows, which tune does not choose from; tune reads a "
                            f"sweep's results (`overlapbench report {path}` shows these)")
    before = {p: _tuned_summary(p) for p in out_dir.glob("*.yaml")} if out_dir.is_dir() else {}
    for path in tune_mod.run(paths, out_dir, console, min_gain):
        replaced = f" (replacing the config it held: {before[path]})" if path in before else ""
        console.print(f"wrote {path}{replaced}", soft_wrap=True)


def _tuned_summary(path: Path) -> str:
    """What a tuned YAML chose, in one line: `runs c3fa158d765c: 1-1448 fused_norm, 1449-16384 token_split`."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
        runs = ", ".join(map(str, data["provenance"]["run_ids"]))
        picks = ", ".join(f"{r['tokens'][0]}-{r['tokens'][1]} {r['strategy']}" for r in data["rules"])
        return f"runs {runs}: {picks}"
    except (OSError, yaml.YAMLError, KeyError, TypeError, IndexError):
        return "a file that is not a tuned config"


@app.command()
@user_errors
def export(
    inputs: list[Path] = typer.Argument(..., metavar="TUNED.yaml|RESULTS.jsonl", help="Tuned configs, or results files to tune here (nothing else written)."),
    engine: str = typer.Option(..., "--engine", help="tokenweave | vllm | sglang | trtllm (any case)."),
    engine_version: str | None = typer.Option(None, "--engine-version", metavar="V", help="The engine release whose key names and defaults to judge against (vllm: 0.31.0 or 0.33.0, the default; sglang: 0.5.23; a leading v is fine). One whose code was not read is refused."),
    out: Path = typer.Option(Path("results/exports"), "--out", help="Folder; each config's files go to OUT/ENGINE/CONFIG-NAME/."),
    show_defaults: bool = typer.Option(False, "--defaults", help="Instead: per measured batch, what the engine's defaults run, what the export runs and the tuned pick, from the rows behind each config (markdown)."),
) -> None:
    """Write the tuned choice as the files and flags an engine reads: TokenWeave's config JSON,
    vLLM's --compilation-config and env lines, SGLang's flags, TensorRT-LLM's YAML. vLLM, SGLang and
    TensorRT-LLM get the fastest setting they can express by the rows behind the config, never slower
    than their own defaults; each file's header says what it changes, what the host needs, what the
    engine cannot run and what that would add."""
    from overlapbench.export import command as export_mod

    for path in export_mod.run(inputs, engine, engine_version, out, show_defaults, console):
        console.print(f"wrote {path}")


@app.command()
@user_errors
def report(
    results: list[Path] | None = typer.Argument(None, metavar="RESULTS.jsonl", help="Results files, read in order (a later row for a point wins). Default: the newest in results/ holding a sweep's rows (layer or micro), else the newest."),
    fmt: str = typer.Option("table", "--format", help="table | markdown | csv | json (csv/json: one record per cell, to stdout)."),
    sensitivity: str | None = typer.Option(None, "--sensitivity", metavar="STRATEGY", help="Show one strategy's knob grid (ms per setting) at --tokens."),
    tokens: int | None = typer.Option(None, "--tokens", metavar="N", help="The token count for --sensitivity."),
    plot: Path | None = typer.Option(None, "--plot", metavar="FILE.png", help="Also draw time per layer (micro: per GEMM) vs tokens to a PNG (needs the 'plot' extra: matplotlib)."),
    plot_metric: str = typer.Option("ms", "--plot-metric", help="ms | speedup: what --plot draws."),
    compare: tuple[Path, Path] | None = typer.Option(None, "--compare", metavar="OLD NEW", help="Per point (matched by key) the ratio NEW/OLD of ms per layer (micro: per GEMM)."),
    fail_above: float | None = typer.Option(None, "--fail-above", metavar="PCT", help="With --compare: exit 1 when any point got slower by more than PCT percent."),
    across_devices: bool = typer.Option(False, "--across-devices", help="With --compare: compare OLD and NEW of different devices, or measured against predicted (refused without it: the difference is not the code's)."),
    profile: Path | None = typer.Option(None, "--profile", metavar="DIR", help="Where each point's GPU time goes: the kernel tables `sweep --profile DIR` wrote, by kind of kernel, per layer, beside no_comm's."),
    rounds: bool = typer.Option(False, "--rounds", help="How noisy the paired timing's rounds were, per batch: rounds, the sd of per-round ratios, the widest interval."),
) -> None:
    """Compare strategies per token count, a table per group (layer, or a micro workload's
    GEMM): ms per layer (per GEMM), speedup over the reference (baseline; micro: sp_baseline),
    share of the exposed communication hidden; the winner marked, noisy cells flagged."""
    from overlapbench import report as report_mod
    from overlapbench.specs.spec import WORKLOADS
    from overlapbench.tuning import results as results_mod

    def file_of(path: Path | None) -> Path:
        return results_mod.given_or_newest(path, WORKLOADS, _say, fallback=True)

    paths = [file_of(p) for p in results] if results else ([] if compare else [file_of(None)])
    compare = None if compare is None else (file_of(compare[0]), file_of(compare[1]))
    code = report_mod.run(paths, fmt, console, sensitivity=sensitivity, tokens=tokens, plot_path=plot,
                          plot_metric=plot_metric, compare_paths=compare, fail_above=fail_above, profile_dir=profile,
                          rounds=rounds, across_devices=across_devices)
    if code:
        raise typer.Exit(code)


@app.command("strategies")
@user_errors
def list_strategies() -> None:
    """List the strategies, where they run, and their knobs with domains and help."""
    from overlapbench.specs import catalog

    catalog.show_strategies(console)


@app.command()
@user_errors
def models(
    config: Path | None = typer.Option(None, "--config", metavar="FILE.json", help="Show the shape read from a Hugging Face config.json (what `model: FILE.json` in a spec measures): each field, the JSON field it came from, and what is not modelled."),
) -> None:
    """List the model presets and their shapes (the attention details and MoE fields beside
    the sizes); with --config, the shape of one Hugging Face config.json."""
    from overlapbench.specs import catalog

    if config is None:
        catalog.show_models(console)
    else:
        catalog.show_config(console, config)


@app.command()
def env(as_json: bool = typer.Option(False, "--json", help="Print the facts as JSON.")) -> None:
    """What the tool sees: devices and their links, versions, symmetric memory, multicast
    settings, world size. The same facts go into every result row."""
    from overlapbench.run import environment

    facts = environment.local_devices() | {
        "versions": environment.versions(),
        "git": environment.git_commit(),
        "world_size": int(os.environ.get("WORLD_SIZE", 1)),
    }
    if as_json:
        console.print_json(json.dumps(facts))
        return
    topology = facts.pop("topology", None)
    import yaml

    # YAML, as specs are written: null and true, nested facts indented, long text wrapped at 80
    plain = json.loads(json.dumps(facts, default=str))  # version objects as their text
    console.print(yaml.safe_dump(plain, sort_keys=False, width=78, allow_unicode=True).rstrip(), soft_wrap=True)
    if topology:
        console.print(topology)


def _version(value: bool) -> None:
    if value:
        from overlapbench import __version__

        console.print(f"overlapbench {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Benchmark and autotune compute/communication overlap for tensor-parallel LLM inference."""


def command():
    """The command behind `app`, its help tidied: a flag takes no value, so it shows no
    `<bool>` placeholder (typer prints one beside every flag, --help included); an argument's
    name (SPEC.yaml, RESULTS.jsonl) says what it takes, without a `<list[Path]>` type beside it.

    Through typer's own API only: typer 0.29 carries its own copy of click and no longer installs
    the `click` package, so nothing here may import it."""
    root = typer.main.get_command(app)
    for cmd in [root, *getattr(root, "commands", {}).values()]:
        for param in cmd.get_params(typer.Context(cmd)):
            if getattr(param, "is_flag", False):
                param.metavar = ""
            elif param.param_type_name == "argument":
                param.display_type_rich = lambda ctx: None
    return root


def main() -> None:
    command()(prog_name="overlapbench")


if __name__ == "__main__":
    main()
