#!/usr/bin/env bash
# Two builds of streamfeed side by side in one GPU session: the checkout in
# $1 (another commit, built beforehand with the same make flags) as A, and
# this tree as B, on the figures a change to the executor must keep:
#   W1 (seed-classifier) batch 32 device-cached, tf32 NHWC and fp32 NCHW
#   W1 batch 32 over HTTP, tf32 (8 connections)
#   W2 (seed-encdec, encoder frozen) tf32 device-cached, batch 8 / 32 / 128
#   W3 (resnet18) bf16 batch 1024 device-cached
# W1 and W3 are taken A, B, A, B so machine drift shows as spread between the
# two runs of one build; W2 once each. Output: $2/ab.log (human lines) and $2/ab.jsonl.
# Usage: bench/ab_compare.sh OTHER_TREE OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
A=$(cd "$1" && pwd)
B=$(pwd)
D=${2:-build/ab-out}
mkdir -p "$D"
log() { echo "$*" | tee -a "$D/ab.log"; }

w1_cached() { # tree label args...
  local t=$1 l=$2; shift 2
  local out; out=$("$t/build/bench/w1_cached" "$@" --iters 300 2>&1 | head -n 1)
  log "$l $(basename "$t") w1_cached $*: $out"
}
cached() { # tree label args...
  local t=$1 l=$2; shift 2
  local out; out=$(timeout 300 "$t/build/bench/cached" "$@" 2>&1)
  log "$l $(basename "$t") cached $*: $(echo "$out" | head -n 1)"
  echo "$out" | grep '^{' | sed "s/^{/{\"tree\":\"$l\",/" >> "$D/ab.jsonl"
}
http_w1() { # tree label
  local t=$1 l=$2
  python3 bench/ingest_e2e.py --bin "$t/build/streamfeed" --load "$t/build/streamfeed-load" \
    --server-args "--model.preset seed-classifier --model.max_batch 32 --ring.slots 16 --http.threads 8" \
    --load-args "--workload w1 --batch 32 --connections 8 --pool 16" --batches "${AB_HTTP_BATCHES:-3000}" \
    --label "w1_b32_http_$l" --json "$D/w1_http_$l.json" 2>&1 | tail -n 1 | sed "s/^/$l /" | tee -a "$D/ab.log"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$D/ab.log"
log "A = $A ($(git -C "$A" rev-parse --short HEAD 2>/dev/null || cat "$A/.commit" 2>/dev/null || echo '?'))"
log "B = $B ($(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
for r in 1 2; do
  for x in "A $A" "B $B"; do
    set -- $x
    w1_cached "$2" "$1" --batch 32 --precision tf32 --layout nhwc
    w1_cached "$2" "$1" --batch 32 --precision fp32 --layout nchw
  done
done
for r in 1 2; do
  for x in "A $A" "B $B"; do
    set -- $x
    http_w1 "$2" "$1"
  done
done
for x in "A $A" "B $B" "A $A" "B $B"; do
  set -- $x
  cached "$2" "$1" --preset resnet18 --batch 1024 --precision bf16 --steps 20 --warmup 3
done
for n in 8 32 128; do
  for x in "A $A" "B $B"; do
    set -- $x
    cached "$2" "$1" --preset seed-encdec --freeze encoder --batch $n --precision tf32 --steps 100 --warmup 10
  done
done
