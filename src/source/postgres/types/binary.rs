//! PostgreSQL binary-format values (each type's `send` function, as pgoutput sends them with
//! its `binary` option) → [`Value`], for the types [`reads_binary`] lists.
//!
//! Every value comes out exactly as its text form parses in [`super::parse_text`] (a test
//! holds the two side by side for edge values from a real server), so nothing downstream can
//! tell which format the stream used. Types outside the list have no binary form Zipline
//! understands: a stream whose tables hold one runs in text (see `replication.rs`).

use super::{
    BOOL, BPCHAR, BYTEA, DATE, FLOAT4, FLOAT8, INT2, INT4, INT8, JSON, JSONB, NAME, NUMERIC, OID,
    TEXT, TIME, TIMESTAMP, TIMESTAMPTZ, TypeError, UUID, VARCHAR,
};
use crate::change::{Column, CompactString, PG_EPOCH_DAYS, SmallVec, Table, Value};

/// Whether values of `type_oid` can be read in binary format. `"char"` is left out on
/// purpose: its text form escapes bytes above 127, which its binary form does not.
pub(crate) fn reads_binary(type_oid: u32) -> bool {
    matches!(
        type_oid,
        BOOL | BYTEA
            | NAME
            | INT8
            | INT2
            | INT4
            | TEXT
            | OID
            | JSON
            | FLOAT4
            | FLOAT8
            | BPCHAR
            | VARCHAR
            | DATE
            | TIME
            | TIMESTAMP
            | TIMESTAMPTZ
            | NUMERIC
            | UUID
            | JSONB
    )
}

/// The first column of `table` whose values Zipline reads only in text.
pub(crate) fn text_only_column(table: &Table) -> Option<&Column> {
    table.columns.iter().find(|c| !reads_binary(c.type_oid))
}

/// Parse one value in PostgreSQL binary format for the type `type_oid`.
pub(crate) fn parse_binary(type_oid: u32, bytes: &[u8]) -> Result<Value, TypeError> {
    let err = |reason| TypeError::binary(type_oid, bytes, reason);
    let value = match type_oid {
        BOOL => match bytes {
            [0] => Value::Bool(false),
            [1] => Value::Bool(true),
            _ => return Err(err("expected one byte, 0 or 1")),
        },
        BYTEA => Value::Bytes(bytes.to_vec()),
        INT2 => Value::Int2(i16::from_be_bytes(exact(type_oid, bytes)?)),
        INT4 => Value::Int4(i32::from_be_bytes(exact(type_oid, bytes)?)),
        INT8 => Value::Int8(i64::from_be_bytes(exact(type_oid, bytes)?)),
        OID => Value::Int8(i64::from(u32::from_be_bytes(exact(type_oid, bytes)?))),
        FLOAT4 => Value::Float4(f32::from_be_bytes(exact(type_oid, bytes)?)),
        FLOAT8 => Value::Float8(f64::from_be_bytes(exact(type_oid, bytes)?)),
        NUMERIC => Value::Numeric(numeric(bytes).ok_or_else(|| err("not a valid numeric"))?),
        TEXT | VARCHAR | BPCHAR | NAME => Value::Text(utf8(bytes).map_err(err)?.into()),
        JSON => Value::Json(utf8(bytes).map_err(err)?.into()),
        JSONB => match bytes.split_first() {
            Some((1, text)) => Value::Json(utf8(text).map_err(err)?.into()),
            _ => return Err(err("expected jsonb format version 1")),
        },
        DATE => {
            let days = i32::from_be_bytes(exact(type_oid, bytes)?);
            Value::Date(match days {
                // PostgreSQL's -infinity and infinity, the sentinels Value::Date keeps.
                i32::MIN | i32::MAX => days,
                _ => days
                    .checked_add(PG_EPOCH_DAYS)
                    .ok_or_else(|| err("date out of range"))?,
            })
        }
        TIME => Value::Time(i64::from_be_bytes(exact(type_oid, bytes)?)),
        // Microseconds since 2000-01-01 with PostgreSQL's sentinels: Value's own form.
        TIMESTAMP => Value::Timestamp(i64::from_be_bytes(exact(type_oid, bytes)?)),
        TIMESTAMPTZ => Value::TimestampTz(i64::from_be_bytes(exact(type_oid, bytes)?)),
        UUID => Value::Uuid(exact(type_oid, bytes)?),
        _ => return Err(err("Zipline reads this type only in text format")),
    };
    Ok(value)
}

/// `bytes` as exactly the `N` bytes of a fixed-width type; the error names the width.
fn exact<const N: usize>(type_oid: u32, bytes: &[u8]) -> Result<[u8; N], TypeError> {
    bytes.try_into().map_err(|_| {
        let reason = match N {
            2 => "expected 2 bytes",
            4 => "expected 4 bytes",
            8 => "expected 8 bytes",
            16 => "expected 16 bytes",
            _ => "not of the type's width",
        };
        TypeError::binary(type_oid, bytes, reason)
    })
}

