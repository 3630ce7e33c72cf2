#!/usr/bin/env bash
# Builds the transform (./build.sh), runs it over sample.jsonl with the config of sample.config
# (`key=value` lines; `#` starts a comment line) and compares its output with expected.jsonl.
#
#   ./test.sh    # ZIPLINE: the zipline binary to run (default: `zipline` on PATH)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
zipline="${ZIPLINE:-zipline}"
command -v "$zipline" >/dev/null ||
  { echo "$zipline not found: put zipline on PATH or set ZIPLINE=/path/to/zipline" >&2; exit 1; }
[[ $zipline != */* ]] || zipline="$(cd "$(dirname "$zipline")" && pwd)/$(basename "$zipline")"
cd "$here"
./build.sh

config=()
while IFS= read -r line || [[ -n $line ]]; do
  line="${line%$'\r'}"
  [[ $line =~ ^[[:space:]]*(#|$) ]] || config+=(--config "$line")
done <sample.config
actual="$(mktemp "${TMPDIR:-/tmp}/__NAME__.XXXXXX.jsonl")"
trap 'rm -f "$actual"' EXIT
"$zipline" transform test --module target/__NAME__.wasm --input sample.jsonl "${config[@]}" >"$actual"
if ! diff -u --label expected.jsonl --label "output of target/__NAME__.wasm" expected.jsonl "$actual"; then
  echo "test failed: the output differs from expected.jsonl (- expected, + output)" >&2
  exit 1
fi
echo "ok: target/__NAME__.wasm turns sample.jsonl into expected.jsonl"
