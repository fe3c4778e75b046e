#!/usr/bin/env bash
# The all-reduce + norm engines on 2 GPUs, one command (about 4 minutes on 2x H200), everything under $OUT:
#   OUT=/tmp/out bash tests/checks/allreduce_norm_gpu.sh
# 1. the GPU tests of the all-reduce + norm engines (kernel v2 push, pull, pull_push, v1, the copy-engine path: every
#    token count 1..32768 x CTA budget 1..64, bf16 hidden 4096/5120/8192 and fp32 8192, two
#    ranges with a writer stream, CUDA-graph replays)              -> gpu-tests.log
# 2. the compiled code of the kernels with this machine's Triton    -> ptx.txt
# 3. overlapbench comm, all_reduce 64 MiB and 256 MiB: NCCL default/8/16/32 CTAs, fused_norm
#    (v2 pull, the layer's), fused_norm_push (v2 push), fused_norm_pull_push, fused_norm_v1 and copy_engine_norm at 4/8/16 CTAs (copy_engine_norm serial and
#    chunked by size: --ce-chunks 1,auto)                         -> comm.{jsonl,csv,log}
# 4. the same at 64 MiB beside the llama3-70b TP=2 MLP GEMMs      -> comm-beside.{jsonl,csv,log}
# 5. a small llama3-8b sweep: fused_norm, token_split and iso with comm fused (v2) and
#    copy_engine, each point checked against the reference      -> layers.{jsonl,log}
# 6. tests/benchmarks/copy_engine_norm.py: the copy-engine path's CTAs x chunks x who writes `out`
#                                                               -> bench_copy_engine_norm.{jsonl,log}
# Last: `overlapbench report` of the layer points and the comm rows (busbw, #wrong, beside-GEMM loss).
# Narrower runs: CHECK_PATHS (comm paths, default below), ALLREDUCE_NORM_ENGINES (the GPU tests'
# engines, e.g. fused,fused_pull,fused_pull_push), CHECK_SKIP=layers,ce_bench (skip steps 5, 6):
#   OUT=/tmp/out CHECK_PATHS=nccl,fused_norm,fused_norm_push,fused_norm_pull_push \
#     ALLREDUCE_NORM_ENGINES=fused,fused_pull,fused_pull_push CHECK_SKIP=layers,ce_bench bash tests/checks/allreduce_norm_gpu.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PATHS=${CHECK_PATHS:-nccl,fused_norm,fused_norm_push,fused_norm_pull_push,fused_norm_v1,copy_engine_norm}
SKIP=${CHECK_SKIP:-}
COMM=(python -m overlapbench comm --ops all_reduce --paths $PATHS --nccl-max-ctas default,8,16,32
      --comm-ctas 4,8,16 --ce-chunks 1,auto --hidden 8192 --iters 10 --warmup 3 --nproc 2 --format csv)

timeout 360 python -m pytest -q -p no:cacheprovider tests/test_allreduce_norm_gpu.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $? ($(tail -n 1 "$OUT/gpu-tests.log"))" | tee "$OUT/summary.txt"
timeout 120 python tests/checks/compiled_kernels.py > "$OUT/ptx.txt" 2>&1 || echo "inspect_ptx failed (see ptx.txt)"
cat > "$OUT/check-layers.yaml" <<'SPEC'
name: check-allreduce-norm-layers
model: llama3-8b
tp: 2
layers: 2
dtype: bf16
tokens: [1000, 4097]
strategies:
  baseline: {}
  fused_norm: {comm: [fused, copy_engine], comm_ctas: 8}
  token_split: {comm: [fused, copy_engine], comm_ctas_attn: 8, comm_ctas_mlp: 4}
  iso: {comm: [fused, copy_engine], comm_ctas: 8}
measure: {warmup: 2, iters: 5, warmup_s: 0.0, timeout_s: 60}
SPEC
if [[ ",$SKIP," != *,layers,* ]]; then
  timeout 150 python -m overlapbench sweep "$OUT/check-layers.yaml" --output "$OUT/layers.jsonl" --nproc 2 > "$OUT/layers.log" 2>&1
  echo "layer check: exit $?" | tee -a "$OUT/summary.txt"
fi
timeout 180 "${COMM[@]}" -b 64M -e 256M -f 4 --output "$OUT/comm.jsonl" > "$OUT/comm.csv" 2> "$OUT/comm.log"
echo "comm: exit $?" | tee -a "$OUT/summary.txt"
timeout 180 "${COMM[@]}" -b 64M -e 64M --beside-gemm --output "$OUT/comm-beside.jsonl" > "$OUT/comm-beside.csv" 2> "$OUT/comm-beside.log"
echo "comm --beside-gemm: exit $?" | tee -a "$OUT/summary.txt"
if [[ ",$SKIP," != *,ce_bench,* ]]; then
  timeout 240 torchrun --nproc-per-node 2 tests/benchmarks/copy_engine_norm.py > "$OUT/bench_copy_engine_norm.log" 2>&1
  echo "bench_copy_engine_norm: exit $?" | tee -a "$OUT/summary.txt"
fi
cat "$OUT/ptx.txt"
# The last table: overlapbench's own reports of what ran (the layer points' failures listed under it)
for rows in layers comm comm-beside; do
  [ -s "$OUT/$rows.jsonl" ] && COLUMNS=200 python -m overlapbench report "$OUT/$rows.jsonl" 2>&1 | tee -a "$OUT/summary.txt"
done
