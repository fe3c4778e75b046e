"""`overlapbench predict`: a spec's rows at TP=k, predicted, in the sweep's row schema.

Every point of the spec at `--tp K` gets a row whose `ms` is the predicted time per layer
(estimate.py), `timing` is "predicted", `device` is the pieces' device with " (predicted)"
added (`tune`, `report` and `export` keep predicted and measured rows apart, by `timing`), `speedup`
is over the predicted default baseline of its batch, and `speedup_ci` that speedup +- `error` (the
absolute error the TP=2 validation supports: docs/predict.md). Nothing was measured, so
`p10_ms`, `p90_ms`, `iqr_ms` and `cv` are null; `tune` takes each time +- half the error as its
range (a challenger must win by more than the model's error). `predicted` says what each row was
made from, its `error` included.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from overlapbench import strategies
from overlapbench.errors import UserError, shown
from overlapbench.predict.estimate import TRANSFER_BESIDE, ComputePieces, Inputs, Skip, estimate
from overlapbench.predict.piece_keys import batch_of
from overlapbench.predict.summary import Summary
from overlapbench.run import environment
from overlapbench.run.workload import reference_setting
from overlapbench.specs.spec import SweepSpec
from overlapbench.tuning import results

# The absolute error in speedup that the TP=2 validation supports: the 90th percentile of
# |predicted - measured| over both models' 168 points on 2x H100 (0.067; median 0.025, worst 0.128),
# results/predicted-h100/validation.md. `--error`'s default.
ERROR = 0.07


def main(spec_path: Path, tp: int, comm: list[Path], compute: list[Path] | None, output: Path | None,
         busbw: float | None, transfer_beside: str, error: float | None) -> tuple[Path, list[str]]:
    """`overlapbench predict`: the options checked, the inputs read, the rows written; their path
    and the summary's lines (what was extrapolated, interpolated, substituted or skipped)."""
    from overlapbench.specs import spec as spec_mod

    if transfer_beside not in TRANSFER_BESIDE:
        raise UserError(f"--transfer-beside: one of {', '.join(TRANSFER_BESIDE)}, got {shown(transfer_beside)}")
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
    predict(loaded, tp, load_inputs(comm, compute, transfer_beside, tp, busbw, loaded.model), out,
            ERROR if error is None else error, summary)
    return out, summary.lines()


def launch_pieces(path: Path, output: Path | None, tp: int | None) -> None:
    """`sweep --pieces`: one process on one GPU times the shard layer's pieces (pieces.py)."""
    import typer

    from overlapbench import printing
    from overlapbench.run import launch
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
    if code:
        raise typer.Exit(code)


def load_inputs(comm: list[Path], compute: list[Path], stretch: str, tp: int, busbw: float | None = None,
                model: str | None = None) -> Inputs:
    """The prediction's inputs: `comm` files are `overlapbench comm` stores (their rows timed
    beside compute give the contention) or nccl-tests text output, of any world sizes
    (predict/comm_inputs.py: tables of other world sizes rescaled, by `busbw` where given);
    `model`: the layer predicted, whose beside-layer rows are chosen."""
    from overlapbench.predict import comm_inputs

    table, contention = comm_inputs.read(comm, tp, busbw, model)
    return Inputs(ComputePieces.load(compute), table, contention, stretch)


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
    reference = reference_setting("layer")
    summary = summary if summary is not None else Summary()
    summary.inputs += inputs.comm.notes + (inputs.contention.notes if inputs.contention else [])
    if inputs.contention is not None:
        summary.contention = inputs.contention.described()
    env = {"world_size": tp, "device": f"{inputs.compute.device} (predicted)", "backend": "predicted", "hosts": [],
           "nodes": 1, "ranks": [], "gpus_per_host": None, "versions": environment.versions(),
           "git": environment.git_commit(), "multicast_env": {}}  # the run's facts, once (git runs a subprocess)
    try:
        for _, group in itertools.groupby(points, key=lambda p: p.workload_key):
            group = list(group)
            found = {id(p): estimate(p.strategy, p.knobs, batch_of(p), p.layers, p.dtype, inputs) for p in group}
            ref = next((found[id(p)] for p in group if (p.strategy, p.knobs) == reference), None)
            ref = None if isinstance(ref, Skip) else ref
            summary.no_speedup += ref is None
            for point in group:
                store.append(_row(point, found[id(point)], ref, inputs, run_id, env, error))
                summary.add(found[id(point)].notes, not isinstance(found[id(point)], Skip))
                written += 1
    finally:
        store.close()
    return written


def _row(point, found, ref, inputs: Inputs, run_id: str, env: dict, error: float) -> dict:
    from overlapbench.run.sweep import make_row

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
    row = make_row(point, result, run_id, env, _measure_stub(point))
    row["predicted"] = {
        "compute": inputs.compute.sources, "compute_runs": sorted(inputs.compute.runs),
        "comm": getattr(inputs.comm, "source", None), "contention": inputs.contention is not None,
        "transfer_beside": inputs.stretch, "error": error,
        "exposed_ms": None if skipped else round(found.played.exposed_ms / point.layers, 6),
        "in_context": None if skipped else round(found.in_context, 4),
        "notes": [] if skipped else [n.text for n in found.notes],
    }
    if not skipped and found.in_layer_ms:
        row["predicted"]["in_layer_ms"] = round(found.in_layer_ms, 6)
    return row


def _measure_stub(point):
    """make_row reads the spec's measurement settings; a prediction has none."""
    from types import SimpleNamespace

    return SimpleNamespace(measure=SimpleNamespace(warmup=0, warmup_s=0.0, min_time_s=0.0, iters=0, span_ms=None))
