#!/usr/bin/env bash
# The Python client as users get it from an index: a wheel and an sdist built
# from client/python alone (python -m build: the wheel is built from the
# sdist, so the sdist is complete), checked (twine check --strict), and the
# wheel installed with its typecheck and async extras into a fresh virtualenv with no
# path into the repository, where it imports and mypy --strict checks a
# user's program against it (tests/package/uses_the_client.py); then the
# same after the documented editable install.
#
# usage: tests/package/check_client_package.sh TEST_VENV OUT_DIR
# TEST_VENV has build and twine (tests/requirements-client.txt); the fresh
# virtualenv's packages come from PyPI.
set -euo pipefail
venv=$(realpath "${1:?usage: check_client_package.sh TEST_VENV OUT_DIR}")
out=$(realpath -m "${2:?usage: check_client_package.sh TEST_VENV OUT_DIR}")
repo=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$out" && mkdir -p "$out/dist"

"$venv/bin/python" -m build --outdir "$out/dist" "$repo/client/python" >"$out/build.log" 2>&1 \
    || { cat "$out/build.log"; exit 1; }
"$venv/bin/python" -m twine check --strict "$out"/dist/*
wheel=$(ls "$out"/dist/streamfeed-*.whl)
sdist=$(ls "$out"/dist/streamfeed-*.tar.gz)
# The licence travels with both, as the metadata's SPDX expression says.
# (Listings are read whole: grep -q would close the pipe early under pipefail.)
listing=$(unzip -Z1 "$wheel")
grep -q 'licenses/LICENSE$' <<<"$listing" || { echo "the wheel has no LICENSE"; exit 1; }
metadata=$(unzip -p "$wheel" '*.dist-info/METADATA')
grep -qx 'License-Expression: MIT' <<<"$metadata" \
    || { echo "the wheel's metadata has no License-Expression: MIT"; exit 1; }
listing=$(tar -tzf "$sdist")
grep -q '^streamfeed-[^/]*/LICENSE$' <<<"$listing" || { echo "the sdist has no LICENSE"; exit 1; }

python3 -m venv "$out/venv"
"$out/venv/bin/pip" install -q --disable-pip-version-check "$wheel[typecheck,async]"
# Outside the repository, so that only the installed package can be imported.
cd "$out"
"$out/venv/bin/python" -c 'import streamfeed, streamfeed.aio, streamfeed.jpeg; print("installed:", streamfeed.__file__)'
"$out/venv/bin/python" -m mypy --strict --no-incremental --cache-dir "$out/mypy-cache" \
    "$repo/tests/package/uses_the_client.py"
# The documented editable install for development: mypy sees the package
# only through a path entry (compat mode), not through setuptools' import hook.
"$out/venv/bin/pip" uninstall -q -y streamfeed
"$out/venv/bin/pip" install -q --disable-pip-version-check -e "$repo/client/python" \
    --config-settings editable_mode=compat
"$out/venv/bin/python" -m mypy --strict --no-incremental --cache-dir "$out/mypy-cache" \
    "$repo/tests/package/uses_the_client.py"
echo "client package: wheel and sdist build, pass twine check, install, import and type-check"
