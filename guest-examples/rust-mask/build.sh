#!/usr/bin/env bash
# Builds the rust-mask transform component (see ../rust-build.sh for the toolchain it needs).
#
#   guest-examples/rust-mask/build.sh [OUT_DIR]    # default OUT_DIR: <repo>/target/guests
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../rust-build.sh" "$here" "$@"
