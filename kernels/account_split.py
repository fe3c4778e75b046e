"""Where a split's time goes: the kernel tables of `sweep --profile` tallied by kind (issues 15, 16).

    PYTHONPATH=. python kernels/account_split.py results/h200x2/a034cb8/profile-split-attn \
        --rows results/h200x2/a034cb8/profile-split-attn.jsonl

Per token count, GPU time per layer of each kind of kernel (GEMM, attention, the log-sum-exp
merge, norms, other elementwise work such as RoPE and SwiGLU, copies, communication: NCCL, the
fused kernels, the copy engines' peer copies and the symmetric-memory barriers) for every table
of the folder, and what each adds per kind over `no_comm`. The tables are of eager forwards;
the last columns set the kernels' sum against the row's graph-replayed time, so what is left
(launch gaps and idle, which graphs mostly remove; overlap, which makes the sum exceed it) shows
too. Kernels on side streams overlap the others: their time is GPU time, not time added.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

KINDS = (
    ("gemm", ("nvjet", "gemm", "cutlass", "xmma")),
    ("attention", ("sdpa", "flash", "fmha", "attention")),
    ("lse_merge", ("lse_merge",)),
    ("comm", ("nccl", "allreduce", "all_reduce", "barrier_kernel", "ptop")),  # PtoP: a copy engine over NVLink
    ("norm", ("rmsnorm", "add_norm")),
    ("copy", ("copy", "cat", "memcpy", "memset")),
    ("elementwise", ("elementwise", "gather", "reduce_kernel")),
)
HOST_ROWS = ("aten::", "cuda", "nccl:", "record_param_comms", "Activity Buffer")
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    return next((kind for kind, keys in KINDS if any(k in name for k in keys)), "other")


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(number) * UNITS[unit]


def tally(table: Path, layers: int) -> dict[str, float]:
    """GPU ms per layer per kind of kernel in one profile table (torch.profiler key_averages)."""
    lines = table.read_text().splitlines()
    forwards = int(lines[0].split()[0])
    per_kind: dict[str, float] = defaultdict(float)
    for line in lines[4:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) < 11 or cells[0].startswith(HOST_ROWS + ("---", "Name")):
            continue
        per_kind[kind_of(cells[0])] += _ms(cells[6]) / forwards / layers
    return dict(per_kind)


def timed_ms(rows_path: Path | None) -> dict[str, float]:
    """ms per layer (graph replays) of each row, by its profile table's name (sweep._slug)."""
    if rows_path is None:
        return {}
    out = {}
    for line in rows_path.read_text().splitlines():
        row = json.loads(line)
        if row.get("status") == "ok":
            knobs = "-".join(f"{k}={v}" for k, v in row["knobs"].items() if v not in (None, "default"))
            out[f"{row['strategy']}-{row['tokens']}" + (f"-{knobs}" if knobs else "")] = row["ms"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="the --profile folder of a sweep")
    p.add_argument("--rows", type=Path, help="the sweep's results (.jsonl): graph-replayed ms per layer")
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args()
    sizes = sorted({int(m.group(1)) for f in args.folder.glob("no_comm-*.txt") if (m := re.search(r"-(\d+)\.txt$", f.name))})
    if not sizes:
        sys.exit(f"{args.folder}: no no_comm-<tokens>.txt tables")
    rows = timed_ms(args.rows)
    kinds = [k for k, _ in KINDS] + ["other"]
    print("GPU ms per layer by kind of kernel (eager profile); + = what a table adds over no_comm")
    print(f"{'tokens':>6} " + " ".join(f"{k:>11}" for k in kinds) + f" {'kernels':>8} {'timed':>8}  table")
    for t in sizes:
        reference = args.folder / f"no_comm-{t}.txt"
        base = tally(reference, args.layers)
        others = sorted(set(args.folder.glob(f"*-{t}.txt")) | set(args.folder.glob(f"*-{t}-*.txt")), key=lambda f: f.name)
        for path in [reference] + [f for f in others if f != reference]:
            got = tally(path, args.layers)
            cells = []
            for k in kinds:
                v, d = got.get(k, 0.0), got.get(k, 0.0) - base.get(k, 0.0)
                cells.append(f"{v:6.3f}" + (f"{d:+5.2f}" if path != reference else " " * 5))
            timed = rows.get(path.stem, float("nan"))
            print(f"{t:>6} " + " ".join(f"{c:>11}" for c in cells) + f" {sum(got.values()):8.3f} {timed:8.3f}  {path.stem}")


if __name__ == "__main__":
    main()
