package transform

import (
	"fmt"
	"math"
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
	// Per table index, built on first use.
	shapes []*shape
	// A batch's changes of one table get the same edits: each new shape is built once.
	reshaped map[reshapeKey]uint32
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

// decode makes the Value of w, remembering w for writing it back as it is.
func (o *out) decode(w types.Value) Value {
	v := Value{kind: Kind(w.Tag()), raw: w, epoch: o.epoch}
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
		v.f = float64(w.Float4())
	case types.Value_Float8:
		v.f = w.Float8()
	case types.Value_Numeric:
		v.s = o.text(w.Numeric())
	case types.Value_Text:
		v.s = o.text(w.Text())
	case types.Value_Json:
		v.s = o.text(w.Json())
	case types.Value_Bytes:
		v.b = o.bytes(w.Bytes())
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
		v.u = [2]uint64{w.Uuid().F0, w.Uuid().F1}
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
// the column's type.
func (o *out) lower(c types.Column, v Value, current *types.Value) (types.Value, error) {
	if v.epoch == o.epoch {
		// Read from this batch: its span still holds, so its bytes are not copied.
		switch v.kind {
		case KindNumeric, KindJSON, KindBytes, KindOther:
			return v.raw, nil
		case KindText:
			span := v.raw.Text()
			return o.lowerString(c, v.s, current, &span)
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
		return o.lowerInt(c, v.n)
	case KindFloat4, KindFloat8:
		return o.lowerFloat(c, v)
	case KindText:
		return o.lowerString(c, v.s, current, nil)
	case KindNumeric:
		return types.MakeValueNumeric(o.appendText(v.s)), nil
	case KindJSON:
		return types.MakeValueJson(o.appendText(v.s)), nil
	case KindBytes:
		return types.MakeValueBytes(o.appendBytes(v.b)), nil
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
		return types.MakeValueUuid(witTypes.Tuple2[uint64, uint64]{F0: v.u[0], F1: v.u[1]}), nil
	}
	return types.Value{}, fmt.Errorf("column %s: cannot write a value of kind %v", c.Name, v.kind)
}

func (o *out) lowerInt(c types.Column, n int64) (types.Value, error) {
	fits := func(bits uint) bool { return n >= -(1<<(bits-1)) && n < 1<<(bits-1) }
	misfit := fmt.Errorf("%d does not fit column %s", n, c.Name)
	switch c.TypeOid {
	case oidInt2:
		if !fits(16) {
			return types.Value{}, misfit
		}
		return types.MakeValueInt2(int16(n)), nil
	case oidInt4:
		if !fits(32) {
			return types.Value{}, misfit
		}
		return types.MakeValueInt4(int32(n)), nil
	case oidDate:
		if !fits(32) {
			return types.Value{}, misfit
		}
		return types.MakeValueDate(int32(n)), nil
	case oidTime:
		return types.MakeValueTime(n), nil
	case oidTimestamp:
		return types.MakeValueTimestamp(n), nil
	case oidTimestampTZ:
		return types.MakeValueTimestamptz(n), nil
	case oidFloat4:
		return types.MakeValueFloat4(float32(n)), nil
	case oidFloat8:
		return types.MakeValueFloat8(float64(n)), nil
	case oidNumeric:
		return types.MakeValueNumeric(o.appendText(strconv.FormatInt(n, 10))), nil
	}
	return types.MakeValueInt8(n), nil
}

func (o *out) lowerFloat(c types.Column, v Value) (types.Value, error) {
	f := v.f
	switch c.TypeOid {
	case oidFloat4:
		return types.MakeValueFloat4(float32(f)), nil
	case oidFloat8:
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
		return types.MakeValueNumeric(o.appendText(s)), nil
	case oidInt2, oidInt4, oidInt8:
		if f != math.Trunc(f) || f < -(1<<63) || f >= 1<<63 {
			return types.Value{}, fmt.Errorf("%v does not fit column %s", f, c.Name)
		}
		return o.lowerInt(c, int64(f))
	}
	if v.kind == KindFloat4 {
		return types.MakeValueFloat4(float32(f)), nil
	}
	return types.MakeValueFloat8(f), nil
}

// lowerString writes s as the kind current or the column calls for; at span, if given, are
// its bytes already.
func (o *out) lowerString(c types.Column, s string, current *types.Value, at *types.Span) (types.Value, error) {
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
	text := func() types.Span {
		if at != nil {
			return *at
		}
		return o.appendText(s)
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
		return types.MakeValueOther(types.OtherValue{TypeOid: oid, Text: text()}), nil
	case KindJSON:
		return types.MakeValueJson(text()), nil
	case KindNumeric:
		return types.MakeValueNumeric(text()), nil
	}
	return types.MakeValueText(text()), nil
}
