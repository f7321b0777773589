#!/usr/bin/env bash
# bench/multi_gpu_run.sh — data-parallel streamfeed against PyTorch DDP on one
# host with G GPUs, both in one command and one session:
#   1. for W3 (ResNet-18 bf16, MG_W3_BATCH per rank) and W1 (seed classifier,
#      TF32, MG_W1_BATCH per rank): a job of 1 rank, then of G ranks (one per
#      GPU, --pipeline.device r), fed over HTTP by one streamfeed-load per rank;
#      samples/s trained, summed over the ranks, from GET /v1/stats over
#      MG_SECONDS after MG_WARMUP_S of training (default 8: the loaders' pools,
#      the CUDA graphs and cuDNN's engines are made in it); then the ranks'
#      parameter checksums (GET /v1/checkpoint),
#      which must be equal;
#   2. the loss of 2 ranks x batch B against 1 rank x batch 2B on the same
#      learnable batches (tiny model, fp32; needs G >= 2);
#   3. PyTorch DDP (bench/pytorch_ddp.py under torchrun, NCCL, channels_last,
#      best of eager and torch.compile, device-cached batches) for the same
#      workloads on 1 and G GPUs (MG_TORCH=0 skips it; MG_TORCH_VARIANTS="eager"
#      runs only those variants, whose best is then the best of those).
# Before part 1, each workload's model passes the numerics gate (one step
# against PyTorch's, bench/families_check.py --preset), or nothing is measured.
# With one GPU it is a dry run at world size 1 (parts 1 and 3 only).
# MG_WORKLOADS="w1" limits parts 1 and 3 to those workloads; MG_LOSS=0 skips
# part 2; MG_SERVER_ARGS adds server flags to every job (e.g.
# "--distributed.bucket_mb 64"); MG_CONNECTIONS sets each loader's
# connections (default 4); MG_WORLDS="2" runs only those world sizes.
# MG_CPU=1 runs part 1 on the CPU reference backend with the tiny model and 2
# ranks: a smoke test of this script on a machine without GPUs.
# Results: $BENCH_OUT (default build/bench-out/multi-gpu): summary.jsonl, one
# log per rank, bench.log; the GPUs, commit and date beside them.
# Expects `make` done (build/streamfeed, build/streamfeed-load).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTD=${BENCH_OUT:-build/bench-out/multi-gpu}
CPU=${MG_CPU:-0}
SECS=${MG_SECONDS:-20}
WARM=${MG_WARMUP_S:-8}
CONNS=${MG_CONNECTIONS:-4}
PORT0=${MG_PORT:-18080}
PY=${PYTHON:-python3}
mkdir -p "$OUTD"
: > "$OUTD/summary.jsonl"
log() { echo "multi-gpu: $*" | tee -a "$OUTD/bench.log"; }

if [ "$CPU" = 1 ]; then
  G=2
  echo "no GPU (MG_CPU=1: reference backend)" > "$OUTD/gpu.txt"
else
  G=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader > "$OUTD/gpu.txt" 2>/dev/null
  nvidia-smi topo -m > "$OUTD/topology.txt" 2>/dev/null
  if [ "$G" -lt 1 ]; then
    log "no GPU found (nvidia-smi -L); MG_CPU=1 runs the smoke test on the CPU"
    exit 1
  fi
fi
echo "${BENCH_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}" > "$OUTD/commit.txt"
date -u +%Y-%m-%dT%H:%M:%SZ > "$OUTD/date.txt"
log "GPUs: $G ($(head -n 1 "$OUTD/gpu.txt")); commit $(cat "$OUTD/commit.txt")"
WORLDS="1"
[ "$G" -gt 1 ] && WORLDS="1 $G"
[ "$G" = 1 ] && log "one GPU: a dry run at world size 1"
WORLDS=${MG_WORLDS:-$WORLDS}

