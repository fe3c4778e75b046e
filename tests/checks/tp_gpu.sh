#!/usr/bin/env bash
# Measurements at TP=$TP (default 2) on $TP GPUs, in steps chosen by STEPS, everything under $OUT
# (packed into $OUT/tp$TP.tgz after every step, so a call cut off by its limit keeps what finished;
# a summary printed last). Keep each call's steps well inside the call's limit: one study per call.
#   OUT=/tmp/out OVERLAPBENCH_GIT=<commit> TP=4 STEPS=table,study SPECS="sweeps/a.yaml" bash tests/checks/tp_gpu.sh
# table:  overlapbench comm, 1 MiB - 1 GiB in steps of 2: the all-reduce paths the layer strategies
#         and the baselines send (NCCL's ring at its default and 16/32 CTAs, its symmetric kernel on
#         16/32 CTAs, PyTorch's one- and two-shot, the fused all-reduce + RMSNorm kernel and the
#         copy-engine path on 16/32/64 CTAs), then all-gather and reduce-scatter for the
#         sequence-parallel families (NCCL ring and symmetric, copy engine)  -> comm{,-sp}.{jsonl,csv,out}
# beside: the all-reduce paths at 64 MiB beside the llama3-70b TP=2 GEMMs, 8 and 16 CTAs: which
#         few-SM path costs the GEMM least                                   -> comm-beside.{jsonl,csv,out}
# beside-layer: for each model of $LAYER_MODELS (default llama3-70b llama3-8b), the all-reduce paths
#         and CTA budgets the layer strategies send, each beside one rank's shard of the model's
#         layer at TP=$TP on the rows it carries ($LAYER_TOKENS, default 512-32768): the compute's
#         loss, the transfer's stretch, the in-line extra in paired rounds, each block's pair with
#         one call (`predict`'s contention and in-layer term); LAYER_PATHS, LAYER_NCCL_CTAS and
#         LAYER_COMM_CTAS narrow the paths and budgets, LAYER_ARGS adds flags (--settle-ms 300
#         --span-ms 200: the windows at each graph's own clock), LAYER_SUFFIX ends the files' names
#         (-settled)                                -> comm-beside-layer-<model><suffix>.{jsonl,csv,out}
# power:  tests/probes/power_beside.py on GPUs 0 and 1 (whatever TP is): the llama3-70b TP=2 MLP
#         GEMMs at 16384 tokens on GPU 0 alone and beside copy-engine copies (GPU 0 pulling from
#         GPU 1, GPU 1 pushing into GPU 0, GPU 0 copying locally; no SM kernel), in rounds of a
#         fresh order: TFLOP/s, SM clock, power; about 75 s (POWER_ARGS: more flags)
#                                                                     -> power/power_beside.jsonl, power.out
# arpower: tests/probes/allreduce_power.py on $TP GPUs (torchrun): the board power of NCCL's
#         all-reduce of the llama3-70b layer's message at 1K-32K tokens, held back to back, beside
#         an idle `_sleep` and the layer's GEMMs; each all-reduce's idle equivalence under the cap;
#         about 100 s (ARPOWER_ARGS: more flags)            -> arpower/allreduce_power.jsonl, arpower.out
# tests:  the whole GPU test suite (pytest -m gpu), with the 25 slowest tests  -> gpu-tests.log
#         listed: on 4 GPUs the cases whose subject depends on the world size run at 2 and 4
#         ranks (ids ws2-... and ws4-...). TESTS_SELECT, a pytest -k expression, runs a part
#         of it where the whole does not fit one call: TESTS_SELECT=ws4, then "not ws4".
# study:  each spec of $SPECS swept on $TP GPUs (--nproc $TP: TP=2 runs on GPUs 0 and 1 of a
#         4-GPU machine; -o <name>.jsonl), then `overlapbench report` of its rows. A study
#         longer than one call: RESUME_DIR names a folder of the working tree holding an earlier
#         call's <name>.jsonl; it is copied in and the sweep continues it (--resume)
# profile: each spec of $PROFILES swept with --profile (-o <name>.jsonl, kernel tables in <name>/),
#         then `overlapbench report --profile` of them
# Each step's wall time and exit code go to summary.txt, and what still holds a GPU after it.
set -u
cd "$(dirname "$0")/../.."
TP=${TP:-2}
ARCHIVE=tp$TP.tgz
source tests/checks/steps.sh
STEPS=",${STEPS:-table,beside,tests},"
COMM=(python -m overlapbench comm --iters 10 --warmup 3 --hidden 8192 --nproc "$TP" --format csv)
LAYER=(python -m overlapbench comm --iters 10 --warmup 3 --nproc "$TP" --format csv)  # hidden: the model's

