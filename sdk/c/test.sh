#!/usr/bin/env bash
# The C SDK's unit tests, natively: test.c with zipline_transform.h and the generated
# bindings' header (gen/transform.h; gen/transform.c is wasm-only), built with the address
# and undefined-behaviour sanitizers so that a leak, a double free or an overrun fails too.
# Needs gcc or clang.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cc="${CC:-$(command -v gcc || command -v clang)}"
bin="$(mktemp "${TMPDIR:-/tmp}/zipline-c-test.XXXXXX")"
trap 'rm -f "$bin"' EXIT
"$cc" -std=c11 -g -O1 -Wall -Wextra -Werror -fsanitize=address,undefined -fno-sanitize-recover=all \
  -I "$here" -I "$here/gen" "$here/test.c" -o "$bin"
ASAN_OPTIONS=detect_leaks=1 "$bin"