PIDS=()
LOADS=()
FAILED=0
# A script stopped from outside (a timeout's SIGTERM, ^C) takes its ranks and
# loaders with it: left running they hold the ports and the binary, and the
# next run on the same host fails or measures beside them.
cleanup() {
  for p in "${PIDS[@]}" "${LOADS[@]}"; do kill -TERM "$p" 2> /dev/null; done
}
trap cleanup EXIT
trap 'exit 143' TERM INT
# start_job WORLD NAME ARGS...: WORLD ranks on ports PORT0.., ready or fail.
start_job() {
  local world=$1 name=$2; shift 2
  PIDS=()
  for ((r = 0; r < world; r++)); do
    local dargs=(--distributed.world_size "$world" --distributed.rank "$r" --distributed.host 127.0.0.1)
    [ "$r" -gt 0 ] && dargs+=(--distributed.rendezvous "127.0.0.1:$PORT0")
    [ "$CPU" = 1 ] || dargs+=(--pipeline.device "$r")
    # shellcheck disable=SC2086  # MG_SERVER_ARGS: extra server flags, as words
    # loopback only, on a machine of its own: the job runs without http.token
    build/streamfeed --http.host 127.0.0.1 --http.port $((PORT0 + r)) --log.requests false \
      --distributed.allow_no_token true \
      "${dargs[@]}" "$@" ${MG_SERVER_ARGS:-} > "$OUTD/$name-w$world-r$r.log" 2>&1 &
    PIDS+=($!)
  done
  for ((r = 0; r < world; r++)); do
    local ok=0
    for ((i = 0; i < 600; i++)); do
      if curl -sf "http://127.0.0.1:$((PORT0 + r))/readyz" > /dev/null 2>&1; then ok=1; break; fi
      sleep 0.5
    done
    if [ "$ok" != 1 ]; then
      log "$name: rank $r of $world not ready after 300 s (see $OUTD/$name-w$world-r$r.log)"
      stop_job
      return 1
    fi
  done
}
# stop_job: SIGTERM to every rank; a rank still running STOP_WAIT_S later is
# reported and killed, so that one hung rank cannot eat the whole lease.
STOP_WAIT_S=${MG_STOP_WAIT_S:-40}
stop_job() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2> /dev/null; done
  local t0=$SECONDS
  for p in "${PIDS[@]}"; do
    while kill -0 "$p" 2> /dev/null && [ $((SECONDS - t0)) -lt "$STOP_WAIT_S" ]; do sleep 0.2; done
    if kill -0 "$p" 2> /dev/null; then
      log "pid $p still running ${STOP_WAIT_S} s after SIGTERM: killed"
      kill -KILL "$p" 2> /dev/null
    fi
    wait "$p" 2> /dev/null
    local rc=$?
    [ "$rc" = 0 ] || log "pid $p exited with status $rc"
  done
  log "job stopped in $((SECONDS - t0)) s"
  PIDS=()
}
ports() { local w=$1 s=""; for ((r = 0; r < w; r++)); do s="$s $((PORT0 + r))"; done; echo $s; }

# 0. The numerics gate (bench/families_check.py --preset): one step of each
# workload's model on one rank against PyTorch's float32 step from the same
# weights, at the precision its job trains in. The ranks' checksums below say
# that they agree with each other, this that they agree with PyTorch; a
# workload that fails it is not measured and the script exits 1.
if [ "$CPU" != 1 ]; then
  for gate in "w3 resnet18 224 bf16" "w1 seed-classifier 256 tf32"; do
    set -- $gate
    case " ${MG_WORKLOADS:-w3 w1} " in *" $1 "*) ;; *) continue ;; esac
    PYTHONPATH=client/python timeout 300 "$PY" bench/families_check.py --bin build/streamfeed --status "$OUTD" \
      --preset --size "$3" --batch 32 --precision "$4" "$2" 2>&1 | tee -a "$OUTD/bench.log"
    if [ "${PIPESTATUS[0]}" != 0 ]; then
      log "$1: the numerics gate failed ($OUTD/$2/check.json): no figures"
      exit 1
    fi
  done
fi

