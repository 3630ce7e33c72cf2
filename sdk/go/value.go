package transform

import (
	"fmt"
	"math"
	"strconv"
	"unsafe"

	types "zipline/transform/wit/zipline_transform_types"
)

// Kind is a value's variant in the contract.
type Kind uint8

// The kinds, as the contract numbers them.
const (
	KindNull        = Kind(types.Value_Null)
	KindBool        = Kind(types.Value_Boolean)
	KindInt2        = Kind(types.Value_Int2)
	KindInt4        = Kind(types.Value_Int4)
	KindInt8        = Kind(types.Value_Int8)
	KindFloat4      = Kind(types.Value_Float4)
	KindFloat8      = Kind(types.Value_Float8)
	KindNumeric     = Kind(types.Value_Numeric)
	KindText        = Kind(types.Value_Text)
	KindBytes       = Kind(types.Value_Bytes)
	KindDate        = Kind(types.Value_Date)
	KindTime        = Kind(types.Value_Time)
	KindTimestamp   = Kind(types.Value_Timestamp)
	KindTimestampTZ = Kind(types.Value_Timestamptz)
	KindUUID        = Kind(types.Value_Uuid)
	KindJSON        = Kind(types.Value_Json)
	KindOther       = Kind(types.Value_Other)
	KindUnchanged   = Kind(types.Value_Unchanged)
)

var kindNames = [...]string{"null", "boolean", "int2", "int4", "int8", "float4", "float8",
	"numeric", "text", "bytes", "date", "time", "timestamp", "timestamptz", "uuid", "json",
	"other", "unchanged"}

// String returns the variant's name in the contract ("text", "int8", "unchanged", ...).
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Value is a column value. Make one with Text, Int, Float, ... to write it; Change.Get reads
// one. A value read from a batch and written back into the same batch (Set, Emit) keeps its
// span: its bytes are not copied. The zero Value is Null.
//
// A Value is one pointer, to its immutable contents (for one read from a batch, in a block
// the batch allocates once for many): passing it as an `any` (Set, Emit) allocates nothing.
type Value struct{ p *cell }

// cell is what a Value holds (72 bytes). It is never modified once made.
type cell struct {
	kind Kind
	oid  uint32 // other's type OID
	// Integers, dates, times, timestamps, a bool as 0 or 1, a float's bits
	// (math.Float64bits), a uuid's high 8 bytes.
	n  int64
	lo uint64 // a uuid's low 8 bytes
	// The text of a text, numeric, json or other value; the bytes of a bytea (see bytes).
	s string
	// The contract's value it was read from, and the batch it belongs to (0: none).
	raw   types.Value
	epoch uint64
}

func floatCell(kind Kind, f float64) cell { return cell{kind: kind, n: int64(math.Float64bits(f))} }

func bytesCell(b []byte) cell {
	return cell{kind: KindBytes, s: unsafe.String(unsafe.SliceData(b), len(b))}
}

func (c *cell) float() float64 { return math.Float64frombits(uint64(c.n)) }

// bytes returns a bytea's bytes (do not modify them).
func (c *cell) bytes() []byte { return unsafe.Slice(unsafe.StringData(c.s), len(c.s)) }

var (
	nullCell      = cell{kind: KindNull}
	unchangedCell = cell{kind: KindUnchanged}
	trueCell      = cell{kind: KindBool, n: 1}
	falseCell     = cell{kind: KindBool}
)

// get returns v's contents (the zero Value's are NULL's). Do not modify them.
func (v Value) get() *cell {
	if v.p == nil {
		return &nullCell
	}
	return v.p
}

// Null is SQL NULL.
var Null = Value{}

// Unchanged is a large (TOASTed) value an update did not touch: the sink keeps what it has.
var Unchanged = Value{&unchangedCell}

// Bool makes a boolean value.
func Bool(b bool) Value {
	if b {
		return Value{&trueCell}
	}
	return Value{&falseCell}
}