if [[ $STEPS == *,table,* ]]; then
  step table "${TABLE_TIMEOUT:-200}" "${COMM[@]}" --ops all_reduce \
    --paths nccl,nccl_symm,symm_one_shot,symm_two_shot,fused_norm,copy_engine_norm,copy_engine_norm_kernel \
    --nccl-max-ctas default,16,32 --comm-ctas 16,32,64 -b 1M -e 1G -f 2 \
    --output "$WORK/comm.jsonl" > "$WORK/comm.csv" 2> "$WORK/comm.out"
  step table-sp "${TABLE_TIMEOUT:-200}" "${COMM[@]}" --ops all_gather,reduce_scatter \
    --paths nccl,nccl_symm,copy_engine --nccl-max-ctas default,16,32 -b 1M -e 1G -f 4 \
    --output "$WORK/comm-sp.jsonl" > "$WORK/comm-sp.csv" 2> "$WORK/comm-sp.out"
fi
if [[ $STEPS == *,beside,* ]]; then
  step beside "${BESIDE_TIMEOUT:-120}" "${COMM[@]}" --ops all_reduce --paths nccl,nccl_symm,symm_two_shot,fused_norm,copy_engine_norm \
    --nccl-max-ctas default,8,16 --comm-ctas 8,16 -b 64M -e 64M --beside-gemm \
    --output "$WORK/comm-beside.jsonl" > "$WORK/comm-beside.csv" 2> "$WORK/comm-beside.out"
fi
if [[ $STEPS == *,beside-layer,* ]]; then
  for model in ${LAYER_MODELS:-llama3-70b llama3-8b}; do
    step "beside-layer-$model" "${BESIDE_LAYER_TIMEOUT:-290}" "${LAYER[@]}" --beside-layer "$model" \
      --tokens "${LAYER_TOKENS:-512,1024,2048,4096,8192,16384,32768}" \
      --paths "${LAYER_PATHS:-nccl,nccl_symm,symm_one_shot,symm_two_shot,fused_norm,copy_engine_norm,copy_engine_norm_kernel}" \
      --nccl-max-ctas "${LAYER_NCCL_CTAS:-default,16}" --comm-ctas "${LAYER_COMM_CTAS:-16,32,64}" ${LAYER_ARGS:-} \
      --output "$WORK/comm-beside-layer-$model${LAYER_SUFFIX:-}.jsonl" > "$WORK/comm-beside-layer-$model${LAYER_SUFFIX:-}.csv" \
      2> "$WORK/comm-beside-layer-$model${LAYER_SUFFIX:-}.out"
    pack
  done
fi
if [[ $STEPS == *,power,* ]]; then
  step power "${POWER_TIMEOUT:-150}" python tests/probes/power_beside.py --out "$WORK/power" ${POWER_ARGS:-} > "$WORK/power.out" 2>&1
  tail -n 9 "$WORK/power.out" | tee -a "$SUMMARY"
fi
if [[ $STEPS == *,arpower,* ]]; then
  step arpower "${ARPOWER_TIMEOUT:-200}" python -m torch.distributed.run --standalone --nproc-per-node "$TP" \
    tests/probes/allreduce_power.py --out "$WORK/arpower" ${ARPOWER_ARGS:-} > "$WORK/arpower.out" 2>&1
  tail -n 10 "$WORK/arpower.out" | tee -a "$SUMMARY"
fi
if [[ $STEPS == *,tests,* ]]; then
  step tests "${TESTS_TIMEOUT:-360}" python -m pytest -q -m gpu -rfEs -p no:cacheprovider --durations=25 \
    ${TESTS_SELECT:+-k "$TESTS_SELECT"} tests > "$WORK/gpu-tests.log" 2>&1
  tail -n 3 "$WORK/gpu-tests.log" | tee -a "$SUMMARY"
fi
if [[ $STEPS == *,study,* ]]; then
  for spec in ${SPECS:-}; do
    name=$(basename "$spec" .yaml)
    resume=()
    if [ -n "${RESUME_DIR:-}" ] && [ -f "$RESUME_DIR/$name.jsonl" ]; then
      cp "$RESUME_DIR/$name.jsonl" "$WORK/$name.jsonl" && resume=(--resume)
    fi
    step "$name" "${STUDY_TIMEOUT:-420}" python -m overlapbench sweep "$spec" --nproc "$TP" -o "$WORK/$name.jsonl" "${resume[@]}" > "$WORK/$name.out" 2>&1
    python -m overlapbench report "$WORK/$name.jsonl" --format markdown > "$WORK/report-$name.md" 2>&1
    pack
  done
fi
if [[ $STEPS == *,profile,* ]]; then
  for spec in ${PROFILES:-}; do
    name=$(basename "$spec" .yaml)
    step "$name" "${PROFILE_TIMEOUT:-240}" python -m overlapbench sweep "$spec" --nproc "$TP" --profile "$WORK/$name" -o "$WORK/$name.jsonl" > "$WORK/$name.out" 2>&1
    python -m overlapbench report "$WORK/$name.jsonl" --profile "$WORK/$name" > "$WORK/report-$name.txt" 2>&1
    pack
  done
fi

pack
for rows in "$WORK"/comm*.jsonl; do
  [ -f "$rows" ] && python -m overlapbench report "$rows" 2>/dev/null | tail -n 30
done
for rows in "$WORK"/*.jsonl; do
  case $rows in */comm*) ;; *) python -m overlapbench report "$rows" 2>/dev/null | tail -n 45 ;; esac
done
cat "$SUMMARY"
