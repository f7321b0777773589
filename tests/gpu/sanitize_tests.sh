#!/usr/bin/env bash
# tests/gpu/sanitize_tests.sh BUILD — the GPU test programs under
# compute-sanitizer, as `make gpu-sanitize` runs them: one run per tool and
# program, test_ops one op family per run (its -o), several runs at once
# (compute-sanitizer is bound by the host's CPU, not the GPU), under one
# deadline, then a table of what each run found (tests/gpu/SANITIZER.md keeps
# the runs worth keeping).
#
# Environment (all optional):
#   GPU_SANITIZE_TOOLS    memcheck racecheck synccheck initcheck
#   GPU_SANITIZE_TESTS    program names (default: every BUILD/tests/gpu/test_*)
#   GPU_SANITIZE_OPS      test_ops families (default: every tests/gpu/ops/*.cu)
#   GPU_SANITIZE_JOBS     runs at once (default: the host's cores)
#   GPU_SANITIZE_SECONDS  wall-clock for the whole run (default 0: none); a run
#                         still going then is stopped and reported unfinished
#   GPU_SANITIZE_SKIP     tool:name pairs not run, each for a reason written in
#                         SANITIZER.md (default: the known sanitizer failures
#                         inside the libraries' Hopper kernels, below)
#   GPU_SANITIZE_OUT      folder for the logs and summary.md (default BUILD/gpu-sanitize)
#
# racecheck and initcheck check streamfeed's kernels: cuBLAS's and cuDNN's
# (nvjet, cudnn, xmma, cutlass in their names) are excluded from them by
# name, because both tools misread those kernels' asynchronous shared-memory
# copies (TMA, wgmma pipelines) and their workspaces; memcheck and synccheck
# check every kernel. Exit status: 0 only when every run that was not skipped
# finished with no report and its test passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:?usage: tests/gpu/sanitize_tests.sh BUILD}
CS=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
[ -x "$CS" ] || { echo "sanitize_tests: compute-sanitizer not found (PATH, CUDA_HOME)"; exit 2; }
TOOLS=${GPU_SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}
if [ -n "${GPU_SANITIZE_TESTS:-}" ]; then TESTS=$GPU_SANITIZE_TESTS
else TESTS=$(for t in "$B"/tests/gpu/test_*; do [ -x "$t" ] && basename "$t"; done); fi
OPS=${GPU_SANITIZE_OPS:-$(for f in tests/gpu/ops/*.cu; do basename "$f" .cu; done)}
JOBS=${GPU_SANITIZE_JOBS:-$(nproc)}
SECONDS_ALL=${GPU_SANITIZE_SECONDS:-0}
# Measured with compute-sanitizer 2025.3.1 on an H200 (SANITIZER.md, 2026-11-29):
# racecheck stops with "Internal Sanitizer Error: failed to handle a hardware
# exception" in every program that runs cuBLAS's or cuDNN's tensor-core GEMMs,
# excluded kernels or not; synccheck overflows its barrier table in cuDNN's SDPA
# kernel and the kernel then fails.
SKIP=${GPU_SANITIZE_SKIP-racecheck:attention racecheck:conv racecheck:conv_gemm racecheck:conv_transpose racecheck:linear racecheck:test_backend racecheck:test_backend_models racecheck:test_train_loop racecheck:test_jpeg_decode racecheck:test_dist_nccl synccheck:sdpa}
OUT=${GPU_SANITIZE_OUT:-$B/gpu-sanitize}
mkdir -p "$OUT"
rm -f "$OUT"/*.log "$OUT/rows"
DEADLINE=0
[ "$SECONDS_ALL" -gt 0 ] && DEADLINE=$(( $(date +%s) + SECONDS_ALL ))
LIBS="--kernel-name-exclude kns=nvjet --kernel-name-exclude kns=cudnn --kernel-name-exclude kns=xmma --kernel-name-exclude kns=cutlass"
export CS B OUT DEADLINE LIBS

one() { # tool name program [args]
    local tool=$1 name=$2 prog=$3; shift 3
    local log="$OUT/$tool-$name.log" t0 rc res lim="" x=""
    if [ "$DEADLINE" -gt 0 ]; then
        lim=$(( DEADLINE - $(date +%s) ))
        if [ "$lim" -lt 5 ]; then printf '%s\t%s\t%s\n' "$tool" "$name" "not run: no time left" >> "$OUT/rows"; return; fi
    fi
    case $tool in racecheck|initcheck) x=$LIBS ;; esac
    # libnccl probes its kernels with cudaFuncGetAttributes and handles the
    # "no kernel image" (209) it gets for other architectures; memcheck would
    # count each as an error of the program. streamfeed checks every CUDA
    # call's status itself (SF_CUDA_CHECK), so none of its own is hidden.
    [ "$prog" = test_dist_nccl ] && x="$x --report-api-errors no"
    t0=$(date +%s)
    # shellcheck disable=SC2086
    ${lim:+timeout $lim} "$CS" --tool "$tool" $x --error-exitcode 99 --print-limit 20 "$B/tests/gpu/$prog" "$@" > "$log" 2>&1
    rc=$?
    case $rc in
        0) res="clean" ;;
        99) res="REPORTS: $(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -1 | sed 's/^=* *//')" ;;
        124) res="UNFINISHED at the deadline" ;;
        *) res="TEST FAILED (exit $rc)" ;;
    esac
    res="$res; $(grep -E '^test_[a-z_]+: [0-9]+ ok' "$log" | tail -1 | sed 's/^test_[a-z_]*: //') $(( $(date +%s) - t0 )) s"
    printf '%s\t%s\t%s\n' "$tool" "$name" "$res" >> "$OUT/rows"
}
export -f one

skipped() { case " $SKIP " in *" $1:$2 "*) return 0 ;; esac; return 1; }
{
    for tool in $TOOLS; do
        for t in $TESTS; do
            if [ "$t" = test_ops ]; then
                for op in $OPS; do
                    if skipped "$tool" "$op"; then printf '%s\t%s\t%s\n' "$tool" "test_ops.$op" "skipped (GPU_SANITIZE_SKIP; SANITIZER.md says why)" >> "$OUT/rows"
                    else echo "$tool test_ops.$op test_ops -o $op"; fi
                done
            elif skipped "$tool" "$t"; then printf '%s\t%s\t%s\n' "$tool" "$t" "skipped (GPU_SANITIZE_SKIP; SANITIZER.md says why)" >> "$OUT/rows"
            else echo "$tool $t $t"; fi
        done
    done
} | xargs -P "$JOBS" -L 1 bash -c 'one "$@"' _

{
    echo "compute-sanitizer: $("$CS" --version 2>/dev/null | grep -m1 Version)"
    echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
    echo
    echo "| tool | test | result |"
    echo "| --- | --- | --- |"
    sort "$OUT/rows" | awk -F'\t' '{ printf "| %s | %s | %s |\n", $1, $2, $3 }'
} > "$OUT/summary.md"
cat "$OUT/summary.md"
# The exit status: any run neither clean nor skipped fails the whole.
if cut -f3 "$OUT/rows" | grep -vq -E '^(clean|skipped)'; then
    echo "gpu-sanitize: FAILED (logs in $OUT)"
    exit 1
fi
echo "gpu-sanitize: every run clean (logs in $OUT)"
