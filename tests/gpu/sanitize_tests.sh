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
#   GPU_SANITIZE_CASE_OPS test_ops families run one case per run (default:
#                         attention conv_gemm)
#   GPU_SANITIZE_SECTIONS `prog:section ...` to run instead of every section
#                         of the SECTIONED programs named in GPU_SANITIZE_TESTS
#
# The programs of SECTIONED run one section per run too (their -l lists the
# sections, -s NAME runs one), since each takes longer under initcheck or
# synccheck than one GPU call may run.
#
# racecheck checks streamfeed's kernels: cuBLAS's and cuDNN's (nvjet, cudnn,
# xmma, cutlass in their names) are excluded by name, because it misreads
# those kernels' asynchronous shared-memory copies (TMA, wgmma pipelines).
# initcheck checks every kernel, since a kernel it skips leaves what it wrote
# unrecorded and every read of that by ours then looks uninitialized; its
# reports are sorted by where the read is: in a kernel of ours (built with
# -lineinfo, so the report names our source file and line) it fails the run,
# in a library kernel (cuDNN's layout conversions read their own workspace)
# it is counted in the table and does not. memcheck and synccheck check every
# kernel. Exit status: 0 only when every run that was not skipped finished
# with no report in our kernels and its test passed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
B=${1:?usage: tests/gpu/sanitize_tests.sh BUILD}
CS=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
[ -x "$CS" ] || { echo "sanitize_tests: compute-sanitizer not found (PATH, CUDA_HOME)"; exit 2; }
TOOLS=${GPU_SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}
if [ -n "${GPU_SANITIZE_TESTS:-}" ]; then TESTS=$GPU_SANITIZE_TESTS
else TESTS=$(for t in "$B"/tests/gpu/test_*; do [ -x "$t" ] && basename "$t"; done); fi
OPS=${GPU_SANITIZE_OPS:-$(for f in tests/gpu/ops/*.cu; do basename "$f" .cu; done)}
JOBS=${GPU_SANITIZE_JOBS:-$(nproc)}
SECONDS_ALL=${GPU_SANITIZE_SECONDS:-0}
# test_ops families run one case per run: under initcheck each of these takes
# longer as a whole than one GPU call may run (SANITIZER.md).
CASE_OPS=${GPU_SANITIZE_CASE_OPS-attention conv_gemm}
# The cases of families racecheck skips (they run cuBLAS or cuDNN) that run
# streamfeed's kernels alone, family=key of test_ops -k, run as one run each.
RACE_OWN=${GPU_SANITIZE_RACE_OWN-conv=conv thin;conv=conv patch;conv_transpose=conv_transpose patch;conv_transpose=conv_transpose bias_dt}
# Measured with compute-sanitizer 2025.3.1 on an H200 (SANITIZER.md, 2026-11-29):
# racecheck stops with "Internal Sanitizer Error: failed to handle a hardware
# exception" in every program that runs cuBLAS's or cuDNN's tensor-core GEMMs,
# excluded kernels or not, with an include filter on streamfeed's kernels, and
# with --racecheck-memcpy-async no (RACE_OWN runs those families' cases that
# need no library kernel); synccheck overflows its barrier table in cuDNN's
# SDPA kernel (test_ops sdpa, test_backend_models' ViT section), with
# --num-cuda-barriers 64 too, and the kernel then fails.
SKIP=${GPU_SANITIZE_SKIP-synccheck:test_backend_models.vit racecheck:attention racecheck:conv racecheck:conv_gemm racecheck:conv_transpose racecheck:linear racecheck:test_backend racecheck:test_backend_models racecheck:test_train_loop racecheck:test_jpeg_decode racecheck:test_dist_nccl synccheck:sdpa}
OUT=${GPU_SANITIZE_OUT:-$B/gpu-sanitize}
mkdir -p "$OUT"
rm -f "$OUT"/*.log "$OUT/rows"
DEADLINE=0
[ "$SECONDS_ALL" -gt 0 ] && DEADLINE=$(( $(date +%s) + SECONDS_ALL ))
LIBS="--kernel-name-exclude kns=nvjet --kernel-name-exclude kns=cudnn --kernel-name-exclude kns=xmma --kernel-name-exclude kns=cutlass"
SECTIONED="test_backend test_backend_models test_train_loop test_jpeg_decode test_dist_nccl"
export CS B OUT DEADLINE LIBS

# initcheck's reports in LOG by where the read is: "ours library total".
# A device report's first frame reads "at <kernel>+0x.. in <file>:<line>" for
# a kernel built with line information (ours) and has no source line in the
# libraries' kernels; total is the tool's own count, so that a report of
# another kind (a host API call reading uninitialized memory) is in neither
# and keeps the run failed.
init_sort() {
    awk '/^========= +at / { if ($0 ~ / in [^ ]+:[0-9]+ *$/) o++; else l++ }
         /ERROR SUMMARY: [0-9]+ error/ { for (i = 1; i <= NF; i++) if ($i == "SUMMARY:") t = $(i + 1) }
         END { printf "%d %d %d\n", o + 0, l + 0, t + 0 }' "$1"
}
export -f init_sort

one() { # tool name program [args]
    local tool=$1 name=$2 prog=$3; shift 3
    local log="$OUT/$tool-$name.log" t0 rc res lim="" x="" libnote=""
    if [ "$DEADLINE" -gt 0 ]; then
        lim=$(( DEADLINE - $(date +%s) ))
        if [ "$lim" -lt 5 ]; then printf '%s\t%s\t%s\n' "$tool" "$name" "not run: no time left" >> "$OUT/rows"; return; fi
    fi
    local limit=20
    case $tool in
        racecheck) x=$LIBS ;;
        initcheck) limit=10000000 ;; # every report, to sort them (init_sort)
        synccheck) [ -n "${GPU_SANITIZE_BARRIERS:-}" ] && x="--num-cuda-barriers $GPU_SANITIZE_BARRIERS" ;;
    esac
    # libnccl probes its kernels with cudaFuncGetAttributes and handles the
    # "no kernel image" (209) it gets for other architectures; memcheck would
    # count each as an error of the program. streamfeed checks every CUDA
    # call's status itself (SF_CUDA_CHECK), so none of its own is hidden.
    [ "$prog" = test_dist_nccl ] && x="$x --report-api-errors no"
    t0=$(date +%s)
    # shellcheck disable=SC2086
    ${lim:+timeout $lim} "$CS" --tool "$tool" $x --error-exitcode 99 --print-limit $limit "$B/tests/gpu/$prog" "$@" > "$log" 2>&1
    rc=$?
    if [ "$rc" = 99 ] && [ "$tool" = initcheck ] && ! grep -q -E '^(FAIL|=+ (Internal|Error:|Program hit))' "$log"; then
        local ours lib total
        read -r ours lib total < <(init_sort "$log")
        [ "$ours" = 0 ] && [ "$lib" -gt 0 ] && [ "$lib" = "$total" ] && rc=0 &&
            libnote=" ($lib reports inside library kernels)"
    fi
    case $rc in
        0) res="clean$libnote" ;;
        99) res="REPORTS: $(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -1 | sed 's/^=* *//')" ;;
        124) res="UNFINISHED at the deadline" ;;
        *) res="TEST FAILED (exit $rc)" ;;
    esac
    res="$res; $(grep -E '^test_[a-z_]+: [0-9]+ ok' "$log" | tail -1 | sed 's/^test_[a-z_]*: //') $(( $(date +%s) - t0 )) s"
    printf '%s\t%s\t%s\n' "$tool" "$name" "$res" >> "$OUT/rows"
}
export -f one

