package transform

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"unsafe"

	types "zipline/transform/wit/zipline_transform_types"

	witTypes "go.bytecodealliance.org/pkg/wit/types"
)

// out is the output being built from one batch: the input's values list, edited in place,
// and the new bytes new texts point at (counting on from the end of the input's data).
type out struct {
	input   []byte
	base    uint32
	data    []byte
	values  []types.Value
	tables  []types.Table
	changes []types.Change
	errors  []types.ChangeError
	epoch   uint64
	// The input's number of changes and the index of the one being run, to size the lists
	// once when a change first emits.
	inputs, index int
	// Per table index, built on first use.
	shapes []*shape
	// A batch's changes of one table get the same edits: each new shape is built once.
	reshaped map[reshapeKey]uint32
	// The tables changes were emitted into, each prepared once; last is the one used last.
	prepared []*prepared
	last     int
	// The Values Get read, a block at a time.
	cells []cell
	// New texts written, by a hash of their kind and text: one written again is the same
	// value (its span), neither appended nor made again.
	texts [64]newText
	// The text of the last LSN asked for, and its position.
	lsn             string
	lsnHigh, lsnLow uint64
}

type shape struct {
	index map[string]int // column name -> index (the first, should two share a name)
	keys  []int          // each column's position in the key, -1 for a non-key column
}

type reshapeKey struct {
	table uint32
	edit  byte
	col   int
	a, b  string
}

// prepared is a table changes are emitted into: its own copy of the shape (an Emit's table
// may be modified after), its index in the output's tables and its key columns.
type prepared struct {
	table    types.Table
	index    uint32
	keys     []int // the key columns' indexes
	adjacent bool  // the key columns lie side by side
}

type newText struct {
	tag uint8 // 0: none
	s   string
	w   types.Value
}

func (o *out) bytes(s types.Span) []byte {
	start, end := uint64(s.Start), uint64(s.Start)+uint64(s.Len)
	if start >= uint64(o.base) {
		start, end = start-uint64(o.base), end-uint64(o.base)
		if end > uint64(len(o.data)) {
			return nil
		}
		return o.data[start:end]
	}
	if end > uint64(len(o.input)) {
		return nil
	}
	return o.input[start:end]
}

