package transform

import (
	"fmt"
	"strconv"
	"strings"

	types "zipline/transform/wit/zipline_transform_types"

	witTypes "go.bytecodealliance.org/pkg/wit/types"
)

// Change is one change of a batch, read and edited in place.
//
// A column is a name (a string, "email") or an index into the table's columns (an int, 1).
// Getters read the new row (for a delete: its key columns); the second result is false when
// the table has no such column, the change holds no value for it, or the value is of
// another kind. Setters write new values; setting a key column sets the change's key too.
// An error from a setter, returned from Transform.Change, refuses the change.
type Change struct {
	out     *out
	raw     types.Change
	dropped bool
}

func (c *Change) shape() *types.Table { return &c.out.tables[c.raw.Table] }

// Op returns what the change does: Insert, Update, Delete or Truncate.
func (c *Change) Op() Op { return Op(c.raw.Op) }

// Position returns where the change sits in commit order.
func (c *Change) Position() Position { return c.raw.Position }

// LSN returns the change's commit LSN as PostgreSQL prints it ("0/7000028").
func (c *Change) LSN() string {
	p, o := c.raw.Position, c.out
	// An emitting transform asks this for every change, and a transaction's changes share
	// their LSN: the last one's text is kept.
	if o.lsn != "" && p.LsnHigh == o.lsnHigh && p.LsnLow == o.lsnLow {
		return o.lsn
	}
	if p.LsnHigh != 0 {
		o.lsn = fmt.Sprintf("0x%04X%016X", p.LsnHigh, p.LsnLow)
	} else {
		// By hand, not fmt.
		var buf [17]byte
		b := appendHex(buf[:0], p.LsnLow>>32)
		o.lsn = string(appendHex(append(b, '/'), p.LsnLow&0xFFFF_FFFF))
	}
	o.lsnHigh, o.lsnLow = p.LsnHigh, p.LsnLow
	return o.lsn
}

// appendHex appends n in upper-case hex without leading zeros, as PostgreSQL prints LSNs.
func appendHex(b []byte, n uint64) []byte {
	i := len(b)
	for {
		b = append(b, "0123456789ABCDEF"[n&0xF])
		if n >>= 4; n == 0 {
			break
		}
	}
	for j := len(b) - 1; i < j; i, j = i+1, j-1 {
		b[i], b[j] = b[j], b[i]
	}
	return b
}

// Schema returns the table's schema.
func (c *Change) Schema() string { return c.shape().Schema }

// Table returns the table's name.
func (c *Change) Table() string { return c.shape().Name }

// Shape returns the table's shape: its schema, name and columns (do not modify it).
func (c *Change) Shape() Table { return *c.shape() }

// IsTable reports whether the change's table is name: `schema.table`, or a bare table name
// for any schema.
func (c *Change) IsTable(name string) bool {
	if dot := strings.LastIndexByte(name, '.'); dot >= 0 {
		return c.Table() == name[dot+1:] && c.Schema() == name[:dot]
	}
	return c.Table() == name
}

// Columns returns the table's column names, in order.
func (c *Change) Columns() []string {
	cols := c.shape().Columns
	names := make([]string, len(cols))
	for i, col := range cols {
		names[i] = col.Name
	}
	return names
}

// Column returns the shape of column col (name, type, whether it is a key column).
func (c *Change) Column(col any) (Column, bool) {
	i, ok := c.index(col)
	if !ok {
		return Column{}, false
	}
	return c.shape().Columns[i], true
}

// KeyColumns returns the names of the table's key columns, in order.
func (c *Change) KeyColumns() []string {
	var keys []string
	for _, col := range c.shape().Columns {
		if col.IsKey {
			keys = append(keys, col.Name)
		}
	}
	return keys
}

// HasColumn reports whether the table has column col.
func (c *Change) HasColumn(col any) bool {
	_, ok := c.index(col)
	return ok
}

func (c *Change) index(col any) (int, bool) {
	switch col := col.(type) {
	case string:
		i, ok := c.out.shape(c.raw.Table).index[col]
		return i, ok
	case int:
		return col, col >= 0 && col < len(c.shape().Columns)
	}
	return 0, false
}

func (c *Change) indexOf(col any) (int, error) {
	i, ok := c.index(col)
	if !ok {
		name := fmt.Sprintf("%q", col)
		if n, isInt := col.(int); isInt {
			name = strconv.Itoa(n)
		}
		return 0, fmt.Errorf("%s.%s has no column %s (it has %s)", c.Schema(), c.Table(), name,
			strings.Join(c.Columns(), ", "))
	}
	return i, nil
}