# 1. streamfeed, 1 and G ranks.
if [ "$CPU" = 1 ]; then
  WORKLOADS=("tiny:16:--model.preset tiny --pipeline.backend ref --augment.pipeline []")
  WORLDS="1 2"
else
  W3B=${MG_W3_BATCH:-1024}
  W1B=${MG_W1_BATCH:-32}
  W3PIPE='[{"op":"to_dtype","scale":0.00392156862745098},{"op":"normalize","mean":[0.5],"std":[0.5]}]'
  WORKLOADS=(
    "w3:$W3B:--model.preset resnet18 --model.precision bf16 --model.max_batch $W3B --optim.momentum 0.9 --ring.slots 6 --http.threads 8 --ring.slot_bytes $((W3B * 224 * 224 * 3 + 65536)) --augment.pipeline $W3PIPE"
    "w1:$W1B:--model.preset seed-classifier --model.max_batch $W1B --ring.slots 16 --http.threads 8 --ring.slot_bytes $((W1B * 256 * 256 * 3 + 65536))"
  )
fi
ONLY=${MG_WORKLOADS:-}
for spec in "${WORKLOADS[@]}"; do
  IFS=: read -r wl batch sargs <<< "$spec"
  [ -z "$ONLY" ] || [[ " $ONLY " == *" $wl "* ]] || continue
  for world in $WORLDS; do
    # shellcheck disable=SC2086  # the server flags are words
    start_job "$world" "$wl" $sargs || continue
    P=$(ports "$world")
    # The loaders run for the warm-up and then the measured window: the
    # window starts once every rank has trained at steady state for WARM s
    # (the loaders' pools made, the CUDA graphs captured, cuDNN's engines
    # chosen), as PyTorch's side leaves out its warm-up steps.
    LOADS=()
    for p in $P; do
      build/streamfeed-load --url "http://127.0.0.1:$p" --workload "$wl" --batch "$batch" --connections "$CONNS" \
        --pool 8 --seconds $((WARM + SECS + 2)) --json > "$OUTD/$wl-w$world-load-$p.json" 2>> "$OUTD/bench.log" &
      LOADS+=($!)
    done
    sleep "$WARM"
    s0=$($PY bench/multi_gpu_check.py samples $P)
    t0=$(date +%s.%N)
    $PY bench/multi_gpu_check.py ranks $P > "$OUTD/$wl-w$world-ranks-start.json"
    # where each rank's time went, taken while the loaders still post: GPU
    # busy share, rounds without a batch of its own, all-reduce seconds, the
    # stages' medians, and the last 40 steps' timelines (GET /v1/trace)
    (sleep $((SECS > 2 ? SECS - 1 : 1)); $PY bench/multi_gpu_check.py ranks $P > "$OUTD/$wl-w$world-ranks.json"
     for p in $P; do curl -s "http://127.0.0.1:$p/v1/trace?steps=40" > "$OUTD/$wl-w$world-trace-$p.json"; done) &
    RANKS_PID=$!
    sleep "$SECS"
    s1=$($PY bench/multi_gpu_check.py samples $P)
    t1=$(date +%s.%N)
    wait "${LOADS[@]}"
    wait "$RANKS_PID"
    log "$wl world $world, per rank: $(cat "$OUTD/$wl-w$world-ranks.json")"
    # A figure counts only from a run that passed its checks: every rank's
    # parameters, optimizer state and batchnorm buffers identical, and no
    # batch refused or failed by any loader. Otherwise the run prints what
    # differed instead of a rate, and the script exits non-zero.
    sum=$($PY bench/multi_gpu_check.py checksum $P)
    refused=$($PY -c "import json,sys; print(sum(json.load(open(f)).get(k, 0) for f in sys.argv[1:] for k in ('rejected', 'failed')))" \
      $(for p in $P; do echo "$OUTD/$wl-w$world-load-$p.json"; done) 2> /dev/null || echo unreadable)
    if [[ "$sum" == *'"identical": true'* ]] && [[ "$sum" == *'"batchnorm_statistics_identical": true'* ]] && [ "$refused" = 0 ]; then
      rate=$($PY -c "print(round(($s1 - $s0) / ($t1 - $t0), 1))")
      log "streamfeed $wl world $world: $rate samples/s (batch $batch per rank); parameters: $sum"
      echo "{\"side\":\"streamfeed\",\"workload\":\"$wl\",\"world_size\":$world,\"batch_per_rank\":$batch,\"samples_per_s\":$rate,\"checks\":[\"parameters, optimizer state and batchnorm buffers identical on every rank\",\"no batch refused or failed\"],\"checksum\":$sum}" >> "$OUTD/summary.jsonl"
    else
      FAILED=1
      why=$($PY bench/multi_gpu_check.py diff $P | cut -c1-2000)
      log "streamfeed $wl world $world: NO FIGURE: the run failed its checks (batches refused or failed: $refused; checksums: $sum; differing tensors: $why)"
      echo "{\"side\":\"streamfeed\",\"workload\":\"$wl\",\"world_size\":$world,\"batch_per_rank\":$batch,\"failed_checks\":true,\"refused_or_failed_batches\":\"$refused\",\"checksum\":$sum}" >> "$OUTD/summary.jsonl"
    fi
    stop_job
  done
