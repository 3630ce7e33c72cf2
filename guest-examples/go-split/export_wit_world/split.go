// Package export_wit_world implements the exports of Zipline's `transform` world in Go: it
// splits (fans out) each change of one table into that change plus an audit row in another.
//
// Config (the route's `transform.config` map):
//
//	table        the table whose changes are split: `schema.table`, or a bare `table` for any
//	             schema (default `orders`)
//	audit_table  the name of the audit table, in the same schema (default `order_audit`)
//	columns      comma-separated columns of the source table copied into each audit row
//	             (default none)
//
// Every change of the source table passes as it is, followed by an insert into the audit
// table with the same position (the host numbers the two apart). The audit table's columns:
// `change_lsn` text and `change_ordinal` int8 (together its key: one row per source change),
// `op` text (insert, update, delete, truncate), the source's key columns, then the `columns`
// copied, each with its source type. A copied value that is `unchanged` (a TOASTed value the
// update did not touch) becomes NULL in the audit row: an insert has no old value to keep.
// A delete has no values, so its copied columns are NULL; a truncate has no key either.
// Changes of other tables pass through untouched.
//
// Bindings (wit-bindgen go): variants are values with Tag() and accessors, made with
// MakeValueText(...) and friends; options witTypes.Option; results witTypes.Ok/Err.
package export_wit_world

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	host "wit_component/zipline_transform_host"
	types "wit_component/zipline_transform_types"

	witTypes "go.bytecodealliance.org/pkg/wit/types"
)

// PostgreSQL type OIDs of the audit table's own columns.
const (
	oidText = 25
	oidInt8 = 20
)

type settings struct {
	schema, table string // schema "" matches any
	auditTable    string
	columns       []string
}

var cfg *settings

func init() {
	// The Go GC may otherwise run inside cabi_realloc while the host is copying a large batch
	// in, and the runtime's stack switch then traps ("cannot leave component instance").
	// Collection happens at the start of each Transform instead.
	debug.SetGCPercent(-1)
}

