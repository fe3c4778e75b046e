"""What charging a copy-engine split's compute for its transfers would do to `predict`'s validation
(no GPU): docs/predict.md, Why TP=4 misses, item 3.

    python tests/checks/copy_engine_charge.py            # a markdown table on stdout
    python tests/checks/copy_engine_charge.py --power 0.045

Under `--transfer-beside auto` a copy-engine transfer beside a split's compute runs at its time
alone and charges the compute nothing (predict/estimate.py, COPY_ENGINE_PATHS). Each variant here
keeps the time alone and charges the compute a loss over it, through the same timeline term every
other path's loss goes through (timeline.py: compute runs at 1 - loss while a transfer runs):

- `rows`: the beside-layer rows' measured compute loss of the path (what `--transfer-beside
  alone` charges it), without their stretch;
- `power`: a fixed loss, `--power` (default 0.045: the llama3-70b TP=2 MLP GEMMs at 16K tokens,
  power-capped, lost 4.2-4.8% of their rate beside copy-engine NVLink copies that run no SM
  kernel: tests/probes/power_beside.py on 4x H200 at a3860b5 and 2x H200 at 277be55).

Every study `predict_validate.py` validates is predicted with each (its default `--in-layer`
only), and compared with the measured rows as the validation compares them: per study the
median and worst |error|, the picks within 0.01, and the median |error| of the copy-engine
splits' own points (`comm=copy_engine`, not `fused_norm`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from overlapbench.predict import estimate  # noqa: E402
from tests.checks import predict_validate  # noqa: E402

POWER = 0.045
BEFORE, ROWS, POWER_LOSS = "auto (nothing)", "rows' loss over the time alone", "power"


def charged(variant: str, power: float):
    """estimate._beside_compute with a copy-engine path under auto charged `variant`'s loss, its
    transfer at its time alone; every other path and mode as predict charges it."""
    as_now = estimate._beside_compute

    def beside(path, lookup, mode, notes):
        if mode != estimate.AUTO or path not in estimate.COPY_ENGINE_PATHS or variant == BEFORE:
            return as_now(path, lookup, mode, notes)
        return (lookup.gemm_loss if variant == ROWS else power), 1.0

    return beside


def scores(device: str, variant: str, power: float) -> list[tuple[str, dict]]:
    """(study title, predict_validation.compare's result) of the device's studies, default --in-layer."""
    out = []
    with mock.patch.object(estimate, "_beside_compute", charged(variant, power)), tempfile.TemporaryDirectory() as rows:
        for study in predict_validate.STUDIES[device]:
            found = predict_validate.run(study, Path(rows))
            out += [(f"{device} {study.title}", r) for _, _, r in found.sections[:1] if r["points"]]
    return out


def copy_engine_error(result: dict) -> float:
    """The median |error| of the copy-engine splits' points."""
    errors = [abs(q["error"]) for q in result["points"]
              if "comm=copy_engine" in q["what"] and not q["what"].startswith("fused_norm")]
    return statistics.median(errors) if errors else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--power", type=float, default=POWER, help="the `power` variant's loss (default %(default)s)")
    args = parser.parse_args()
    os.chdir(ROOT)
    variants = (BEFORE, ROWS, POWER_LOSS)
    found = {v: {d: scores(d, v, args.power) for d in sorted(predict_validate.STUDIES)} for v in variants}
    names = {BEFORE: BEFORE, ROWS: ROWS, POWER_LOSS: f"{args.power:g} (power)"}
    print("| study | " + " | ".join(f"{names[v]}: median / worst / picks / copy-engine median" for v in variants) + " |")
    print("|---|" + "---|" * len(variants))
    for device in sorted(predict_validate.STUDIES):
        for i, (title, _) in enumerate(found[BEFORE][device]):
            cells = []
            for v in variants:
                r = found[v][device][i][1]
                cells.append(f"{r['median_abs_error']:.3f} / {r['max_abs_error']:.3f} / {r['picks_within']} of "
                             f"{r['token_counts']} / {copy_engine_error(r):.3f}")
            print(f"| {title} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
