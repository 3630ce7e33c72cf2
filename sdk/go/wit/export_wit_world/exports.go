// Package export_wit_world holds the component's two exports, which the generated
// wit_exports.go calls. They are variables, set by package transform (transform.Export), so
// that this package need not import the SDK that imports it.
package export_wit_world

import (
	types "zipline/transform/wit/zipline_transform_types"

	witTypes "go.bytecodealliance.org/pkg/wit/types"
)

// Init is the `init` export: it gets the route's config.
var Init func(config []witTypes.Tuple2[string, string]) witTypes.Result[witTypes.Unit, string]

// Transform is the `transform` export: one batch in, its output out.
var Transform func(batch types.Batch) witTypes.Result[types.Output, string]
