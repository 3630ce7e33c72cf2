package transform

import (
	"fmt"
	"math"
	"strconv"

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
type Value struct {
	kind Kind
	n    int64 // integers, dates, times, timestamps, a bool as 0 or 1
	f    float64
	s    string // text, numeric, json, other
	b    []byte // bytes
	u    [2]uint64
	oid  uint32 // other's type OID
	// The contract's value it was read from, and the batch it belongs to (0: none).
	raw   types.Value
	epoch uint64
}

// Null is SQL NULL.
var Null = Value{kind: KindNull}

// Unchanged is a large (TOASTed) value an update did not touch: the sink keeps what it has.
var Unchanged = Value{kind: KindUnchanged}

// Bool makes a boolean value.
func Bool(b bool) Value {
	v := Value{kind: KindBool}
	if b {
		v.n = 1
	}
	return v
}

// Int makes an integer, written at the width of the column it goes to (int2, int4, int8,
// or a date, time or timestamp for those columns).
func Int(n int64) Value { return Value{kind: KindInt8, n: n} }

// Float makes a float, written as float4 into a real column, else as float8.
func Float(f float64) Value { return Value{kind: KindFloat8, f: f} }

// Text makes a string. Written where the change holds a text, numeric, json or other value
// it takes that kind; elsewhere the column type's (a uuid column parses it).
func Text(s string) Value { return Value{kind: KindText, s: s} }

// Numeric makes a numeric from its decimal text.
func Numeric(s string) Value { return Value{kind: KindNumeric, s: s} }

// JSON makes a json value from its text.
func JSON(s string) Value { return Value{kind: KindJSON, s: s} }

// Bytes makes a bytea value.
func Bytes(b []byte) Value { return Value{kind: KindBytes, b: b} }

// Date makes a date: days since 1970-01-01.
func Date(days int32) Value { return Value{kind: KindDate, n: int64(days)} }

// Time makes a time: microseconds since midnight.
func Time(micros int64) Value { return Value{kind: KindTime, n: micros} }

// Timestamp makes a timestamp: microseconds since 2000-01-01 00:00:00.
func Timestamp(micros int64) Value { return Value{kind: KindTimestamp, n: micros} }

// TimestampTZ makes a timestamptz: microseconds since 2000-01-01 00:00:00 UTC.
func TimestampTZ(micros int64) Value { return Value{kind: KindTimestampTZ, n: micros} }

// UUID makes a uuid from its 16 bytes, big-endian: high and low 8 bytes.
func UUID(hi, lo uint64) Value { return Value{kind: KindUUID, u: [2]uint64{hi, lo}} }

// Other makes a value of a type the contract does not name: its type OID and text form.
func Other(typeOid uint32, s string) Value { return Value{kind: KindOther, oid: typeOid, s: s} }

// IfUnchanged returns fallback when v is Unchanged, else v: a change emitted as an insert
// from an update has no old value for the sink to keep.
func (v Value) IfUnchanged(fallback Value) Value {
	if v.kind == KindUnchanged {
		return fallback
	}
	return v
}

// valueOf converts what Set and Emit take: a Value, or nil (NULL), a bool, a string, a
// []byte, an integer or a float.
func valueOf(x any) (Value, error) {
	switch x := x.(type) {
	case Value:
		return x, nil
	case nil:
		return Null, nil
	case bool:
		return Bool(x), nil
	case string:
		return Text(x), nil
	case []byte:
		return Bytes(x), nil
	case int:
		return Int(int64(x)), nil
	case int8:
		return Int(int64(x)), nil
	case int16:
		return Int(int64(x)), nil
	case int32:
		return Int(int64(x)), nil
	case int64:
		return Int(x), nil
	case uint8:
		return Int(int64(x)), nil
	case uint16:
		return Int(int64(x)), nil
	case uint32:
		return Int(int64(x)), nil
	case uint:
		if uint64(x) <= math.MaxInt64 {
			return Int(int64(x)), nil
		}
	case uint64:
		if x <= math.MaxInt64 {
			return Int(int64(x)), nil
		}
	case float32:
		return Value{kind: KindFloat4, f: float64(x)}, nil
	case float64:
		return Float(x), nil
	default:
		return Value{}, fmt.Errorf("cannot write a %T", x)
	}
	return Value{}, fmt.Errorf("%v does not fit a bigint", x)
}

// Kind returns the value's variant.
func (v Value) Kind() Kind { return v.kind }

// IsNull reports whether v is SQL NULL.
func (v Value) IsNull() bool { return v.kind == KindNull }

// IsUnchanged reports whether v is a TOASTed value the update did not touch.
func (v Value) IsUnchanged() bool { return v.kind == KindUnchanged }

// Str returns the text of a text, numeric, json or other value.
func (v Value) Str() (string, bool) {
	switch v.kind {
	case KindText, KindNumeric, KindJSON, KindOther:
		return v.s, true
	}
	return "", false
}

// Int returns an integer of any width.
func (v Value) Int() (int64, bool) {
	switch v.kind {
	case KindInt2, KindInt4, KindInt8:
		return v.n, true
	}
	return 0, false
}

// Float returns a float, or an integer as a float.
func (v Value) Float() (float64, bool) {
	switch v.kind {
	case KindFloat4, KindFloat8:
		return v.f, true
	case KindInt2, KindInt4, KindInt8:
		return float64(v.n), true
	}
	return 0, false
}

// Bool returns a boolean.
func (v Value) Bool() (bool, bool) { return v.n != 0, v.kind == KindBool }

// Bytes returns the bytes of a bytea value (do not modify them).
func (v Value) Bytes() ([]byte, bool) { return v.b, v.kind == KindBytes }

// Temporal returns a date (days since 1970-01-01), time (microseconds since midnight) or
// timestamp (microseconds since 2000-01-01) as the contract counts it.
func (v Value) Temporal() (int64, bool) {
	switch v.kind {
	case KindDate, KindTime, KindTimestamp, KindTimestampTZ:
		return v.n, true
	}
	return 0, false
}

// UUID returns a uuid's high and low 8 bytes.
func (v Value) UUID() (hi, lo uint64, ok bool) { return v.u[0], v.u[1], v.kind == KindUUID }

// OID returns the type OID of an other-typed value.
func (v Value) OID() (uint32, bool) { return v.oid, v.kind == KindOther }

// String returns a readable form: the text of a text-like value, a UUID as
// xxxxxxxx-xxxx-..., a number in decimal, NULL, UNCHANGED.
func (v Value) String() string {
	switch v.kind {
	case KindNull:
		return "NULL"
	case KindUnchanged:
		return "UNCHANGED"
	case KindBool:
		return strconv.FormatBool(v.n != 0)
	case KindFloat4, KindFloat8:
		return strconv.FormatFloat(v.f, 'g', -1, 64)
	case KindBytes:
		return fmt.Sprintf("\\x%x", v.b)
	case KindUUID:
		return uuidText(v.u[0], v.u[1])
	case KindText, KindNumeric, KindJSON, KindOther:
		return v.s
	}
	return strconv.FormatInt(v.n, 10)
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
