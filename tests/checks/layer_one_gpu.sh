#!/usr/bin/env bash
# The layer's compute on ONE GPU, one command, everything under $OUT (about 8 minutes on an H200):
#   OUT=/tmp/out bash tests/checks/layer_one_gpu.sh
# 1. the GPU tests of the layer's kernels and of the one-GPU layer paths (RoPE, SwiGLU, RMSNorm
#    against float32, graph replay on a side stream, the tp=1 layer and split against the truth,
#    attention, MoE, mixed batches)                                      -> gpu-tests.log
# 2. tests/benchmarks/layer_vs_transformers.py: our no_comm layer against transformers' (eager, compiled) at the
#    llama3-70b and llama3-8b TP=2 shard shapes, 1K-32K tokens, kernel tables at ENGINE_PROFILE
#    tokens                                                               -> bench-layer.{jsonl,log}, profile/
# 3. the shard sweeps: baseline, no_comm and token_split comm none, paired, with flops/peak_frac
#                                                                         -> shard-*.{jsonl,log}
# 4. tests/benchmarks/layer_pieces.py --gemms: each elementwise piece as Triton, torch eager, torch.compile;
#    the layer's GEMMs one by one (ours and transformers'), the 8192^3 GEMM burst and sustained
#                                                                         -> bench-pieces.{jsonl,log}
# 5. split-profile (only where named): sweep --profile of no_comm and token_split comm none, at
#    ENGINE_SPLIT_TOKENS (one count per sweep in ENGINE_SWEEPS)               -> split-profile-*/
# 6. base (only where named in ENGINE_STEPS): the same shard points, baseline and no_comm at
#    ENGINE_BASE_TOKENS, on the code in ENGINE_BASE (a checkout of the commit compared against,
#    named in its rows' git by ENGINE_BASE_GIT)
#                                                                         -> base-*.{jsonl,log}
# Steps by name: ENGINE_STEPS (default tests,layer,sweeps,pieces); ENGINE_MODELS, ENGINE_TOKENS,
# ENGINE_PROFILE, ENGINE_SWEEPS, ENGINE_PIECES_TOKENS narrow them. A short table last; with
# ENGINE_PACK=1 everything is packed into $OUT/engine.tgz (the device returns at most 8 files).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
STEPS=${ENGINE_STEPS:-tests,layer,sweeps,pieces}
MODELS=${ENGINE_MODELS:-llama3-70b:2,llama3-8b:2}
TOKENS=${ENGINE_TOKENS:-1024,2048,4096,8192,16384,32768}
PROFILE=${ENGINE_PROFILE:-2048,8192}
SWEEPS=${ENGINE_SWEEPS:-shard-llama3-70b-tp2 shard-llama3-8b-tp2}
has() { [[ ",$STEPS," == *,$1,* ]]; }
start=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > "$OUT/env.txt" 2>&1
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> "$OUT/env.txt" 2>&1
if has tests; then
  timeout ${ENGINE_TESTS_S:-240} python -m pytest -q -p no:cacheprovider -rs \
    ${ENGINE_TESTS:-tests/test_layer_kernels_gpu.py tests/test_moe_gpu.py tests/test_mixed_gpu.py tests/test_attention_gpu.py} > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests: exit $? ($(tail -n 1 "$OUT/gpu-tests.log")) at $((SECONDS - start)) s" | tee "$OUT/summary.txt"
fi
if has layer; then
  timeout ${ENGINE_LAYER_S:-300} python tests/benchmarks/layer_vs_transformers.py --out "$OUT/bench-layer.jsonl" --models "$MODELS" \
    --tokens "$TOKENS" --profile "$OUT/profile" --profile-tokens "$PROFILE" > "$OUT/bench-layer.log" 2>&1
  echo "bench_layer: exit $? at $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  if [[ -n ${ENGINE_EXTRA_MODELS:-} ]]; then  # more shapes at fewer token counts, into the same file
    timeout ${ENGINE_EXTRA_S:-150} python tests/benchmarks/layer_vs_transformers.py --out "$OUT/bench-layer.jsonl" --models "$ENGINE_EXTRA_MODELS" \
      --tokens "${ENGINE_EXTRA_TOKENS:-2048,8192}" > "$OUT/bench-layer-extra.log" 2>&1
    echo "bench_layer $ENGINE_EXTRA_MODELS: exit $? at $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  fi
