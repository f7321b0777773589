#!/usr/bin/env bash
# W2 side by side in one GPU session: streamfeed over HTTP (streamfeed-load
# posting uint8 images with per-pixel u8 labels; the encoder is frozen and runs
# on the transform stream) for batch 8/32/128 with overlap on and off, then
# PyTorch's serial / streams / cached variants. Output under $1.
set -uo pipefail
cd "$(dirname "$0")/.."
D=${1:-build/w2-out}
mkdir -p "$D"
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
