#!/usr/bin/env bash
# The C bindings c-drop-hash builds with are the SDK's (sdk/c/gen/): this checks or rewrites
# them with sdk/c/regen.sh (wit-bindgen-cli 0.63.0).
#
#   guest-examples/c-drop-hash/regen.sh           # fails if gen/ differs from a fresh run
#   guest-examples/c-drop-hash/regen.sh --write   # rewrites gen/ (after a WIT change)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../../sdk/c/regen.sh" "$@"
