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
// The batch (zipline:transform@0.3.0) is four flat lists: `Tables`, `Data` (the bytes of
// every text-like value), `Values` (every value of every change; a text value is a Span of
// Data) and `Changes` (whose Key, OldKey and Values are Spans of Values). The output is the
// same lists plus `Errors`, and this transform builds it so that nothing already in the batch
// is copied or re-encoded:
//
//   - output.Values starts as the input's list, so every input change, and every input value
//     an audit row reuses, keeps its span; audit rows are appended after it;
//   - an audit row's key (change_lsn, change_ordinal) is its first two values: the key span
//     and the row span overlap, so the key is not written twice;
//   - a copied value keeps its Span into the input's Data: only the Value (tag and span) is
//     copied, never its bytes;
//   - only new text (LSNs and op names) goes to output.Data, and a span of output.Data counts
//     from the input's Data length onwards (see out.text).
//
// Bindings (wit-bindgen go): variants are values with Tag() and accessors, made with
// MakeValueText(span) and friends; options witTypes.Option; results witTypes.Ok/Err.
package export_wit_world

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
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

// fixedCols is the number of audit columns before the source's key columns: change_lsn,
// change_ordinal (the audit key) and op.
const fixedCols = 3

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

// width is the number of values in each audit row.
func (p *plan) width() int { return fixedCols + p.keyCols + len(p.copied) }

func matches(t types.Table) bool {
	return t.Name == cfg.table && (cfg.schema == "" || t.Schema == cfg.schema)
}

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
		cols = append(cols, t.Columns[found])
		p.copied = append(p.copied, found)
	}
	return types.Table{Schema: t.Schema, Name: cfg.auditTable, Columns: cols}, p, nil
}

var opNames = [...]string{"insert", "update", "delete", "truncate"}

// out is the output under construction, with what lets audit rows share their text.
type out struct {
	types.Output
	// dataBase is the input's Data length: output.Data's first byte is addressed as dataBase.
	dataBase uint32
	// opText[op] is the span of that op's name once written (Len 0 until then): each name is
	// written once per batch, however many rows use it.
	opText [len(opNames)]types.Span
	// lastLSN is the span of the last LSN written, for the position it was written for: the
	// changes of one transaction share a commit LSN and come one after another, so its text
	// is written once per transaction rather than once per change.
	lastLSN  types.Span
	lastPos  types.Position
	wroteLSN bool
}

// text appends new bytes to output.Data and returns their span. Spans of output.Data count
// on from the end of the input's Data (the WIT's `output` record), so dataBase is added.
func (o *out) text(b string) types.Span {
	start := o.dataBase + uint32(len(o.Data))
	o.Data = append(o.Data, b...)
	return types.Span{Start: start, Len: uint32(len(b))}
}

// lsn returns the span of p's commit LSN as text ("0/7000028"), writing it only when the
// previous audit row's LSN differs.
func (o *out) lsn(p types.Position) types.Span {
	if !o.wroteLSN || p.LsnHigh != o.lastPos.LsnHigh || p.LsnLow != o.lastPos.LsnLow {
		// Appended straight into output.Data: no string is built on the way.
		start := o.dataBase + uint32(len(o.Data))
		if p.LsnHigh == 0 {
			o.Data = fmt.Appendf(o.Data, "%X/%X", p.LsnLow>>32, p.LsnLow&0xFFFF_FFFF)
		} else {
			o.Data = fmt.Appendf(o.Data, "0x%04X%016X", p.LsnHigh, p.LsnLow)
		}
		o.lastLSN = types.Span{Start: start, Len: o.dataBase + uint32(len(o.Data)) - start}
		o.lastPos, o.wroteLSN = p, true
	}
	return o.lastLSN
}

// op returns the span of an op's name, writing it on first use.
func (o *out) op(op types.Op) types.Span {
	if o.opText[op].Len == 0 {
		o.opText[op] = o.text(opNames[op])
	}
	return o.opText[op]
}

