#!/usr/bin/env bash
# tools/gpu_host_build.sh [MAKE TARGETS...] — build streamfeed on a GPU host
# that has CUDA, cuDNN and NCCL but neither the -dev packages nor a package
# mirror (docs/GPU-HOSTS.md, steps 2 and 3):
#   - unpacks every .deb in DEBS_DIR (default .deps/, fetched on another
#     machine with the `apt-get download` line of docs/GPU-HOSTS.md) into
#     PREFIX (default /opt/deps);
#   - keeps the host's own libcurl and GnuTLS (the packages' builds pull in
#     libraries such a host may lack; only their headers are used);
#   - runs make with DEPS_PREFIX and CUDA_ARCH (default sm_90), all cores.
# A program started afterwards finds the unpacked libraries through the
# binaries' run path, but a library's own dependencies (Gloo's libibverbs,
# its libnl) are not searched there: `source tools/gpu_host_build.sh --env`
# exports LD_LIBRARY_PATH for them without building.
# (The --env case comes before `set -e`, which would stay in a sourcing shell.)
if [ "${1:-}" = "--env" ]; then
  export LD_LIBRARY_PATH="${PREFIX:-/opt/deps}/usr/lib/x86_64-linux-gnu:${PREFIX:-/opt/deps}/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  return 0 2> /dev/null || exit 0
fi
set -euo pipefail
PREFIX=${PREFIX:-/opt/deps}
LIBS="$PREFIX/usr/lib/x86_64-linux-gnu:$PREFIX/usr/lib"
cd "$(dirname "$0")/.."
DEBS=${DEBS_DIR:-.deps}
shopt -s nullglob
debs=("$DEBS"/*.deb)
if [ ${#debs[@]} -eq 0 ]; then
  echo "gpu_host_build: no .deb files in $DEBS (see docs/GPU-HOSTS.md, step 1)" >&2
  exit 1
fi
mkdir -p "$PREFIX"
for f in "${debs[@]}"; do dpkg -x "$f" "$PREFIX"; done
rm -f "$PREFIX"/usr/lib/x86_64-linux-gnu/libcurl*
for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu; do
  if [ -e "$d/libgnutls.so.30" ]; then
    ln -sf "$d/libgnutls.so.30" "$PREFIX/usr/lib/x86_64-linux-gnu/libgnutls.so"
    break
  fi
done
export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec make -j"$(nproc)" DEPS_PREFIX="$PREFIX/usr" CUDA_ARCH="${CUDA_ARCH:-sm_90}" "$@"