// text returns the bytes of s as a string without copying them: neither the input's data
// nor the bytes already appended change while the batch runs.
func (o *out) text(s types.Span) string {
	b := o.bytes(s)
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

func (o *out) appendText(s string) types.Span {
	start := o.base + uint32(len(o.data))
	o.data = append(o.data, s...)
	return types.Span{Start: start, Len: uint32(len(s))}
}

func (o *out) appendBytes(b []byte) types.Span {
	start := o.base + uint32(len(o.data))
	o.data = append(o.data, b...)
	return types.Span{Start: start, Len: uint32(len(b))}
}

// cell returns a new cell for a Value, from the batch's current block (a Value points at
// its cell: a block is freed when no Value points into it).
func (o *out) cell(c cell) *cell {
	if len(o.cells) == cap(o.cells) {
		n := 2 * cap(o.cells)
		if n < 16 {
			n = 16
		} else if n > 512 {
			n = 512
		}
		o.cells = make([]cell, 0, n)
	}
	o.cells = append(o.cells, c)
	return &o.cells[len(o.cells)-1]
}

// newText returns a text, json or numeric value (tag) of s, appending s to the output's data
// unless the batch wrote the same value already (an emitting transform writes the same LSN
// and op names over and over).
func (o *out) newText(tag uint8, s string) types.Value {
	if len(s) > 64 {
		return makeSpan(tag, o.appendText(s))
	}
	h := uint32(2166136261) ^ uint32(tag)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	e := &o.texts[(h^h>>16)%uint32(len(o.texts))]
	if e.tag == tag && e.s == s {
		return e.w
	}
	span := o.appendText(s)
	w := makeSpan(tag, span)
	*e = newText{tag: tag, s: o.text(span), w: w}
	return w
}

func makeSpan(tag uint8, s types.Span) types.Value {
	switch tag {
	case types.Value_Json:
		return types.MakeValueJson(s)
	case types.Value_Numeric:
		return types.MakeValueNumeric(s)
	}
	return types.MakeValueText(s)
}

// reserve makes room for values more values and changes more changes. A list that must
// grow gets room for as many again for each change left in the batch (the changes list: for
// each, itself and one emitted), since a transform that emits from one change mostly emits
// from the next: the lists are then copied once rather than at each of append's steps (whose
// old arrays stay until the next batch's collection, see init). It grows to at most twice
// its capacity at a time, in case the estimate is far off.
func (o *out) reserve(values, changes int) {
	left := o.inputs - o.index - 1 // after this change
	o.values = reserve(o.values, values, values*(left+1))
	o.changes = reserve(o.changes, changes, changes+2*left)
}

// reserve returns s with room for need more: s itself when it has it, else a copy with room
// for want more (at least need, at most as many as s has room for in all).
func reserve[E any](s []E, need, want int) []E {
	if cap(s)-len(s) >= need {
		return s
	}
	n := max(need, min(want, cap(s)))
	return append(make([]E, 0, len(s)+n), s...)
}

// prepare returns the prepared table equal to t, preparing it on its first use.
func (o *out) prepare(t types.Table) *prepared {
	if o.last < len(o.prepared) && sameTable(o.prepared[o.last].table, t) {
		return o.prepared[o.last]
	}
	for i, p := range o.prepared {
		if sameTable(p.table, t) {
			o.last = i
			return p
		}
	}
	p := &prepared{table: types.Table{Schema: t.Schema, Name: t.Name, Columns: slices.Clone(t.Columns)}}
	for i, c := range p.table.Columns {
		if c.IsKey {
			p.keys = append(p.keys, i)
		}
	}
	p.adjacent = len(p.keys) > 0 && p.keys[len(p.keys)-1]-p.keys[0] == len(p.keys)-1
	p.index = o.table(p.table)
	o.prepared = append(o.prepared, p)
	o.last = len(o.prepared) - 1
	return p
}

// table returns the index of t in the output's tables, adding it unless an equal one is
// listed.
func (o *out) table(t types.Table) uint32 {
	for i, x := range o.tables {
		if sameTable(x, t) {
			return uint32(i)
		}
	}
	o.tables = append(o.tables, t)
	return uint32(len(o.tables) - 1)
}

func sameTable(a, b types.Table) bool {
	if a.Schema != b.Schema || a.Name != b.Name || len(a.Columns) != len(b.Columns) {
		return false
	}
	for i := range a.Columns {
		if a.Columns[i] != b.Columns[i] {
			return false
		}
	}
	return true
}

func (o *out) shape(table uint32) *shape {
	for len(o.shapes) <= int(table) {
		o.shapes = append(o.shapes, nil)
	}
	if s := o.shapes[table]; s != nil {
		return s
	}
	cols := o.tables[table].Columns
	s := &shape{index: make(map[string]int, len(cols)), keys: make([]int, len(cols))}
	k := 0
	for i, c := range cols {
		if _, dup := s.index[c.Name]; !dup {
			s.index[c.Name] = i
		}
		s.keys[i] = -1
		if c.IsKey {
			s.keys[i] = k
			k++
		}
	}
	o.shapes[table] = s
	return s
}

// decode returns what w holds, remembering w for writing it back as it is.
func (o *out) decode(w types.Value) cell {
	v := cell{kind: Kind(w.Tag()), raw: w, epoch: o.epoch}
	switch w.Tag() {
	case types.Value_Boolean:
		if w.Boolean() {
			v.n = 1
		}
	case types.Value_Int2:
		v.n = int64(w.Int2())
	case types.Value_Int4:
		v.n = int64(w.Int4())
	case types.Value_Int8:
		v.n = w.Int8()
	case types.Value_Float4:
		v.n = int64(math.Float64bits(float64(w.Float4())))
	case types.Value_Float8:
		v.n = int64(math.Float64bits(w.Float8()))
	case types.Value_Numeric:
		v.s = o.text(w.Numeric())
	case types.Value_Text:
		v.s = o.text(w.Text())
	case types.Value_Json:
		v.s = o.text(w.Json())
	case types.Value_Bytes:
		b := o.bytes(w.Bytes())
		v.s = unsafe.String(unsafe.SliceData(b), len(b))
	case types.Value_Other:
		v.oid, v.s = w.Other().TypeOid, o.text(w.Other().Text)
	case types.Value_Date:
		v.n = int64(w.Date())
	case types.Value_Time:
		v.n = w.Time()
	case types.Value_Timestamp:
		v.n = w.Timestamp()
	case types.Value_Timestamptz:
		v.n = w.Timestamptz()
	case types.Value_Uuid:
		u := w.Uuid()
		v.n, v.lo = int64(u.F0), u.F1
	}
	return v
}

// PostgreSQL type OIDs the encoding looks at.
const (
	oidBool        = 16
	oidBytea       = 17
	oidName        = 19
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidText        = 25
	oidJSON        = 114
	oidFloat4      = 700
	oidFloat8      = 701
	oidBpchar      = 1042
	oidVarchar     = 1043
	oidDate        = 1082
	oidTime        = 1083
	oidTimestamp   = 1114
	oidTimestampTZ = 1184
	oidNumeric     = 1700
	oidUUID        = 2950
	oidJSONB       = 3802
)

// lower returns the contract's form of v for column c, whose value is now current (if
// any): integers at the column's width, strings in the kind of the current value, else of
// the column's type. A value read from this batch that keeps its variant is given back as
// it was read (its span still holds, so its bytes are not copied, and nothing is made).
func (o *out) lower(c types.Column, v *cell, current *types.Value) (types.Value, error) {
	var raw *types.Value
	if v.epoch == o.epoch {
		raw = &v.raw
		switch v.kind {
		case KindNumeric, KindJSON, KindBytes, KindOther, KindDate, KindTime, KindTimestamp,
			KindTimestampTZ, KindUUID, KindNull, KindUnchanged, KindBool:
			return v.raw, nil
		case KindText:
			span := v.raw.Text()
			return o.lowerString(c, v.s, current, &span, raw)
		}
	}
	switch v.kind {
	case KindNull:
		return types.MakeValueNull(), nil
	case KindUnchanged:
		return types.MakeValueUnchanged(), nil
	case KindBool:
		return types.MakeValueBoolean(v.n != 0), nil
	case KindInt2, KindInt4, KindInt8:
		return o.lowerInt(c, v.n, raw)
	case KindFloat4, KindFloat8:
		return o.lowerFloat(c, v, raw)
	case KindText:
		return o.lowerString(c, v.s, current, nil, nil)
	case KindNumeric:
		return o.newText(types.Value_Numeric, v.s), nil
	case KindJSON:
		return o.newText(types.Value_Json, v.s), nil
	case KindBytes:
		return types.MakeValueBytes(o.appendBytes(v.bytes())), nil
	case KindOther:
		return types.MakeValueOther(types.OtherValue{TypeOid: v.oid, Text: o.appendText(v.s)}), nil
	case KindDate:
		return types.MakeValueDate(int32(v.n)), nil
	case KindTime:
		return types.MakeValueTime(v.n), nil
	case KindTimestamp:
		return types.MakeValueTimestamp(v.n), nil
	case KindTimestampTZ:
		return types.MakeValueTimestamptz(v.n), nil
	case KindUUID:
		return types.MakeValueUuid(witTypes.Tuple2[uint64, uint64]{F0: uint64(v.n), F1: v.lo}), nil
	}
	return types.Value{}, fmt.Errorf("column %s: cannot write a value of kind %v", c.Name, v.kind)
}

// lowerInt writes n at column c's width; raw, if given, is n as read from this batch, given
// back when it has that width.
func (o *out) lowerInt(c types.Column, n int64, raw *types.Value) (types.Value, error) {
	tag, bits := types.Value_Int8, uint(64)
	switch c.TypeOid {
	case oidInt2:
		tag, bits = types.Value_Int2, 16
	case oidInt4:
		tag, bits = types.Value_Int4, 32
	case oidDate:
		tag, bits = types.Value_Date, 32
	case oidTime:
		tag = types.Value_Time
	case oidTimestamp:
		tag = types.Value_Timestamp
	case oidTimestampTZ:
		tag = types.Value_Timestamptz
	case oidFloat4:
		return types.MakeValueFloat4(float32(n)), nil
	case oidFloat8:
		return types.MakeValueFloat8(float64(n)), nil
	case oidNumeric:
		return o.newText(types.Value_Numeric, strconv.FormatInt(n, 10)), nil
	}
	if bits < 64 && (n < -(1<<(bits-1)) || n >= 1<<(bits-1)) {
		return types.Value{}, fmt.Errorf("%d does not fit column %s", n, c.Name)
	}
	if raw != nil && raw.Tag() == tag {
		return *raw, nil
	}
	switch tag {
	case types.Value_Int2:
		return types.MakeValueInt2(int16(n)), nil
	case types.Value_Int4:
		return types.MakeValueInt4(int32(n)), nil
	case types.Value_Date:
		return types.MakeValueDate(int32(n)), nil
	case types.Value_Time:
		return types.MakeValueTime(n), nil
	case types.Value_Timestamp:
		return types.MakeValueTimestamp(n), nil
	case types.Value_Timestamptz:
		return types.MakeValueTimestamptz(n), nil
	}
	return types.MakeValueInt8(n), nil
}

// lowerFloat writes v's float for column c; raw as for lowerInt.
func (o *out) lowerFloat(c types.Column, v *cell, raw *types.Value) (types.Value, error) {
	f := v.float()
	switch c.TypeOid {
	case oidFloat4:
		if raw != nil && raw.Tag() == types.Value_Float4 {
			return *raw, nil
		}
		return types.MakeValueFloat4(float32(f)), nil
	case oidFloat8:
		if raw != nil && raw.Tag() == types.Value_Float8 {
			return *raw, nil
		}
		return types.MakeValueFloat8(f), nil
	case oidNumeric:
		s := strconv.FormatFloat(f, 'f', -1, 64)
		switch {
		case math.IsNaN(f):
			s = "NaN"
		case math.IsInf(f, 1):
			s = "Infinity"
		case math.IsInf(f, -1):
			s = "-Infinity"
		}
		return o.newText(types.Value_Numeric, s), nil
	case oidInt2, oidInt4, oidInt8:
		if f != math.Trunc(f) || f < -(1<<63) || f >= 1<<63 {
			return types.Value{}, fmt.Errorf("%v does not fit column %s", f, c.Name)
		}
		return o.lowerInt(c, int64(f), nil)
	}
	if raw != nil {
		return *raw, nil // float4 or float8, as it was read
	}
	if v.kind == KindFloat4 {
		return types.MakeValueFloat4(float32(f)), nil
	}
	return types.MakeValueFloat8(f), nil
}

// lowerString writes s as the kind current or the column calls for; at span, if given, are
// its bytes already, and raw, if given, is s as read from this batch (a text), given back
// when it stays a text.
func (o *out) lowerString(c types.Column, s string, current *types.Value, at *types.Span, raw *types.Value) (types.Value, error) {
	kind := KindOther
	if current != nil && current.Tag() != types.Value_Null && current.Tag() != types.Value_Unchanged {
		kind = Kind(current.Tag())
	} else {
		switch c.TypeOid {
		case oidJSON, oidJSONB:
			kind = KindJSON
		case oidNumeric:
			kind = KindNumeric
		case oidUUID:
			kind = KindUUID
		case oidBool, oidBytea, oidName, oidInt8, oidInt2, oidInt4, oidText, oidFloat4, oidFloat8,
			oidBpchar, oidVarchar, oidDate, oidTime, oidTimestamp, oidTimestampTZ:
			kind = KindText
		}
	}
	switch kind {
	case KindUUID:
		hi, lo, ok := parseUUID(s)
		if !ok {
			return types.Value{}, fmt.Errorf("column %s: `%s` is not a UUID", c.Name, s)
		}
		return types.MakeValueUuid(witTypes.Tuple2[uint64, uint64]{F0: hi, F1: lo}), nil
	case KindOther:
		oid := c.TypeOid
		if current != nil && current.Tag() == types.Value_Other {
			oid = current.Other().TypeOid
		}
		var span types.Span
		if at != nil {
			span = *at
		} else {
			span = o.appendText(s)
		}
		return types.MakeValueOther(types.OtherValue{TypeOid: oid, Text: span}), nil
	case KindJSON, KindNumeric:
	default:
		kind = KindText
		if raw != nil && raw.Tag() == types.Value_Text {
			return *raw, nil
		}
	}
	if at != nil {
		return makeSpan(uint8(kind), *at), nil
	}
	return o.newText(uint8(kind), s), nil
}
