"""`overlapbench predict`: a spec's rows at TP=k, predicted, in the sweep's row schema.

Every point of the spec at `--tp K` gets a row whose `ms` is the predicted time per layer
(estimate.py), `timing` is "predicted", `device` is the pieces' device with " (predicted)"
added (`tune`, `report` and `export` keep predicted and measured rows apart, by `timing`), `speedup`
is over the predicted default baseline of its batch (a batch at one depth where the spec lists
several: each depth's rows per layer of its own stack), and `speedup_ci` that speedup +- `error` (the
absolute error the TP=2 validation supports: docs/predict.md). Nothing was measured, so
`p10_ms`, `p90_ms`, `iqr_ms` and `cv` are null; `tune` takes each time +- half the error as its
range (a challenger must win by more than the model's error). `predicted` says what each row was
made from, its `error` and `in_layer` (whether blocking all-reduces paid the measured in-layer
term: `--in-layer`) included.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from overlapbench import printing, strategies
from overlapbench.errors import UserError, shown
from overlapbench.launch import environment
from overlapbench.predict.estimate import (
    DEFAULT_TRANSFER_BESIDE,
    PAIR,
    TRANSFER_BESIDE,
    ComputePieces,
    Estimate,
    Inputs,
    MissingPiece,
    Skip,
    estimate,
)
from overlapbench.predict.in_layer_choice import (
    AUTO_IN_LAYER,
    DEFAULT_IN_LAYER,
    IN_LAYER,
    MEASURED_IN_LAYER,
    NO_IN_LAYER,
    in_layer_for,
)
from overlapbench.predict.notes import FLAGGED, Note
from overlapbench.predict.summary import Summary
from overlapbench.run.piece_keys import batch_of
from overlapbench.specs.spec import SweepSpec
from overlapbench.tuning import results
from overlapbench.tuning.rows import MeasureSettings, make_row

# The absolute error in speedup that the validation supports, `--error`'s default. At TP=2, with
# the in-layer term not charged (`--in-layer none`), the 90th percentile of |predicted - measured|
# over both models' points is 0.036 on 2x H100 and 2x H200 pooled (288 points; 0.039 over the 168
# on H100, 0.032 over the 120 on H200; median 0.012, worst 0.123: results/predicted-h100/ and
# results/predicted-h200/validation.md). At TP=4 on 4x H200 (contention beside TP=4's own layer)
# it is 0.058 (llama3-70b) and 0.091 (llama3-8b), and a prediction is mostly made for a TP above
# the GPUs at hand: so the default stays at 0.07, wider than TP=2 alone supports.
ERROR = 0.07
# Said where the spec settles each choice but a piece row's chain was timed in the shared rounds:
# there a chain read 1-10% faster than at its own clock on one H200 (docs/predict.md, "Each chain
# at its own clock"), and the compute of every phase is scaled by it
SHARED_CHAINS = Note(FLAGGED, "the pieces' chains were timed in shared rounds, where the spec settles each choice: "
                              "its compute may read fast; time them again with `overlapbench sweep SPEC --pieces`")


@dataclass(kw_only=True)
class Options:
    """Predict a study at TP=K from one GPU's compute pieces and a table of collectives: rows in
    the sweep's schema (timing "predicted"), which `tune` and `report` read as they are."""

    spec: Annotated[Path, typer.Argument(metavar="SPEC.yaml", help="The study to predict: every strategy, knob setting and batch of it.")]
    tp: Annotated[int, typer.Option("--tp", help="The TP degree to predict.")]
    comm: Annotated[list[Path], typer.Option("--comm", metavar="TABLE", help="The all-reduce table: `overlapbench comm` rows (.jsonl; its --beside-layer or --beside-gemm rows give the contention), or nccl-tests all_reduce_perf output (.txt). Repeat for several files; tables of another world size are rescaled to --tp's (docs/predict.md).")]
    compute: Annotated[list[Path] | None, typer.Option("--compute", metavar="ROWS", help="The shard's compute pieces, timed on one GPU by `overlapbench sweep SPEC --pieces --tp K`. Default: results/{name}-pieces-tp{K}.jsonl.")] = None
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Where the predicted rows go (.jsonl). Default: results/{name}-predicted-tp{K}.jsonl.")] = None
    busbw: Annotated[float | None, typer.Option("--busbw", metavar="GB/S", help="Rescale the tables of other world sizes to this all-reduce bus bandwidth at 1 GiB at --tp's world size (a table measured on fewer GPUs, to predict more). Default: match them to a --tp table's NCCL ring.")] = None
    transfer_beside: Annotated[str, typer.Option("--transfer-beside", help="auto | alone | measured | one-call | pair (the default): a transfer beside compute runs as slowed as measured beside the layer (--beside-layer rows), as fast as alone where only --beside-gemm rows measured it, and a copy-engine one as fast as alone taking nothing from the compute (auto); always as fast as alone; as slowed as either measured it; or as slowed as one call issued as a split issues it, taking from the compute exactly the beside-layer rows' extra beside that call per transfer (compute_one_call_op_ms, compute_one_call_extra_ms; auto's where the rows lack them) (one-call); or ending as late after the block beside it as one call and that block released together did in the beside-layer rows (pair_attention_extra_ms, pair_mlp_extra_ms; auto's where the rows lack them, said) (pair, the default).")] = DEFAULT_TRANSFER_BESIDE
    in_layer: Annotated[str, typer.Option("--in-layer", help="auto | measured | none: a serial plan's blocking all-reduce costs its time in the table plus the in-layer term of the --beside-layer rows (measured; none where the rows lack it, said), or its time in the table alone (none); auto, the default: measured where the spec times its choices in shared spans (measure.settle_ms 0), none where each settles at its own clock, as sweep's default does (docs/predict.md).")] = DEFAULT_IN_LAYER
    error: Annotated[float | None, typer.Option("--error", metavar="ABS", help="The error of a predicted speedup, absolute: the rows' interval. Default: what the TP=2 validation supports (docs/predict.md).")] = None


