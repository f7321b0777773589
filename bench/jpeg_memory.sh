#!/usr/bin/env bash
# The device memory the JPEG decoder holds, for a job that posts raw pixels
# and for one that posts JPEG files (docs/DESIGN.md §15, "Made by the first
# encoded batch"). Two servers in turn, the ImageNet-like ResNet-18 bf16
# batch-256 setting of bench/jpeg_run.sh:
#   jpeg_on   the defaults: N raw batches, then N JPEG batches
#   jpeg_off  jpeg.max_batch_pixels 0 (no decoder at all): N raw batches
# After each phase a line gives GET /v1/model's jpeg_decoder (what the
# decoder holds by the service's count) and the process's device memory by
# NVML (nvidia-smi --query-compute-apps; the device's used memory where the
# driver gives no per-process figure). What shows the decoder is made by the
# first encoded batch: after the raw batches jpeg_on's decoder is not made,
# holds 0 bytes, and its process holds about as much as jpeg_off's; after the
# JPEG batches it is made and the process has grown by about what it holds.
# Output: $1/memory.log (default build/jpeg-memory-out).
# Env: BIN, LOAD, PORT, N (batches per phase, default 40), JPEG_CACHE (the
# generated ImageNet-like files, as bench/jpeg_run.sh), SERVER_ARGS, AUG, RAW_ARGS, JPEG_ARGS (the
# settings, which a CPU smoke run replaces with small ones).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${1:-build/jpeg-memory-out}
BIN=${BIN:-build/streamfeed}
LOAD=${LOAD:-build/streamfeed-load}
PORT=${PORT:-18431}
N=${N:-40}
CACHE=${JPEG_CACHE:-build/jpeg-cache}
URL=http://127.0.0.1:$PORT
AUG=${AUG:-'[{"op":"random_resized_crop","size":[224,224]},{"op":"horizontal_flip","p":0.5},{"op":"to_dtype","scale":0.00392157},{"op":"normalize","mean":[0.485,0.456,0.406],"std":[0.229,0.224,0.225]}]'}
SERVER_ARGS=${SERVER_ARGS:---model.preset resnet18 --model.precision bf16 --model.max_batch 256 --ring.slots 8 --ring.slot_bytes 67108864 --http.threads 8}
RAW_ARGS=${RAW_ARGS:---workload w3 --batch 256 --connections 8 --pool 8}
JPEG_ARGS=${JPEG_ARGS:---workload imagenet-jpeg --cache-dir $CACHE --batch 256 --connections 8 --pool 8}
mkdir -p "$OUT"
LOG=$OUT/memory.log

process_mib() { # pid
  local v
  v=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
      awk -F', *' -v p="$1" '$1 == p { print $2 }')
  [ -n "$v" ] && { echo "$v MiB (process)"; return; }
  v=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n 1)
  [ -n "$v" ] && { echo "$v MiB (device used)"; return; }
  echo "no NVML figure"
}

decoder() {
  curl -sf "$URL/v1/model" |
    python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin).get("jpeg_decoder", "absent")))'
}

say() { echo "$*" | tee -a "$LOG"; }

# label, then the server's extra options; phases raw and (with jpeg=1) jpeg.
serve() {
  local label=$1 jpeg=$2; shift 2
  # shellcheck disable=SC2086 # the settings are word lists on purpose
  "$BIN" --http.host 127.0.0.1 --http.port "$PORT" $SERVER_ARGS --augment.pipeline "$AUG" "$@" \
    > "$OUT/$label.server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do
    curl -sf "$URL/readyz" > /dev/null 2>&1 && break
    kill -0 "$pid" 2> /dev/null || { say "$label: the server exited (see $OUT/$label.server.log)"; return 1; }
    sleep 0.2
  done
  say "$label: started: jpeg_decoder $(decoder); $(process_mib "$pid")"
  # shellcheck disable=SC2086
  "$LOAD" --url "$URL" $RAW_ARGS --batches "$N" --drain --quiet >> "$OUT/$label.load.log" 2>&1 ||
    say "$label: the raw load failed (see $OUT/$label.load.log)"
  say "$label: after $N raw batches: jpeg_decoder $(decoder); $(process_mib "$pid")"
  if [ "$jpeg" = 1 ]; then
    # shellcheck disable=SC2086
    "$LOAD" --url "$URL" $JPEG_ARGS --batches "$N" --drain --quiet >> "$OUT/$label.load.log" 2>&1 ||
      say "$label: the JPEG load failed (see $OUT/$label.load.log)"
    say "$label: after $N JPEG batches: jpeg_decoder $(decoder); $(process_mib "$pid")"
  fi
  kill "$pid" 2> /dev/null
  wait "$pid" 2> /dev/null
  return 0
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee -a "$LOG"
serve jpeg_on 1
serve jpeg_off 0 --jpeg.max_batch_pixels 0
say "done: $LOG"
