#!/usr/bin/env bash
# device call 3 (issue 17): the paired-ratio GPU check, then two interleaved runs of the SP 70B study
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD OVERLAPBENCH_GIT=cbe2822
R=/tmp/r; mkdir -p $R
timeout 90 python -m pytest -q -s -p no:cacheprovider tests/test_measure_gpu.py > $R/test_measure_gpu.log 2>&1; echo "test_measure_gpu exit $?"
for run in a b; do
  start=$(date +%s)
  timeout 285 python -m overlapbench sweep sweeps/sp-llama3-70b-tp2.yaml -o $R/sp-llama3-70b-tp2-$run.jsonl > $R/sp-llama3-70b-tp2-$run.log 2>&1
  echo "sweep $run exit $? wall $(( $(date +%s) - start )) s" | tee -a $R/walltime.txt
done
python kernels/check_paired_runs.py $R/sp-llama3-70b-tp2-a.jsonl $R/sp-llama3-70b-tp2-b.jsonl > $R/check-paired.txt 2>&1
cat $R/walltime.txt >> $R/check-paired.txt
cp $R/*.log $R/*-a.jsonl $R/*-b.jsonl $R/check-paired.txt $OUT/
grep -m3 "paired A/B\|passed\|failed" $R/test_measure_gpu.log
tail -4 $R/sp-llama3-70b-tp2-a.log; tail -4 $R/sp-llama3-70b-tp2-b.log
cat $R/check-paired.txt
