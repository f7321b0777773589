#!/usr/bin/env bash
# The GPU-side checks of the "see the pipeline" issue, on the W1 model:
#  1. a deliberately slow loader (--rate 2) -> diagnose must say "ingest";
#  2. a fast loader (8 connections) -> diagnose must say "compute-bound";
#  3. the trace taken under the fast loader (for the overlap check and the
#     picture in docs/OBSERVABILITY.md), /v1/stats, and the NVML gauges from /metrics.
# Writes everything under $1 (default build/gpu-scenarios); exits non-zero
# when a verdict is not the expected one.
set -uo pipefail
cd "$(dirname "$0")/.."
D=${1:-build/gpu-scenarios}
mkdir -p "$D"
BIN=build/streamfeed
LOAD=build/streamfeed-load
fail=0

start() {
  $BIN --http.port 0 --log.requests false --model.preset seed-classifier --model.max_batch 32 \
       --ring.slots 16 --http.threads 8 "$@" > "$D/server.out" 2> "$D/server.err" &
  SPID=$!
  for _ in $(seq 1 600); do grep -q listening "$D/server.out" 2>/dev/null && break; sleep 0.05; done
  URL=$(grep -o 'http://[^ ]*' "$D/server.out" | sed 's/0\.0\.0\.0/127.0.0.1/')
}
stop() { kill -TERM $SPID; wait $SPID; echo "server exit $?" >> "$D/log.txt"; }

# 1. slow loader
start
$LOAD --url "$URL" --workload w1 --batch 32 --rate 2 --seconds 12 --quiet > "$D/slow_load.txt" 2>&1 &
LP=$!
sleep 5
$LOAD --url "$URL" --diagnose --seconds 3 | tee "$D/diagnose_slow.txt"
wait $LP
grep -q 'verdict: ingest' "$D/diagnose_slow.txt" \
  || { echo "FAIL slow loader verdict is not ingest" | tee -a "$D/log.txt"; fail=1; }
stop

# 2./3. fast loader
start
$LOAD --url "$URL" --workload w1 --batch 32 --connections 8 --pool 16 --seconds 20 --quiet > "$D/fast_load.txt" 2>&1 &
LP=$!
sleep 6
curl -s "$URL/v1/trace?steps=60" > "$D/trace_fast.json"
curl -s "$URL/v1/stats" > "$D/stats_fast.json"
curl -s "$URL/metrics" | grep -E '^streamfeed_(gpu_|compute_busy|steps_total)' > "$D/metrics_gpu.txt"
$LOAD --url "$URL" --diagnose --seconds 3 | tee "$D/diagnose_fast.txt"
wait $LP
grep -q 'verdict: compute-bound' "$D/diagnose_fast.txt" \
  || { echo "FAIL fast loader verdict is not compute-bound" | tee -a "$D/log.txt"; fail=1; }
grep -q 'streamfeed_gpu_memory_used_bytes{gpu="0"}' "$D/metrics_gpu.txt" \
  || { echo "FAIL no NVML gauges" | tee -a "$D/log.txt"; fail=1; }
python3 - "$D/trace_fast.json" <<'PY' | tee -a "$D/log.txt"
import json, sys
t = json.load(open(sys.argv[1]))
ev = [e for e in t["traceEvents"] if e.get("ph") == "X"]
names = {e["tid"]: None for e in ev}
tn = {e["tid"]: e["args"]["name"] for e in t["traceEvents"] if e.get("ph") == "M" and e.get("name") == "thread_name"}
by = {}
for e in ev:
    by.setdefault(tn.get(e["tid"], e["tid"]), []).append(e)
comp = sorted(by.get("compute stream", []), key=lambda e: e["ts"])
tran = {e["args"].get("batch"): e for e in by.get("transform stream", [])}
pairs = inside = 0
for a, b in zip(comp, comp[1:]):
    tb = tran.get(b["args"].get("batch"))
    if tb is None:
        continue
    pairs += 1
    inside += tb["ts"] < a["ts"] + a["dur"] and tb["ts"] + tb["dur"] > a["ts"]
print(f"trace: tracks {sorted(by)}; transform of N+1 overlaps compute of N in {inside} of {pairs} pairs")
sys.exit(0 if pairs and inside * 2 > pairs else 1)
PY
[ $? = 0 ] || { echo "FAIL trace overlap" | tee -a "$D/log.txt"; fail=1; }
stop
echo "gpu scenarios: $([ $fail = 0 ] && echo PASS || echo FAIL)" | tee -a "$D/log.txt"
exit $fail
