#!/usr/bin/env bash
# tests/fuzz/run.sh BUILD SECONDS NAME:SEED_CORPUS... — runs each libFuzzer
# target BUILD/fuzz_NAME for SECONDS on the corpus it grew before
# (BUILD/fuzz-corpus/NAME) plus its checked-in seeds, one after the other,
# and prints one row per target in the format of tests/fuzz/RESULTS.md:
#   | date | commit | target | seconds | executions | result |
# A crash, leak, timeout or failed check leaves its input in
# BUILD/fuzz-artifacts/NAME-* and its log in BUILD/fuzz-logs/NAME.log, and
# makes the script exit 1 after the remaining targets ran.
# Environment: FUZZ_JOBS (default 1) parallel workers per target (-fork),
# FUZZ_TARGETS_AT_ONCE (default 1) targets run side by side (make fuzz-smoke
# runs one per core: a smoke run is about finding a crash at all, and the
# rows still come out in the order given), FUZZ_NICE (default 10) the nice
# level.
set -uo pipefail
build=$1 seconds=$2
shift 2
mkdir -p "$build/fuzz-logs" "$build/fuzz-artifacts"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit-dirty"
dict_dir="$build/fuzz-dicts"
mkdir -p "$dict_dir"
# The option names of the configuration table, as JSON keys: the config
# fuzzer finds real options far sooner with them (generated, so never stale).
# Written aside and renamed, so two runs started at once (one target each)
# never read a half-written dictionary.
dict_tmp=$(mktemp "$dict_dir/config_patch.dict.XXXXXX")
grep -o '{"[a-z_]*\.[a-z_0-9]*"' server/config.c | tr -d '{"' | tr '.' '\n' | sort -u |
    sed 's/.*/"\\"&\\""/' > "$dict_tmp"
mv -f "$dict_tmp" "$dict_dir/config_patch.dict"
# One target: its row on stdout, its log tail on stderr, exit 1 on a finding.
run_one() {
    local spec=$1 name seeds bin log start rc execs result
    name=${spec%%:*} seeds=${spec#*:}
    bin="$build/fuzz_$name" log="$build/fuzz-logs/$name.log"
    mkdir -p "$build/fuzz-corpus/$name"
    local dict=() jobs=()
    [ -s "$dict_dir/$name.dict" ] && dict=(-dict="$dict_dir/$name.dict")
    [ "${FUZZ_JOBS:-1}" -gt 1 ] && jobs=(-fork="$FUZZ_JOBS")
    start=$(date -u +%Y-%m-%dT%H:%MZ)
    nice -n "${FUZZ_NICE:-10}" "$bin" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$build/fuzz-artifacts/$name-" "${dict[@]}" "${jobs[@]}" \
        "$build/fuzz-corpus/$name" "$seeds" >"$log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    [ -z "$execs" ] && execs=$(grep -o '#[0-9]*' "$log" | tail -1 | tr -d '#')
    if [ $rc -eq 0 ]; then
        result="no crash, corpus $(ls "$build/fuzz-corpus/$name" | wc -l) inputs"
    else
        result="FAILED (exit $rc): $(grep -m1 -E 'ERROR|SUMMARY|deadly signal' "$log" | cut -c1-120)"
        tail -40 "$log" >&2
    fi
    echo "| $start | $commit | $name | $seconds | ${execs:-?} | $result |"
    [ $rc -eq 0 ]
}

at_once=${FUZZ_TARGETS_AT_ONCE:-1}
rows=$(mktemp -d)
trap 'rm -rf "$rows"' EXIT
status=0 i=0 pids=()
for spec in "$@"; do
    run_one "$spec" >"$rows/$i" &
    pids+=($!)
    i=$((i + 1))
    if [ ${#pids[@]} -ge "$at_once" ]; then
        wait "${pids[0]}" || status=1
        pids=("${pids[@]:1}")
    fi
done
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
for ((k = 0; k < i; k++)); do
    cat "$rows/$k"
done
exit $status
