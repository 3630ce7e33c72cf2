//! Values → PostgreSQL binary parameters.
//!
//! Rows travel column-wise: each column of a statement is one array parameter (`$n::int8[]`)
//! that the statement unnests into rows, so a batch of any size is one statement with a fixed
//! number of parameters, prepared once per shape. Each array has a [`Wire`] element type:
//! the binary format of the value variant where PostgreSQL has a simple one (integers, floats,
//! booleans, text, bytea, dates and times, uuid), otherwise text (numeric, json, and every
//! [`Value::Other`]). The statement then casts each column to the sink column's type, so text
//! goes through that type's input function exactly as `COPY` or a literal would, and binary
//! values need no parsing at all. Binary formats: <https://www.postgresql.org/docs/15/protocol-overview.html#PROTOCOL-FORMAT-CODES>
//! and the `*_send`/`*_recv` functions of each type; the array format is `array_recv`'s:
//! dimensions, a has-null flag, the element type OID, then per dimension its length and lower
//! bound, then each element as a 4-byte length (−1 for NULL) and its bytes.
//!
//! Temporal values: timestamps already count microseconds from 2000-01-01 as PostgreSQL's
//! binary format does, so they go as they are (after a range check that names the problem
//! before the server would); dates count from 1970-01-01 and are shifted to 2000. The
//! `MIN`/`MAX` sentinels of [`Value`] are exactly PostgreSQL's `-infinity` and `infinity`
//! (`DATEVAL_NOBEGIN`/`DT_NOBEGIN` and friends), so they pass through unchanged.

use std::error::Error;
use std::fmt::{self, Write as _};

use bytes::{BufMut, BytesMut};
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use crate::change::{PG_EPOCH_DAYS, Value, timestamp_in_pg_range};
use crate::sink::coalesce::Row;
use crate::source::postgres::types::{
    format_date, format_time, format_timestamp, format_timestamptz, format_uuid,
};

/// The element type an array parameter carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Wire {
    Bool,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    Text,
    Bytea,
    Date,
    Time,
    Timestamp,
    TimestampTz,
    Uuid,
}

impl Wire {
    /// The natural wire type of a source column of type `type_oid` (the same mapping as the
    /// PostgreSQL source's text parser: `oid` arrives as [`Value::Int8`]).
    pub(super) fn for_type(type_oid: u32) -> Wire {
        match type_oid {
            16 => Wire::Bool,
            21 => Wire::Int2,
            23 => Wire::Int4,
            20 | 26 => Wire::Int8,
            700 => Wire::Float4,
            701 => Wire::Float8,
            17 => Wire::Bytea,
            1082 => Wire::Date,
            1083 => Wire::Time,
            1114 => Wire::Timestamp,
            1184 => Wire::TimestampTz,
            2950 => Wire::Uuid,
            _ => Wire::Text,
        }
    }

    /// Whether `value` can travel as this type (text takes anything; integers widen).
    pub(super) fn carries(self, value: &Value) -> bool {
        matches!(
            (self, value),
            (_, Value::Null | Value::Unchanged)
                | (Wire::Text, _)
                | (Wire::Bool, Value::Bool(_))
                | (Wire::Int2, Value::Int2(_))
                | (Wire::Int4, Value::Int2(_) | Value::Int4(_))
                | (Wire::Int8, Value::Int2(_) | Value::Int4(_) | Value::Int8(_))
                | (Wire::Float4, Value::Float4(_))
                | (Wire::Float8, Value::Float4(_) | Value::Float8(_))
                | (Wire::Bytea, Value::Bytes(_))
                | (Wire::Date, Value::Date(_))
                | (Wire::Time, Value::Time(_))
                | (Wire::Timestamp, Value::Timestamp(_))
                | (Wire::TimestampTz, Value::TimestampTz(_))
                | (Wire::Uuid, Value::Uuid(_))
        )
    }

