#!/usr/bin/env bash
# W3 side by side in one GPU session (WORKLOADS.md: ResNet-18, batch 1024,
# 224x224 from 32x32 uint8 images, normalised on the GPU, SGD momentum 0.9):
# streamfeed's device-cached figures (build/bench/cached: raw uint8 batch on
# the device, augment+step, and the step alone) for each layout/precision
# choice, then PyTorch's eager / channels_last / torch.compile variants
# (bench/pytorch_w3.py; W3_TORCH=0 skips it). Output under $1. W3_HTTP=1 adds an end-to-end run
# over HTTP (bf16, batch $W3_HTTP_BATCH). First the numerics gate
# (bench/families_check.py --preset): one step of the service's resnet18 in
# bf16 and in tf32 against PyTorch's from the same weights; when it fails, no
# figure is measured and the script exits 1.
set -uo pipefail
cd "$(dirname "$0")/.."
D=${1:-build/w3-out}
B=${W3_BATCH:-1024}
mkdir -p "$D"
PYTHONPATH=client/python timeout 300 python3 bench/families_check.py --bin build/streamfeed --status "$D" --preset \
  --size 224 --batch 32 --precision bf16,tf32 resnet18 2>&1 | tee -a "$D/w3.log"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "w3: the numerics gate failed ($D/resnet18/check.json): no figures" | tee -a "$D/w3.log"; exit 1; }
# precision layout
for c in "bf16 nhwc" "bf16 nchw" "tf32 nhwc" "tf32 nchw"; do
  set -- $c
  timeout 180 build/bench/cached --preset resnet18 --batch "$B" --precision $1 --layout $2 \
    --steps ${W3_STEPS:-20} --warmup 3 > "$D/cached.tmp" 2>&1
  head -n 1 "$D/cached.tmp" | tee -a "$D/w3.log"
  grep '^{' "$D/cached.tmp" >> "$D/w3_streamfeed.jsonl"
done
[ "${W3_TORCH:-1}" = 1 ] && PYTHONUNBUFFERED=1 timeout 420 python3 bench/pytorch_w3.py --batch "$B" --steps ${W3_TORCH_STEPS:-30} \
  --warmup 5 --json "$D/pytorch_w3.json" 2>&1 | tee -a "$D/w3.log"
if [ "${W3_HTTP:-0}" = 1 ]; then
  HB=${W3_HTTP_BATCH:-256}
  PIPE='[{"op":"to_dtype","scale":0.00392156862745098},{"op":"normalize","mean":[0.5],"std":[0.5]}]'
  python3 bench/ingest_e2e.py --bin build/streamfeed --load build/streamfeed-load \
    --server-args "--model.preset resnet18 --model.precision bf16 --model.max_batch $HB --optim.momentum 0.9 --ring.slots 8 --http.threads 8 --augment.pipeline '$PIPE' --ring.slot_bytes $(( HB * 224 * 224 * 3 + 65536 ))" \
    --load-args "--workload w3 --batch $HB --connections 8 --pool 4" --batches ${W3_HTTP_BATCHES:-120} \
    --label "w3_b${HB}_http_bf16" --json "$D/w3_b${HB}_http.json" 2>&1 | tee -a "$D/w3.log"
fi