inlist() { case " $2 " in *" $1 "*) return 0 ;; esac; return 1; } # word $1 in list $2
skipped() { inlist "$1:$2" "$SKIP"; }
skip_row() { printf '%s\t%s\t%s\n' "$1" "$2" "skipped (GPU_SANITIZE_SKIP; SANITIZER.md says why)" >> "$OUT/rows"; }
{
    for tool in $TOOLS; do
        for t in $TESTS; do
            if [ "$t" = test_ops ]; then
                for op in $OPS; do
                    if skipped "$tool" "$op"; then
                        skip_row "$tool" "test_ops.$op"
                        # the family's cases that run streamfeed's kernels alone still run
                        [ "$tool" = racecheck ] && printf '%s\n' "$RACE_OWN" | tr ';' '\n' | while IFS='=' read -r f k; do
                            [ "$f" = "$op" ] && echo "$tool \"test_ops.$op ($k)\" test_ops -o $op -k \"$k\""
                        done
                    elif inlist "$op" "$CASE_OPS"; then
                        # one run per case, named by its place in -l's list (a
                        # case's name holds spaces; -k matches a substring of it,
                        # quoted for xargs)
                        "$B/tests/gpu/test_ops" -o "$op" -l | sed -n 's/^case //p' | awk -v t="$tool" -v op="$op" \
                            '{ printf "%s test_ops.%s#%d test_ops -o %s -k \"%s\"\n", t, op, NR, op, $0 }'
                    else echo "$tool test_ops.$op test_ops -o $op"; fi
                done
            elif skipped "$tool" "$t"; then skip_row "$tool" "$t"
            elif inlist "$t" "$SECTIONED"; then
                if [ -n "${GPU_SANITIZE_SECTIONS:-}" ]; then
                    secs=$(for ps in $GPU_SANITIZE_SECTIONS; do [ "${ps%%:*}" = "$t" ] && echo "${ps#*:}"; done)
                else secs=$("$B/tests/gpu/$t" -l 2>/dev/null | grep -E '^[a-z0-9_]+$'); fi
                for sec in $secs; do
                    if skipped "$tool" "$t.$sec"; then skip_row "$tool" "$t.$sec"
                    else echo "$tool $t.$sec $t -s $sec"; fi
                done
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
