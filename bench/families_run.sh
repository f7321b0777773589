#!/usr/bin/env bash
# The torchvision families' speed and memory table in one GPU call: for each
# family, a numerics gate first (bench/families_check.py: one step of the
# exported model on the service against PyTorch's, from the same weights; a
# family that fails it gets no streamfeed figure and the call exits 1), then
# streamfeed trains the exported model in bf16 fed over HTTP, then
# PyTorch trains the same model at the same batch, model-only on a
# device-resident batch (bench/pytorch_families.py: eager and torch.compile,
# bf16 autocast, channels_last for the CNNs), each in a process of its own,
# every process's peak device memory taken from NVML. Writes OUTDIR/NAME/*.json
# per family, OUTDIR/families.log and OUTDIR/families.md (bench/families_report.py),
# re-rendered after each family, so a call cut short still leaves the families
# it finished.
#
#   bash bench/families_run.sh OUTDIR
#
# Expects build/streamfeed and build/streamfeed-load built. Environment:
#   PY           python with torch and torchvision (default python3); the client
#                package must be importable (PYTHONPATH=client/python)
#   FAMILIES     space- or comma-separated torchvision factories, or timm:NAME for timm's
#                model NAME (default: the 13 below)
#   VARIANTS     PyTorch variants, comma list of eager,compile (default both)
#   SIDES        both | streamfeed | pytorch (default both)
#   BATCH        batch of every family (default 256 each)
#   SIZE         image height and width (default 224; the loader has 224, 256 and 32)
#   PRECISION    streamfeed's model.precision (default bf16)
#   BUDGET_S     wall seconds for the whole call (default 540): a family starts only
#                while FAMILY_MIN_S of it are left, and no stage runs past it
#   FAMILY_MIN_S (default 60)
#   SF_TIMEOUT   seconds of one streamfeed run, start-up included (default 150)
#   CHECK_BATCH  the numerics gate's batch (default 32; its size is SIZE, its precisions PRECISION and
#                fp32: fp32's tight bounds see a lost gradient that bf16's noise can hide)
#   PT_TIMEOUT   seconds of one PyTorch variant (default 200)
#   HTTP_BATCHES batches sent per streamfeed run (default 100; 250 for the light
#                families: mobilenets, efficientnet_b0, regnet_y_400mf, squeezenet1_1), HTTP_WARMUP the
#                trained batches before the window opens (default 20)
#   PT_STEPS / PT_WARMUP  PyTorch's timed and untimed steps (default 30 / 10)
#   PT_DEVICE    PyTorch's device (default cuda; cpu only to smoke-test this script)
#   MODELS_DIR   where the exported models go (default a temporary directory,
#                removed at the end: the weights are not results)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${1:?usage: bench/families_run.sh OUTDIR}
PY=${PY:-python3}
DEFAULT_FAMILIES="resnet50 resnext50_32x4d wide_resnet50_2 mobilenet_v2 mobilenet_v3_small mobilenet_v3_large
  efficientnet_b0 regnet_y_400mf convnext_tiny densenet121 squeezenet1_1 vgg11_bn vit_b_16"
FAMILIES=$(echo "${FAMILIES:-$DEFAULT_FAMILIES}" | tr ',' ' ')
VARIANTS=${VARIANTS:-eager,compile}
SIDES=${SIDES:-both}
SIZE=${SIZE:-224}
PRECISION=${PRECISION:-bf16}
BUDGET_S=${BUDGET_S:-540}
FAMILY_MIN_S=${FAMILY_MIN_S:-60}
SF_TIMEOUT=${SF_TIMEOUT:-150}
PT_TIMEOUT=${PT_TIMEOUT:-200}
HTTP_WARMUP=${HTTP_WARMUP:-20}
PT_STEPS=${PT_STEPS:-30}
PT_WARMUP=${PT_WARMUP:-10}
PT_DEVICE=${PT_DEVICE:-cuda}
case "$SIDES" in both|streamfeed|pytorch) ;; *) echo "SIDES must be both, streamfeed or pytorch" >&2; exit 2;; esac
case "$SIZE" in
  224) WORKLOAD=w3 ;;   # 224x224x3 (upscaled 32x32 content: the content does not change the speed)
  256) WORKLOAD=w1 ;;
  32) WORKLOAD=tiny ;;
  *) echo "SIZE must be 224, 256 or 32 (the loader's synthetic image sizes)" >&2; exit 2;;
