#!/usr/bin/env bash
# W3 side by side in one GPU session (WORKLOADS.md: ResNet-18, batch 1024,
# 224x224 from 32x32 uint8 images, normalised on the GPU, SGD momentum 0.9):
# streamfeed's device-cached figures (build/bench/cached: raw uint8 batch on
# the device, augment+step, and the step alone) in bf16 and tf32, NHWC and
# NCHW, then PyTorch's eager / channels_last / torch.compile variants
# (bench/pytorch_w3.py). Output under $1.
set -uo pipefail
cd "$(dirname "$0")/.."
D=${1:-build/w3-out}
B=${W3_BATCH:-1024}
mkdir -p "$D"
for prec in bf16 tf32; do
  for lay in nhwc nchw; do
    SF_CUDA_LAYOUT=$lay build/bench/cached --preset resnet18 --batch "$B" --precision $prec --steps 20 --warmup 3 \
      2>&1 | tee -a "$D/w3.log" | grep '^{' >> "$D/w3_streamfeed.jsonl"
    tail -n 2 "$D/w3.log" | head -n 1
  done
done
PYTHONUNBUFFERED=1 python3 bench/pytorch_w3.py --batch "$B" --json "$D/pytorch_w3.json" 2>&1 | tee -a "$D/w3.log"
# Over HTTP end to end (streamfeed-load posting uint8 224x224 images, 8
# connections), bf16, batch 256 (38.5 MB bodies): the figure the service
# reaches when the data arrives over the network.
HB=${W3_HTTP_BATCH:-256}
PIPE='[{"op":"to_dtype","scale":0.00392156862745098},{"op":"normalize","mean":[0.5],"std":[0.5]}]'
python3 bench/ingest_e2e.py --bin build/streamfeed --load build/streamfeed-load \
  --server-args "--model.preset resnet18 --model.precision bf16 --model.max_batch $HB --optim.momentum 0.9 --ring.slots 8 --http.threads 8 --augment.pipeline '$PIPE' --ring.slot_bytes $(( HB * 224 * 224 * 3 + 65536 ))" \
  --load-args "--workload w3 --batch $HB --connections 8 --pool 4" --batches ${W3_HTTP_BATCHES:-120} \
  --label "w3_b${HB}_http_bf16" --json "$D/w3_b${HB}_http.json" 2>&1 | tee -a "$D/w3.log"
