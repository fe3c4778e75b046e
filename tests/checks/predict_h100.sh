#!/usr/bin/env bash
# results/predicted-h100/ from committed inputs, on any machine (no GPU): the TP=2 predictions of
# llama3-70b and llama3-8b, llama3-70b at TP=4 and TP=8 (the 2x H100 table rescaled to the
# all-reduce bus bandwidth 4 and 8 H100s reach at 1 GiB), their reports and tuned YAMLs; then
# validation.md (tests/checks/predict_validate.py: TP=2 and TP=4 against the measured studies of
# H100s, and which inputs are not committed yet) and the cross-device diagnostic at TP=4.
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
python tests/checks/predict_validate.py --device h100 --out "$OUT"
python tests/checks/predict_validate.py --diagnostic "$OUT/diagnostic-tp4-h200-rows.md"
for tp in 4 8; do
  ob report "$OUT/predicted-llama3-70b-tp$tp.jsonl" --format markdown > "$OUT/report-llama3-70b-tp$tp.md"
done
ob tune "$OUT"/predicted-llama3-70b-tp4.jsonl "$OUT"/predicted-llama3-70b-tp8.jsonl --out-dir "$OUT/tuned"
grep -h "^| llama3" "$OUT/validation.md"