def main(options: Options) -> int:
    """`run`, then where the rows went and the summary's lines, at the terminal."""
    out, summary = run(options)
    console = printing.console()
    console.print(f"wrote predicted rows to {out}", soft_wrap=True, highlight=False)
    for line in summary:
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    return 0


def run(options: Options) -> tuple[Path, list[str]]:
    """The options checked, the inputs read, the rows written; their path and the summary's
    lines (what was extrapolated, interpolated, substituted or skipped)."""
    from overlapbench.specs import spec as spec_mod

    spec_path, tp, comm, compute, output = options.spec, options.tp, options.comm, options.compute, options.output
    busbw, transfer_beside, in_layer, error = options.busbw, options.transfer_beside, options.in_layer, options.error
    if transfer_beside not in TRANSFER_BESIDE:
        raise UserError(f"--transfer-beside: one of {', '.join(TRANSFER_BESIDE)}, got {shown(transfer_beside)}")
    if in_layer not in IN_LAYER:
        raise UserError(f"--in-layer: one of {', '.join(IN_LAYER)}, got {shown(in_layer)}")
    if tp < 1:
        raise UserError(f"--tp: must be at least 1, got {tp}")
    if error is not None and not 0 <= error < 1:
        raise UserError(f"--error: an absolute error of the speedup in [0, 1), such as 0.03, got {error}")
    loaded = spec_mod.load(spec_path, cuda=True)
    loaded.check_tp(tp)
    compute = compute or [Path("results") / f"{loaded.name}-pieces-tp{tp}.jsonl"]
    out = output or Path("results") / f"{loaded.name}-predicted-tp{tp}.jsonl"
    if out.exists() and out.stat().st_size > 0:
        raise UserError(f"--output: {out} already holds rows; give a new file (-o NEW.jsonl) or delete that one")
    summary = Summary()
    charged = in_layer_for(in_layer, loaded.measure.settle_ms)
    inputs = load_inputs(comm, compute, transfer_beside, tp, busbw, loaded.model, charged)
    if loaded.measure.settle_ms > 0 and inputs.compute.shared_chains:
        summary.inputs.append(SHARED_CHAINS)
    predict(loaded, tp, inputs, out, ERROR if error is None else error, summary)
    if in_layer == AUTO_IN_LAYER and charged == NO_IN_LAYER:
        summary.in_layer = _auto_left_out_said(loaded.measure.settle_ms)
    return out, summary.lines()


