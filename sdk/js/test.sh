#!/usr/bin/env bash
# Runs the JavaScript SDK's unit tests natively with node (20 or later); the contract's host
# import resolves to a stand-in (test/hooks.js).
set -euo pipefail
cd "$(dirname "$0")"
node --test test/zipline-transform.test.js
