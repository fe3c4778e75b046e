"""The compiled code of the all-reduce + norm kernels: access widths, registers, local memory.

    python tests/checks/compiled_kernels.py [--hidden 8192] [--world 2] [--arch 90] [--json]

Compiles (nothing runs: no GPU needed, only Triton's NVIDIA backend) kernel v2, push, pull and
pull with the output pushed (both output modes each), v1 and the copy-engine path's local add +
norm kernel for bf16 rows of `hidden`, with the argument properties real launches have
(16-divisible pointers, hidden and strides; odd row offsets), and prints per kernel its global
loads and stores by PTX spelling and its resource usage (registers; LOCAL > 0 means spills).
Every access to row data must be 16 bytes (`v4.b32`); the narrow ones are the per-rank offsets
and flag addresses (`b64`, once per launch) and the flag waits (`b32`). Exit 3: this machine cannot compile for NVIDIA.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `kernels` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import triton

from kernels import allreduce_norm as v1
from kernels import allreduce_norm_pull as pull
from kernels import allreduce_norm_v2 as v2
from kernels import copy_engine_norm as ce

ACCESS = re.compile(r"\b((?:ld|st)\.global[.a-z0-9]*)")
ALIGNED = ("buf_ptr", "peer_off_ptr", "flag_ptrs", "pad_ptrs", "res_ptr", "out_ptr", "w_ptr", "part_ptr",
           "stage_ptr", "pub_ptr", "hidden", "stride_res", "stride_out", "slot_elems")


def _compile(fn, types: dict[str, str], constexprs: dict, num_warps: int, arch: int):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    signature = {n: "constexpr" if n in constexprs else types[n] for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n in ALIGNED}
    src = ASTSource(fn, signature, constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})


def _resources(cubin: bytes) -> str:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        done = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(f.name)
    return " ".join(line.strip() for line in done.stdout.splitlines() if "REG:" in line)


def inspect(hidden: int, world: int, arch: int) -> list[dict]:
    """One record per kernel: name, accesses {spelling: count}, resources (cuobjdump's line)."""
    rows = dict(buf_ptr="*bf16", res_ptr="*bf16", out_ptr="*bf16", w_ptr="*bf16", row_start="i32", n_rows="i32",
                hidden="i32", stride_res="i32", stride_out="i32", eps="fp32", rank="i32", stage_row0="i32",
                slot_rows="i32", out_row0="i32", peer_off_ptr="*i64", flag_ptrs="*i64", pad_ptrs="*i64")
    kernels = []
    t2 = v2.tiling(world, hidden, 2)
    for copy_out in (True, False):
        kernels.append((f"v2 copy_out={copy_out}", _compile(
            v2._allreduce_norm_v2_kernel, rows,
            dict(WORLD=world, LANES=triton.next_power_of_2(world), MAXW=v2.MAX_WORLD, DONE=v2._DONE,
                 TILE_R=t2.tile_rows, REDUCE_R=t2.reduce_rows, BLOCK_H=t2.block_h, VEC=8, COPY_OUT=copy_out),
            t2.num_warps, arch)))
        for push_out in (False, True):
            kernels.append((f"v2 pull{'_push' if push_out else ''} copy_out={copy_out}", _compile(
                pull._allreduce_norm_pull_kernel, rows,
                dict(WORLD=world, LANES=triton.next_power_of_2(world), MAXW=pull.MAX_WORLD, DONE=pull._DONE,
                     TILE_R=t2.tile_rows, REDUCE_R=t2.reduce_rows, BLOCK_H=t2.block_h, VEC=8, COPY_OUT=copy_out,
                     PUSH_OUT=push_out),
                t2.num_warps, arch)))
    t1 = v1.tiling(world, hidden, 2)
    kernels.append(("v1", _compile(
        v1._allreduce_norm_kernel, rows,
        dict(WORLD=world, PEERS=t1.peers, LANES=t1.lanes, TILE_R=t1.tile_rows, SCATTER_L=t1.scatter_lanes,
             REDUCE_L=t1.reduce_lanes, REDUCE_R=t1.reduce_rows, GATHER_L=t1.gather_lanes, GATHER_R=t1.gather_rows,
             BLOCK_H=t1.block_h, VEC=8), t1.num_warps, arch)))
    block_h = triton.next_power_of_2(hidden)
    block_r = max(1, ce.TILE_ELEMS // block_h)
    local = dict(part_ptr="*bf16", stage_ptr="*bf16", res_ptr="*bf16", out_ptr="*bf16", pub_ptr="*bf16",
                 w_ptr="*bf16", n_rows="i32", hidden="i32", slot_elems="i32", stride_res="i32", stride_out="i32",
                 eps="fp32")
    for write_out in (False, True):  # out by the copy engine (default), or also by the kernel (sm_out)
        kernels.append((f"copy_engine local{' sm_out' if write_out else ''}", _compile(
            ce._add_norm_kernel, local, dict(STAGED=world - 1, BLOCK_R=block_r, BLOCK_H=block_h, WRITE_OUT=write_out),
            max(4, min(16, block_r * block_h // 1024)), arch)))
    return [{"kernel": name, "accesses": dict(sorted(collections.Counter(
                m.group(1) for m in ACCESS.finditer(k.asm["ptx"])).items())),
             "resources": _resources(k.asm["cubin"])} for name, k in kernels]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for H100/H200")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    try:
        records = inspect(args.hidden, args.world, args.arch)
    except (ImportError, RuntimeError, FileNotFoundError) as e:
        print(f"cannot compile for NVIDIA here: {e}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps(records))
        return 0
    print(f"triton {triton.__version__}, sm_{args.arch}, bf16 hidden {args.hidden}, world {args.world}")
    for r in records:
        print(f"{r['kernel']}: {r['resources']}\n    " + ", ".join(f"{op} x{n}" for op, n in r["accesses"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
