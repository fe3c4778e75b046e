"""Where the split's time goes: the kernel tables of `sweep --profile` tallied by kind (issue 15).

    PYTHONPATH=. python kernels/account_split.py results/h200x2/a034cb8/profile-split-attn \
        --rows results/h200x2/a034cb8/profile-split-attn.jsonl

Per token count, GPU time per layer of each kind of kernel (GEMM, attention, the log-sum-exp
merge, norms, other elementwise work such as RoPE and SwiGLU, copies, communication) for
`no_comm` and for the splits with no communication (`token_split comm=none` at its defaults,
`iso comm=none`), and what the split adds per kind. The tables are of eager forwards; the last
columns set the kernels' sum against the rows' graph-replayed time, so what is left (launch gaps
and idle, which graphs mostly remove) shows too.
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
    ("norm", ("rmsnorm",)),
    ("copy", ("copy", "cat", "memcpy", "memset")),
    ("comm", ("nccl", "allreduce", "all_reduce")),
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


def timed_ms(rows_path: Path | None) -> dict[tuple[str, int, str], float]:
    """ms per layer of each (strategy, tokens, comm) row, graph replays."""
    if rows_path is None:
        return {}
    out = {}
    for line in rows_path.read_text().splitlines():
        row = json.loads(line)
        if row.get("status") == "ok":
            out[(row["strategy"], row["tokens"], json.dumps(row["knobs"], sort_keys=True))] = row["ms"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="the --profile folder of a sweep")
    p.add_argument("--rows", type=Path, help="the sweep's results (.jsonl): graph-replayed ms per layer")
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args()
    tables = {
        "no_comm": "no_comm-{t}.txt",
        "token_split": "token_split-{t}-align=256-split_offset=0-comm=none.txt",
        "iso": "iso-{t}-split_ratio=balanced-align=64-comm=none.txt",
    }
    sizes = sorted({int(m.group(1)) for f in args.folder.glob("no_comm-*.txt") if (m := re.search(r"-(\d+)\.txt$", f.name))})
    if not sizes:
        sys.exit(f"{args.folder}: no no_comm-<tokens>.txt tables")
    rows = timed_ms(args.rows)
    kinds = [k for k, _ in KINDS] + ["other"]
    print("GPU ms per layer by kind of kernel (eager profile); + = what the split adds over no_comm")
    print(f"{'tokens':>6} {'strategy':<12} " + " ".join(f"{k:>11}" for k in kinds) + f" {'kernels':>8} {'timed':>8}")
    for t in sizes:
        base = tally(args.folder / tables["no_comm"].format(t=t), args.layers)
        for name, pattern in tables.items():
            path = args.folder / pattern.format(t=t)
            if not path.exists():
                continue
            got = tally(path, args.layers)
            cells = []
            for k in kinds:
                v, d = got.get(k, 0.0), got.get(k, 0.0) - base.get(k, 0.0)
                cells.append(f"{v:6.3f}" + (f"{d:+5.2f}" if name != "no_comm" else " " * 5))
            timed = next((ms for (s, tk, knobs), ms in rows.items() if s == name and tk == t
                          and (name == "no_comm" or '"comm": "none"' in knobs)
                          and (name != "token_split" or ('"align": 256' in knobs and '"split_offset": 0' in knobs))), None)
            total = sum(got.values())
            print(f"{t:>6} {name:<12} " + " ".join(f"{c:>11}" for c in cells)
                  + f" {total:8.3f} {timed if timed is not None else float('nan'):8.3f}")


if __name__ == "__main__":
    main()
