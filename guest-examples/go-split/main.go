// go-split, on the Go SDK (sdk/go): every change of one table goes out as it came, followed by
// an insert of its audit row into another table of the same schema. See README.md.
package main

import (
	"fmt"
	"strings"

	"zipline/transform"
)

func init() {
	transform.Export(func(cfg *transform.Config) (transform.Transform, error) {
		rawTable, rawAudit := cfg.Get("table", "orders"), cfg.Get("audit_table", "order_audit")
		table, audit, columns := strings.TrimSpace(rawTable), strings.TrimSpace(rawAudit), cfg.List("columns")
		// `schema.table`, or a bare `table` for any schema; the audit table is in the same schema.
		if table == "" || strings.Count(table, ".") > 1 || strings.Trim(table, ".") != table {
			return nil, fmt.Errorf("config key `table`: %q is not a table name", rawTable)
		} else if audit == "" || strings.Contains(audit, ".") {
			return nil, fmt.Errorf("config key `audit_table`: %q is not a bare table name", rawAudit)
		}
		transform.Logf(transform.LevelInfo, "go-split: splitting %s into %s with columns [%s]",
			table[strings.IndexByte(table, '.')+1:], audit, strings.Join(columns, ", "))
		return transform.Func(func(c *transform.Change) error {
			if !c.IsTable(table) {
				return nil
			}
			// Keyed by the change (LSN and ordinal), then its op, key columns and copied columns.
			t := transform.Table{Schema: c.Schema(), Name: audit, Columns: []transform.Column{
				{Name: "change_lsn", TypeOid: 25, TypeModifier: -1, IsKey: true},
				{Name: "change_ordinal", TypeOid: 20, TypeModifier: -1, IsKey: true},
				{Name: "op", TypeOid: 25, TypeModifier: -1}}}
			row, keys := []any{c.LSN(), c.Position().Ordinal, c.Op().String()}, c.KeyColumns()
			for i, name := range append(keys, columns...) {
				v, _ := c.Get(name) // NULL for a delete's row and a truncate's key
				if col, ok := c.Column(name); !ok {
					return transform.FailBatchf("%s.%s has no column `%s` to copy into %s", c.Schema(), c.Table(), name, audit)
				} else if !col.IsKey || i < len(keys) { // a copied key column is there already
					// An insert has no old value for the sink to keep: `unchanged` becomes NULL.
					col.IsKey, v = false, v.IfUnchanged(transform.Null)
					t.Columns, row = append(t.Columns, col), append(row, v)
				}
			}
			return c.Emit(transform.Insert, t, row...)
		}), nil
	}, "table", "audit_table", "columns")
}

func main() {}