// Int makes an integer, written at the width of the column it goes to (int2, int4, int8,
// or a date, time or timestamp for those columns).
func Int(n int64) Value { return Value{&cell{kind: KindInt8, n: n}} }

// Float makes a float, written as float4 into a real column, else as float8.
func Float(f float64) Value {
	c := floatCell(KindFloat8, f)
	return Value{&c}
}

// Text makes a string. Written where the change holds a text, numeric, json or other value
// it takes that kind; elsewhere the column type's (a uuid column parses it).
func Text(s string) Value { return Value{&cell{kind: KindText, s: s}} }

// Numeric makes a numeric from its decimal text.
func Numeric(s string) Value { return Value{&cell{kind: KindNumeric, s: s}} }

// JSON makes a json value from its text.
func JSON(s string) Value { return Value{&cell{kind: KindJSON, s: s}} }

// Bytes makes a bytea value.
func Bytes(b []byte) Value {
	c := bytesCell(b)
	return Value{&c}
}

// Date makes a date: days since 1970-01-01.
func Date(days int32) Value { return Value{&cell{kind: KindDate, n: int64(days)}} }

// Time makes a time: microseconds since midnight.
func Time(micros int64) Value { return Value{&cell{kind: KindTime, n: micros}} }

// Timestamp makes a timestamp: microseconds since 2000-01-01 00:00:00.
func Timestamp(micros int64) Value { return Value{&cell{kind: KindTimestamp, n: micros}} }

// TimestampTZ makes a timestamptz: microseconds since 2000-01-01 00:00:00 UTC.
func TimestampTZ(micros int64) Value { return Value{&cell{kind: KindTimestampTZ, n: micros}} }

// UUID makes a uuid from its 16 bytes, big-endian: high and low 8 bytes.
func UUID(hi, lo uint64) Value { return Value{&cell{kind: KindUUID, n: int64(hi), lo: lo}} }

// Other makes a value of a type the contract does not name: its type OID and text form.
func Other(typeOid uint32, s string) Value { return Value{&cell{kind: KindOther, oid: typeOid, s: s}} }

// IfUnchanged returns fallback when v is Unchanged, else v: a change emitted as an insert
// from an update has no old value for the sink to keep.
func (v Value) IfUnchanged(fallback Value) Value {
	if v.get().kind == KindUnchanged {
		return fallback
	}
	return v
}

// valueOf converts what Set and Emit take: a Value, or nil (NULL), a bool, a string, a
// []byte, an integer or a float. A plain Go value is made in *tmp, which it returns.
func valueOf(x any, tmp *cell) (*cell, error) {
	switch x := x.(type) {
	case Value:
		return x.get(), nil
	case nil:
		return &nullCell, nil
	case bool:
		return Bool(x).p, nil
	case string:
		*tmp = cell{kind: KindText, s: x}
	case []byte:
		*tmp = bytesCell(x)
	case int:
		*tmp = cell{kind: KindInt8, n: int64(x)}
	case int8:
		*tmp = cell{kind: KindInt8, n: int64(x)}
	case int16:
		*tmp = cell{kind: KindInt8, n: int64(x)}
	case int32:
		*tmp = cell{kind: KindInt8, n: int64(x)}
	case int64:
		*tmp = cell{kind: KindInt8, n: x}
	case uint8:
		*tmp = cell{kind: KindInt8, n: int64(x)}
	case uint16:
		*tmp = cell{kind: KindInt8, n: int64(x)}
	case uint32:
		*tmp = cell{kind: KindInt8, n: int64(x)}
	case uint:
		if uint64(x) > math.MaxInt64 {
			return nil, fmt.Errorf("%d does not fit a bigint", x)
		}
		*tmp = cell{kind: KindInt8, n: int64(x)}
	case uint64:
		if x > math.MaxInt64 {
			return nil, fmt.Errorf("%d does not fit a bigint", x)
		}
		*tmp = cell{kind: KindInt8, n: int64(x)}
	case float32:
		*tmp = floatCell(KindFloat4, float64(x))
	case float64:
		*tmp = floatCell(KindFloat8, x)
	default:
		return nil, fmt.Errorf("cannot write a %T", x)
	}
	return tmp, nil
}

