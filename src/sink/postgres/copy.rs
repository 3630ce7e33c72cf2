//! Fresh rows by `COPY … FROM STDIN (FORMAT binary)`.
//!
//! A batch's fresh rows (keys the batch itself inserted first, see `crate::sink::coalesce`)
//! need no conflict handling, and `COPY` is PostgreSQL's cheapest way in: it buffers rows into
//! multi-row heap inserts and skips the executor's per-row work. On this project's machine
//! 600,000 rows of the benchmark's table took 0.87 s by binary `COPY`, 1.13 s by text `COPY`
//! and 1.53 s by `INSERT … SELECT … FROM unnest(…)`. Binary needs no parsing on the server, but
//! every field must be in the binary format of the *sink* column's own type
//! (<https://www.postgresql.org/docs/15/sql-copy.html#id-1.9.3.55.10>: a header, then per
//! row a 16-bit field count and per field a 32-bit length, −1 for NULL, and the type's
//! `*_send` bytes; the trailer is a field count of −1). The server runs each type's `*_recv`
//! with the column's type modifier, so `numeric(12,2)` rounds and `varchar(10)` refuses long
//! strings exactly as the `INSERT` path's assignment does.
//!
//! So a group of fresh rows goes by `COPY` only when every column's values have that format
//! here: the integer, float, bool, bytea, date, time, timestamp, timestamptz and uuid values
//! into columns of the same type (integers and floats may widen), text into text or varchar,
//! numeric text into numeric (`numeric_send`: digit count, weight, sign, display scale, then
//! base-10000 digits), json into json or jsonb (`jsonb_send` prefixes version 1). Anything
//! else (enums, arrays, narrowing, a sink table with rules or row-level security, which
//! `COPY` would bypass or refuse) keeps the plain `INSERT`. A unique violation means the same
//! as for that `INSERT`: the batch is a replay, written again with upserts.

use bytes::{BufMut, Bytes, BytesMut};
use tokio_postgres::types::IsNull;

use super::encode::{Param, Wire, encode};
use crate::change::Value;

/// The binary format a `COPY` field is written in: the sink column's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CopyType {
    /// A type the array parameters also use (text here means text or varchar).
    Wire(Wire),
    Numeric,
    Json,
    Jsonb,
}

impl CopyType {
    /// The format for a sink column whose type is `cast` (`"schema"."typname"`, as
    /// `SinkTable::cast` gives it); `None` when `COPY` cannot write it.
    pub(super) fn for_cast(cast: &str) -> Option<CopyType> {
        let name = cast.strip_prefix("\"pg_catalog\".\"")?.strip_suffix('"')?;
        Some(match name {
            "bool" => CopyType::Wire(Wire::Bool),
            "int2" => CopyType::Wire(Wire::Int2),
            "int4" => CopyType::Wire(Wire::Int4),
            "int8" => CopyType::Wire(Wire::Int8),
            "float4" => CopyType::Wire(Wire::Float4),
            "float8" => CopyType::Wire(Wire::Float8),
            "bytea" => CopyType::Wire(Wire::Bytea),
            "date" => CopyType::Wire(Wire::Date),
            "time" => CopyType::Wire(Wire::Time),
            "timestamp" => CopyType::Wire(Wire::Timestamp),
            "timestamptz" => CopyType::Wire(Wire::TimestampTz),
            "uuid" => CopyType::Wire(Wire::Uuid),
            // varchar_recv reads text_send's bytes and applies the length limit.
            "text" | "varchar" => CopyType::Wire(Wire::Text),
            "numeric" => CopyType::Numeric,
            "json" => CopyType::Json,
            "jsonb" => CopyType::Jsonb,
            _ => return None,
        })
    }

