#!/usr/bin/env bash
# bench/jpeg_run.sh (make bench-jpeg) — JPEG ingest on a GPU host, streamfeed
# and PyTorch in one session, so the ratios come from one run:
#   1. decode alone, images/s: each nvJPEG backend through streamfeed's decoder
#      (build/bench/jpeg_decode), torchvision.io.decode_jpeg(list, device="cuda")
#      and PIL per core (bench/jpeg_decode.py), batch 32 and 256, on 256x256
#      (w1-jpeg) and 500x375 (imagenet-jpeg) quality-90 files;
#   then the numerics gate of the two models parts 2 and 3 train
#      (bench/families_check.py --preset; nothing more runs without it);
#   2. W1 over HTTP, 8 connections: raw uint8 batches against JPEG batches of
#      the same size, steps/s and bytes on the wire (bench/ingest_e2e.py);
#   3. ImageNet-like: ResNet-18 bf16 batch 256 from 500x375 JPEGs through
#      random_resized_crop 224 (antialias), with the per-batch decoder choice
#      and with gpu_hybrid forced, against raw 224x224 uint8 batches
#      through the same list, and PyTorch's DataLoader+PIL and GPU-decode
#      pipelines on the same files (bench/pytorch_jpeg.py).
# The files are generated once by streamfeed-load into $JPEG_CACHE (no data
# set, no network). Results: $BENCH_OUT (default build/bench-out/jpeg), one
# .jsonl/.json per part and bench.log; the GPU, commit and date beside them.
# Each HTTP run also records what ran: JPEG batches per decoder
# (streamfeed_jpeg_batches_total), the engine thread's host time per decode,
# and the mean h2d (on CUDA: the decode), transform and step times.
# Expects `make all bench-bins` done (make bench-jpeg does it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTD=${BENCH_OUT:-build/bench-out/jpeg}
CACHE=${JPEG_CACHE:-build/jpeg-cache}
N=${BENCH_BATCHES:-2000}
mkdir -p "$OUTD"
log() { echo "bench-jpeg: $*" | tee -a "$OUTD/bench.log"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUTD/gpu.txt" 2>/dev/null \
  || echo "no GPU" > "$OUTD/gpu.txt"
echo "${BENCH_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}" > "$OUTD/commit.txt"
date -u +%Y-%m-%dT%H:%M:%SZ > "$OUTD/date.txt"
log "GPU: $(cat "$OUTD/gpu.txt"); commit $(cat "$OUTD/commit.txt")"

LOAD=build/streamfeed-load
# 256 files of each kind (8 bodies of 32), made once; --prepare prints the folder.
W1DIR=$($LOAD --workload w1-jpeg --cache-dir "$CACHE" --pool 8 --batch 32 --prepare --quiet | sed -n 's/.*files in //p')
IMNDIR=$($LOAD --workload imagenet-jpeg --cache-dir "$CACHE" --pool 8 --batch 32 --prepare --quiet | sed -n 's/.*files in //p')
log "files: $W1DIR, $IMNDIR"

# 1. Decode alone.
for d in "w1_256x256:$W1DIR" "imagenet_500x375:$IMNDIR"; do
  label=${d%%:*}; dir=${d#*:}
  build/bench/jpeg_decode "$dir" --batch 32,256 --iters 50 --label "$label" 2>&1 | tee -a "$OUTD/bench.log" \
    | grep '^{' >> "$OUTD/decode.jsonl"
  python3 bench/jpeg_decode.py --dir "$dir" --batch 32,256 --iters 50 --label "$label" 2>&1 \
    | tee -a "$OUTD/bench.log" | grep '^{' >> "$OUTD/decode.jsonl"
done

# The numerics gate (bench/families_check.py --preset) before parts 2 and 3
# train: W1's seed-classifier in tf32 and W3's resnet18 in bf16, each against
# its PyTorch module from the same weights, and fp32 for both. Decoding's own
# correctness is the tests' (tests/integration/test_jpeg_real_files.py and
# beside it); a speed of a model that computes the wrong thing is worse than
# none, so without the gate parts 2 and 3 do not run and the script exits 1.
GATE=0
PY=${PY:-python3}
if "$PY" -c "import torch, torchvision" 2> /dev/null; then
  PYTHONPATH=client/python timeout 300 "$PY" bench/families_check.py --bin build/streamfeed --status "$OUTD/gate" \
    --preset --size 256 --batch 32 --precision tf32,fp32 seed-classifier 2>&1 | tee -a "$OUTD/bench.log"
  w1=${PIPESTATUS[0]}
  PYTHONPATH=client/python timeout 300 "$PY" bench/families_check.py --bin build/streamfeed --status "$OUTD/gate" \
    --preset --size 224 --batch 32 --precision bf16,fp32 resnet18 2>&1 | tee -a "$OUTD/bench.log"
  [ "$w1" = 0 ] && [ "${PIPESTATUS[0]}" = 0 ] && GATE=1
fi
if [ "$GATE" != 1 ]; then
  log "the numerics gate did not pass or could not run (PyTorch with torchvision via PY=$PY; $OUTD/gate): no training figures"
  log "done: $OUTD"
  exit 1
fi

# 2. W1 over HTTP: raw uint8 against JPEG, same server, same augmentation.
E2E="python3 bench/ingest_e2e.py --bin build/streamfeed --load build/streamfeed-load"
W1S="--model.preset seed-classifier --model.max_batch 32 --ring.slots 16 --http.threads 8"
$E2E --server-args "$W1S" --load-args "--workload w1 --batch 32 --connections 8 --pool 16" \
     --batches "$N" --label w1_b32_raw --json "$OUTD/w1_b32_raw.json" | tee -a "$OUTD/bench.log"
$E2E --server-args "$W1S" --load-args "--workload w1-jpeg --cache-dir $CACHE --batch 32 --connections 8 --pool 8" \
     --batches "$N" --label w1_b32_jpeg --json "$OUTD/w1_b32_jpeg.json" | tee -a "$OUTD/bench.log"

# 3. ImageNet-like: ResNet-18 bf16, batch 256, random_resized_crop to 224.
AUG='[{"op":"random_resized_crop","size":[224,224]},{"op":"horizontal_flip","p":0.5},{"op":"to_dtype","scale":0.00392157},{"op":"normalize","mean":[0.485,0.456,0.406],"std":[0.229,0.224,0.225]}]'
W3S="--model.preset resnet18 --model.precision bf16 --model.max_batch 256 --ring.slots 8 --ring.slot_bytes 67108864 --http.threads 8"
NB=$(( N / 8 ))
$E2E --server-args "$W3S --augment.pipeline '$AUG'" \
     --load-args "--workload imagenet-jpeg --cache-dir $CACHE --batch 256 --connections 8 --pool 8" \
     --batches "$NB" --label imagenet_b256_jpeg --json "$OUTD/imagenet_b256_jpeg.json" | tee -a "$OUTD/bench.log"
# The same with every batch forced onto gpu_hybrid: its Huffman/IDCT kernels
# share the SMs with the step, where the engines' decode does not; the
# decode-alone rates above cannot show that cost (the per-batch rule's input).
$E2E --server-args "$W3S --jpeg.decoder gpu_hybrid --augment.pipeline '$AUG'" \
     --load-args "--workload imagenet-jpeg --cache-dir $CACHE --batch 256 --connections 8 --pool 8" \
     --batches "$NB" --label imagenet_b256_jpeg_gpu_hybrid --json "$OUTD/imagenet_b256_jpeg_gpu_hybrid.json" \
     | tee -a "$OUTD/bench.log"
$E2E --server-args "$W3S --augment.pipeline '$AUG'" \
     --load-args "--workload w3 --batch 256 --connections 8 --pool 8" \
     --batches "$NB" --label w3_b256_raw --json "$OUTD/w3_b256_raw.json" | tee -a "$OUTD/bench.log"
if python3 -c "import torch, torchvision; assert torch.cuda.is_available()" 2>/dev/null; then
  PYTHONUNBUFFERED=1 python3 bench/pytorch_jpeg.py --dir "$IMNDIR" --batch 256 --json "$OUTD/pytorch_jpeg.json" \
    2>&1 | tee -a "$OUTD/bench.log"
else
  log "PyTorch with CUDA not available: no side-by-side figures"
fi
log "done: $OUTD"
