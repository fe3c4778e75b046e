#!/usr/bin/env bash
# results/predicted-h100/ from committed inputs, on any machine (no GPU): the TP=2 predictions
# of llama3-70b and llama3-8b against the measured studies (validation.md), and llama3-70b at TP=4
# and TP=8 (the 2x H100 table rescaled to the all-reduce bus bandwidth 8 H100s reach at 1 GiB).
#   bash tests/checks/predict_h100.sh
set -eu
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
OUT=results/predicted-h100
PIECES=results/h100x1/d604491
COMM="--comm results/h100x2/cc10b27/comm.jsonl --comm results/h100x2/cc10b27/comm-h4096.jsonl --comm results/h100x2/cc10b27/comm-beside.jsonl"
mkdir -p "$OUT"
rm -f "$OUT"/predicted-*.jsonl
ob() { python -m overlapbench "$@"; }
for m in 70b 8b; do
  ob predict sweeps/llama3-$m-tp2.yaml --tp 2 $COMM --compute $PIECES/pieces-llama3-$m-tp2-tp2.jsonl -o "$OUT/predicted-llama3-$m-tp2.jsonl"
done
ob predict sweeps/llama3-70b-tp2.yaml --tp 4 --busbw 355 $COMM --compute $PIECES/pieces-llama3-70b-tp2-tp4.jsonl -o "$OUT/predicted-llama3-70b-tp4.jsonl"
ob predict sweeps/llama3-70b-tp2.yaml --tp 8 --busbw 361 $COMM --compute $PIECES/pieces-llama3-70b-tp2-tp8.jsonl -o "$OUT/predicted-llama3-70b-tp8.jsonl"
{
  echo "# Predicted against measured: llama3-70b and llama3-8b at TP=2 on 2x H100"
  echo
  echo "Made by \`bash tests/checks/predict_h100.sh\` (tests/checks/predict_validation.py) from committed files; see README.md here."
  echo
  python tests/checks/predict_validation.py --name "llama3-70b TP=2 (measured: results/h100x2/331cb63, run a29ad33dda64)" \
    --measured results/h100x2/331cb63/llama3-70b-tp2.jsonl --predicted "$OUT/predicted-llama3-70b-tp2.jsonl" --markdown
  python tests/checks/predict_validation.py --name "llama3-8b TP=2 (measured: results/h100x2/331cb63 run 6c02b578738c, 32K: results/h100x2/cc10b27 run 88485435c2bf)" \
    --measured results/h100x2/331cb63/llama3-8b-tp2.jsonl results/h100x2/cc10b27/llama3-8b-tp2-32k.jsonl \
    --predicted "$OUT/predicted-llama3-8b-tp2.jsonl" --markdown
  python tests/checks/predict_validation.py --name "llama3-70b TP=2, 2K and 8K measured on the host whose GPU 0 timed the isolated pieces (results/h100x2/49668c3)" \
    --measured results/h100x2/49668c3/llama3-70b-tp2-2k8k.jsonl --predicted "$OUT/predicted-llama3-70b-tp2.jsonl" --markdown
  python tests/checks/predict_validation.py --name "llama3-8b TP=2, 2K and 8K measured on that host (results/h100x2/49668c3)" \
    --measured results/h100x2/49668c3/llama3-8b-tp2-2k8k.jsonl --predicted "$OUT/predicted-llama3-8b-tp2.jsonl" --markdown
} > "$OUT/validation.md"
for tp in 4 8; do
  ob report "$OUT/predicted-llama3-70b-tp$tp.jsonl" --format markdown > "$OUT/report-llama3-70b-tp$tp.md"
done
ob tune "$OUT"/predicted-llama3-70b-tp4.jsonl "$OUT"/predicted-llama3-70b-tp8.jsonl --out-dir "$OUT/tuned"
grep -h "^[0-9]* points" "$OUT/validation.md"