    /// Whether `value` can be written in this format.
    pub(super) fn takes(self, value: &Value) -> bool {
        match (self, value) {
            (_, Value::Null) => true,
            (_, Value::Unchanged) => false,
            (CopyType::Wire(Wire::Text), v) => matches!(v, Value::Text(_)),
            (CopyType::Wire(w), v) => w.carries(v),
            (CopyType::Numeric, Value::Numeric(s)) => numeric(s, &mut BytesMut::new()),
            (CopyType::Json | CopyType::Jsonb, Value::Json(_)) => true,
            _ => false,
        }
    }
}

/// `COPY` header: signature, flags, header extension length.
const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";

/// The `COPY` data of `params` (one per column, all over the same rows) in `types`' formats.
/// Every value must be one its type [`CopyType::takes`].
pub(super) fn payload(params: &[Param<'_>], types: &[CopyType]) -> Result<Bytes, String> {
    let rows = params.first().map_or(0, Param::len);
    let mut out = BytesMut::with_capacity(HEADER.len() + rows * (2 + params.len() * 12) + 2);
    out.put_slice(HEADER);
    let fields = i16::try_from(params.len()).map_err(|_| "too many columns for COPY")?;
    for row in 0..rows {
        out.put_i16(fields);
        for (param, &ty) in params.iter().zip(types) {
            field(param.get(row), ty, &mut out)?;
        }
    }
    out.put_i16(-1);
    Ok(out.freeze())
}

fn field(value: &Value, ty: CopyType, out: &mut BytesMut) -> Result<(), String> {
    if matches!(value, Value::Null) {
        out.put_i32(-1);
        return Ok(());
    }
    let at = out.len();
    out.put_i32(0);
    let ok = match (ty, value) {
        (CopyType::Wire(w), v) => matches!(encode(w, v, out).map_err(|e| e.0)?, IsNull::No),
        (CopyType::Numeric, Value::Numeric(s)) => numeric(s, out),
        (CopyType::Json, Value::Json(s)) => {
            out.put_slice(s.as_bytes());
            true
        }
        (CopyType::Jsonb, Value::Json(s)) => {
            out.put_u8(1);
            out.put_slice(s.as_bytes());
            true
        }
        _ => false,
    };
    if !ok {
        return Err(format!("a value COPY cannot write as {ty:?}"));
    }
    let len = i32::try_from(out.len() - at - 4).map_err(|_| "a value over 2 GiB")?;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

/// `numeric_send`'s sign words.
const NUMERIC_POS: u16 = 0x0000;
const NUMERIC_NEG: u16 = 0x4000;
const NUMERIC_NAN: u16 = 0xC000;
const NUMERIC_PINF: u16 = 0xD000;
const NUMERIC_NINF: u16 = 0xF000;

/// Appends decimal `text` (`[-+]digits[.digits]`, or `NaN`, `Infinity`, `-Infinity`) in
/// `numeric_send`'s format; `false` (with `out` unchanged in length meaning nothing) when it
/// is not such text.
fn numeric(text: &str, out: &mut BytesMut) -> bool {
    let special = match text {
        "NaN" => Some(NUMERIC_NAN),
        "Infinity" | "+Infinity" => Some(NUMERIC_PINF),
        "-Infinity" => Some(NUMERIC_NINF),
        _ => None,
    };
    if let Some(sign) = special {
        out.put_slice(&[0, 0, 0, 0]);
        out.put_u16(sign);
        out.put_u16(0);
        return true;
    }
    let (negative, body) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (int.is_empty() && frac.is_empty()) || !digits(int) || !digits(frac) {
        return false;
    }
    let Ok(dscale) = u16::try_from(frac.len()) else {
        return false;
    };
    if dscale > 0x3FFF {
        return false;
    }
    // Base-10000 groups aligned on the decimal point.
    let int = int.trim_start_matches('0');
    let lead = (4 - int.len() % 4) % 4;
    let mut groups: Vec<u16> = Vec::with_capacity((int.len() + frac.len()) / 4 + 2);
    let mut acc = 0u16;
    let mut n = 0;
    let padded_int = std::iter::repeat_n(b'0', lead).chain(int.bytes());
    let tail = (4 - frac.len() % 4) % 4;
    let padded_frac = frac.bytes().chain(std::iter::repeat_n(b'0', tail));
    for b in padded_int.chain(padded_frac) {
        acc = acc * 10 + u16::from(b - b'0');
        n += 1;
        if n == 4 {
            groups.push(acc);
            acc = 0;
            n = 0;
        }
    }
    let int_groups = (lead + int.len()) / 4;
    let mut weight = int_groups as i32 - 1;
    let first = groups.iter().position(|&g| g != 0);
    let (start, end) = match first {
        Some(first) => {
            let last = groups.iter().rposition(|&g| g != 0).unwrap_or(first);
            (first, last + 1)
        }
        None => (0, 0),
    };
    weight -= start as i32;
    let digits = &groups[start..end];
    let (Ok(ndigits), Ok(weight)) = (i16::try_from(digits.len()), i16::try_from(weight)) else {
        return false;
    };
    let sign = if negative && !digits.is_empty() {
        NUMERIC_NEG
    } else {
        NUMERIC_POS
    };
    out.put_i16(ndigits);
    out.put_i16(if digits.is_empty() { 0 } else { weight });
    out.put_u16(sign);
    out.put_u16(dscale);
    for &d in digits {
        out.put_u16(d);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(text: &str) -> Option<Vec<u16>> {
        let mut out = BytesMut::new();
        numeric(text, &mut out).then(|| {
            out.chunks(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect()
        })
    }

    #[test]
    fn numerics_take_numeric_send_form() {
        // [ndigits, weight, sign, dscale, digits…]
        assert_eq!(num("12345.678"), Some(vec![3, 1, 0, 3, 1, 2345, 6780]));
        assert_eq!(num("0.0001"), Some(vec![1, 0xFFFF, 0, 4, 1]));
        assert_eq!(
            num("-1234567890.12"),
            Some(vec![4, 2, 0x4000, 2, 12, 3456, 7890, 1200])
        );
        assert_eq!(num("10000"), Some(vec![1, 1, 0, 0, 1]));
        assert_eq!(num("0.00"), Some(vec![0, 0, 0, 2]));
        assert_eq!(num("-0"), Some(vec![0, 0, 0, 0]));
        assert_eq!(num("007"), Some(vec![1, 0, 0, 0, 7]));
        assert_eq!(num(".5"), Some(vec![1, 0xFFFF, 0, 1, 5000]));
        assert_eq!(num("NaN"), Some(vec![0, 0, 0xC000, 0]));
        assert_eq!(num("-Infinity"), Some(vec![0, 0, 0xF000, 0]));
        for bad in ["", ".", "1e5", "1.2.3", "--1", " 1", "abc"] {
            assert_eq!(num(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_pg_catalog_types_with_a_binary_form_qualify() {
        let ty = |c: &str| CopyType::for_cast(c);
        assert_eq!(
            ty("\"pg_catalog\".\"int8\""),
            Some(CopyType::Wire(Wire::Int8))
        );
        assert_eq!(
            ty("\"pg_catalog\".\"varchar\""),
            Some(CopyType::Wire(Wire::Text))
        );
        assert_eq!(ty("\"pg_catalog\".\"jsonb\""), Some(CopyType::Jsonb));
        assert_eq!(ty("\"public\".\"mood\""), None);
        assert_eq!(ty("\"pg_catalog\".\"_int4\""), None);
        let int4 = CopyType::Wire(Wire::Int4);
        assert!(int4.takes(&Value::Int2(1)) && int4.takes(&Value::Null));
        assert!(!int4.takes(&Value::Int8(1)) && !int4.takes(&Value::Unchanged));
        assert!(!CopyType::Wire(Wire::Text).takes(&Value::Int4(1)));
        assert!(!CopyType::Numeric.takes(&Value::Numeric("1e3".into())));
    }
}