def load_inputs(comm: list[Path], compute: list[Path], stretch: str, tp: int, busbw: float | None = None,
                model: str | None = None, in_layer: str = NO_IN_LAYER) -> Inputs:
    """The prediction's inputs: `comm` files are `overlapbench comm` stores (their rows timed
    beside compute give the contention) or nccl-tests text output, of any world sizes
    (predict/comm_inputs.py: tables of other world sizes rescaled, by `busbw` where given);
    `model`: the layer predicted, whose beside-layer rows are chosen; `in_layer`: one of
    CHARGED_IN_LAYER (`auto` resolved by the spec: in_layer_choice.in_layer_for)."""
    from overlapbench.predict import comm_inputs

    table, contention = comm_inputs.read(comm, tp, busbw, model)
    return Inputs(ComputePieces.load(compute), table, contention, stretch, in_layer)


def predict(spec: SweepSpec, tp: int, inputs: Inputs, output: Path, error: float = ERROR,
            summary: Summary | None = None) -> int:
    """Rows for every point of `spec` at TP=tp into `output` (a new store); returns the count.
    `summary`: told every point's notes and the inputs' own."""
    if inputs.compute.tp != tp:
        raise UserError(f"--compute: the piece rows are of TP={inputs.compute.tp}, not --tp {tp}; time the pieces "
                        f"with `overlapbench sweep SPEC --pieces --tp {tp}`")
    spec = dataclasses.replace(spec, tp=tp)
    points = [p for p in spec.points(tp, cuda=True) if p.workload == "layer"]
    store = results.ResultStore(output)
    store.open(resume=False, study=spec.name)
    run_id, written = results.new_run_id(), 0
    from overlapbench.run.workload import reference_setting  # imports torch: not at the command line's start

    reference = reference_setting("layer")
    summary = summary if summary is not None else Summary()
    summary.inputs += inputs.comm.notes
    if inputs.contention is not None:
        summary.inputs += inputs.contention.notes
        summary.contention = inputs.contention.described()
        summary.transfers = _transfers_said(inputs)
    summary.in_layer = _in_layer_said(inputs, summary)
    env = {"world_size": tp, "device": f"{inputs.compute.device} (predicted)", "backend": "predicted", "hosts": [],
           "nodes": 1, "ranks": [], "gpus_per_host": None, "versions": environment.versions(),
           "git": environment.git_commit(), "multicast_env": {}}  # the run's facts, once (git runs a subprocess)
    try:
        rows = []  # every row made before any is written: a piece missing leaves no part of a store
        for _, group in itertools.groupby(points, key=lambda p: p.workload_key):  # a batch at one depth
            group = list(group)
            found = {id(p): _estimate(p, spec, tp, inputs) for p in group}
            ref = next((found[id(p)] for p in group if (p.strategy, p.knobs) == reference), None)
            ref = None if isinstance(ref, Skip) else ref
            summary.no_speedup += ref is None
            for point in group:
                rows.append(_row(point, found[id(point)], ref, inputs, run_id, env, error))
                summary.add(found[id(point)].notes, not isinstance(found[id(point)], Skip))
        for row in rows:
            store.append(row)
            written += 1
    finally:
        store.close()
    return written