// slot returns where column i's value is in the values list: the row, or for a delete the
// key.
func (c *Change) slot(i int) (int, bool) {
	if i < int(c.raw.Values.Len) {
		return int(c.raw.Values.Start) + i, true
	}
	k := c.out.shape(c.raw.Table).keys[i]
	if k >= 0 && k < int(c.raw.Key.Len) {
		return int(c.raw.Key.Start) + k, true
	}
	return 0, false
}

// slots returns every slot holding column i: the row, the key and, with oldKey, an update's
// old key.
func (c *Change) slots(i int, oldKey bool) []int {
	var slots []int
	if i < int(c.raw.Values.Len) {
		slots = append(slots, int(c.raw.Values.Start)+i)
	}
	k := c.out.shape(c.raw.Table).keys[i]
	if k < 0 {
		return slots
	}
	spans := []types.Span{c.raw.Key}
	if oldKey && c.raw.OldKey.IsSome() {
		spans = append(spans, c.raw.OldKey.Some())
	}
	for _, s := range spans {
		if k >= int(s.Len) {
			continue
		}
		slot, seen := int(s.Start)+k, false
		for _, x := range slots {
			seen = seen || x == slot // a slot listed twice would be rewritten twice
		}
		if !seen {
			slots = append(slots, slot)
		}
	}
	return slots
}

// Get returns the value of col (Null and false when there is none).
func (c *Change) Get(col any) (Value, bool) {
	w, ok := c.value(col)
	if !ok {
		return Value{}, false
	}
	return Value{c.out.cell(c.out.decode(w))}, true
}

// value returns the contract's value of col, as Get finds it.
func (c *Change) value(col any) (types.Value, bool) {
	i, ok := c.index(col)
	if !ok {
		return types.Value{}, false
	}
	slot, ok := c.slot(i)
	if !ok {
		return types.Value{}, false
	}
	return c.out.values[slot], true
}

// Kind returns the variant of col's value.
func (c *Change) Kind(col any) (Kind, bool) {
	i, ok := c.index(col)
	if !ok {
		return 0, false
	}
	slot, ok := c.slot(i)
	if !ok {
		return 0, false
	}
	return Kind(c.out.values[slot].Tag()), true
}

// GetStr returns the text of a text, numeric, json or other-typed column.
func (c *Change) GetStr(col any) (string, bool) {
	w, ok := c.value(col)
	if !ok {
		return "", false
	}
	v := c.out.decode(w)
	return Value{&v}.Str()
}

// GetInt returns an integer column of any width.
func (c *Change) GetInt(col any) (int64, bool) {
	w, ok := c.value(col)
	if !ok {
		return 0, false
	}
	v := c.out.decode(w)
	return Value{&v}.Int()
}

// GetFloat returns a float column (or an integer one, converted).
func (c *Change) GetFloat(col any) (float64, bool) {
	w, ok := c.value(col)
	if !ok {
		return 0, false
	}
	v := c.out.decode(w)
	return Value{&v}.Float()
}

// GetBool returns a boolean column.
func (c *Change) GetBool(col any) (bool, bool) {
	w, ok := c.value(col)
	if !ok {
		return false, false
	}
	v := c.out.decode(w)
	return Value{&v}.Bool()
}

// IsNull reports whether col is SQL NULL.
func (c *Change) IsNull(col any) bool {
	k, ok := c.Kind(col)
	return ok && k == KindNull
}

// Set sets col to x, a Value or a plain Go value (nil for NULL, a bool, a string, a []byte,
// an integer or a float; see valueOf); a key column's key value follows. The error names a
// column the table lacks, or a value that does not fit it.
func (c *Change) Set(col any, x any) error {
	i, err := c.indexOf(col)
	if err != nil {
		return err
	}
	var tmp cell
	v, err := valueOf(x, &tmp)
	if err != nil {
		return fmt.Errorf("column %s: %v", c.shape().Columns[i].Name, err)
	}
	var current *types.Value
	if slot, ok := c.slot(i); ok {
		current = &c.out.values[slot]
	}
	w, err := c.out.lower(c.shape().Columns[i], v, current)
	if err != nil {
		return err
	}
	for _, slot := range c.slots(i, false) {
		c.out.values[slot] = w
	}
	return nil
}

// SetStr sets col to the string s (see Text for the kind it takes).
func (c *Change) SetStr(col any, s string) error { return c.Set(col, Text(s)) }

// SetInt sets col to n, written at the column's width.
func (c *Change) SetInt(col any, n int64) error { return c.Set(col, Int(n)) }

// SetNull sets col to SQL NULL.
func (c *Change) SetNull(col any) error { return c.Set(col, Null) }