esac
for n in BATCH BUDGET_S FAMILY_MIN_S SF_TIMEOUT PT_TIMEOUT HTTP_BATCHES HTTP_WARMUP PT_STEPS PT_WARMUP; do
  v=${!n:-1}
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "$n must be a positive integer, not '$v'" >&2; exit 2; }
done
[ "$HTTP_WARMUP" -lt "${HTTP_BATCHES:-100}" ] || { echo "HTTP_WARMUP must be below HTTP_BATCHES" >&2; exit 2; }
if [ "$SIDES" != pytorch ]; then
  for b in build/streamfeed build/streamfeed-load; do
    [ -x "$b" ] || { echo "$b is not built" >&2; exit 2; }
  done
fi
mkdir -p "$OUT"
START=$SECONDS
log() { echo "families: $*" | tee -a "$OUT/families.log"; }
left() { echo $(( BUDGET_S - (SECONDS - START) )); }
min() { [ "$1" -lt "$2" ] && echo "$1" || echo "$2"; }
batch_of() { echo "${BATCH:-256}"; }
# The light families train many batches a second: a longer run gives their
# window the length of the heavy ones'.
http_batches_of() {
  case "$1" in
    mobilenet_v2|mobilenet_v3_small|mobilenet_v3_large|efficientnet_b0|regnet_y_400mf|squeezenet1_1|\
    timm:efficientnet_b0|timm:mobilenetv3_*|timm:lcnet_*|timm:regnety_00*)
      echo "${HTTP_BATCHES:-250}" ;;
    *) echo "${HTTP_BATCHES:-100}" ;;
  esac
}
report() { "$PY" bench/families_report.py "$OUT" --order "$FAMILIES" --out "$OUT/families.md" 2>> "$OUT/families.log"; }

MODELS=${MODELS_DIR:-}
if [ -z "$MODELS" ]; then
  MODELS=$(mktemp -d "${TMPDIR:-/tmp}/streamfeed-families.XXXXXX")
  trap 'rm -rf "$MODELS"' EXIT
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1 > "$OUT/gpu.txt"
[ -s "$OUT/gpu.txt" ] || echo "no GPU" > "$OUT/gpu.txt"
# The commit the binary was built from (the device's copy of the tree may have no .git),
# with its "-dirty" mark: a copy whose .git is older than its files builds as
# that older commit, dirty, and the report must not name the commit alone.
commit=$(build/streamfeed --version 2>/dev/null | grep -o '[0-9a-f]\{7,40\}\(-dirty\)\?' | head -n 1)
echo "${BENCH_COMMIT:-${commit:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}}" > "$OUT/commit.txt"
date -u +%Y-%m-%dT%H:%M:%SZ > "$OUT/date.txt"
log "GPU $(cat "$OUT/gpu.txt"); commit $(cat "$OUT/commit.txt"); $("$PY" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)' 2>&1 | tail -n 1)"
log "families: $FAMILIES; size $SIZE; variants $VARIANTS; sides $SIDES; budget ${BUDGET_S} s"

if [ "$SIDES" != pytorch ]; then
  log "exporting (one process)"
  # shellcheck disable=SC2086 # the family list splits into arguments
  timeout "$(min "$(left)" 300)" "$PY" bench/families_export.py --size "$SIZE" --models "$MODELS" --status "$OUT" \
    $FAMILIES 2>&1 | tee -a "$OUT/families.log"
fi

failed=0
CHECK_PRECISIONS=$PRECISION
[ "$PRECISION" = fp32 ] || CHECK_PRECISIONS="$PRECISION,fp32"
if [ "$SIDES" != pytorch ]; then
  log "numerics gate (one process)"
  for fam in $FAMILIES; do rm -f "$OUT/${fam/:/-}/check.json"; done
  # shellcheck disable=SC2086 # the family list splits into arguments
  PYTHONUNBUFFERED=1 timeout -k 10 "$(min "$(left)" 600)" "$PY" bench/families_check.py --bin build/streamfeed \
    --status "$OUT" --size "$SIZE" --batch "${CHECK_BATCH:-32}" --precision "$CHECK_PRECISIONS" $FAMILIES 2>&1 |
    tee -a "$OUT/families.log"
