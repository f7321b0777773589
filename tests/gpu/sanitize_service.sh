#!/usr/bin/env bash
# The service itself under compute-sanitizer's memcheck: W1's model in bf16
# (CUDA graphs, cuDNN, cuBLAS, the augmentation kernels) trains raw uint8
# batches, then JPEG batches (nvJPEG), every accepted batch drained, then
# SIGTERM. Passes when memcheck reports no error, both loaders finish with
# every batch accepted, and the service finished all it accepted, none
# failed. Needs a GPU and a CUDA build (make CUDA=1).
#
#   bash tests/gpu/sanitize_service.sh [OUTDIR]     (BUILD=build by default)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
B=${BUILD:-build}
D=${1:-$B/sanitize-service}
SAN=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
mkdir -p "$D"
if ! ls /dev/nvidia0 > /dev/null 2>&1; then echo "SKIPPED sanitize_service: no GPU on this machine"; exit 0; fi
"$SAN" --tool memcheck --print-limit 20 "$B/streamfeed" --model.preset seed-classifier --model.precision bf16 \
  --model.max_batch 32 --ring.slots 8 --http.port 0 > "$D/server.log" 2>&1 &
PID=$!
url=
for _ in $(seq 1 900); do
  url=$(grep -o 'listening on http[^ ]*' "$D/server.log" | head -1 | cut -d' ' -f3)
  [ -n "$url" ] && break
  kill -0 $PID 2> /dev/null || break
  sleep 0.2
done
fail=0
if [ -z "$url" ]; then
  echo "FAIL the service did not start under memcheck"; tail -5 "$D/server.log"; fail=1
else
  L="$B/streamfeed-load --url $url --batch 32 --connections 2 --pool 4 --drain --quiet --json"
  timeout 300 $L --workload w1 --batches 40 > "$D/raw.json" 2>&1 || { echo "FAIL raw batches: $(tail -c 300 "$D/raw.json")"; fail=1; }
  timeout 300 $L --workload w1-jpeg --batches 20 --cache-dir "$D/jpeg-cache" > "$D/jpeg.json" 2>&1 \
    || { echo "FAIL JPEG batches: $(tail -c 300 "$D/jpeg.json")"; fail=1; }
  curl -s "$url/metrics" | grep -E '^streamfeed_batches_(finished|received)_total' > "$D/metrics.txt"
  acc=$(sed -n 's/^streamfeed_batches_received_total{status="accepted"} //p' "$D/metrics.txt")
  done_=$(sed -n 's/^streamfeed_batches_finished_total{status="done"} //p' "$D/metrics.txt")
  failed=$(sed -n 's/^streamfeed_batches_finished_total{status="failed"} //p' "$D/metrics.txt")
  echo "accepted ${acc:-?}, trained ${done_:-?}, failed ${failed:-?}"
  [ "${acc:-x}" = 60 ] && [ "${done_:-y}" = 60 ] && [ "${failed:-1}" = 0 ] || { echo "FAIL want 60 accepted, 60 trained, 0 failed"; fail=1; }
fi
# SIGTERM to the service (the sanitizer's child), which drains and exits.
CH=$(pgrep -P $PID | head -1)
kill -TERM "${CH:-$PID}" 2> /dev/null
wait $PID
grep -E "ERROR SUMMARY" "$D/server.log" | tail -1
grep -q "ERROR SUMMARY: 0 errors" "$D/server.log" || { echo "FAIL memcheck reported errors (see $D/server.log)"; fail=1; }
[ $fail = 0 ] && echo "ok the service under memcheck: no error" 
exit $fail
