//go:build wasm

package transform

import host "zipline/transform/wit/zipline_transform_host"

func init() {
	logSink = func(level Level, message string) { host.Log(host.Level(level), message) }
}