    /// SQL name of the element type, as written in `$n::<name>[]`.
    pub(super) fn sql_name(self) -> &'static str {
        match self {
            Wire::Bool => "bool",
            Wire::Int2 => "int2",
            Wire::Int4 => "int4",
            Wire::Int8 => "int8",
            Wire::Float4 => "float4",
            Wire::Float8 => "float8",
            Wire::Text => "text",
            Wire::Bytea => "bytea",
            Wire::Date => "date",
            Wire::Time => "time",
            Wire::Timestamp => "timestamp",
            Wire::TimestampTz => "timestamptz",
            Wire::Uuid => "uuid",
        }
    }

    fn oid(self) -> u32 {
        match self {
            Wire::Bool => 16,
            Wire::Int2 => 21,
            Wire::Int4 => 23,
            Wire::Int8 => 20,
            Wire::Float4 => 700,
            Wire::Float8 => 701,
            Wire::Text => 25,
            Wire::Bytea => 17,
            Wire::Date => 1082,
            Wire::Time => 1083,
            Wire::Timestamp => 1114,
            Wire::TimestampTz => 1184,
            Wire::Uuid => 2950,
        }
    }

    fn array_oid(self) -> u32 {
        match self {
            Wire::Bool => 1000,
            Wire::Int2 => 1005,
            Wire::Int4 => 1007,
            Wire::Int8 => 1016,
            Wire::Float4 => 1021,
            Wire::Float8 => 1022,
            Wire::Text => 1009,
            Wire::Bytea => 1001,
            Wire::Date => 1182,
            Wire::Time => 1183,
            Wire::Timestamp => 1115,
            Wire::TimestampTz => 1185,
            Wire::Uuid => 2951,
        }
    }

    /// The wire type for a column: its natural type if every value fits, else text.
    pub(super) fn choose<'v>(type_oid: u32, values: impl IntoIterator<Item = &'v Value>) -> Wire {
        let natural = Wire::for_type(type_oid);
        if natural != Wire::Text && values.into_iter().any(|v| !natural.carries(v)) {
            Wire::Text
        } else {
            natural
        }
    }
}

/// A value that cannot be sent: says what is wrong, without naming the column (the caller
/// knows it). Travels as the source of tokio-postgres's "error serializing parameter".
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct EncodeError(pub(super) String);

/// Where a parameter's values come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// Column `col` of upsert rows.
    Rows(&'a [Row<'a>], usize),
    /// Position `pos` of delete keys.
    Keys(&'a [&'a [Value]], usize),
    /// A single value (a scalar parameter, not an array).
    One(&'a Value),
}

/// One parameter: a column of values as a binary array, or a single value.
#[derive(Clone, Copy)]
pub(super) struct Param<'a> {
    wire: Wire,
    source: Source<'a>,
}

impl fmt::Debug for Param<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Values stay out of debug output: they are row data.
        f.debug_struct("Param")
            .field("wire", &self.wire)
            .field("len", &self.len())
            .finish()
    }
}

impl<'a> Param<'a> {
    /// Column `col` of `rows`, as an array of `wire`.
    pub(super) fn rows(wire: Wire, rows: &'a [Row<'a>], col: usize) -> Self {
        Param {
            wire,
            source: Source::Rows(rows, col),
        }
    }

    /// Key position `pos` of `keys`, as an array of `wire`.
    pub(super) fn keys(wire: Wire, keys: &'a [&'a [Value]], pos: usize) -> Self {
        Param {
            wire,
            source: Source::Keys(keys, pos),
        }
    }

    /// `value` alone, as a scalar of `wire`.
    pub(super) fn one(wire: Wire, value: &'a Value) -> Self {
        Param {
            wire,
            source: Source::One(value),
        }
    }

    /// The same parameter restricted to rows `range` (a scalar stays as it is).
    pub(super) fn slice(&self, range: std::ops::Range<usize>) -> Param<'a> {
        let source = match self.source {
            Source::Rows(rows, col) => Source::Rows(&rows[range], col),
            Source::Keys(keys, pos) => Source::Keys(&keys[range], pos),
            Source::One(v) => Source::One(v),
        };
        Param {
            wire: self.wire,
            source,
        }
    }

    /// The type OID it is sent as: the wire type's, or its array's.
    #[cfg(feature = "bench")]
    pub(super) fn type_oid(&self) -> u32 {
        match self.source {
            Source::One(_) => self.wire.oid(),
            Source::Rows(..) | Source::Keys(..) => self.wire.array_oid(),
        }
    }

    pub(super) fn len(&self) -> usize {
        match self.source {
            Source::Rows(rows, _) => rows.len(),
            Source::Keys(keys, _) => keys.len(),
            Source::One(_) => 1,
        }
    }

    pub(super) fn get(&self, i: usize) -> &'a Value {
        match self.source {
            Source::Rows(rows, col) => &rows[i].values()[col],
            Source::Keys(keys, pos) => &keys[i][pos],
            Source::One(v) => v,
        }
    }

    /// Rough size on the wire, to cut statements before they grow huge.
    pub(super) fn approx_bytes(value: &Value) -> usize {
        4 + match value {
            Value::Text(s) | Value::Numeric(s) | Value::Json(s) | Value::Other { text: s, .. } => {
                s.len()
            }
            Value::Bytes(b) => b.len(),
            _ => 8,
        }
    }
}