fi
if has sweeps; then
  for spec in $SWEEPS; do
    timeout ${ENGINE_SWEEP_S:-150} python -m overlapbench sweep "sweeps/$spec.yaml" --nproc 1 --output "$OUT/$spec.jsonl" > "$OUT/$spec.log" 2>&1
    echo "sweep $spec: exit $? at $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  done
fi
if has pieces; then
  timeout ${ENGINE_PIECES_S:-120} python tests/benchmarks/layer_pieces.py --out "$OUT/bench-pieces.jsonl" --models "${ENGINE_PIECES_MODELS:-llama3-70b:2}" \
    --tokens "${ENGINE_PIECES_TOKENS:-8192}" --gemms > "$OUT/bench-pieces.log" 2>&1
  echo "bench_pieces: exit $? at $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
fi
if has split-profile; then
  set -- ${ENGINE_SPLIT_TOKENS:-4096 2048}
  for spec in $SWEEPS; do
    sed -e "s/^tokens: .*/tokens: [$1]/" -e "s/^  check: fp32.*//" -e "s/^name: /name: split-profile-/" "sweeps/$spec.yaml" > "$OUT/split-profile-$spec.yaml"
    timeout ${ENGINE_SPLIT_S:-60} python -m overlapbench sweep "$OUT/split-profile-$spec.yaml" --nproc 1 --output "$OUT/split-profile-$spec.jsonl" \
      --profile "$OUT/split-profile-$spec" > "$OUT/split-profile-$spec.log" 2>&1
    echo "split profile $spec at $1 tokens: exit $? at $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
    shift
  done
fi
if has base; then
  for spec in $SWEEPS; do
    sed -e "s/^tokens: .*/tokens: [${ENGINE_BASE_TOKENS:-2048, 8192}]/" -e "s/^  token_split: .*//" -e "s/^  check: fp32.*//" \
      -e "s/^name: /name: base-/" "sweeps/$spec.yaml" > "$OUT/base-$spec.yaml"
    (cd "${ENGINE_BASE:?ENGINE_BASE: a checkout of the base commit}" && PYTHONPATH=$PWD OVERLAPBENCH_GIT=${ENGINE_BASE_GIT:-base} \
      timeout ${ENGINE_BASE_S:-60} python -m overlapbench sweep \
      "$OUT/base-$spec.yaml" --nproc 1 --output "$OUT/base-$spec.jsonl") > "$OUT/base-$spec.log" 2>&1
    echo "base sweep $spec: exit $? at $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  done
fi
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for path in sorted(out.glob("*shard-*.jsonl")):
    for r in map(json.loads, path.read_text().splitlines()):
        rate = f" {r['tflops']:.0f} TF/s {r['peak_frac']:.1%}" if r.get("peak_frac") else ""
        print(f"{path.stem:<30} {r['strategy']:<12} {r['tokens']:>6} {r['status']:<7} "
              + (f"{r['ms']:.3f} ms{rate} err {r['rel_err'] or 0:.1e}" if r['status'] == 'ok' else str(r['error'])[:120]))
PY
tail -n 14 "$OUT/bench-layer.log" 2>/dev/null
tail -n 5 "$OUT/bench-layer-extra.log" 2>/dev/null
tail -n 30 "$OUT/bench-pieces.log" 2>/dev/null
cat "$OUT/summary.txt"
if [[ ${ENGINE_PACK:-0} == 1 ]]; then
  rm -f "$OUT"/*.lock
  tar czf /tmp/engine.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/engine.tgz "$OUT/engine.tgz"
fi