func list(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// Init reads the route's config.
func Init(config []witTypes.Tuple2[string, string]) witTypes.Result[witTypes.Unit, string] {
	c := &settings{table: "orders", auditTable: "order_audit"}
	for _, kv := range config {
		switch kv.F0 {
		case "table":
			name := strings.TrimSpace(kv.F1)
			schema, table, qualified := strings.Cut(name, ".")
			if !qualified {
				schema, table = "", name
			}
			c.schema, c.table = schema, table
			if table == "" || (qualified && schema == "") || strings.Contains(table, ".") {
				return witTypes.Err[witTypes.Unit](fmt.Sprintf("config key `table`: %q is not a table name", kv.F1))
			}
		case "audit_table":
			c.auditTable = strings.TrimSpace(kv.F1)
			if c.auditTable == "" || strings.Contains(c.auditTable, ".") {
				return witTypes.Err[witTypes.Unit](fmt.Sprintf("config key `audit_table`: %q is not a bare table name", kv.F1))
			}
		case "columns":
			c.columns = list(kv.F1)
		default:
			return witTypes.Err[witTypes.Unit](fmt.Sprintf("unknown config key `%s`; expected table, audit_table, columns", kv.F0))
		}
	}
	cfg = c
	host.Log(host.Level_Info, fmt.Sprintf("go-split: splitting %s into %s with columns [%s]",
		c.table, c.auditTable, strings.Join(c.columns, ", ")))
	return witTypes.Ok[witTypes.Unit, string](witTypes.Unit{})
}

// plan says how one source table's changes become audit rows.
type plan struct {
	audit   uint32 // index of the audit table in the output
	keyCols int    // number of source key columns
	copied  []int  // source column index of each copied column
}

func lsnText(p types.Position) string {
	if p.LsnHigh == 0 {
		return fmt.Sprintf("%X/%X", p.LsnLow>>32, p.LsnLow&0xFFFF_FFFF)
	}
	return fmt.Sprintf("0x%04X%016X", p.LsnHigh, p.LsnLow)
}

var opNames = [...]string{"insert", "update", "delete", "truncate"}

// auditTable builds the audit table's shape for source table t, and the plan; an error names
// a configured column t lacks.
func auditTable(t types.Table, index uint32) (types.Table, plan, error) {
	cols := []types.Column{
		{Name: "change_lsn", TypeOid: oidText, TypeModifier: -1, IsKey: true},
		{Name: "change_ordinal", TypeOid: oidInt8, TypeModifier: -1, IsKey: true},
		{Name: "op", TypeOid: oidText, TypeModifier: -1},
	}
	p := plan{audit: index}
	for _, c := range t.Columns {
		if c.IsKey {
			c.IsKey = false
			cols = append(cols, c)
			p.keyCols++
		}
	}
	for _, name := range cfg.columns {
		found := -1
		for i, c := range t.Columns {
			if c.Name == name {
				found = i
			}
		}
		if found < 0 {
			return types.Table{}, p, fmt.Errorf("%s.%s has no column `%s` to copy into %s",
				t.Schema, t.Name, name, cfg.auditTable)
		}
		if t.Columns[found].IsKey {
			continue // already there, with the key columns
		}
		c := t.Columns[found]
		cols = append(cols, c)
		p.copied = append(p.copied, found)
	}
	return types.Table{Schema: t.Schema, Name: cfg.auditTable, Columns: cols}, p, nil
}

func auditChange(p plan, c types.Change) types.Change {
	lsn := types.MakeValueText(lsnText(c.Position))
	ordinal := types.MakeValueInt8(int64(c.Position.Ordinal))
	values := make([]types.Value, 0, 3+p.keyCols+len(p.copied))
	values = append(values, lsn, ordinal, types.MakeValueText(opNames[c.Op]))
	for i := 0; i < p.keyCols; i++ {
		if i < len(c.Key) {
			values = append(values, c.Key[i])
		} else {
			values = append(values, types.MakeValueNull()) // truncate: no key
		}
	}
	for _, src := range p.copied {
		v := types.MakeValueNull()
		if src < len(c.Values) && c.Values[src].Tag() != types.Value_Unchanged {
			v = c.Values[src]
		}
		values = append(values, v)
	}
	return types.Change{
		Table:    p.audit,
		Op:       types.Op_Insert,
		Position: c.Position,
		Key:      []types.Value{lsn, ordinal},
		OldKey:   witTypes.None[[]types.Value](),
		Values:   values,
	}
}

func matches(t types.Table) bool {
	return t.Name == cfg.table && (cfg.schema == "" || t.Schema == cfg.schema)
}

// Transform passes every change and adds an audit row after each change of the source table.
func Transform(batch types.Batch) witTypes.Result[types.Output, string] {
	if cfg == nil {
		return witTypes.Err[types.Output]("transform called before init")
	}
	// With automatic collection off (see init), collect here: the previous call's output has
	// been copied out by now, and nothing is being lowered into our memory.
	runtime.GC()

	tables := append([]types.Table(nil), batch.Tables...)
	plans := make([]*plan, len(batch.Tables))
	for i, t := range batch.Tables {
		if !matches(t) {
			continue
		}
		audit, p, err := auditTable(t, uint32(len(tables)))
		if err != nil {
			return witTypes.Err[types.Output](err.Error())
		}
		tables = append(tables, audit)
		plans[i] = &p
	}

	changes := make([]types.Change, 0, len(batch.Changes)*2)
	for i, c := range batch.Changes {
		if int(c.Table) >= len(plans) {
			return witTypes.Err[types.Output](fmt.Sprintf("change %d refers to table #%d of %d", i, c.Table, len(plans)))
		}
		changes = append(changes, c)
		if p := plans[c.Table]; p != nil {
			changes = append(changes, auditChange(*p, c))
		}
	}
	return witTypes.Ok[types.Output, string](types.Output{Tables: tables, Changes: changes, Errors: []types.ChangeError{}})
}
