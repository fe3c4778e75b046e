#!/usr/bin/env bash
# On 2 GPUs, in one command: a sweep stopped by SIGTERM while a rank is stuck leaves no process on
# the GPUs, and points whose CUDA-graph capture fails end alone with the run exiting 0
# (tests/test_stopped_runs_gpu.py)                                  -> signal-tests.log
# Packed into $OUT/signal.tgz with what nvidia-smi lists afterwards; the summary printed last.
#   OUT=/tmp/out OVERLAPBENCH_GIT=<commit> bash tests/checks/signal_gpu.sh
set -u
cd "$(dirname "$0")/../.."
ARCHIVE=signal.tgz
source tests/checks/steps.sh

step tests "${TESTS_TIMEOUT:-300}" python -m pytest -q -rA -p no:cacheprovider tests/test_stopped_runs_gpu.py \
  > "$WORK/signal-tests.log" 2>&1
tail -n 3 "$WORK/signal-tests.log" | tee -a "$SUMMARY"
nvidia-smi --query-compute-apps=pid,used_memory,process_name --format=csv > "$WORK/signal-gpus-after.txt" 2>&1
pack
cat "$SUMMARY"
