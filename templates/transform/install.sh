#!/usr/bin/env bash
# Checks that a built component imports nothing but the contract's interfaces (of the version
# in zipline/wit: no WASI, nothing else), then installs it as target/NAME.wasm. build.sh runs
# it last.
#
#   zipline/install.sh COMPONENT.wasm NAME
set -euo pipefail
(($# == 2)) || { echo "usage: $0 COMPONENT.wasm NAME" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
v="$(sed -n 's/^package zipline:transform@\(.*\);$/\1/p' "$here/wit/transform.wit")"
others="$(wasm-tools component wit "$1" | sed -n 's/^  import \(.*\);$/\1/p' |
  grep -vx -e "zipline:transform/host@$v" -e "zipline:transform/types@$v" || true)"
[[ -z $others ]] || { echo "$2.wasm imports more than the contract:" $others >&2; exit 1; }
out="$here/../target/$2.wasm"
mkdir -p "$(dirname "$out")"
install -m 0644 "$1" "$out"
echo "built target/$2.wasm ($(stat -c %s "$out") bytes)"
