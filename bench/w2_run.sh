#!/usr/bin/env bash
# W2 side by side in one GPU session: streamfeed over HTTP (streamfeed-load
# posting uint8 images with per-pixel u8 labels; the encoder is frozen and runs
# on the transform stream) for batch 8/32/128 with overlap on and off, then
# PyTorch's serial / streams / cached variants. Output under $1. First the
# numerics gate (bench/families_check.py --preset): one step of seed-encdec,
# every layer trained, per-pixel labels, in tf32 and fp32 against its PyTorch
# module from the same weights; when it fails, nothing is measured and the
# script exits 1.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
D=${1:-build/w2-out}
mkdir -p "$D"
PYTHONPATH=client/python timeout 300 "${PY:-python3}" bench/families_check.py --bin build/streamfeed --status "$D" \
  --preset --size 256 --batch 8 --precision tf32,fp32 seed-encdec 2>&1 | tee -a "$D/w2.log"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "w2: the numerics gate failed ($D/seed-encdec/check.json): no figures" | tee -a "$D/w2.log"; exit 1; }
E2E="python3 bench/ingest_e2e.py --bin build/streamfeed --load build/streamfeed-load"
PIPE='[{"op":"to_dtype","scale":1.0}]'
for b in 8 32 128; do
  n=$(( b == 8 ? 1500 : (b == 32 ? 600 : 200) ))
  for ov in true false; do
    $E2E --server-args "--model.preset seed-encdec --model.freeze encoder --model.max_batch $b --ring.slots 16 --http.threads 8 --pipeline.overlap $ov --augment.pipeline '$PIPE' --ring.slot_bytes $(( b * 256 * 256 * 4 + 65536 ))" \
         --load-args "--workload w2 --batch $b --connections 8 --pool 8 --label-dtype u8" --batches $n \
         --label "w2_b${b}_http_overlap_$ov" --json "$D/w2_b${b}_overlap_$ov.json" | tee -a "$D/w2.log"
  done
done
PYTHONUNBUFFERED=1 python3 bench/pytorch_w2.py --batches 8,32,128 --json "$D/pytorch_w2.json" 2>&1 | tee -a "$D/w2.log"
