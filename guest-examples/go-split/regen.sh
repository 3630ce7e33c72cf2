#!/usr/bin/env bash
# Regenerates the Go bindings (wit_exports.go, wit_world/, zipline_transform_host/,
# zipline_transform_types/) from wit/transform.wit with wit-bindgen-cli 0.63.0
# (`cargo install wit-bindgen-cli@0.63.0 --locked --no-default-features --features go`, about
# five minutes). They are committed so that builds and CI need no wit-bindgen.
#
#   guest-examples/go-split/regen.sh           # fails if the bindings differ from a fresh run
#   guest-examples/go-split/regen.sh --write   # rewrites them (after a WIT change)
#
# `wit-bindgen go` also writes a go.mod, which is not used: ours points the runtime module at
# ./third_party_pkg (see build.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
want=0.63.0
have="$(wit-bindgen --version | awk '{print $2}')"
[[ $have == "$want" ]] || { echo "wit-bindgen $have found, $want wanted" >&2; exit 1; }
generated=(wit_exports.go wit_world zipline_transform_host zipline_transform_types)

fresh="$(mktemp -d)"
trap 'rm -rf "$fresh"' EXIT
(cd "$fresh" && wit-bindgen go "$repo/wit" --world transform > >(grep -v '^Generating' >&2) 2>&1)
rm "$fresh/go.mod"
sha256sum "$repo/wit/transform.wit" | cut -d' ' -f1 >"$fresh/WIT.sha256"

if [[ ${1:-} == --write ]]; then
  for g in "${generated[@]}"; do rm -rf "${here:?}/$g"; cp -r "$fresh/$g" "$here/$g"; done
  cp "$fresh/WIT.sha256" "$here/WIT.sha256"
  echo "rewrote the bindings in $here"
else
  stale=0
  for g in "${generated[@]}" WIT.sha256; do diff -r "$fresh/$g" "$here/$g" || stale=1; done
  ((stale == 0)) || { echo "the Go bindings are stale: run $0 --write and commit the result" >&2; exit 1; }
  echo "the Go bindings are up to date"
fi
