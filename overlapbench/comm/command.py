"""`overlapbench comm`: the options (`Options` as the command line gives them, `Plan` once they
are checked), the re-launch under torchrun, and the per-rank measurement."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from overlapbench.comm.cases import DEFAULT_LAYER_TOKENS, BesideLayer
from overlapbench.comm.in_layer import SPAN_MS
from overlapbench.comm.output import FORMATS, render, totals
from overlapbench.comm.paths import DEFAULT_PATHS, OPS, make_cases
from overlapbench.comm.run import RunInfo, run_cases
from overlapbench.comm.sizes import CPU_SIZES, DTYPE_BYTES, DTYPES, GPU_SIZES, parse_size, size_ladder
from overlapbench.comm.spec import CommSpec
from overlapbench.errors import UserError, did_you_mean, shown
from overlapbench.model.models import PRESETS
from overlapbench.printing import console as new_console
from overlapbench.printing import styled

if TYPE_CHECKING:
    from rich.console import Console

    from overlapbench.distributed.runtime import Runtime

TIMEOUT_S = 600
STUDY = "comm"  # the `spec` of this command's rows: a results file holds one study (results.ResultStore)


@dataclass(kw_only=True)
class Options:
    """Collective microbenchmarks in nccl-tests' terms: size, count, type, time, algbw, busbw,
    #wrong, for NCCL under CTA budgets, symmetric-memory one-/two-shot all-reduce, the fused
    all-reduce + RMSNorm kernel, and a copy-engine all-gather. Each size is checked (#wrong,
    exact integer inputs) before it is timed; rows go to a results file like sweep's."""

    min_bytes: Annotated[str | None, typer.Option("-b", "--min-bytes", help="Smallest size, bytes or with K/M/G (binary). Default: 1M on GPUs, 1K on CPU.")] = None
    max_bytes: Annotated[str | None, typer.Option("-e", "--max-bytes", help="Largest size. Default: 1G on GPUs, 64K on CPU.")] = None
    factor: Annotated[int, typer.Option("-f", "--factor", help="Each size is the previous one times this.")] = 2
    ops: Annotated[str | None, typer.Option("--ops", help="Comma list of all_reduce, all_gather, reduce_scatter. Default: all.")] = None
    paths: Annotated[str | None, typer.Option("--paths", help="Comma list of nccl (gloo on CPU), symm_one_shot, symm_two_shot, fused_norm (the layer's fused kernel: v2 pull), fused_norm_push and fused_norm_pull_push (v2's other variants), fused_norm_v1, copy_engine, copy_engine_norm, copy_engine_norm_kernel (copy_engine_norm with the add + norm kernel writing the rank's own rows: a split's ce_out kernel), nccl_symm (NCCL's symmetric kernels on registered windows, NCCL 2.27+). Default: all.")] = None
    dtype: Annotated[str, typer.Option("--dtype", help="auto (bf16 on GPUs, fp32 on CPU) | bf16 | fp16 | fp32.")] = "auto"
    nccl_max_ctas: Annotated[str | None, typer.Option("--nccl-max-ctas", help="NCCL CTA budgets (max_ctas; nccl_symm: exactly that many, min_ctas = max_ctas), 'default' or 1..64. Default: default,4,8,16,32.")] = None
    comm_ctas: Annotated[str | None, typer.Option("--comm-ctas", help="CTA budgets of the fused all-reduce+RMSNorm kernel and of the copy-engine path's add+norm kernel. Default: 1,2,4,8,16,32,64.")] = None
    hidden: Annotated[int | None, typer.Option("--hidden", help="fused_norm measures rows x hidden: a size becomes size / (hidden x dtype bytes) rows. Default: 8192 (with --beside-layer: the model's).")] = None
    iters: Annotated[int, typer.Option("--iters", help="Timed samples per size (small sizes repeat the op within a sample).")] = 20
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed samples first.")] = 5
    graphs: Annotated[bool, typer.Option("--graphs/--no-graphs", help="Time CUDA-graph replays (falls back to eager where capture fails).")] = True
    fmt: Annotated[str, typer.Option("--format", help="table | csv | json (to stdout; progress goes to stderr).")] = "table"
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Results file (.jsonl). Default: results/comm-{device}-{world}.jsonl.")] = None
    resume: Annotated[bool, typer.Option("--resume", help="Continue: skip the cases already in the results file.")] = False
    nproc: Annotated[int | None, typer.Option("--nproc", help="Processes to launch when not under torchrun. Default: all local GPUs, or 2 on CPU.")] = None
    ce_chunks: Annotated[str | None, typer.Option("--ce-chunks", help="copy_engine_norm and copy_engine_norm_kernel: comma list of chunk counts its rows are cut into (1: the serial schedule) or auto (by size, as the layer). Default: auto.")] = None
    beside_gemm: Annotated[bool, typer.Option("--beside-gemm", help="Also time each case while llama3-70b TP=2 MLP GEMMs (4096 tokens, bf16) run on another stream: the path's time and busbw beside them and the GEMMs' TFLOP/s loss. GPUs only.")] = False
    beside_layer: Annotated[str | None, typer.Option("--beside-layer", metavar="MODEL", help="Also time each all-reduce beside one rank's shard of MODEL's layer (a preset: its attention, then its MLP, on the rows the all-reduce carries): the compute's loss, the transfer's stretch, and the all-reduce's extra cost in line with the layer. The sizes come from --tokens. GPUs only.")] = None
    layer_tp: Annotated[int | None, typer.Option("--tp", help="With --beside-layer: the TP degree of the layer shard. Default: the world size.")] = None
    tokens: Annotated[str | None, typer.Option("--tokens", help="With --beside-layer: comma list of the layer's row counts; each case's all-reduce carries that many rows (rows x hidden x 2 bytes). Default: 512,1024,...,32768.")] = None
    settle_ms: Annotated[float | None, typer.Option("--settle-ms", help="With --beside-layer: each graph of the in-layer term's and the pair window's rounds runs untimed this long before its span, so it is timed at its own clock where the GPU runs at its power cap (sweep's measure.settle_ms; 300 there). Default: 0, the graphs of a round sharing one clock.")] = None
    span_ms: Annotated[float | None, typer.Option("--span-ms", help="With --beside-layer: each graph's timed span per round, ms. Default: 20.")] = None


