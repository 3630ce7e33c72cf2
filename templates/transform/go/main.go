// __NAME__: keeps only the rows whose `column` is not `value` (both from the route's config).
// Filtered tables need `row_filter: true` on the route's transform and REPLICA IDENTITY FULL.
package main

import "zipline/transform"

func init() {
	transform.Export(func(cfg *transform.Config) (transform.Transform, error) {
		column, err := transform.Require[string](cfg, "column")
		if err != nil {
			return nil, err
		}
		value, err := transform.Require[string](cfg, "value")
		if err != nil {
			return nil, err
		}
		return transform.Func(func(c *transform.Change) error {
			// An insert failing the test is dropped, an update failing it deletes the row.
			c.Filter(func(row *transform.Change) bool { s, ok := row.GetStr(column); return !ok || s != value })
			return nil
		}), nil
	}, "column", "value")
}

func main() {}
