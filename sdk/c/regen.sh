#!/usr/bin/env bash
# Regenerates the C bindings in gen/ from wit/transform.wit with wit-bindgen-cli 0.63.0
# (`cargo install wit-bindgen-cli@0.63.0 --locked --no-default-features --features c`, about
# five minutes). They are the contract's, the same for every C guest, and committed so that
# builds and CI need no wit-bindgen.
#
#   sdk/c/regen.sh           # fails if gen/ differs from a fresh generation
#   sdk/c/regen.sh --write   # rewrites gen/ (after a WIT change)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
want=0.63.0
have="$(wit-bindgen --version | awk '{print $2}')"
[[ $have == "$want" ]] || { echo "wit-bindgen $have found, $want wanted" >&2; exit 1; }

fresh="$(mktemp -d)"
trap 'rm -rf "$fresh"' EXIT
wit-bindgen c "$repo/wit" --world transform --out-dir "$fresh" > >(grep -v "^Generating" >&2) 2>&1
sha256sum "$repo/wit/transform.wit" | cut -d' ' -f1 >"$fresh/WIT.sha256"

if [[ ${1:-} == --write ]]; then
  rm -rf "$here/gen"
  cp -r "$fresh" "$here/gen"
  echo "rewrote $here/gen"
elif ! diff -r "$fresh" "$here/gen"; then
  echo "gen/ is stale: run $0 --write and commit the result" >&2
  exit 1
else
  echo "gen/ is up to date"
fi
