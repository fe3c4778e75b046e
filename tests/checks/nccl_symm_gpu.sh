#!/usr/bin/env bash
# NCCL's symmetric windows (nccl_symm) on 2 GPUs, one command, everything under $OUT:
#   OUT=/tmp/out OVERLAPBENCH_GIT=<commit> bash tests/checks/nccl_symm_gpu.sh
# 1. the GPU tests of nccl_symm: windows, the collectives on them (exact, symmetric kernel on the
#    budget's channels, from NCCL's tuning log), every strategy that takes it (eager and graph),
#    and comm's every path (nccl_symm included)                  -> gpu-tests.log
# 2. overlapbench comm, 64-256 MiB, all-reduce, all-gather and reduce-scatter: nccl and nccl_symm
#    at default/4/8/16/32 CTAs, fused_norm and copy_engine_norm at 4/8/16 (the table of the
#    issue, refilled; each NCCL row says which kernel ran on how many channels) -> comm.{jsonl,csv,log}
# 3. the same all-reduce at 64 MiB beside the llama3-70b TP=2 MLP GEMMs, 8 and 16 CTAs (the decision
#    between NCCL's symmetric all-reduce + add/norm, the fused kernel and the copy-engine path)
#                                                               -> comm-beside.{jsonl,csv,log}
# 4. a small llama3-8b sweep: baseline, token_split, iso and sp_baseline on windows, each point
#    checked against the reference                              -> layers.{jsonl,log}
# Last: a short table. CHECK_SKIP=tests,layers skips steps 1 and 4.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
SKIP=${CHECK_SKIP:-}
COMM=(python -m overlapbench comm --iters 10 --warmup 3 --hidden 8192 --nproc 2 --format csv)

python -m overlapbench env > "$OUT/env.txt" 2>&1
grep nccl_windows "$OUT/env.txt" | tee "$OUT/summary.txt"
if [[ ",$SKIP," != *,tests,* ]]; then
  timeout 420 python -m pytest -q -p no:cacheprovider tests/test_nccl_symm_gpu.py tests/test_comm_gpu.py > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests: exit $? ($(tail -n 1 "$OUT/gpu-tests.log"))" | tee -a "$OUT/summary.txt"
fi
timeout 300 "${COMM[@]}" --paths nccl,nccl_symm,fused_norm,copy_engine_norm --nccl-max-ctas default,4,8,16,32 \
  --comm-ctas 4,8,16 -b 64M -e 256M -f 2 --output "$OUT/comm.jsonl" > "$OUT/comm.csv" 2> "$OUT/comm.log"
echo "comm: exit $?" | tee -a "$OUT/summary.txt"
timeout 240 "${COMM[@]}" --ops all_reduce --paths nccl,nccl_symm,fused_norm,copy_engine_norm --nccl-max-ctas default,8,16 \
  --comm-ctas 8,16 -b 64M -e 64M --beside-gemm --output "$OUT/comm-beside.jsonl" > "$OUT/comm-beside.csv" 2> "$OUT/comm-beside.log"
echo "comm --beside-gemm: exit $?" | tee -a "$OUT/summary.txt"
cat > "$OUT/check-layers.yaml" <<'SPEC'
name: check-nccl-symm-layers
model: llama3-8b
tp: 2
layers: 2
dtype: bf16
tokens: [1000, 4097]
strategies:
  baseline: {nccl_max_ctas: [default, 16], nccl_symm: [false, true]}
  token_split:
    - {comm: nccl}
    - {comm: nccl_symm, comm_ctas_attn: [8, 16], comm_ctas_mlp: 16}
  iso: {comm: [nccl, nccl_symm], comm_ctas: 8}
  sp_baseline: {nccl_symm: [false, true]}
measure: {warmup: 2, iters: 5, warmup_s: 0.0, timeout_s: 60}
SPEC
if [[ ",$SKIP," != *,layers,* ]]; then
  timeout 240 python -m overlapbench sweep "$OUT/check-layers.yaml" --output "$OUT/layers.jsonl" --nproc 2 > "$OUT/layers.log" 2>&1
  echo "layer check: exit $?" | tee -a "$OUT/summary.txt"
fi
python - "$OUT" <<'SUMMARY' | tee -a "$OUT/summary.txt"
import csv, json, sys
from pathlib import Path

out = Path(sys.argv[1])


def rows(name):
    p = out / name
    return list(csv.DictReader(p.open())) if p.exists() and p.stat().st_size else []


layers = out / "layers.jsonl"
for line in layers.read_text().splitlines() if layers.exists() else []:
    r = json.loads(line)
    if r.get("workload") == "layer":
        err = "-" if r.get("rel_err") is None else f"{r['rel_err']:.1e}"
        ms = "-" if r.get("ms") is None else f"{r['ms']:.3f}"
        knobs = " ".join(f"{k}={v}" for k, v in r["knobs"].items() if v not in ("default", None))
        print(f"layer {r['strategy']:<11} {knobs:<48} tokens {r['tokens']:>5}: {r['status']:<7} "
              f"rel_err {err:>7}, {ms} ms/layer {(r.get('error') or '')[:80]}")
beside = {(r["op"], r["path"], r["ctas"], r["size"]): r for r in rows("comm-beside.csv")}
print(f"{'op':<14} {'path':<17} {'ctas':>7} {'MiB':>5} {'us':>9} {'busbw':>7} {'wrong':>5} {'NCCL kernel':<28} | "
      f"{'beside us':>9} {'busbw':>7} {'GEMM loss':>9}")
for r in rows("comm.csv"):
    b = beside.get((r["op"], r["path"], r["ctas"], r["size"]), {})
    kernel = f"{r['nccl_kernel']} x{r['nccl_channels']}" if r.get("nccl_kernel") else "-"
    status = "" if r["status"] == "ok" else f"  {r['status']}: {r['error'][:60]}"
    loss = f"{float(b['gemm_loss']):.1%}" if b.get("gemm_loss") else "-"
    print(f"{r['op']:<14} {r['path']:<17} {r['ctas']:>7} {int(r['size']) >> 20:>5} {r['time_us'] or '-':>9} "
          f"{r['busbw'] or '-':>7} {r['wrong'] or '-':>5} {kernel:<28} | {b.get('beside_us') or '-':>9} "
          f"{b.get('beside_busbw') or '-':>7} {loss:>9}{status}")
SUMMARY
