module go-split

go 1.27.1

require (
	go.bytecodealliance.org/pkg v0.4.0 // indirect
	zipline/transform v0.0.0
)

replace (
	// The SDK and its bindings' runtime module, which sdk/go/deps.sh copies from crates.io
	// (no Go module proxy is reachable here).
	go.bytecodealliance.org/pkg => ../../sdk/go/third_party_pkg
	zipline/transform => ../../sdk/go
)