def main(options: Options) -> int:
    """The options checked (`Plan`), then `run`: its exit code."""
    return run(Plan.parse(**asdict(options)), new_console(), new_console(stderr=True))


@dataclass(frozen=True)
class Plan:
    """One `overlapbench comm` invocation, validated before any process starts."""

    min_bytes: int | None  # None: by device (GPU_SIZES / CPU_SIZES)
    max_bytes: int | None
    factor: int
    ops: tuple[str, ...]
    paths: tuple[str, ...]
    dtype: str
    nccl_max_ctas: tuple
    comm_ctas: tuple[int, ...]
    hidden: int
    iters: int
    warmup: int
    graphs: bool
    fmt: str
    output: Path | None
    resume: bool
    nproc: int | None
    beside_gemm: bool = False  # also time each case beside a GEMM stream (comm.contention)
    ce_chunks: tuple[int | None, ...] = (None,)  # copy_engine_norm's chunk counts (None: by size, the layer's)
    # --beside-layer: each all-reduce timed beside this model's layer shard at TP=layer_tp (None:
    # the world size) on each of `tokens` rows; the sizes are those rows' reductions (comm.beside_layer)
    beside_layer: str | None = None
    layer_tp: int | None = None
    tokens: tuple[int, ...] = ()
    settle_ms: float = 0.0  # the beside-layer windows' settling and span (comm/cases.BesideLayer)
    span_ms: float = SPAN_MS

    @classmethod
    def parse(cls, *, min_bytes: str | None, max_bytes: str | None, factor: int, ops: str | None,
              paths: str | None, dtype: str, nccl_max_ctas: str, comm_ctas: str, hidden: int | None,
              iters: int, warmup: int, graphs: bool, fmt: str, output: Path | None, resume: bool,
              nproc: int | None, beside_gemm: bool = False, ce_chunks: str | None = None,
              beside_layer: str | None = None, layer_tp: int | None = None, tokens: str | None = None,
              settle_ms: float | None = None, span_ms: float | None = None) -> Plan:
        if fmt not in FORMATS:
            raise UserError(f"--format: {shown(fmt)} is not one of {', '.join(FORMATS)}")
        if dtype not in DTYPES:
            raise UserError(f"--dtype: {shown(dtype)} is not one of {', '.join(DTYPES)}")
        if iters < 1:
            raise UserError(f"--iters: must be at least 1, got {iters}")
        if warmup < 0:
            raise UserError(f"--warmup: must be at least 0, got {warmup}")
        if nproc is not None and nproc < 1:
            raise UserError(f"--nproc: must be at least 1, got {nproc}")
        if output is not None and output.suffix != ".jsonl":
            raise UserError(f"--output: must be a path ending in .jsonl, got {shown(str(output))}")
        if beside_layer is not None:
            ops, hidden = _beside_layer_checks(beside_layer, beside_gemm, ops, min_bytes, max_bytes, dtype, hidden, layer_tp)
        else:
            given = [flag for flag, value in (("--tp", layer_tp), ("--tokens", tokens), ("--settle-ms", settle_ms),
                                              ("--span-ms", span_ms)) if value is not None]
            if given:
                raise UserError(f"{given[0]}: the layer shard beside the paths; give it with --beside-layer MODEL, or drop it")
        settle_ms = 0.0 if settle_ms is None else settle_ms
        span_ms = SPAN_MS if span_ms is None else span_ms
        if not 0 <= settle_ms <= 60_000:
            raise UserError(f"--settle-ms: must be in [0, 60000] (0: no settling), got {settle_ms:g}")
        if not 0 < span_ms <= 60_000:
            raise UserError(f"--span-ms: must be in (0, 60000], got {span_ms:g}")
        hidden = 8192 if hidden is None else hidden
        lists = CommSpec.build(
            ops=ops or OPS, paths=paths or DEFAULT_PATHS, sizes=(), hidden=hidden,
            nccl_max_ctas=nccl_max_ctas or CommSpec.DEFAULT_NCCL_MAX_CTAS,
            comm_ctas=comm_ctas or CommSpec.DEFAULT_COMM_CTAS,
            name=lambda field: "--" + field.replace("_", "-"),
        )
        opts = cls(
            min_bytes=None if min_bytes is None else parse_size(min_bytes, "-b/--min-bytes"),
            max_bytes=None if max_bytes is None else parse_size(max_bytes, "-e/--max-bytes"),
            factor=factor, ops=lists.ops, paths=lists.paths, dtype=dtype, nccl_max_ctas=lists.nccl_max_ctas,
            comm_ctas=lists.comm_ctas, hidden=hidden, iters=iters, warmup=warmup, graphs=graphs, fmt=fmt,
            output=output, resume=resume, nproc=nproc, beside_gemm=beside_gemm,
            ce_chunks=(None,) if ce_chunks is None else parse_chunks(ce_chunks), beside_layer=beside_layer,
            layer_tp=layer_tp, tokens=() if beside_layer is None else parse_tokens(tokens),
            settle_ms=float(settle_ms), span_ms=float(span_ms),
        )
        opts.sizes(cuda=False)  # validates -b -e -f now, in one line
        return opts

    def layer(self, world: int) -> BesideLayer | None:
        """What --beside-layer times each case beside, at `world` ranks (--tp's default)."""
        if self.beside_layer is None:
            return None
        tp = self.layer_tp or world
        _check_tp(self.beside_layer, tp)
        return BesideLayer(self.beside_layer, tp, self.hidden, self.settle_ms, self.span_ms)

    def sizes(self, cuda: bool) -> tuple[int, ...]:
        """The ladder; a bound not given is the device's default, moved to meet the other. With
        --beside-layer: the all-reduce of each --tokens count of rows (rows x hidden x 2 bytes)."""
        if self.beside_layer is not None:
            return tuple(sorted(n * self.hidden * DTYPE_BYTES["bf16"] for n in self.tokens))
        lo_default, hi_default = (parse_size(s, "size") for s in (GPU_SIZES if cuda else CPU_SIZES))
        lo, hi = self.min_bytes, self.max_bytes
        if lo is None:
            lo = lo_default if hi is None else min(lo_default, hi)
        if hi is None:
            hi = max(lo, hi_default)
        return size_ladder(lo, hi, self.factor)

    def bench(self, cuda: bool) -> CommSpec:
        return CommSpec(self.ops, self.paths, self.sizes(cuda), self.nccl_max_ctas, self.comm_ctas, self.hidden)

    def argv(self, cuda: bool, output: Path) -> list[str]:
        """The same command, explicit, for the ranks torchrun starts."""
        sizes = self.sizes(cuda)
        ladder = [] if self.beside_layer else ["-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", str(self.factor)]
        args = [
            "comm", *ladder,
            "--ops", ",".join(self.ops), "--paths", ",".join(self.paths), "--dtype", self.dtype,
            "--nccl-max-ctas", ",".join(map(str, self.nccl_max_ctas)), "--comm-ctas", ",".join(map(str, self.comm_ctas)),
            "--hidden", str(self.hidden), "--iters", str(self.iters), "--warmup", str(self.warmup),
            "--graphs" if self.graphs else "--no-graphs", "--format", self.fmt, "--output", str(output),
        ]
        args += ["--ce-chunks", ",".join("auto" if c is None else str(c) for c in self.ce_chunks)]
        if self.beside_layer is not None:
            args += ["--beside-layer", self.beside_layer, "--tokens", ",".join(map(str, self.tokens)),
                     "--settle-ms", repr(self.settle_ms), "--span-ms", repr(self.span_ms)]
            args += [] if self.layer_tp is None else ["--tp", str(self.layer_tp)]
        return args + (["--resume"] if self.resume else []) + (["--beside-gemm"] if self.beside_gemm else [])


