#!/usr/bin/env bash
# The inputs and the validation of `overlapbench predict` (issue 37), in steps chosen by STEPS,
# everything under $OUT (packed into $OUT/predict.tgz after every step, so a call cut off by its
# limit keeps what finished; a summary printed last). Keep each call inside the call's limit.
#   OUT=/tmp/out OVERLAPBENCH_GIT=<commit> STEPS=table,beside,study SPECS="sweeps/a.yaml" bash tests/checks/predict_gpu.sh
# table:   (2 GPUs) the all-reduce paths the layer strategies send, 1 MiB - 1 GiB in steps of 2, at
#          the CTA budgets the studies use; hidden 8192 and, for the paths whose cost is per row,
#          4096 (llama3-8b)                                                     -> comm{,-h4096}.{jsonl,log}
# beside:  (2 GPUs) the same paths beside the llama3-70b TP=2 GEMM stream, 4 - 512 MiB: the
#          transfer's time there and the GEMMs' loss                            -> comm-beside.{jsonl,log}
# study:   (2 GPUs) each spec of $SPECS swept (-o <name>.jsonl)
# pieces:  (1 GPU) each spec of $PIECES at each TP of $TPS: the shard layer's pieces timed
#          (`sweep --pieces`)                                                  -> pieces-<name>-tp<K>.jsonl
# gaps:    (1 GPU) tests/probes/gaps_beside.py on GPU 0: one rank's GEMMs of the llama3-70b TP=4
#          layer at 16384 tokens back to back, and with an idle _sleep gap after each pass of a
#          share 0.1/0.2/0.3 of the period, in rounds of a fresh order: the GEMMs' TFLOP/s between
#          the gaps against back to back, SM clock, power; not in the default STEPS; about 85 s
#          of GPU time (4 gaps x 5 rounds x (2 s settle + 2 s measured), 3 s warm-up) plus
#          torch's start, inside GAPS_TIMEOUT (150 s) (GAPS_ARGS: more flags)
#                                                                     -> gaps/gaps_beside.jsonl, gaps.out
# Each step's wall time and exit code go to summary.txt.
set -u
cd "$(dirname "$0")/../.."
ARCHIVE=predict.tgz
source tests/checks/steps.sh
STEPS=",${STEPS:-table,beside},"
COMM=(python -m overlapbench comm --ops all_reduce --iters 10 --warmup 3 --nproc 2 --format csv)
PATHS=nccl,nccl_symm,symm_one_shot,symm_two_shot,fused_norm,copy_engine_norm

if [[ $STEPS == *,table,* ]]; then
  step table "${TABLE_TIMEOUT:-150}" "${COMM[@]}" --hidden 8192 --paths $PATHS \
    --nccl-max-ctas default,8,16,32 --comm-ctas 8,16,32,64 -b 1M -e 1G -f 2 \
    --output "$WORK/comm.jsonl" > "$WORK/comm.csv" 2> "$WORK/comm.out"
  step table-h4096 "${TABLE_TIMEOUT:-150}" "${COMM[@]}" --hidden 4096 --paths fused_norm,copy_engine_norm \
    --comm-ctas 8,16,32,64 -b 1M -e 512M -f 2 \
    --output "$WORK/comm-h4096.jsonl" > "$WORK/comm-h4096.csv" 2> "$WORK/comm-h4096.out"
fi
if [[ $STEPS == *,beside,* ]]; then
  step beside "${BESIDE_TIMEOUT:-200}" "${COMM[@]}" --hidden 8192 --paths $PATHS \
    --nccl-max-ctas default,16 --comm-ctas 16,32,64 -b 4M -e 512M -f 2 --beside-gemm \
    --output "$WORK/comm-beside.jsonl" > "$WORK/comm-beside.csv" 2> "$WORK/comm-beside.out"
fi
if [[ $STEPS == *,study,* ]]; then
  for spec in ${SPECS:-}; do
    name=$(basename "$spec" .yaml)
    step "$name" "${STUDY_TIMEOUT:-300}" python -m overlapbench sweep "$spec" -o "$WORK/$name.jsonl" > "$WORK/$name.out" 2>&1
  done
fi
if [[ $STEPS == *,pieces,* ]]; then
  for spec in ${PIECES:-}; do
    name=$(basename "$spec" .yaml)
    for tp in ${TPS:-2}; do
      step "pieces-$name-tp$tp" "${PIECES_TIMEOUT:-200}" python -m overlapbench sweep "$spec" --pieces --tp "$tp" \
        -o "$WORK/pieces-$name-tp$tp.jsonl" > "$WORK/pieces-$name-tp$tp.out" 2>&1
    done
  done
fi
if [[ $STEPS == *,gaps,* ]]; then
  step gaps "${GAPS_TIMEOUT:-150}" python tests/probes/gaps_beside.py --out "$WORK/gaps" ${GAPS_ARGS:-} > "$WORK/gaps.out" 2>&1
  tail -n 8 "$WORK/gaps.out" | tee -a "$SUMMARY"
fi

pack
cat "$SUMMARY"
