# What the device scripts here share; sourced from the repository root, after setting ARCHIVE.
# It makes the run's folders ($OUT comes back from the device call; $WORK is packed into
# $OUT/$ARCHIVE), exports the environment every process keeps (NVLink multicast off), writes
# env.txt and the summary's first line, and defines
#   step NAME TIMEOUT_S COMMAND...  run it under a timeout (SIGINT first, as Ctrl-C: a sweep keeps
#                                   its rows, pytest names the failures so far; SIGKILL 30 s on), note its wall time and exit code in
#                                   summary.txt, end what still holds a GPU after it, then pack
#   leftovers                       the processes still on the GPUs, noted in summary.txt and
#                                   killed: the machine is the script's, and a survivor of one
#                                   step would take memory and SMs from the next
#   pack                            everything so far into one archive (at most 8 files come back
#                                   from a call): a call cut off by its limit keeps every step that finished
OUT=${OUT:-out}
WORK=$(mktemp -d)
SUMMARY=$WORK/summary.txt
mkdir -p "$OUT"
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

pack() {
  tar -czf "$OUT/$ARCHIVE" -C "$WORK" . && cp "$SUMMARY" "$OUT/summary.txt"
}

leftovers() {
  local apps pids
  apps=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null)
  [ -z "$apps" ] && return 0
  echo "  still on the GPUs: $(echo "$apps" | tr '\n' ';')" | tee -a "$SUMMARY"
  pids=$(echo "$apps" | cut -d, -f1)
  kill -9 $pids 2>/dev/null
  sleep 3
}

step() {
  local name=$1 limit=$2 start
  shift 2
  start=$(date +%s)
  timeout --signal=INT --kill-after=30 "$limit" "$@"
  echo "$name: exit $? in $(( $(date +%s) - start )) s" | tee -a "$SUMMARY"
  sleep 1
  leftovers
  pack
}

{ python -m overlapbench env; nvidia-smi -L; nvidia-smi topo -m; } > "$WORK/env.txt" 2>&1
echo "git ${OVERLAPBENCH_GIT:-unset} on $(nvidia-smi -L | head -n 1)" | tee "$SUMMARY"
