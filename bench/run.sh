#!/usr/bin/env bash
# make bench — every benchmark of shared/WORKLOADS.md that exists so far, in one
# GPU session, streamfeed and PyTorch side by side, so ratios come from one run.
# Writes JSON/text per benchmark and report.md (bench/report.py) to $BENCH_OUT.
# Expects `make all bench-bins` done (the Makefile's bench target does it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTD=${BENCH_OUT:-build/bench-out}
QUICK=${BENCH_QUICK:-0}
mkdir -p "$OUTD"
log() { echo "bench: $*" | tee -a "$OUTD/bench.log"; }
run() { log "$*"; "$@" 2>&1 | tee -a "$OUTD/bench.log"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUTD/gpu.txt" 2>/dev/null \
  || echo "no GPU" > "$OUTD/gpu.txt"
echo "${BENCH_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}" > "$OUTD/commit.txt"
date -u +%Y-%m-%dT%H:%M:%SZ > "$OUTD/date.txt"
log "GPU: $(cat "$OUTD/gpu.txt"); commit $(cat "$OUTD/commit.txt")"

B=build/bench
PY=${PY:-python3}
# The numerics gate (bench/families_check.py --preset): one step of W1's model
# on the service in tf32 and fp32 against PyTorch's from the same weights.
# Without it passing, no W1 figure is measured: a speed of a model that
# computes the wrong thing is worse than none. The ingest, augmentation and
# layer figures below do not train a model and run regardless.
W1_GATE=0
if "$PY" -c "import torch" 2> /dev/null; then
  PYTHONPATH=client/python timeout 300 "$PY" bench/families_check.py --bin build/streamfeed --status "$OUTD/gate" \
    --preset --size 256 --batch 32 --precision tf32,fp32 seed-classifier 2>&1 | tee -a "$OUTD/bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] && W1_GATE=1
else
  log "PyTorch is not importable by $PY: no numerics gate, so no W1 figures (set PY to a python with torch)"
fi
[ "$W1_GATE" = 1 ] || log "W1: the numerics gate did not pass ($OUTD/gate/seed-classifier/check.json): no W1 figures"
# Ceilings of ingest: plain memcpy of W1 bodies, and raw TCP over loopback.
for t in 1 8; do $B/memcpy_bw $t 400 | tee -a "$OUTD/memcpy.jsonl"; done
for t in 1 8; do $B/loopback_bw $t 400 | tee -a "$OUTD/loopback.jsonl"; done

if [ -x $B/augment_bench ]; then
  run $B/augment_bench > "$OUTD/augment.txt"
  cat "$OUTD/augment.txt" >> "$OUTD/bench.log"
  # The op families at ResNet-18's batch-256 shapes (convolutions, BN, maxpool, add).
  run $B/layers_bench > "$OUTD/layers.txt"
fi
if [ -x $B/augment_bench ] && [ "$W1_GATE" = 1 ]; then
  # streamfeed's own device-cached W1 figure (the model's upper bound).
  # The step variants at batch 32 (fork, momentum, layout x precision) that
  # tests/gpu/test_backend printed before it became a test, then larger batches.
  for args in "--batch 32 --precision tf32 --profile 1" "--batch 32 --precision tf32 --graphs 0" \
              "--batch 32 --precision tf32 --fork 0" "--batch 32 --precision tf32 --momentum 0.9" \
              "--batch 32 --precision tf32 --layout nchw" "--batch 32 --precision fp32 --layout nchw" \
              "--batch 32 --precision fp32 --layout nhwc" "--batch 128 --precision tf32" \
              "--batch 256 --precision tf32"; do
    $B/w1_cached $args --iters 200 2>&1 | tee -a "$OUTD/w1_cached.txt"
  done
fi

E2E="python3 bench/ingest_e2e.py --bin build/streamfeed --load build/streamfeed-load"
N=${BENCH_BATCHES:-2000}
W1S="--model.preset seed-classifier --model.max_batch 32 --ring.slots 16 --http.threads 8"
W1L="--workload w1 --batch 32 --connections 8 --pool 16"
if [ -x $B/augment_bench ] && [ "$W1_GATE" = 1 ]; then
  $E2E --server-args "$W1S" --load-args "$W1L" --batches "$N" --label w1_b32_http --json "$OUTD/w1_b32_http.json" | tee -a "$OUTD/bench.log"
  $E2E --server-args "$W1S --pipeline.overlap false" --load-args "$W1L" --batches "$N" --label w1_b32_http_overlap_off --json "$OUTD/w1_b32_http_overlap_off.json" | tee -a "$OUTD/bench.log"
  $E2E --server-args "$W1S --pipeline.cuda_graphs false" --load-args "$W1L" --batches "$N" --label w1_b32_http_graphs_off --json "$OUTD/w1_b32_http_graphs_off.json" | tee -a "$OUTD/bench.log"
fi
# Ingest only (sink mode), 1/4/8 connections.
for c in 1 4 8; do
  $E2E --server-args "--pipeline.mode sink --ring.slots 32 --http.threads 8" \
       --load-args "--workload w1 --batch 32 --connections $c --pool 16" --batches "$N" \
       --label ingest_c$c --json "$OUTD/ingest_c$c.json" | tee -a "$OUTD/bench.log"
done

if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  V=gpu_aug,gpu_aug_streams,cached,cached_cl,compile
  [ "$QUICK" = 1 ] && V=gpu_aug_streams,cached,cached_cl
  PYTHONUNBUFFERED=1 python3 bench/pytorch_w1.py --batch 32 --variants "$V" --json "$OUTD/pytorch_w1_b32.json" 2>&1 | tee -a "$OUTD/bench.log"
else
  log "PyTorch with CUDA not available: no side-by-side figures"
fi
python3 bench/report.py "$OUTD" | tee "$OUTD/report.md"
[ "$W1_GATE" = 1 ] || exit 1
