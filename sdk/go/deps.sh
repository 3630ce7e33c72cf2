#!/usr/bin/env bash
# Fetches what every Go guest needs from crates.io (see deps/Cargo.toml), refreshes
# sdk/go/third_party_pkg (the bindings' runtime module, go.bytecodealliance.org/pkg, which
# go.mod files point at with a replace: no Go module proxy is reachable here) and prints the
# path of the WASI preview1 reactor adapter.
#
#   sdk/go/deps.sh    # prints ADAPTER_PATH
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
manifest="$here/deps/Cargo.toml"

crate_dir() { # NAME: the unpacked source of a dependency of deps/
  cargo metadata --quiet --locked --format-version 1 --manifest-path "$manifest" |
    python3 -c 'import json, os, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == sys.argv[1]:
        print(os.path.dirname(p["manifest_path"]))' "$1"
}
cargo fetch --quiet --locked --manifest-path "$manifest"
pkg="$(crate_dir wit-bindgen-go)/src/pkg"
adapter="$(crate_dir wasi-preview1-component-adapter-provider)/artefacts/wasi_snapshot_preview1.reactor.wasm"
[[ -f $pkg/go.mod ]] || { echo "no Go module at $pkg" >&2; exit 1; }
[[ -f $adapter ]] || { echo "no WASI adapter at $adapter" >&2; exit 1; }
rm -rf "$here/third_party_pkg"
cp -r "$pkg" "$here/third_party_pkg"
echo "$adapter"
