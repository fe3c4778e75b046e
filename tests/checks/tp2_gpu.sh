#!/usr/bin/env bash
# The TP=2 measurements of issue 33 on 2 GPUs, in steps, everything under $OUT (packed into
# $OUT/tp2.tgz after every step, so a call cut off by its limit keeps what finished; a summary
# printed last). Keep each call's steps well inside the call's limit: one study per call.
#   OUT=/tmp/out OVERLAPBENCH_GIT=<commit> STEPS=comm,beside,tests bash tests/checks/tp2_gpu.sh
#   OUT=/tmp/out OVERLAPBENCH_GIT=<commit> STEPS=study SPECS="sweeps/a.yaml sweeps/b.yaml" bash tests/checks/tp2_gpu.sh
# comm:   overlapbench comm, 1-256 MiB: nccl and nccl_symm (all-reduce, all-gather, reduce-scatter) at
#         default/4/8/16/32 CTAs, PyTorch's one- and two-shot symmetric-memory all-reduce, the fused
#         all-reduce + RMSNorm kernel and the copy-engine path at 4/8/16/32 CTAs   -> comm.{jsonl,csv,log}
# beside: the all-reduce paths at 64 MiB beside the llama3-70b TP=2 GEMMs, 8 and 16 CTAs: which
#         few-SM path costs the GEMM least                                       -> comm-beside.{jsonl,csv,log}
# tests:  the whole GPU test suite (pytest -m gpu)                                -> gpu-tests.log
# study:  each spec of $SPECS swept (-o <name>.jsonl), then `overlapbench report` of its rows
# Each step's wall time and exit code go to summary.txt.
set -u
cd "$(dirname "$0")/../.."
ARCHIVE=tp2.tgz
source tests/checks/steps.sh
STEPS=",${STEPS:-comm,beside,tests},"
COMM=(python -m overlapbench comm --iters 10 --warmup 3 --hidden 8192 --nproc 2 --format csv)

if [[ $STEPS == *,comm,* ]]; then
  step comm "${COMM_TIMEOUT:-200}" "${COMM[@]}" --paths nccl,nccl_symm,symm_one_shot,symm_two_shot,fused_norm,copy_engine_norm \
    --nccl-max-ctas default,4,8,16,32 --comm-ctas 4,8,16,32 -b 1M -e 256M -f 4 \
    --output "$WORK/comm.jsonl" > "$WORK/comm.csv" 2> "$WORK/comm.log"
fi
if [[ $STEPS == *,beside,* ]]; then
  step beside "${BESIDE_TIMEOUT:-120}" "${COMM[@]}" --ops all_reduce --paths nccl,nccl_symm,symm_two_shot,fused_norm,copy_engine_norm \
    --nccl-max-ctas default,8,16 --comm-ctas 8,16 -b 64M -e 64M --beside-gemm \
    --output "$WORK/comm-beside.jsonl" > "$WORK/comm-beside.csv" 2> "$WORK/comm-beside.log"
fi
if [[ $STEPS == *,tests,* ]]; then
  step tests "${TESTS_TIMEOUT:-360}" python -m pytest -q -m gpu -rs -p no:cacheprovider tests > "$WORK/gpu-tests.log" 2>&1
  tail -n 3 "$WORK/gpu-tests.log" | tee -a "$SUMMARY"
fi
if [[ $STEPS == *,study,* ]]; then
  for spec in ${SPECS:-}; do
    name=$(basename "$spec" .yaml)
    step "$name" "${STUDY_TIMEOUT:-420}" python -m overlapbench sweep "$spec" -o "$WORK/$name.jsonl" > "$WORK/$name.log" 2>&1
    python -m overlapbench report "$WORK/$name.jsonl" --format markdown > "$WORK/report-$name.md" 2>&1
    pack
  done
fi

pack
for rows in "$WORK"/comm*.jsonl; do
  [ -f "$rows" ] && python -m overlapbench report "$rows" 2>/dev/null | tail -n 40
done
cat "$SUMMARY"
