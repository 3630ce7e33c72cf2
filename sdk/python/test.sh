#!/usr/bin/env bash
# Runs the Python SDK's unit tests natively against the contract's generated bindings
# (componentize-py writes them for wit/ into a temporary folder). Needs componentize-py.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bindings="$(mktemp -d "${TMPDIR:-/tmp}/zipline-py-bindings.XXXXXX")"
trap 'rm -rf "$bindings"' EXIT
componentize-py -d "$repo/wit" -w transform bindings "$bindings" >/dev/null
cd "$here"
PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$bindings:$here" python3 -m unittest -q test_zipline_transform