def _estimate(point, spec: SweepSpec, tp: int, inputs: Inputs) -> Estimate | Skip:
    """The point's estimate; a piece its plan needs that the --compute rows lack is one line
    naming the piece, the point, and the command that times this spec's pieces."""
    try:
        return estimate(point.strategy, point.knobs, batch_of(point), point.layers, point.dtype, inputs)
    except MissingPiece as missing:
        timed = sorted(inputs.compute.specs - {spec.name})
        whose = f" (timed for spec {', '.join(timed)})" if timed else ""
        source = spec.source or f"sweeps/{spec.name}.yaml"
        raise UserError(f"--compute: no piece row for {missing.what} ({point.strategy} at {point.tokens} tokens, "
                        f"{point.layers} layers) in {', '.join(inputs.compute.sources) or 'the rows'}{whose}; time "
                        f"this spec's pieces on one GPU: `overlapbench sweep {source} --pieces --tp {tp}` (to "
                        f"results/{spec.name}-pieces-tp{tp}.jsonl, predict's default --compute)") from None


def _transfers_said(inputs: Inputs) -> str:
    """The summary's line on how a split's transfers beside compute were charged (`inputs.stretch`),
    where contention is given (without any, the summary's own default says so)."""
    pairs = inputs.contention.pairs_described() if inputs.stretch == PAIR else None
    if pairs:
        return (f"their pairs (--transfer-beside pair), measured beside {pairs}; other paths as "
                f"--transfer-beside auto charges them")
    if inputs.stretch == PAIR:
        return "as --transfer-beside auto charges them: the rows hold no pair (comm --beside-layer measures them)"
    return f"as --transfer-beside {inputs.stretch} charges them"


def _in_layer_said(inputs: Inputs, summary: Summary) -> str:
    """The summary's line on the in-layer term (`inputs.in_layer`); where the measured term is
    asked for, what reading it flagged goes into the summary's inputs."""
    if inputs.in_layer != MEASURED_IN_LAYER:
        return ("not charged (--in-layer none): blocking all-reduces cost their time in the table; "
                "--in-layer measured charges the --beside-layer rows' term")
    if inputs.contention is None:
        return "none (no --beside-layer rows): blocking all-reduces cost their time in the table"
    summary.inputs += inputs.contention.in_layer_notes
    return inputs.contention.in_layer_described()


def _auto_left_out_said(settle_ms: float) -> str:
    """The summary's line on the in-layer term where `--in-layer auto` left it out: why."""
    return (f"not charged (--in-layer auto: the spec settles each choice for {settle_ms:g} ms before timing it, and at "
            "its own clock the baseline's compute gains about what the term charges): blocking all-reduces cost their "
            "time in the table; --in-layer measured charges the --beside-layer rows' term")


def _row(point, found, ref, inputs: Inputs, run_id: str, env: dict, error: float) -> dict:
    cls = strategies.get(point.strategy)
    skipped = isinstance(found, Skip)
    if skipped:
        result = {"status": "skipped", "error": found.reason}
    else:
        speedup = None if ref is None else ref.ms / found.ms
        result = {"status": "ok", "error": None, "ms": found.ms, "p10_ms": None, "p90_ms": None, "iqr_ms": None,
                  "cv": None, "graphs": None, "rel_err": None,
                  "tolerance": None, "checked": cls.is_checked(point.knobs), "timing": "predicted",
                  "speedup": None if speedup is None else round(speedup, 6),
                  "speedup_ci": None if speedup is None else [round(max(speedup - error, 1e-6), 6), round(speedup + error, 6)],
                  "iters": 0}
    row = make_row(point, result, run_id, env, MeasureSettings())  # nothing was timed
    row["predicted"] = {
        "compute": inputs.compute.sources, "compute_runs": sorted(inputs.compute.runs),
        "comm": getattr(inputs.comm, "source", None), "contention": inputs.contention is not None,
        "transfer_beside": inputs.stretch, "in_layer": inputs.in_layer, "error": error,
        "exposed_ms": None if skipped else round(found.played.exposed_ms / point.layers, 6),
        "in_context": None if skipped else round(found.in_context, 4),
        "notes": [] if skipped else [n.text for n in found.notes],
    }
    if not skipped and found.in_layer_ms:
        row["predicted"]["in_layer_ms"] = round(found.in_layer_ms, 6)
    return row