def _beside_layer_checks(model: str, beside_gemm: bool, ops: str | None, min_bytes, max_bytes, dtype: str,
                         hidden: int | None, tp: int | None) -> tuple[str, int]:
    """--beside-layer's options checked: (the ops, the model's hidden)."""
    if model not in PRESETS:
        raise UserError(f"--beside-layer: {shown(model)} is not a model preset{did_you_mean(model, PRESETS)}; "
                        f"choose one of {', '.join(PRESETS)}")
    shape = PRESETS[model]
    if shape.moe:
        raise UserError(f"--beside-layer: {model} is a mixture-of-experts model; the layer beside the paths is a dense one")
    if beside_gemm:
        raise UserError("--beside-gemm: one compute beside the paths per run; drop --beside-gemm or --beside-layer")
    if ops not in (None, "all_reduce"):
        raise UserError(f"--ops: --beside-layer times the layer's all-reduce only, got {shown(ops)}; drop --ops")
    if min_bytes is not None or max_bytes is not None:
        raise UserError("-b/-e: with --beside-layer the sizes are the reductions of --tokens rows "
                        "(rows x hidden x 2 bytes); drop -b/-e")
    if dtype not in ("auto", "bf16"):
        raise UserError(f"--dtype: --beside-layer runs the layer in bf16, got {shown(dtype)}; drop --dtype")
    if hidden is not None and hidden != shape.hidden:
        raise UserError(f"--hidden: {model}'s hidden is {shape.hidden}, not {hidden}; drop --hidden")
    if tp is not None:
        if tp < 1:
            raise UserError(f"--tp: must be at least 1, got {tp}")
        _check_tp(model, tp)
    return "all_reduce", shape.hidden


