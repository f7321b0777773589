#!/usr/bin/env bash
# make demo — the service's main job, end to end on this machine: start
# streamfeed, feed it learnable batches over HTTP with streamfeed-load, and
# watch the loss fall. Uses the CUDA backend and the W1 model when a GPU is
# usable; otherwise the CPU reference backend and the `tiny` preset, so it
# finishes in a minute on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/streamfeed
LOAD=$BUILD/streamfeed-load
BATCHES=${BATCHES:-}

# One line saying why the demo runs on the CPU, when it does: no GPU here, or
# a binary built without the CUDA backend (the Makefile's choice, or CUDA=0).
built=$($BIN --version | sed -n 's/.*backend built: \([a-z]*\).*/\1/p')
if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  MODE=cpu
  WHY="no usable GPU on this machine (nvidia-smi finds none)"
elif [ "$built" != cuda ]; then
  MODE=cpu
  WHY="$BIN was built without the CUDA backend (make CUDA=1 demo builds it)"
else
  MODE=gpu
fi
if [ "$MODE" = gpu ]; then
  ARGS=(--pipeline.backend auto --model.preset seed-classifier --optim.lr 0.01 --optim.momentum 0.9)
  WORKLOAD=(--workload w1 --batch 32 --batches "${BATCHES:-2000}" --connections 8)
else
  ARGS=(--pipeline.backend ref --model.preset tiny --optim.lr 0.01 --optim.momentum 0.9
        --model.max_batch 64)
  WORKLOAD=(--workload tiny --batch 32 --batches "${BATCHES:-400}" --connections 2)
fi

log=$(mktemp)
out=$(mktemp)
$BIN --http.host 127.0.0.1 --http.port 0 --log.requests false "${ARGS[@]}" >"$out" 2>"$log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log" "$out"' EXIT
for _ in $(seq 1 200); do
  grep -q listening "$out" 2>/dev/null && break
  kill -0 $pid 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.05
done
url=$(grep -o 'http://[^ ]*' "$out")
[ "$MODE" = cpu ] && echo "demo: on the CPU reference backend with the tiny model: $WHY"
echo "demo: streamfeed ($MODE) at $url — model: $(curl -s "$url/v1/model" | python3 -c 'import json,sys; m=json.load(sys.stdin); print(m["preset"], m["params"], "params, backend", m["backend"])')"
$LOAD --url "$url" --learnable --wait "${WORKLOAD[@]}"
echo "demo: first and last losses as the service reports them:"
python3 - "$url" <<'PY'
import json, sys, urllib.request
url = sys.argv[1]
def get(p):
    with urllib.request.urlopen(url + p) as r:
        return json.load(r)
last = None
for i in range(1, 100000):
    try:
        b = get(f"/v1/batches/{i}")
    except Exception:
        break
    if b["loss"] is not None:
        last = b
        if i <= 3:
            print(f"  batch {b['id']:>5}: loss {b['loss']:.4f}  accuracy {b['accuracy']:.2f}")
if last:
    print(f"  batch {last['id']:>5}: loss {last['loss']:.4f}  accuracy {last['accuracy']:.2f}")
PY
