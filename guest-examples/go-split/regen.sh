#!/usr/bin/env bash
# The Go bindings go-split builds with are the SDK's (sdk/go/wit/): this checks or rewrites
# them with sdk/go/regen.sh (wit-bindgen-cli 0.63.0).
#
#   guest-examples/go-split/regen.sh           # fails if the bindings differ from a fresh run
#   guest-examples/go-split/regen.sh --write   # rewrites them (after a WIT change)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../../sdk/go/regen.sh" "$@"