// MapStr replaces the text of col by f(text) everywhere the change holds it: the row, the
// key and, for an update that changed its key, the old key. A deterministic f (a mask, a
// hash) keeps every row findable by its transformed key. NULL, unchanged and non-text values
// are left alone, and so is a text f returns as it was (its span is kept).
func (c *Change) MapStr(col any, f func(string) string) error {
	i, err := c.indexOf(col)
	if err != nil {
		return err
	}
	values := c.out.values
	for _, slot := range c.slots(i, true) {
		w := values[slot]
		switch w.Tag() {
		case types.Value_Text, types.Value_Numeric, types.Value_Json:
			var span types.Span
			switch w.Tag() {
			case types.Value_Text:
				span = w.Text()
			case types.Value_Numeric:
				span = w.Numeric()
			default:
				span = w.Json()
			}
			s := c.out.text(span)
			if next := f(s); next != s {
				span = c.out.appendText(next)
				switch w.Tag() {
				case types.Value_Text:
					values[slot] = types.MakeValueText(span)
				case types.Value_Numeric:
					values[slot] = types.MakeValueNumeric(span)
				default:
					values[slot] = types.MakeValueJson(span)
				}
			}
		case types.Value_Other:
			other := w.Other()
			s := c.out.text(other.Text)
			if next := f(s); next != s {
				other.Text = c.out.appendText(next)
				values[slot] = types.MakeValueOther(other)
			}
		}
	}
	return nil
}

// MapBytes is MapStr for bytea values: f gets a copy of the bytes.
func (c *Change) MapBytes(col any, f func([]byte) []byte) error {
	i, err := c.indexOf(col)
	if err != nil {
		return err
	}
	for _, slot := range c.slots(i, true) {
		w := c.out.values[slot]
		if w.Tag() != types.Value_Bytes {
			continue
		}
		b := c.out.bytes(w.Bytes())
		if next := f(append([]byte(nil), b...)); string(next) != string(b) {
			c.out.values[slot] = types.MakeValueBytes(c.out.appendBytes(next))
		}
	}
	return nil
}

// Drop drops the change: nothing of it reaches the sinks (changes it emitted still do).
func (c *Change) Drop() { c.dropped = true }

// Keep undoes Drop.
func (c *Change) Keep() { c.dropped = false }

// Dropped reports whether the change is dropped.
func (c *Change) Dropped() bool { return c.dropped }

// reshape gives the change the table shape make(current shape), which key names.
func (c *Change) reshape(key reshapeKey, make func(types.Table) types.Table) {
	c.raw.Table = c.reshaped(key, make)
}

// reshaped returns the index of the table shape make(current shape), which key names,
// building it on the first use in the batch.
func (c *Change) reshaped(key reshapeKey, make func(types.Table) types.Table) uint32 {
	key.table = c.raw.Table
	index, ok := c.out.reshaped[key]
	if !ok {
		index = c.out.table(make(*c.shape()))
		if c.out.reshaped == nil {
			c.out.reshaped = map[reshapeKey]uint32{}
		}
		c.out.reshaped[key] = index
	}
	return index
}

// RenameTable moves the change to table schema.name (same columns).
func (c *Change) RenameTable(schema, name string) {
	c.reshape(reshapeKey{edit: 't', a: schema, b: name}, func(t types.Table) types.Table {
		return types.Table{Schema: schema, Name: name, Columns: t.Columns}
	})
}

// RenameColumn renames col to newName.
func (c *Change) RenameColumn(col any, newName string) error {
	i, err := c.indexOf(col)
	if err != nil {
		return err
	}
	c.reshape(reshapeKey{edit: 'c', col: i, a: newName}, func(t types.Table) types.Table {
		t.Columns = append([]types.Column(nil), t.Columns...)
		t.Columns[i].Name = newName
		return t
	})
	return nil
}

// DropColumn removes col, which may not be a key column, from the change and its table.
func (c *Change) DropColumn(col any) error {
	i, err := c.indexOf(col)
	if err != nil {
		return err
	}
	t := c.shape()
	if t.Columns[i].IsKey {
		return fmt.Errorf("cannot drop key column %s of %s.%s", t.Columns[i].Name, t.Schema, t.Name)
	}
	if row := c.raw.Values; i < int(row.Len) {
		// The row without it goes to the end of the list: copies emitted earlier keep theirs.
		start := uint32(len(c.out.values))
		for j := 0; j < int(row.Len); j++ {
			if j != i {
				c.out.values = append(c.out.values, c.out.values[int(row.Start)+j])
			}
		}
		c.raw.Values = types.Span{Start: start, Len: row.Len - 1}
	}
	c.reshape(reshapeKey{edit: 'd', col: i}, func(t types.Table) types.Table {
		cols := make([]types.Column, 0, len(t.Columns)-1)
		t.Columns = append(append(cols, t.Columns[:i]...), t.Columns[i+1:]...)
		return t
	})
	return nil
}

