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
# Last: `overlapbench report` of the layer points and the comm rows. CHECK_SKIP=tests,layers skips steps 1 and 4.
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
# The last table: overlapbench's own reports of what ran (the layer points' failures listed under it)
for rows in layers comm comm-beside; do
  [ -s "$OUT/$rows.jsonl" ] && COLUMNS=200 python -m overlapbench report "$OUT/$rows.jsonl" 2>&1 | tee -a "$OUT/summary.txt"
done