def _check_tp(model: str, tp: int) -> None:
    try:
        PRESETS[model].check_tp(tp)
    except UserError as e:
        raise UserError(f"--tp: {str(e).removeprefix('tp: ')}") from None


def parse_tokens(text: str | None) -> tuple[int, ...]:
    """--tokens: a comma list of row counts >= 1 (the layer's rows beside each all-reduce), each once."""
    if text is None:
        return DEFAULT_LAYER_TOKENS
    tokens: list[int] = []
    for item in (x.strip() for x in text.split(",")):
        if not item.isdigit() or int(item) < 1:
            raise UserError(f"--tokens: {shown(item)} is not a whole number >= 1 (a comma list of row counts)")
        if int(item) not in tokens:
            tokens.append(int(item))
    return tuple(sorted(tokens))


def parse_chunks(text: str) -> tuple[int | None, ...]:
    """--ce-chunks: a comma list of chunk counts >= 1 or `auto` (chosen by size), each once."""
    chunks: list[int | None] = []
    for item in (x.strip() for x in text.split(",")):
        if item == "auto":
            value = None
        elif item.isdigit() and int(item) >= 1:
            value = int(item)
        else:
            raise UserError(f"--ce-chunks: {shown(item)} is not auto or an int >= 1")
        if value not in chunks:
            chunks.append(value)
    return tuple(chunks)


