#!/usr/bin/env bash
# Installs torch (tests/requirements-torch.txt) into the test virtualenv, or
# says plainly why not. The tests that compare with PyTorch skip, by name and
# with this reason, when torch is absent; every other test runs either way.
#
# Why a fallback chain rather than one pip line: the PyTorch CPU index gives a
# ~200 MB wheel, but a CI machine may reach only PyPI, whose torch is the CUDA
# build: ~3.4 GB of wheels that unpack to ~5.5 GB (measured with torch 2.15).
# On a machine with less disk than that, pip fails with ENOSPC half way and the
# whole test run was lost for a dependency of a few tests. So PyPI is tried
# only when the disk has room, without pip's cache (which would hold a second
# copy of every wheel), and a failed attempt is uninstalled again so that no
# half-installed torch makes its tests fail on import instead of skipping.
#
# usage: tests/install_torch.sh VENV_DIR [CPU_INDEX_URL]
set -uo pipefail
venv=${1:?usage: install_torch.sh VENV_DIR [CPU_INDEX_URL]}
index=${2:-https://download.pytorch.org/whl/cpu}
reqs="$(dirname "$0")/requirements-torch.txt"
pip="$venv/bin/pip"
need_gb=${TORCH_PYPI_MIN_FREE_GB:-12}

# pip's own ERROR lines of an attempt that has a fallback after it are kept
# aside and shown only if no attempt succeeds: a first attempt that fails as
# expected (an index that does not answer, a wheel it lacks) is the normal
# path on many machines, not an error.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# timm, for tests/integration/test_export_timm.py (timm's models exported and
# trained like PyTorch), once torch is in. It is pure Python and needs only
# torch, torchvision, PyYAML and safetensors, which the virtualenv has:
# --no-deps keeps pip from resolving torch again against PyPI's CUDA build
# (and from adding huggingface_hub, which timm imports only to download
# weights). Pinned: a new timm may rename the models those tests name.
timm() {
    if "$pip" install -q --no-cache-dir --no-deps --retries 1 --timeout 30 "timm==1.0.31" 2>>"$log"; then
        echo "install_torch: timm 1.0.31 from PyPI"
    else
        echo "install_torch: WARNING: timm is not installed; test_export_timm's timm models will be SKIPPED." >&2
    fi
}

if "$pip" install -q --no-cache-dir --retries 1 --timeout 30 --index-url "$index" -r "$reqs" 2>"$log"; then
    echo "install_torch: torch from $index"
    timm
    exit 0
fi
first=$(grep -m1 -o 'ERROR: .*' "$log" | cut -c8-120)
echo "install_torch: no torch from $index (${first:-pip failed}); trying PyPI"

free_gb=$(df -Pk "$venv" | awk 'NR == 2 { print int($4 / 1048576) }')
if [ "${free_gb:-0}" -ge "$need_gb" ]; then
    if "$pip" install -q --no-cache-dir -r "$reqs" 2>>"$log"; then
        echo "install_torch: torch from PyPI (the CUDA build; $free_gb GiB were free)"
        timm
        exit 0
    fi
    cat "$log" >&2
    why="pip could not install PyPI's torch"
    "$pip" freeze 2>/dev/null | sed -n -E 's/^((torch|triton|nvidia-[^=]*|cuda-[^=]*)) ?[=@].*/\1/p' \
        | xargs -r "$pip" uninstall -q -y >/dev/null 2>&1
else
    why="$index gave none (${first:-pip failed}) and PyPI's CUDA build needs ~${need_gb} GiB free here, where ${free_gb:-?} GiB are"
fi
echo "install_torch: WARNING: torch is not installed: $why." >&2
echo "install_torch: the tests that compare with PyTorch will be SKIPPED (pytest -rs names them)." >&2
exit 0