fn utf8(bytes: &[u8]) -> Result<&str, &'static str> {
    std::str::from_utf8(bytes).map_err(|_| "not valid UTF-8")
}

const NUMERIC_POS: u16 = 0x0000;
const NUMERIC_NEG: u16 = 0x4000;
const NUMERIC_NAN: u16 = 0xC000;
const NUMERIC_PINF: u16 = 0xD000;
const NUMERIC_NINF: u16 = 0xF000;

/// A binary numeric as `numeric_out` prints it: `ndigits`, `weight` (of the first digit, in
/// powers of 10000), `sign`, `dscale` (decimal digits after the point), then the base-10000
/// digits. `None` when the header or a digit is out of range. Written on the stack first:
/// the value's string then holds a short number inline, with no allocation.
fn numeric(bytes: &[u8]) -> Option<CompactString> {
    let word = |i: usize| {
        bytes
            .get(2 * i..2 * i + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    };
    let ndigits = usize::from(word(0)?);
    let weight = i32::from(word(1)? as i16);
    let sign = word(2)?;
    let dscale = usize::from(word(3)?);
    if bytes.len() != 8 + 2 * ndigits || (0..ndigits).any(|i| word(4 + i).is_none_or(|d| d > 9999))
    {
        return None;
    }
    let mut out: SmallVec<[u8; 64]> = SmallVec::new();
    match sign {
        NUMERIC_POS => {}
        NUMERIC_NEG => out.push(b'-'),
        NUMERIC_NAN => return Some("NaN".into()),
        NUMERIC_PINF => return Some("Infinity".into()),
        NUMERIC_NINF => return Some("-Infinity".into()),
        _ => return None,
    }
    // Digit `i` of the number (index 0 has weight `weight`), 0 past the stored ones.
    let digit = |i: i32| {
        usize::try_from(i)
            .ok()
            .filter(|&i| i < ndigits)
            .and_then(|i| word(4 + i))
            .unwrap_or(0)
    };
    if weight < 0 {
        out.push(b'0');
    } else {
        // The first group without its leading zeros, the others in full.
        let first = group(digit(0));
        let zeros = first.iter().take(3).take_while(|&&b| b == b'0').count();
        out.extend_from_slice(&first[zeros..]);
        for d in 1..=weight {
            out.extend_from_slice(&group(digit(d)));
        }
    }
    if dscale > 0 {
        out.push(b'.');
        let end = out.len() + dscale;
        let mut d = weight + 1;
        while out.len() < end {
            out.extend_from_slice(&group(digit(d)));
            d += 1;
        }
        out.truncate(end);
    }
    std::str::from_utf8(&out).ok().map(CompactString::new)
}

/// A base-10000 digit as four decimal digits.
fn group(d: u16) -> [u8; 4] {
    // Each quotient is below 10: the casts keep its value.
    let digit = |unit: u16| b'0' + (d / unit % 10) as u8;
    [digit(1000), digit(100), digit(10), digit(1)]
}

#[cfg(test)]
mod tests {
    use super::super::parse_text;
    use super::*;

    fn unhex(hex: &str) -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// Each value as PostgreSQL 15's output function prints it and as its send function
    /// sends it (from `SELECT v::text, encode(<type>send(v), 'hex')` on a real server; `bool`
    /// and `char(5)` printed by `boolout` and `bpcharout`): both forms must give one value.
    const PAIRS: &[(u32, &str, &str)] = &[
        (NUMERIC, "0", "0000000000000000"),
        (NUMERIC, "0.000", "0000000000000003"),
        (NUMERIC, "1", "00010000000000000001"),
        (NUMERIC, "-1", "00010000400000000001"),
        (NUMERIC, "10000", "00010001000000000001"),
        (NUMERIC, "9999.9999", "0002000000000004270f270f"),
        (NUMERIC, "0.0001", "0001ffff000000040001"),
        (
            NUMERIC,
            "-123456789012345678901234567890.123456789",
            "000b000740000009000c0d801ed204d2162e23340d801ed204d2162e2328",
        ),
        (
            NUMERIC,
            "0.000000000000000000000000000001",
            "0001fff80000001e0064",
        ),
        (NUMERIC, "99999999.9999", "0003000100000004270f270f270f"),
        (NUMERIC, "-99999999.9999", "0003000140000004270f270f270f"),
        (NUMERIC, "NaN", "00000000c0000000"),
        (NUMERIC, "Infinity", "00000000d0000020"),
        (NUMERIC, "-Infinity", "00000000f0000020"),
        (NUMERIC, "12.50", "0002000000000002000c1388"),
        (NUMERIC, "100000000", "00010002000000000001"),
        (NUMERIC, "0.1", "0001ffff0000000103e8"),
        (NUMERIC, "1234560000000", "0003000300000000000109291770"),
        (NUMERIC, "0.0000123", "0001fffe0000000704ce"),
        (NUMERIC, "1.50", "000200000000000200011388"),
        (DATE, "2000-01-01", "00000000"),
        (DATE, "1970-01-01", "ffffd533"),
        (DATE, "5874897-12-31", "7fda970c"),
        (DATE, "4714-11-24 BC", "ffda97a7"),
        (DATE, "0044-03-15 BC", "fff49d7b"),
        (DATE, "infinity", "7fffffff"),
        (DATE, "-infinity", "80000000"),
        (DATE, "2024-02-29", "00002279"),
        (TIMESTAMP, "2000-01-01 00:00:00", "0000000000000000"),
        (
            TIMESTAMP,
            "294276-12-31 23:59:59.999999",
            "7fffff5bb3b29fff",
        ),
        (TIMESTAMP, "4714-11-24 00:00:00 BC", "fd0f7cc1411fa000"),
        (TIMESTAMP, "infinity", "7fffffffffffffff"),
        (TIMESTAMP, "-infinity", "8000000000000000"),
        (TIMESTAMP, "1999-12-31 23:59:59.5", "fffffffffff85ee0"),
        (TIMESTAMPTZ, "2024-03-10 10:30:00+00", "0002b64aad045a00"),
        (
            TIMESTAMPTZ,
            "294276-12-31 23:59:59.999999+00",
            "7fffff5bb3b29fff",
        ),
        (TIMESTAMPTZ, "4713-11-24 00:00:00+00 BC", "fd0f9983eb0ae000"),
        (TIMESTAMPTZ, "infinity", "7fffffffffffffff"),
        (TIMESTAMPTZ, "-infinity", "8000000000000000"),
        (TIME, "00:00:00", "0000000000000000"),
        (TIME, "23:59:59.999999", "000000141dd75fff"),
        (TIME, "24:00:00", "000000141dd76000"),
        (FLOAT4, "-3.4028235e+38", "ff7fffff"),
        (FLOAT4, "1e-45", "00000001"),
        (FLOAT4, "NaN", "7fc00000"),
        (FLOAT4, "Infinity", "7f800000"),
        (FLOAT4, "-Infinity", "ff800000"),
        (FLOAT4, "0.1", "3dcccccd"),
        (FLOAT4, "-0", "80000000"),
        (FLOAT8, "5e-324", "0000000000000001"),
        (FLOAT8, "-1.7976931348623157e+308", "ffefffffffffffff"),
        (FLOAT8, "0.1", "3fb999999999999a"),
        (FLOAT8, "NaN", "7ff8000000000000"),
        (FLOAT8, "-0", "8000000000000000"),
        (INT2, "-32768", "8000"),
        (INT2, "32767", "7fff"),
        (INT2, "0", "0000"),
        (INT4, "-2147483648", "80000000"),
        (INT4, "2147483647", "7fffffff"),
        (INT8, "-9223372036854775808", "8000000000000000"),
        (INT8, "9223372036854775807", "7fffffffffffffff"),
        (OID, "0", "00000000"),
        (OID, "4294967295", "ffffffff"),
        (BOOL, "t", "01"),
        (BOOL, "f", "00"),
        (
            UUID,
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "a0eebc999c0b4ef8bb6d6bb9bd380a11",
        ),
        (
            JSONB,
            r#"{"a": {"n": 1.50}, "z": 1}"#,
            "017b2261223a207b226e223a20312e35307d2c20227a223a20317d",
        ),
        (JSONB, "[]", "015b5d"),
        (
            TEXT,
            r#"żółw 🐢 "quoted""#,
            "c5bcc3b3c5827720f09f90a2202271756f74656422",
        ),
        (TEXT, "", ""),
        (BPCHAR, "ab   ", "6162202020"),
        (BYTEA, r#"\x00ff0a5c"#, "00ff0a5c"),
    ];

    #[test]
    fn binary_values_equal_their_text_forms() {
        for (oid, text, hex) in PAIRS {
            let from_text = parse_text(*oid, text.as_bytes()).expect(text);
            let from_binary = parse_binary(*oid, &unhex(hex)).expect(text);
            assert!(reads_binary(*oid), "{text}");
            // Debug output compares NaNs as equal and tells -0.0 from 0.0.
            assert_eq!(
                format!("{from_binary:?}"),
                format!("{from_text:?}"),
                "type {oid}, {text}"
            );
        }
    }

    #[test]
    fn a_malformed_binary_value_is_an_error_naming_its_type() {
        for (oid, hex) in [
            (INT4, "000001"),
            (BOOL, "02"),
            (NUMERIC, "0001000000000000"),
            (NUMERIC, "00010000000000002710"),
            (JSONB, "027b7d"),
            (TEXT, "ff"),
            (UUID, "00"),
        ] {
            let e = parse_binary(oid, &unhex(hex)).expect_err(hex);
            assert_eq!(e.type_oid, oid, "{e}");
            assert!(e.to_string().contains(&format!("\\x{hex}")), "{e}");
        }
        assert!(
            !reads_binary(18),
            "\"char\" prints escapes its binary form lacks"
        );
        assert!(
            parse_binary(1186, &[0; 16]).is_err(),
            "interval is read as text only"
        );
    }
}