// auditChange appends the audit row of input change c to o.Values and returns the insert
// that refers to it; key and row are c's key and row, sliced from the input's values.
func (o *out) auditChange(p *plan, c types.Change, key, row []types.Value) types.Change {
	start := uint32(len(o.Values))
	o.Values = append(o.Values,
		types.MakeValueText(o.lsn(c.Position)),
		types.MakeValueInt8(int64(c.Position.Ordinal)),
		types.MakeValueText(o.op(c.Op)))
	for i := 0; i < p.keyCols; i++ {
		v := types.MakeValueNull() // truncate: no key
		if i < len(key) {
			v = key[i] // its span, if any, still points at the input's bytes
		}
		o.Values = append(o.Values, v)
	}
	for _, src := range p.copied {
		// NULL for a delete (no row), and for `unchanged`: the audit row is an insert, and an
		// insert has no old value for the sink to keep.
		v := types.MakeValueNull()
		if src < len(row) && row[src].Tag() != types.Value_Unchanged {
			v = row[src]
		}
		o.Values = append(o.Values, v)
	}
	// The source change's position (the host numbers the two apart). The key, change_lsn
	// and change_ordinal, is the row's first two values: a span of the row's span.
	return types.Change{
		Table:    p.audit,
		Op:       types.Op_Insert,
		Position: c.Position,
		Key:      types.Span{Start: start, Len: 2},
		OldKey:   witTypes.None[types.Span](),
		Values:   types.Span{Start: start, Len: uint32(p.width())},
	}
}

// spanOf returns the values s refers to, or an error if it runs past the list.
func spanOf(values []types.Value, s types.Span) ([]types.Value, error) {
	end := uint64(s.Start) + uint64(s.Len)
	if end > uint64(len(values)) {
		return nil, fmt.Errorf("span %d+%d runs past the %d values", s.Start, s.Len, len(values))
	}
	return values[s.Start:end], nil
}

// Transform passes every change and adds an audit row after each change of the source table.
func Transform(batch types.Batch) witTypes.Result[types.Output, string] {
	if cfg == nil {
		return witTypes.Err[types.Output]("transform called before init")
	}
	// With automatic collection off (see init), collect here: the previous call's output has
	// been copied out by now, and nothing is being lowered into our memory.
	runtime.GC()

	// The output's tables: the input's, same indexes, then one audit table per source table
	// that matches (a bare `table` matches its name in every schema).
	tables := batch.Tables
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

	// Count the audit rows first, to size the output once.
	splits, extraValues := 0, 0
	for i, c := range batch.Changes {
		if int(c.Table) >= len(plans) {
			return witTypes.Err[types.Output](fmt.Sprintf("change %d refers to table #%d of %d", i, c.Table, len(plans)))
		}
		if p := plans[c.Table]; p != nil {
			splits++
			extraValues += p.width()
		}
	}
	o := out{
		Output: types.Output{
			Tables: tables,
			// The input's values, as they came: every input change keeps its spans. Grow
			// copies them once (the bindings size the list exactly), then rows are appended.
			Values:  slices.Grow(batch.Values, extraValues),
			Changes: batch.Changes,
			Errors:  []types.ChangeError{},
		},
		dataBase: uint32(len(batch.Data)),
	}
	if splits == 0 {
		return witTypes.Ok[types.Output, string](o.Output) // nothing to split: all passes as it came
	}

	// Room for an LSN per row (PostgreSQL's take at most 17 characters) and the op names;
	// append grows it if that is short.
	o.Data = make([]byte, 0, 17*splits+26)
	o.Changes = make([]types.Change, 0, len(batch.Changes)+splits)
	for i, c := range batch.Changes {
		o.Changes = append(o.Changes, c) // as it came: its spans still hold in o.Values
		p := plans[c.Table]
		if p == nil {
			continue
		}
		key, err := spanOf(batch.Values, c.Key)
		var row []types.Value
		if err == nil {
			row, err = spanOf(batch.Values, c.Values)
		}
		if err != nil {
			return witTypes.Err[types.Output](fmt.Sprintf("change %d: %v", i, err))
		}
		o.Changes = append(o.Changes, o.auditChange(p, c, key, row))
	}
	return witTypes.Ok[types.Output, string](o.Output)
}
