"""What a split's transfers cost it, measured, against what `predict` charges them (no GPU):
docs/predict.md, Why TP=4 misses (4x H100).

    python tests/checks/transfer_charge.py            # every TP=4 machine of MACHINES, both models, markdown

Per split setting and token count of a TP=4 study, per transfer and as a share of the transfer's
time alone in the comm table (`alone`):

- measured: (the split's ms per layer - the same split with `comm: none`) / (transfers per layer x
  alone): what moving the partial sums cost the split, paired within the study's run;
- charged: the same difference of predict's own estimates of the two points, from the inputs
  `predict_validate.py` validates with (the machine's table and beside-layer rows, one GPU's pieces);
- charged under `--transfer-beside one-call`, where the machine's beside-layer rows hold the extra
  beside one call (bfff1d7's on 4x H200: docs/predict.md, the one-call window measured);
- the beside-layer rows' compute loss and transfer stretch at the transfer's path, CTAs and size,
  and their product (the compute predict takes from the split under `--transfer-beside auto`, as a
  share of `alone`, for the SM-based paths; the copy-engine paths are charged nothing under auto).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from overlapbench import strategies  # noqa: E402
from overlapbench.comm.sizes import DTYPE_BYTES  # noqa: E402
from overlapbench.predict.comm_table import NotInTable  # noqa: E402
from overlapbench.predict.command import load_inputs  # noqa: E402
from overlapbench.predict.estimate import AUTO, ONE_CALL, estimate  # noqa: E402
from overlapbench.run.piece_keys import batch_of  # noqa: E402
from overlapbench.specs import spec as specs  # noqa: E402
from overlapbench.tuning.results import read_rows  # noqa: E402

# Each machine's TP=4 inputs, as predict_validate.py's studies name them: its folder (the studies,
# the table and the beside-layer rows of one run) and the one GPU's pieces.
MACHINES = {"4x H100": ("results/h100x4/b71640f", "results/h100x1/d6478c6"),
            "4x H200": ("results/h200x4/2112bbf", "results/h200/a9c1a0e"),
            "4x H200 (bfff1d7)": ("results/h200x4/bfff1d7", "results/h200/a9c1a0e")}
MODELS = ("llama3-70b", "llama3-8b")
TOKENS = (1024, 2048, 4096, 8192, 16384, 32768)
# The split settings compared, by the knobs that tell them apart; every other knob at its default.
SETTINGS = {"nccl_symm 16/16": {"comm": "nccl_symm", "comm_ctas_attn": 16},
            "fused 16/16": {"comm": "fused", "comm_ctas_attn": 16},
            "copy_engine 32/32": {"comm": "copy_engine", "comm_ctas_attn": 32, "ce_out": None},
            "copy_engine 32/32, ce_out kernel": {"comm": "copy_engine", "comm_ctas_attn": 32, "ce_out": "kernel"}}
ALONE = {"comm": "none"}
PLAIN = {"split_ratio": None, "chunks": None, "reduce_start": None, "ce_chunks": None}


@dataclass(frozen=True)
class Charge:
    """One split setting at one token count: per transfer, shares of its time alone."""
    measured: float
    charged: float
    loss: float
    stretch: float
    charged_one_call: float | None  # predict's charge under --transfer-beside one-call, where the rows hold its extra


def _holds(knobs: dict, wanted: dict) -> bool:
    return all(knobs.get(k) == v for k, v in (PLAIN | wanted).items())


def _charged(split, alone, inputs, per_layer: float) -> float:
    """predict's charge for the split's transfers under `inputs`: its estimate of the split less
    its estimate of the same split with `comm: none`, per transfer as a share of its time alone."""
    split_ms, alone_ms = (estimate(p.strategy, p.knobs, batch_of(p), p.layers, p.dtype, inputs).ms for p in (split, alone))
    return (split_ms - alone_ms) / per_layer


def charges(machine: str, model: str) -> dict[str, dict[int, Charge]]:
    """Setting -> token count -> Charge, for one machine's TP=4 study of `model` (a setting whose
    path the machine's table does not hold is left out)."""
    folder, pieces = (ROOT / p for p in MACHINES[machine])
    comm = [folder / "comm.jsonl", folder / f"comm-beside-layer-{model}.jsonl"]
    compute = [pieces / f"pieces-{model}-tp4-tp4.jsonl"]
    inputs = load_inputs(comm, compute, AUTO, 4, None, model)
    # the same inputs charged under --transfer-beside one-call, where the rows hold its extra
    one_call = replace(inputs, stretch=ONE_CALL) if inputs.contention.one_call_extras else None
    measured = {(r["tokens"], json.dumps(r["knobs"], sort_keys=True)): r["ms"] for r in read_rows(folder / f"{model}-tp4.jsonl")
                if r.get("status") == "ok" and r["strategy"] == "token_split"}
    points = [p for p in specs.load(ROOT / f"sweeps/{model}-tp4.yaml", cuda=True).points(4, cuda=True)
              if p.workload == "layer" and p.strategy == "token_split"]

    def point(tokens: int, wanted: dict):
        (found,) = [p for p in points if p.tokens == tokens and _holds(p.knobs, wanted)]
        return found

    def ms(p) -> float | None:
        return measured.get((p.tokens, json.dumps(p.knobs, sort_keys=True)))

    out: dict[str, dict[int, Charge]] = {}
    for name, wanted in SETTINGS.items():
        for tokens in TOKENS:
            split, alone = point(tokens, wanted), point(tokens, ALONE)
            if ms(split) is None or ms(alone) is None:
                continue
            batch = batch_of(split)
            plan = strategies.get(split.strategy).plan(split.knobs, batch)
            transfer = plan.after_attention
            nbytes = plan.chunks[0].size * batch.shape.hidden * DTYPE_BYTES[split.dtype]
            try:
                time_alone = inputs.comm.time_ms(transfer.path, transfer.ctas, nbytes, hidden=batch.shape.hidden).ms
            except NotInTable:
                break  # the machine's table has no rows of this setting's path: no row in the output
            per_layer = 2 * len(plan.chunks) * time_alone  # a reduction per block and chunk
            beside = inputs.contention.at(transfer.path, transfer.ctas, nbytes)
            out.setdefault(name, {})[tokens] = Charge((ms(split) - ms(alone)) / per_layer,
                                                      _charged(split, alone, inputs, per_layer),
                                                      beside.gemm_loss, beside.transfer_stretch,
                                                      _charged(split, alone, one_call, per_layer) if one_call else None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machine", choices=sorted(MACHINES), action="append", help="default: every one")
    args = parser.parse_args()
    os.chdir(ROOT)
    print("| machine | model | split | " + " | ".join(f"{t // 1024}K" for t in TOKENS) + " |")
    print("|---|---|---|" + "---:|" * len(TOKENS))
    for machine in args.machine or sorted(MACHINES):
        for model in MODELS:
            for name, by_tokens in charges(machine, model).items():
                cells = [f"{c.measured:.2f} / {c.charged:.2f}{_one_call(c)} ({c.loss:.2f} x {c.stretch:.1f})"
                         if (c := by_tokens.get(t)) else "" for t in TOKENS]
                print(f"| {machine} | {model} | {name} | " + " | ".join(cells) + " |")
    print("\nEach cell: measured / charged per transfer, as a share of its time alone (and / charged under "
          "`--transfer-beside one-call` where the rows hold its extra); in brackets the beside-layer rows' compute "
          "loss x transfer stretch.")


def _one_call(charge: Charge) -> str:
    return "" if charge.charged_one_call is None else f" / {charge.charged_one_call:.2f}"


if __name__ == "__main__":
    main()
