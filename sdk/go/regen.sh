#!/usr/bin/env bash
# Regenerates the Go bindings under wit/ (wit_exports/, wit_world/, zipline_transform_host/,
# zipline_transform_types/) from wit/transform.wit with wit-bindgen-cli 0.63.0
# (`cargo install wit-bindgen-cli@0.63.0 --locked --no-default-features --features go`, about
# five minutes). They are committed so that builds and CI need no wit-bindgen.
#
#   sdk/go/regen.sh           # fails if the bindings differ from a fresh run
#   sdk/go/regen.sh --write   # rewrites them (after a WIT change)
#
# `wit-bindgen go` writes bindings for one program, module wit_component, package main; they
# are the contract's, the same for every guest, so they live in this SDK's module instead:
# wit_exports.go moves into package wit_exports, and imports of wit_component/... become
# zipline/transform/wit/... Its go.mod is not used. wit/export_wit_world/ is the SDK's own.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
want=0.63.0
have="$(wit-bindgen --version | awk '{print $2}')"
[[ $have == "$want" ]] || { echo "wit-bindgen $have found, $want wanted" >&2; exit 1; }
generated=(wit_exports wit_world zipline_transform_host zipline_transform_types)

fresh="$(mktemp -d)"
trap 'rm -rf "$fresh"' EXIT
(cd "$fresh" && wit-bindgen go "$repo/wit" --world transform > >(grep -v '^Generating' >&2) 2>&1)
rm "$fresh/go.mod"
mkdir "$fresh/wit_exports"
sed 's/^package main$/package wit_exports/' "$fresh/wit_exports.go" >"$fresh/wit_exports/wit_exports.go"
rm "$fresh/wit_exports.go"
for g in "${generated[@]}"; do
  sed -i 's#"wit_component/#"zipline/transform/wit/#' "$fresh/$g"/*.go
done
sha256sum "$repo/wit/transform.wit" | cut -d' ' -f1 >"$fresh/WIT.sha256"

if [[ ${1:-} == --write ]]; then
  for g in "${generated[@]}"; do rm -rf "${here:?}/wit/$g"; cp -r "$fresh/$g" "$here/wit/$g"; done
  cp "$fresh/WIT.sha256" "$here/wit/WIT.sha256"
  echo "rewrote the bindings in $here/wit"
else
  stale=0
  for g in "${generated[@]}" WIT.sha256; do diff -r "$fresh/$g" "$here/wit/$g" || stale=1; done
  ((stale == 0)) || { echo "the Go bindings are stale: run $0 --write and commit the result" >&2; exit 1; }
  echo "the Go bindings are up to date"
fi
