#!/usr/bin/env bash
# Peak device memory of one training process, streamfeed against PyTorch, each
# workload in a process of its own at the same batch, measured the same way for
# both: the device memory NVML reports for the process (nvidia-smi
# --query-compute-apps), sampled every ~0.1 s while it runs; where the driver
# gives no per-process figure, the device's used memory less what was in use
# before the process started. Output: $1/memory.log (a line per run) and
# $1/memory.jsonl. SIDES=streamfeed|pytorch|both (default both) picks the side.
# Expects `make all bench-bins` done; PyTorch's side needs torch with CUDA.
set -uo pipefail
cd "$(dirname "$0")/.."
D=${1:-build/memory-out}
SIDES=${SIDES:-both}
mkdir -p "$D"

used_total() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -n 1; }

peak() { # label command...
  local label=$1; shift
  local base; base=$(used_total)
  "$@" > "$D/$label.out" 2>&1 &
  local pid=$! p=0 t=0 v u
  while kill -0 "$pid" 2>/dev/null; do
    v=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
        awk -F', *' -v p="$pid" '$1 == p { print $2 }')
    [ -n "$v" ] && [ "$v" -gt "$p" ] && p=$v
    u=$(( $(used_total) - base ))
    [ "$u" -gt "$t" ] && t=$u
    sleep 0.05
  done
  wait "$pid"
  local rc=$?
  echo "$label: peak $p MiB (process), $t MiB (device used above the idle baseline), exit $rc" | tee -a "$D/memory.log"
  echo "{\"label\":\"$label\",\"process_mib\":$p,\"device_delta_mib\":$t,\"rc\":$rc}" >> "$D/memory.jsonl"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$D/memory.log"
SF="build/bench/cached --steps 30 --warmup 5"
if [ "$SIDES" != pytorch ]; then
  # W1 and W2 train with plain SGD (WORKLOADS.md), W3 with momentum 0.9
  peak sf_w1_b32_tf32 $SF --preset seed-classifier --batch 32 --precision tf32 --momentum 0
  for n in 8 32 128; do
    peak sf_w2_b${n}_tf32 $SF --preset seed-encdec --freeze encoder --batch $n --precision tf32 --momentum 0
  done
  peak sf_w3_b1024_bf16 $SF --preset resnet18 --batch 1024 --precision bf16 --steps 10 --warmup 3
fi
if [ "$SIDES" != streamfeed ]; then
  export PYTHONUNBUFFERED=1
  for v in cached_cl compile; do
    peak pt_w1_b32_$v python3 bench/pytorch_w1.py --batch 32 --steps 50 --variants $v
  done
  for n in 8 32 128; do
    for v in streams cached; do peak pt_w2_b${n}_$v python3 bench/pytorch_w2.py --batches $n --steps 50 --variants $v; done
  done
  for v in compile_cl eager_cl; do
    peak pt_w3_b1024_$v python3 bench/pytorch_w3.py --batch 1024 --steps 10 --warmup 5 --variants $v
  done
fi