impl ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        if let Source::One(value) = self.source {
            if ty.oid() != self.wire.oid() {
                return Err(Box::new(type_mismatch(ty, self.wire.oid())));
            }
            return Ok(encode(self.wire, value, out)?);
        }
        if ty.oid() != self.wire.array_oid() {
            return Err(Box::new(type_mismatch(ty, self.wire.array_oid())));
        }
        let len = i32::try_from(self.len())
            .map_err(|_| EncodeError("too many rows for one array parameter".into()))?;
        out.put_i32(1); // dimensions
        let null_flag_at = out.len();
        out.put_i32(0); // has nulls, patched below
        out.put_u32(self.wire.oid());
        out.put_i32(len);
        out.put_i32(1); // lower bound
        let mut nulls = false;
        for i in 0..self.len() {
            let len_at = out.len();
            out.put_i32(0);
            match encode(self.wire, self.get(i), out)? {
                IsNull::Yes => {
                    nulls = true;
                    out[len_at..len_at + 4].copy_from_slice(&(-1i32).to_be_bytes());
                }
                IsNull::No => {
                    let n = i32::try_from(out.len() - len_at - 4)
                        .map_err(|_| EncodeError("a value larger than 2 GiB".into()))?;
                    out[len_at..len_at + 4].copy_from_slice(&n.to_be_bytes());
                }
            }
        }
        if nulls {
            out[null_flag_at..null_flag_at + 4].copy_from_slice(&1i32.to_be_bytes());
        }
        Ok(IsNull::No)
    }

    fn accepts(_: &Type) -> bool {
        // Checked in `to_sql` against the wire type, which the statement text declares.
        true
    }

    to_sql_checked!();
}

fn type_mismatch(ty: &Type, expected: u32) -> EncodeError {
    EncodeError(format!(
        "the statement expects type {ty} (OID {}) where Zipline sends OID {expected}",
        ty.oid()
    ))
}

/// Writes one value in `wire`'s binary format (nothing for NULL).
pub(super) fn encode(wire: Wire, value: &Value, out: &mut BytesMut) -> Result<IsNull, EncodeError> {
    match (wire, value) {
        (_, Value::Null) => return Ok(IsNull::Yes),
        (_, Value::Unchanged) => {
            return Err(EncodeError(
                "an unchanged-TOAST marker where a value is required".into(),
            ));
        }
        (Wire::Bool, Value::Bool(b)) => out.put_u8(u8::from(*b)),
        (Wire::Int2, Value::Int2(i)) => out.put_i16(*i),
        (Wire::Int4, Value::Int2(i)) => out.put_i32(i32::from(*i)),
        (Wire::Int4, Value::Int4(i)) => out.put_i32(*i),
        (Wire::Int8, Value::Int2(i)) => out.put_i64(i64::from(*i)),
        (Wire::Int8, Value::Int4(i)) => out.put_i64(i64::from(*i)),
        (Wire::Int8, Value::Int8(i)) => out.put_i64(*i),
        (Wire::Float4, Value::Float4(f)) => out.put_f32(*f),
        (Wire::Float8, Value::Float4(f)) => out.put_f64(f64::from(*f)),
        (Wire::Float8, Value::Float8(f)) => out.put_f64(*f),
        (Wire::Bytea, Value::Bytes(b)) => out.put_slice(b),
        (Wire::Date, Value::Date(d)) => out.put_i32(pg_date(*d)),
        (Wire::Time, Value::Time(t)) => out.put_i64(*t),
        (Wire::Timestamp, Value::Timestamp(t)) | (Wire::TimestampTz, Value::TimestampTz(t)) => {
            out.put_i64(pg_timestamp(*t)?);
        }
        (Wire::Uuid, Value::Uuid(u)) => out.put_slice(u),
        (Wire::Text, v) => {
            let mut text = String::new();
            let text = match v {
                Value::Text(s)
                | Value::Numeric(s)
                | Value::Json(s)
                | Value::Other { text: s, .. } => s.as_str(),
                other => {
                    push_text(&mut text, other);
                    text.as_str()
                }
            };
            out.put_slice(text.as_bytes());
        }
        (wire, v) => {
            return Err(EncodeError(format!(
                "a {} value where the column travels as {}",
                variant_name(v),
                wire.sql_name()
            )));
        }
    }
    Ok(IsNull::No)
}