fi

# Whether the top-level field KEY of the status file FILE is VALUE, as JSON
# writes it (true, null): a grep for the text would also match the rows nested
# in it (check.json's summary rows say "ok": true when the gate failed).
top_is() {
  "$PY" -c 'import json, sys
sys.exit(0 if json.dumps(json.load(open(sys.argv[1])).get(sys.argv[2], "absent")) == sys.argv[3] else 1)' \
    "$1" "$2" "$3" 2>/dev/null
}

not_started=
for fam in $FAMILIES; do
  D="$OUT/${fam/:/-}" # timm:NAME's folder is timm-NAME: a colon is no portable path character
  mkdir -p "$D"
  # What this call measures replaces what an earlier call left in OUTDIR, so a
  # row never pairs this call's figure with an older one.
  rm -f "$D/skipped.json"
  [ "$SIDES" != pytorch ] && rm -f "$D/streamfeed.json" "$D/streamfeed.log"
  [ "$SIDES" != streamfeed ] && rm -f "$D/pytorch.json"
  B=$(batch_of "$fam")
  if [ "$(left)" -lt "$FAMILY_MIN_S" ]; then
    log "$fam: not started, $(left) s of the budget left"
    echo "{\"family\":\"$fam\",\"error\":\"not started: the call's budget ran out\"}" > "$D/skipped.json"
    not_started="$not_started $fam"
    failed=1
    continue
  fi
  log "$fam batch $B ($(left) s left)"
  if [ "$SIDES" != pytorch ]; then
    # export.json says whether this call's export of the family succeeded,
    # check.json whether the service computed its step as PyTorch does.
    if ! top_is "$D/check.json" ok true; then
      log "$fam: the numerics gate did not pass, no streamfeed run"
      failed=1
    elif top_is "$D/export.json" error null && [ -f "$MODELS/$fam/config.json" ]; then
      t=$(min "$(left)" "$SF_TIMEOUT")
      timeout -k 10 $(( t + 30 )) "$PY" bench/ingest_e2e.py --bin build/streamfeed --load build/streamfeed-load \
        --config "$MODELS/$fam/config.json" \
        --server-args "--model.precision $PRECISION --model.max_batch $B --ring.slots 8 --http.threads 8 --ring.slot_bytes $(( B * SIZE * SIZE * 3 + 65536 ))" \
        --load-args "--workload $WORKLOAD --batch $B --connections 8 --pool 4" \
        --batches "$(http_batches_of "$fam")" --warmup-steps "$HTTP_WARMUP" --timeout "$t" --nvml-peak \
        --server-log "$D/streamfeed.log" --label "${fam}_b${B}_http_$PRECISION" --json "$D/streamfeed.json" 2>&1 |
        tee -a "$OUT/families.log"
      [ "${PIPESTATUS[0]}" = 0 ] || failed=1
    else
      log "$fam: not exported, no streamfeed run"
      failed=1
    fi
  fi
  if [ "$SIDES" != streamfeed ] && [ "$(left)" -gt 10 ]; then
    # per variant: the budget left, shared out over the variants still to run
    nv=$(echo "$VARIANTS" | tr ',' '\n' | grep -c .)
    t=$(min $(( $(left) / nv )) "$PT_TIMEOUT")
    PYTHONUNBUFFERED=1 timeout -k 10 $(( $(left) + 5 )) "$PY" bench/pytorch_families.py --family "$fam" --batch "$B" \
      --size "$SIZE" --steps "$PT_STEPS" --warmup "$PT_WARMUP" --variants "$VARIANTS" --timeout "$t" \
      --device "$PT_DEVICE" --json "$D/pytorch.json" 2>&1 | tee -a "$OUT/families.log"
    [ "${PIPESTATUS[0]}" = 0 ] || failed=1
  fi
  report
done
report
log "done in $(( SECONDS - START )) s; table in $OUT/families.md"
[ -n "$not_started" ] && log "not started (run them in another call into another OUTDIR, then bench/families_report.py OUTDIR1 OUTDIR2): FAMILIES=\"${not_started# }\""
cat "$OUT/families.md"
exit $failed