// copySpan appends the values of s again and returns their span, so that later edits of
// this change leave a copy as it was (the Values are copied, never their bytes).
func (c *Change) copySpan(s types.Span) types.Span {
	start := uint32(len(c.out.values))
	c.out.values = append(c.out.values, c.out.values[s.Start:s.Start+s.Len]...)
	return types.Span{Start: start, Len: s.Len}
}

// EmitCopy emits a copy of the change as it is now (same op, position, key and values) into
// table schema.name of the same columns, after this change.
func (c *Change) EmitCopy(schema, name string) {
	copied := c.raw
	copied.Table = c.reshaped(reshapeKey{edit: 'e', a: schema, b: name}, func(t types.Table) types.Table {
		return types.Table{Schema: schema, Name: name, Columns: t.Columns}
	})
	n := c.raw.Key.Len + c.raw.Values.Len
	if c.raw.OldKey.IsSome() {
		n += c.raw.OldKey.Some().Len
	}
	c.out.reserve(int(n), 1)
	copied.Key = c.copySpan(c.raw.Key)
	if c.raw.OldKey.IsSome() {
		copied.OldKey = witTypes.Some(c.copySpan(c.raw.OldKey.Some()))
	}
	copied.Values = c.copySpan(c.raw.Values)
	c.out.changes = append(c.out.changes, copied)
}

// Emit emits a new change of op into table t with the row values (one per column, each a
// Value or a plain Go value as Set takes; for a delete only the key columns' matter), after
// this change and with its position. Its key is taken from the key columns. Each table is
// listed once in the output, however many changes are emitted into it.
func (c *Change) Emit(op Op, t Table, values ...any) error {
	if len(values) != len(t.Columns) {
		return fmt.Errorf("emit into %s.%s: %d values for %d columns", t.Schema, t.Name,
			len(values), len(t.Columns))
	}
	if op > Truncate {
		return fmt.Errorf("emit into %s.%s: no op %d", t.Schema, t.Name, uint8(op))
	}
	o, p := c.out, c.out.prepare(t)
	whole := op == Insert || op == Update
	// The row, then (unless it is a span of the row) the key, straight into the values list.
	n := len(p.keys)
	if whole && p.adjacent {
		n = len(values)
	} else if whole {
		n += len(values)
	}
	o.reserve(n, 1)
	start := len(o.values)
	for i, x := range values {
		var tmp cell
		v, err := valueOf(x, &tmp)
		if err == nil {
			var w types.Value
			if w, err = o.lower(p.table.Columns[i], v, nil); err == nil {
				if whole || p.table.Columns[i].IsKey {
					o.values = append(o.values, w)
				}
				continue
			}
		} else {
			err = fmt.Errorf("emit into %s.%s, column %s: %v", t.Schema, t.Name, t.Columns[i].Name, err)
		}
		o.values = o.values[:start]
		return err
	}
	row := types.Span{Start: uint32(start)}
	key := types.Span{Start: uint32(start), Len: uint32(len(p.keys))}
	switch {
	case op == Truncate:
		o.values = o.values[:start] // no key
		key.Len = 0
	case !whole: // a delete: the key columns are all there is
	case p.adjacent:
		// The key columns lie side by side in the row: the key is a span of the row's span.
		row.Len = uint32(len(values))
		key.Start += uint32(p.keys[0])
	default:
		row.Len = uint32(len(values))
		key.Start = uint32(len(o.values))
		for _, i := range p.keys {
			o.values = append(o.values, o.values[start+i])
		}
	}
	o.changes = append(o.changes, types.Change{
		Table:    p.index,
		Op:       uint8(op),
		Position: c.raw.Position,
		Key:      key,
		OldKey:   witTypes.None[types.Span](),
		Values:   row,
	})
	return nil
}

// Filter keeps only rows for which keep holds, correctly across updates: an insert that
// fails is dropped; an update that fails becomes a delete of its (old) key, since the row
// may have matched before; an update that holds goes on as an update, which the sinks apply
// as an upsert of the whole new row. Deletes and truncates pass. The sink table then equals
// `SELECT … WHERE keep` on the source, provided keep reads only the row's own values and
// the table sends whole rows (REPLICA IDENTITY FULL, `row_filter: true`; see README.md).
func (c *Change) Filter(keep func(row *Change) bool) {
	switch Op(c.raw.Op) {
	case Insert:
		if !keep(c) {
			c.dropped = true
		}
	case Update:
		if !keep(c) {
			c.raw.Op = uint8(Delete)
			if c.raw.OldKey.IsSome() {
				c.raw.Key = c.raw.OldKey.Some()
			}
			c.raw.OldKey = witTypes.None[types.Span]()
			c.raw.Values.Len = 0
		}
	}
}