fn pg_date(days: i32) -> i32 {
    match days {
        i32::MIN | i32::MAX => days,
        // No valid date is within 10957 days of i32::MIN, so this cannot overflow for values
        // PostgreSQL produced; saturate anyway so a bogus value fails in the server's range check.
        _ => days.saturating_sub(PG_EPOCH_DAYS),
    }
}

fn pg_timestamp(micros: i64) -> Result<i64, EncodeError> {
    if timestamp_in_pg_range(micros) {
        Ok(micros)
    } else {
        Err(EncodeError(format!(
            "timestamp of {micros} microseconds since 2000-01-01 is out of PostgreSQL's range \
             (4714-11-24 BC to 294276-12-31)"
        )))
    }
}

/// Appends `value` in PostgreSQL's text input format (for columns that travel as text, and
/// for key values in error messages). NULL is written `NULL`.
pub(super) fn push_text(buf: &mut String, value: &Value) {
    match value {
        Value::Null => buf.push_str("NULL"),
        Value::Unchanged => buf.push_str("<unchanged>"),
        Value::Bool(b) => buf.push(if *b { 't' } else { 'f' }),
        Value::Int2(i) => {
            let _ = write!(buf, "{i}");
        }
        Value::Int4(i) => {
            let _ = write!(buf, "{i}");
        }
        Value::Int8(i) => {
            let _ = write!(buf, "{i}");
        }
        Value::Float4(f) => push_float(buf, f64::from(*f), f.is_nan(), || format!("{f:e}")),
        Value::Float8(f) => push_float(buf, *f, f.is_nan(), || format!("{f:e}")),
        Value::Text(s) | Value::Numeric(s) | Value::Json(s) | Value::Other { text: s, .. } => {
            buf.push_str(s);
        }
        Value::Bytes(b) => {
            buf.push_str("\\x");
            for byte in b {
                let _ = write!(buf, "{byte:02x}");
            }
        }
        Value::Date(d) => buf.push_str(&format_date(*d)),
        Value::Time(t) => buf.push_str(&format_time(*t)),
        Value::Timestamp(t) => buf.push_str(&format_timestamp(*t)),
        Value::TimestampTz(t) => buf.push_str(&format_timestamptz(*t)),
        Value::Uuid(u) => buf.push_str(&format_uuid(u)),
    }
}

/// Floats in the spelling `float4in`/`float8in` accept; finite ones in Rust's shortest
/// round-trip form (`{:e}` of the original width, so a `real` keeps its own digits).
fn push_float(buf: &mut String, f: f64, nan: bool, finite: impl FnOnce() -> String) {
    if nan {
        buf.push_str("NaN");
    } else if f == f64::INFINITY {
        buf.push_str("Infinity");
    } else if f == f64::NEG_INFINITY {
        buf.push_str("-Infinity");
    } else {
        buf.push_str(&finite());
    }
}

fn variant_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "NULL",
        Value::Bool(_) => "boolean",
        Value::Int2(_) => "smallint",
        Value::Int4(_) => "integer",
        Value::Int8(_) => "bigint",
        Value::Float4(_) => "real",
        Value::Float8(_) => "double precision",
        Value::Numeric(_) => "numeric",
        Value::Text(_) => "text",
        Value::Bytes(_) => "bytea",
        Value::Date(_) => "date",
        Value::Time(_) => "time",
        Value::Timestamp(_) => "timestamp",
        Value::TimestampTz(_) => "timestamptz",
        Value::Uuid(_) => "uuid",
        Value::Json(_) => "json",
        Value::Other { .. } => "other",
        Value::Unchanged => "unchanged",
    }
}