done

# 2. 2 ranks x B against 1 rank x 2B (tiny, fp32; the CUDA backend's sums
# are not in the reference's order, so the difference is reported, not bounded).
if [ "$G" -ge 2 ] && [ "${MG_LOSS:-1}" = 1 ]; then
  LB=${MG_LOSS_BATCH:-16}
  common=(--model.preset tiny --model.precision fp32 --model.max_batch $((2 * LB)) --augment.pipeline '[]'
          --optim.lr 0.005 --optim.momentum 0.9 --distributed.wait_ms 10000)
  [ "$CPU" = 1 ] && common+=(--pipeline.backend ref)
  if start_job 2 loss2 "${common[@]}"; then
    two="$PORT0,$((PORT0 + 1))"
    KEEP=("${PIDS[@]}")
    PORT0=$((PORT0 + 10))
    if start_job 1 loss1 "${common[@]}"; then
      res=$($PY bench/multi_gpu_check.py losses --two "$two" --one "$PORT0" --batch "$LB" --steps ${MG_LOSS_STEPS:-20})
      log "2 ranks x $LB against 1 rank x $((2 * LB)): $res"
      echo "{\"side\":\"streamfeed\",\"check\":\"loss_2xB_vs_1x2B\",\"result\":$res}" >> "$OUTD/summary.jsonl"
      stop_job
    fi
    PORT0=$((PORT0 - 10))
    PIDS=("${KEEP[@]}")
    stop_job
  fi
fi

# 3. PyTorch DDP, the same workloads on 1 and G GPUs.
if [ "$CPU" != 1 ] && [ "${MG_TORCH:-1}" = 1 ]; then
  for wl in w3 w1; do
    [ -z "$ONLY" ] || [[ " $ONLY " == *" $wl "* ]] || continue
    b=$([ "$wl" = w3 ] && echo "$W3B" || echo "$W1B")
    for world in $WORLDS; do
      PYTHONUNBUFFERED=1 timeout 900 $PY -m torch.distributed.run --standalone --nproc_per_node "$world" \
        bench/pytorch_ddp.py --workload "$wl" --batch "$b" --variants "${MG_TORCH_VARIANTS:-eager,compile}" \
        --json "$OUTD/pytorch-$wl-w$world.json" \
        2>> "$OUTD/bench.log" | tee -a "$OUTD/bench.log" | grep '"best"' | sed 's/^{/{"side":"pytorch_ddp",/' \
        >> "$OUTD/summary.jsonl"
    done
  done
fi
log "summary: $OUTD/summary.jsonl"
cat "$OUTD/summary.jsonl"
if [ "$FAILED" = 1 ]; then
  log "FAILED: at least one run failed its correctness checks; its figure is not reported"
  exit 1
fi
