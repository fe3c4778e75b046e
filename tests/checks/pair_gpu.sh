#!/usr/bin/env bash
# The pair window of `comm --beside-layer` (comm/pair.py) at TP=$TP (default 2) on $TP GPUs, in
# one call, everything under $OUT (packed into $OUT/pair-tp$TP.tgz after every step; a summary
# printed last):
# tests:     tests/test_comm_beside_layer_gpu.py (the pair fields on two ranks) -> gpu-tests.log
# rows:      for each model of $LAYER_MODELS, the paths and budgets the studies' splits send
#            (nccl_symm 16, the fused kernel and the copy engine's two writers on 16 and 32 CTAs)
#            beside the layer at 512-16384 rows       -> comm-beside-layer-<model>.{jsonl,csv,out}
#            (ROWS_ARGS: more flags, e.g. "--settle-ms 300 --span-ms 200" to settle each graph
#            before its spans; ROWS_SUFFIX: appended to the files' names, e.g. -settled)
# timelines: $TIMELINE_MODEL (default llama3-70b) at $TIMELINE_ROWS rows (default 4096), each
#            path of $TIMELINE_PATHS (default the copy engine's `copy` writer on 32 CTAs and
#            nccl_symm on 16): every rank's timelines of the five pair graphs
#            (OVERLAPBENCH_PAIR_TIMELINES)                         -> timelines/, timelines-*.out
#   OUT=/tmp/out OVERLAPBENCH_GIT=<commit> TP=2 STEPS=tests,rows,timelines bash tests/checks/pair_gpu.sh
set -u
cd "$(dirname "$0")/../.."
TP=${TP:-2}
ARCHIVE=pair-tp$TP.tgz
source tests/checks/steps.sh
STEPS=",${STEPS:-tests,rows,timelines},"
LAYER=(python -m overlapbench comm --iters 10 --warmup 3 --nproc "$TP" --format csv)

if [[ $STEPS == *,tests,* ]]; then
  step tests "${TESTS_TIMEOUT:-150}" python -m pytest -q -rfEs -p no:cacheprovider tests/test_comm_beside_layer_gpu.py \
    > "$WORK/gpu-tests.log" 2>&1
  tail -n 2 "$WORK/gpu-tests.log" | tee -a "$SUMMARY"
fi
if [[ $STEPS == *,rows,* ]]; then
  for model in ${LAYER_MODELS:-llama3-70b llama3-8b}; do
    step "beside-layer-$model" "${ROWS_TIMEOUT:-190}" "${LAYER[@]}" --beside-layer "$model" \
      --tokens "${LAYER_TOKENS:-512,1024,2048,4096,8192,16384}" \
      --paths nccl_symm,fused_norm,copy_engine_norm,copy_engine_norm_kernel --nccl-max-ctas 16 --comm-ctas 16,32 \
      ${ROWS_ARGS:-} --output "$WORK/comm-beside-layer-$model${ROWS_SUFFIX:-}.jsonl" \
      > "$WORK/comm-beside-layer-$model${ROWS_SUFFIX:-}.csv" 2> "$WORK/comm-beside-layer-$model${ROWS_SUFFIX:-}.out"
  done
fi
if [[ $STEPS == *,timelines,* ]]; then
  mkdir -p "$WORK/timelines"
  for path in ${TIMELINE_PATHS:-copy_engine_norm nccl_symm}; do
    mkdir -p "$WORK/timelines/$path"
    OVERLAPBENCH_PAIR_TIMELINES=$WORK/timelines/$path step "timelines-$path" 150 "${LAYER[@]}" --beside-layer "${TIMELINE_MODEL:-llama3-70b}" \
      --tokens "${TIMELINE_ROWS:-4096}" --paths "$path" --nccl-max-ctas 16 --comm-ctas 32 \
      --output "$WORK/timelines-$path.jsonl" > "$WORK/timelines-$path.csv" 2> "$WORK/timelines-$path.out"
  done
fi
pack
cat "$SUMMARY"