impl fmt::Display for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.sql_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::{TIMESTAMP_END, TIMESTAMP_MIN};

    fn bytes(p: &Param<'_>, ty: &Type) -> Vec<u8> {
        let mut out = BytesMut::new();
        assert!(matches!(p.to_sql(ty, &mut out).unwrap(), IsNull::No));
        out.to_vec()
    }

    #[test]
    fn arrays_follow_array_recv_layout() {
        let rows = [
            Row::Borrowed(&[Value::Int8(1), Value::Null][..]),
            Row::Borrowed(&[Value::Int4(-2), Value::Text("é".into())][..]),
        ];
        let ids = Param::rows(Wire::Int8, &rows, 0);
        let mut want = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 20, 0, 0, 0, 2, 0, 0, 0, 1];
        want.extend([0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1]);
        want.extend([0, 0, 0, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]);
        assert_eq!(bytes(&ids, &Type::INT8_ARRAY), want);

        let notes = Param::rows(Wire::Text, &rows, 1);
        let mut want = vec![0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 25, 0, 0, 0, 2, 0, 0, 0, 1];
        want.extend([0xff, 0xff, 0xff, 0xff, 0, 0, 0, 2, 0xc3, 0xa9]);
        assert_eq!(bytes(&notes, &Type::TEXT_ARRAY), want);

        // The declared type must be the wire type's array.
        let Err(err) = ids.to_sql(&Type::TEXT_ARRAY, &mut BytesMut::new()) else {
            panic!("a text[] parameter accepted int8 elements");
        };
        assert!(err.to_string().contains("OID 1016"), "{err}");
    }

    #[test]
    fn dates_shift_to_the_2000_epoch_and_timestamps_and_infinities_go_as_they_are() {
        let one = |wire, v: &Value, ty: &Type| {
            let mut out = BytesMut::new();
            Param::one(wire, v).to_sql(ty, &mut out).unwrap();
            out.to_vec()
        };
        assert_eq!(
            one(Wire::Date, &Value::Date(10_957), &Type::DATE),
            [0, 0, 0, 0]
        );
        assert_eq!(
            one(Wire::Date, &Value::Date(i32::MAX), &Type::DATE),
            i32::MAX.to_be_bytes()
        );
        assert_eq!(
            one(
                Wire::TimestampTz,
                &Value::TimestampTz(1),
                &Type::TIMESTAMPTZ
            ),
            1i64.to_be_bytes()
        );
        for t in [TIMESTAMP_MIN, TIMESTAMP_END - 1] {
            assert_eq!(
                one(Wire::Timestamp, &Value::Timestamp(t), &Type::TIMESTAMP),
                t.to_be_bytes()
            );
        }
        assert_eq!(
            one(
                Wire::Timestamp,
                &Value::Timestamp(i64::MIN),
                &Type::TIMESTAMP
            ),
            i64::MIN.to_be_bytes()
        );
        for t in [i64::MIN + 1, TIMESTAMP_MIN - 1, TIMESTAMP_END] {
            let Err(err) = Param::one(Wire::Timestamp, &Value::Timestamp(t))
                .to_sql(&Type::TIMESTAMP, &mut BytesMut::new())
            else {
                panic!("a timestamp outside PostgreSQL's range was encoded: {t}");
            };
            assert!(
                err.to_string().contains("out of PostgreSQL's range"),
                "{err}"
            );
        }
    }

    #[test]
    fn wire_choice_falls_back_to_text_for_mixed_values() {
        let ints = [Value::Int4(1), Value::Null, Value::Int2(2)];
        assert_eq!(Wire::choose(23, &ints), Wire::Int4);
        assert_eq!(Wire::choose(20, &ints), Wire::Int8);
        let mixed = [Value::Int4(1), Value::Text("x".into())];
        assert_eq!(Wire::choose(23, &mixed), Wire::Text);
        assert_eq!(
            Wire::choose(1700, &[Value::Numeric("1.50".into())]),
            Wire::Text
        );
        assert_eq!(Wire::choose(26, &[Value::Int8(4_000_000_000)]), Wire::Int8);
    }

    #[test]
    fn text_forms_are_postgres_input_syntax() {
        let text = |v: Value| {
            let mut s = String::new();
            push_text(&mut s, &v);
            s
        };
        assert_eq!(text(Value::Bool(true)), "t");
        assert_eq!(text(Value::Float8(0.1)), "1e-1");
        assert_eq!(text(Value::Float4(f32::MAX)), "3.4028235e38");
        assert_eq!(text(Value::Float8(f64::NEG_INFINITY)), "-Infinity");
        assert_eq!(text(Value::Float4(f32::NAN)), "NaN");
        assert_eq!(text(Value::Bytes(vec![0, 0xab])), "\\x00ab");
        assert_eq!(text(Value::Date(-719_163)), "0001-12-31 BC");
        assert_eq!(text(Value::TimestampTz(1)), "2000-01-01 00:00:00.000001+00");
        assert_eq!(
            text(Value::Timestamp(TIMESTAMP_END - 1)),
            "294276-12-31 23:59:59.999999"
        );
        assert_eq!(
            text(Value::TimestampTz(TIMESTAMP_MIN)),
            "4714-11-24 00:00:00+00 BC"
        );
        assert_eq!(
            text(Value::Uuid([0xab; 16])),
            "abababab-abab-abab-abab-abababababab"
        );
        // Mixed text wire: every variant is spelled out.
        let rows = [Row::Borrowed(&[Value::Date(0)][..])];
        let p = Param::rows(Wire::Text, &rows, 0);
        assert!(bytes(&p, &Type::TEXT_ARRAY).ends_with(b"1970-01-01"));
    }
}
