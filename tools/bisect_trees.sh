#!/usr/bin/env bash
# tools/bisect_trees.sh — find the commit that broke something on a GPU host
# in one call: the host has no git history to bisect with (the device copy of
# the tree carries the working tree, not the object store) and each call costs
# minutes of start-up, so the trees to compare travel with the call, are built
# side by side and are all tested in it.
#
#   tools/bisect_trees.sh pack DIR REV...
#       on a machine with the repository: DIR/HASH.tgz for each commit (git
#       archive of its tree, named by its short hash). DIR goes with the
#       call (a git-ignored folder, carried).
#
#   tools/bisect_trees.sh run DIR [MAKE TARGETS...] -- COMMAND
#       on the GPU host, from the checkout: unpacks each DIR/*.tgz into
#       WORK/REV (default WORK=/tmp/bisect-trees), builds the targets in all
#       of them at once (tools/gpu_host_build.sh CUDA=1 BUILD=build, the
#       .deb files from this checkout's DEBS_DIR, default .deps), then runs
#       COMMAND in each tree with bash -c, one tree per GPU at a time
#       (CUDA_VISIBLE_DEVICES set to its GPU; NGPUS, default the count
#       nvidia-smi lists, or 1). Prints "REV rc N" per tree and writes each
#       tree's build and command output to WORK/REV.build.log and
#       WORK/REV.log. Exits 1 if a build failed, else 0: the command's
#       status is the finding, not the script's.
#
# BUILD_CMD replaces the build command (run in each tree, the targets after
# it), e.g. BUILD_CMD="make CUDA=0 -j2" on a machine without CUDA.
#
# Example (the bf16 stem bisect of 2026-11-30, one call on two GPUs):
#   tools/bisect_trees.sh pack .diag/trees 8763f2f fea091d 8c14132
#   tools/bisect_trees.sh run .diag/trees build/tests/gpu/test_backend_models -- \
#     'timeout 120 build/tests/gpu/test_backend_models -s resnet18_nhwc'
set -uo pipefail
usage() { sed -n '2,30p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
mode=$1 dir=$2
shift 2
case "$mode" in
  pack)
    [ $# -ge 1 ] || usage
    mkdir -p "$dir"
    for rev in "$@"; do
      git rev-parse --verify --quiet "$rev^{commit}" > /dev/null || { echo "bisect_trees: $rev is not a commit" >&2; exit 2; }
      name=$(git rev-parse --short "$rev")
      git archive --format=tar.gz -o "$dir/$name.tgz" "$rev" || exit 1
      echo "$dir/$name.tgz"
    done
    exit 0 ;;
  run) ;;
  *) usage ;;
esac

targets=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do targets+=("$1"); shift; done
[ "${1:-}" = "--" ] && [ $# -ge 2 ] || usage
shift
cmd=$*
shopt -s nullglob
tgzs=("$dir"/*.tgz)
[ ${#tgzs[@]} -gt 0 ] || { echo "bisect_trees: no .tgz in $dir (make them with: $0 pack $dir REV...)" >&2; exit 2; }
work=${WORK:-/tmp/bisect-trees}
debs=$(cd "${DEBS_DIR:-.deps}" 2> /dev/null && pwd)
ngpus=${NGPUS:-$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')}
[ "${ngpus:-0}" -ge 1 ] 2> /dev/null || ngpus=1
mkdir -p "$work"

revs=()
for t in "${tgzs[@]}"; do
  rev=$(basename "$t" .tgz)
  revs+=("$rev")
  rm -rf "${work:?}/$rev" && mkdir -p "$work/$rev" && tar xzf "$t" -C "$work/$rev" || exit 1
done

# All builds at once: each make uses every core, and the compiler's waits on
# the disk and the linker's single thread leave room for the others.
for rev in "${revs[@]}"; do
  rm -f "$work/$rev.build-failed"
  (cd "$work/$rev" && if [ -n "${BUILD_CMD:-}" ]; then
     bash -c "$BUILD_CMD ${targets[*]}"
   else
     DEBS_DIR=$debs bash tools/gpu_host_build.sh CUDA=1 BUILD=build "${targets[@]}"
   fi > "$work/$rev.build.log" 2>&1 || touch "$work/$rev.build-failed") &
done
wait
built=() build_failed=0
for rev in "${revs[@]}"; do
  if [ -e "$work/$rev.build-failed" ]; then
    build_failed=1
    echo "$rev build failed:"
    tail -n 5 "$work/$rev.build.log" | sed 's/^/  /'
  else
    built+=("$rev")
  fi
done

# One tree per GPU at a time: a GPU test's timing and memory are its own.
run_one() {
  local rev=$1 gpu=$2
  if (cd "$work/$rev" && CUDA_VISIBLE_DEVICES=$gpu bash -c "$cmd") > "$work/$rev.log" 2>&1; then
    echo "$rev rc 0"
  else
    echo "$rev rc $?"
  fi
}
i=0
for rev in "${built[@]}"; do
  run_one "$rev" $(( i % ngpus )) &
  i=$(( i + 1 ))
  [ $(( i % ngpus )) -eq 0 ] && wait
done
wait
exit "$build_failed"
