module __NAME__

go 1.27.1

require (
	go.bytecodealliance.org/pkg v0.4.0 // indirect
	zipline/transform v0.0.0
)

replace (
	// The vendored SDK and its bindings' runtime module, which zipline/sdk/go/deps.sh copies
	// from the Rust package registry, through cargo (no Go module proxy is needed).
	go.bytecodealliance.org/pkg => ./zipline/sdk/go/third_party_pkg
	zipline/transform => ./zipline/sdk/go
)