// Kind returns the value's variant.
func (v Value) Kind() Kind { return v.get().kind }

// IsNull reports whether v is SQL NULL.
func (v Value) IsNull() bool { return v.get().kind == KindNull }

// IsUnchanged reports whether v is a TOASTed value the update did not touch.
func (v Value) IsUnchanged() bool { return v.get().kind == KindUnchanged }

// Str returns the text of a text, numeric, json or other value.
func (v Value) Str() (string, bool) {
	c := v.get()
	switch c.kind {
	case KindText, KindNumeric, KindJSON, KindOther:
		return c.s, true
	}
	return "", false
}

// Int returns an integer of any width.
func (v Value) Int() (int64, bool) {
	c := v.get()
	switch c.kind {
	case KindInt2, KindInt4, KindInt8:
		return c.n, true
	}
	return 0, false
}

// Float returns a float, or an integer as a float.
func (v Value) Float() (float64, bool) {
	c := v.get()
	switch c.kind {
	case KindFloat4, KindFloat8:
		return c.float(), true
	case KindInt2, KindInt4, KindInt8:
		return float64(c.n), true
	}
	return 0, false
}

// Bool returns a boolean.
func (v Value) Bool() (bool, bool) { c := v.get(); return c.n != 0, c.kind == KindBool }

// Bytes returns the bytes of a bytea value (do not modify them).
func (v Value) Bytes() ([]byte, bool) {
	if c := v.get(); c.kind == KindBytes {
		return c.bytes(), true
	}
	return nil, false
}

// Temporal returns a date (days since 1970-01-01), time (microseconds since midnight) or
// timestamp (microseconds since 2000-01-01) as the contract counts it.
func (v Value) Temporal() (int64, bool) {
	c := v.get()
	switch c.kind {
	case KindDate, KindTime, KindTimestamp, KindTimestampTZ:
		return c.n, true
	}
	return 0, false
}

// UUID returns a uuid's high and low 8 bytes.
func (v Value) UUID() (hi, lo uint64, ok bool) {
	c := v.get()
	return uint64(c.n), c.lo, c.kind == KindUUID
}

// OID returns the type OID of an other-typed value.
func (v Value) OID() (uint32, bool) { c := v.get(); return c.oid, c.kind == KindOther }

// String returns a readable form: the text of a text-like value, a UUID as
// xxxxxxxx-xxxx-..., a number in decimal, NULL, UNCHANGED.
func (v Value) String() string {
	c := v.get()
	switch c.kind {
	case KindNull:
		return "NULL"
	case KindUnchanged:
		return "UNCHANGED"
	case KindBool:
		return strconv.FormatBool(c.n != 0)
	case KindFloat4, KindFloat8:
		return strconv.FormatFloat(c.float(), 'g', -1, 64)
	case KindBytes:
		return fmt.Sprintf("\\x%x", c.bytes())
	case KindUUID:
		return uuidText(uint64(c.n), c.lo)
	case KindText, KindNumeric, KindJSON, KindOther:
		return c.s
	}
	return strconv.FormatInt(c.n, 10)
}

func uuidText(hi, lo uint64) string {
	h := fmt.Sprintf("%016x%016x", hi, lo)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// parseUUID reads a UUID's text, with or without hyphens.
func parseUUID(s string) (hi, lo uint64, ok bool) {
	hex := make([]byte, 0, 32)
	for i := 0; i < len(s); i++ {
		if s[i] != '-' {
			hex = append(hex, s[i])
		}
	}
	if len(hex) != 32 {
		return 0, 0, false
	}
	hi, err1 := strconv.ParseUint(string(hex[:16]), 16, 64)
	lo, err2 := strconv.ParseUint(string(hex[16:]), 16, 64)
	return hi, lo, err1 == nil && err2 == nil
}