def default_output(device: str, world: int) -> Path:
    """results/comm-<device>-<world>.jsonl, e.g. results/comm-nvidia-h200-2.jsonl."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "cpu"
    return Path("results") / f"comm-{slug}-{world}.jsonl"


def _local_device_name() -> str:
    import torch

    return torch.cuda.get_device_properties(0).name if torch.cuda.is_available() else "cpu"


def run(opts: Plan, console: Console, err_console: Console) -> int:
    """Started plainly: check the store, re-launch under torchrun; under torchrun: measure."""
    from overlapbench.launch import launch
    from overlapbench.tuning.results import held_for_launch, kept

    if launch.under_torchrun():
        launch.as_worker()
        return run_ranks(opts, console)
    cuda = launch.local_gpus() > 0
    world = opts.nproc or launch.default_nproc()
    if not cuda:
        _refuse_if_nothing_runs(opts, world)
    opts.layer(world)  # --beside-layer's TP (the world size by default) divides the model's heads
    out = opts.output or default_output(_local_device_name(), world)
    with held_for_launch(out, opts.resume, STUDY):  # a second run into `out` is refused from here on
        for warning in (launch.oversubscription(world), launch.gpu_sharing_check(world, None, False)):
            if warning:
                err_console.print(styled(("warning:", "bold yellow"), f" {warning}"), soft_wrap=True)
        try:
            code, what = launch.run_into(out, opts.argv(cuda, out), world)
        except launch.Interrupted as stop:
            raise launch.Interrupted(launch.stopped(kept(out, f"add --output {out} --resume to continue"), stop)) from None
    if what is not None:
        rows = kept(out, f"`--output {out} --resume` skips them")
        err_console.print(styled(("comm failed:", "bold red"), f" {what} {rows[0].upper()}{rows[1:]}."), soft_wrap=True)
    return code


def _refuse_if_nothing_runs(opts: Plan, world: int) -> None:
    """On a machine without GPUs, refuse up front what would only skip: every case needs CUDA."""
    if opts.beside_gemm:
        raise UserError("--beside-gemm: times each path beside a bf16 GEMM stream on CUDA GPUs, and this machine "
                        "has none; drop --beside-gemm here")
    if opts.beside_layer is not None:
        raise UserError("--beside-layer: times each path beside the layer's bf16 kernels on CUDA GPUs, and this "
                        "machine has none; run it on the GPUs whose transfers it measures")
    dtype = "fp32" if opts.dtype == "auto" else opts.dtype
    cases = make_cases(opts.bench(cuda=False), world, "gloo", dtype, opts.hidden, ce_chunks=opts.ce_chunks)
    if cases and all(c.skip for c in cases):
        reasons = sorted({f"{c.path}: {c.skip}" for c in cases})
        raise UserError(f"--paths: nothing would run on this machine ({'; '.join(reasons)}); on CPU processes "
                        f"only the nccl path (gloo) runs")


def run_ranks(opts: Plan, console: Console) -> int:
    """The measurement on this rank: cases, the store, the rows; rank 0 prints them. The
    runtime is closed however it ends (session): NCCL windows go before their groups."""
    from overlapbench.launch.session import session

    with session(TIMEOUT_S, nccl_tuning_log=True) as rt:  # rows of NCCL paths record its kernel and channels
        _measure(opts, console, rt)
    return 0


def _measure(opts: Plan, console: Console, rt: Runtime) -> None:
    from overlapbench import printing
    from overlapbench.launch import environment
    from overlapbench.tuning import results

    progress = printing.console(stderr=True, quiet=rt.rank != 0)
    env = environment.run_environment(rt)
    dtype = ("bf16" if rt.is_cuda else "fp32") if opts.dtype == "auto" else opts.dtype
    cases = make_cases(opts.bench(rt.is_cuda), rt.world_size, rt.backend, dtype, opts.hidden, len(env["hosts"]),
                       beside_gemm=opts.beside_gemm, ce_chunks=opts.ce_chunks, windows=rt.nccl_windows_unavailable(),
                       beside_layer=opts.layer(rt.world_size))
    output = opts.output or default_output(env["device"], rt.world_size)
    store, done, run_id = results.open_on_ranks(output, opts.resume, rt.rank, STUDY)
    info = RunInfo(STUDY, run_id, env, opts.warmup, opts.iters, opts.graphs)
    try:
        what = f"comm: {len(cases)} cases on {rt.world_size} x {env['device']} ({rt.backend}, {dtype}) -> {output}"
        progress.print(what, highlight=False)
        rows = run_cases(rt, cases, info, store, done, progress)
    finally:
        if store is not None:
            store.close()
    if rt.rank == 0:
        render(rows, opts.fmt, console)
        progress.print(totals(rows), highlight=False)
