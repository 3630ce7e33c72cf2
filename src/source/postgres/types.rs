//! PostgreSQL text-format values → [`Value`], and the inverse formatters.
//!
//! pgoutput sends column values in each type's text output format unless asked for its
//! `binary` option (then `binary.rs` reads them), so this module parses what PostgreSQL's
//! output functions print. The
//! replication session runs with `DateStyle=ISO` and `TimeZone=UTC`, but offsets are still
//! parsed in full (`+HH`, `+HH:MM`, `+HH:MM:SS`, as printed for historical local mean time).
//!
//! Quirks worth knowing (see <https://www.postgresql.org/docs/15/datatype-datetime.html>):
//! - Years before 1 AD print as positive years with a trailing ` BC`, after any offset:
//!   `0044-03-15 12:00:00+00 BC` is astronomical year -43. There is no year 0.
//! - `infinity`/`-infinity` are valid dates and timestamps; they map to the `MAX`/`MIN`
//!   sentinels documented on [`Value`].
//! - `time` may be `24:00:00`.
//! - Dates run from 4714-11-24 BC to 5874897-12-31, timestamps from 4714-11-24 BC to
//!   294276-12-31 23:59:59.999999. Timestamps become microseconds since 2000-01-01, as
//!   PostgreSQL counts them, which holds the whole range in 64 bits (since 1970 would not).
//!
//! Calendar math is the proleptic Gregorian "days from civil" algorithm (March-based years,
//! 400-year eras), written out here so the crate needs no date library.

mod binary;

use std::fmt::Write as _;

pub(crate) use binary::{parse_binary, text_only_column};

use crate::change::{DATE_MAX, DATE_MIN, PG_EPOCH_DAYS, TIMESTAMP_END, TIMESTAMP_MIN, Value};

const BOOL: u32 = 16;
const BYTEA: u32 = 17;
const CHAR: u32 = 18;
const NAME: u32 = 19;
const INT8: u32 = 20;
const INT2: u32 = 21;
const INT4: u32 = 23;
const TEXT: u32 = 25;
const OID: u32 = 26;
const JSON: u32 = 114;
const FLOAT4: u32 = 700;
const FLOAT8: u32 = 701;
const BPCHAR: u32 = 1042;
const VARCHAR: u32 = 1043;
const DATE: u32 = 1082;
const TIME: u32 = 1083;
const TIMESTAMP: u32 = 1114;
const TIMESTAMPTZ: u32 = 1184;
const NUMERIC: u32 = 1700;
const UUID: u32 = 2950;
const JSONB: u32 = 3802;

const MICROS_PER_SECOND: i64 = 1_000_000;
const MICROS_PER_DAY: i64 = 86_400 * MICROS_PER_SECOND;
/// Days from 0000-03-01 (start of the algorithm's era 0) to 1970-01-01.
const EPOCH_SHIFT_DAYS: i64 = 719_468;
const DAYS_PER_ERA: i64 = 146_097;

/// A column value that is not valid text output for its type.
#[derive(Debug, thiserror::Error)]
#[error("invalid {type_name} value {text:?} (type OID {type_oid}): {reason}")]
pub(crate) struct TypeError {
    /// The PostgreSQL type OID.
    pub(crate) type_oid: u32,
    /// Human name of the type, e.g. `timestamptz`.
    pub(crate) type_name: &'static str,
    /// The offending text, lossily decoded and cut to 64 characters (a binary value: its
    /// bytes in hex).
    pub(crate) text: String,
    /// What is wrong with it.
    pub(crate) reason: &'static str,
}

impl TypeError {
    fn new(type_oid: u32, text: &[u8], reason: &'static str) -> Self {
        let lossy = String::from_utf8_lossy(text);
        let mut text: String = lossy.chars().take(64).collect();
        if lossy.chars().nth(64).is_some() {
            text.push('…');
        }
        Self::shown(type_oid, text, reason)
    }

    /// For a value in binary format: its bytes in hex, cut to 31 bytes.
    fn binary(type_oid: u32, bytes: &[u8], reason: &'static str) -> Self {
        let mut text = String::from("\\x");
        for b in bytes.iter().take(31) {
            let _ = write!(text, "{b:02x}");
        }
        if bytes.len() > 31 {
            text.push('…');
        }
        Self::shown(type_oid, text, reason)
    }

    /// With `text` as the error shows the value.
    fn shown(type_oid: u32, text: String, reason: &'static str) -> Self {
        TypeError {
            type_oid,
            type_name: type_name(type_oid),
            text,
            reason,
        }
    }
}

fn type_name(type_oid: u32) -> &'static str {
    match type_oid {
        BOOL => "boolean",
        BYTEA => "bytea",
        CHAR => "\"char\"",
        NAME => "name",
        INT8 => "bigint",
        INT2 => "smallint",
        INT4 => "integer",
        TEXT => "text",
        OID => "oid",
        JSON => "json",
        FLOAT4 => "real",
        FLOAT8 => "double precision",
        BPCHAR => "character",
        VARCHAR => "character varying",
        DATE => "date",
        TIME => "time",
        TIMESTAMP => "timestamp",
        TIMESTAMPTZ => "timestamptz",
        NUMERIC => "numeric",
        UUID => "uuid",
        JSONB => "jsonb",
        _ => "other-type",
    }
}

/// A column type as `format_type` would name it, for messages: `character varying(64)`,
/// `numeric(12,2)`; types Zipline does not know by OID are named by their OID.
pub(crate) fn describe_type(type_oid: u32, type_modifier: i32) -> String {
    let name = match type_name(type_oid) {
        "other-type" => return format!("type OID {type_oid} (modifier {type_modifier})"),
        name => name,
    };
    // Modifiers: VARHDRSZ (4) plus the length, or plus (precision << 16 | scale).
    match (type_oid, type_modifier) {
        (_, m) if m < 0 => name.to_owned(),
        (VARCHAR | BPCHAR, m) => format!("{name}({})", m - 4),
        (NUMERIC, m) => format!("{name}({},{})", (m - 4) >> 16, (m - 4) & 0xFFFF),
        (TIME | TIMESTAMP | TIMESTAMPTZ, m) => format!("{name}({m})"),
        (_, m) => format!("{name} (modifier {m})"),
    }
}

/// Parse one value in PostgreSQL text output format for the type `type_oid`.
pub(crate) fn parse_text(type_oid: u32, text: &[u8]) -> Result<Value, TypeError> {
    let err = |reason| TypeError::new(type_oid, text, reason);
    if type_oid == BYTEA {
        return parse_bytea(text).map(Value::Bytes).map_err(err);
    }
    let s = std::str::from_utf8(text).map_err(|_| err("not valid UTF-8"))?;
    let value = match type_oid {
        BOOL => match s {
            "t" | "true" => Value::Bool(true),
            "f" | "false" => Value::Bool(false),
            _ => return Err(err("expected 't' or 'f'")),
        },
        INT2 => Value::Int2(s.parse().map_err(|_| err("not a 16-bit integer"))?),
        INT4 => Value::Int4(s.parse().map_err(|_| err("not a 32-bit integer"))?),
        INT8 => Value::Int8(s.parse().map_err(|_| err("not a 64-bit integer"))?),
        OID => Value::Int8(i64::from(
            s.parse::<u32>()
                .map_err(|_| err("not an unsigned 32-bit integer"))?,
        )),
        FLOAT4 => Value::Float4(parse_float(s).map_err(err)?),
        FLOAT8 => Value::Float8(parse_float(s).map_err(err)?),
        NUMERIC => Value::Numeric(s.into()),
        TEXT | VARCHAR | BPCHAR | NAME | CHAR => Value::Text(s.into()),
        DATE => Value::Date(parse_date(s).map_err(err)?),
        TIME => Value::Time(parse_time(s).map_err(err)?),
        TIMESTAMP => Value::Timestamp(parse_timestamp(s, false).map_err(err)?),
        TIMESTAMPTZ => Value::TimestampTz(parse_timestamp(s, true).map_err(err)?),
        UUID => Value::Uuid(parse_uuid(s).map_err(err)?),
        JSON | JSONB => Value::Json(s.into()),
        _ => Value::Other {
            type_oid,
            text: s.into(),
        },
    };
    Ok(value)
}

/// PostgreSQL prints non-finite floats as `NaN`, `Infinity`, `-Infinity`, which Rust's
/// parser does not all accept.
fn parse_float<F: std::str::FromStr + From<f32>>(s: &str) -> Result<F, &'static str> {
    match s {
        "NaN" => Ok(F::from(f32::NAN)),
        "Infinity" => Ok(F::from(f32::INFINITY)),
        "-Infinity" => Ok(F::from(f32::NEG_INFINITY)),
        _ => s.parse().map_err(|_| "not a floating-point number"),
    }
}

/// Hex format (`\x0aff`, the default since PostgreSQL 9.0) or the legacy escape format
/// (`\\` for a backslash, `\ooo` octal for other bytes, the rest literal).
fn parse_bytea(text: &[u8]) -> Result<Vec<u8>, &'static str> {
    if let Some(hex) = text.strip_prefix(b"\\x") {
        if hex.len() % 2 != 0 {
            return Err("odd number of hex digits");
        }
        return hex
            .chunks_exact(2)
            .map(|pair| Ok(hex_digit(pair[0])? << 4 | hex_digit(pair[1])?))
            .collect();
    }
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some((&b, tail)) = rest.split_first() {
        if b != b'\\' {
            out.push(b);
            rest = tail;
        } else if let Some(tail) = tail.strip_prefix(b"\\") {
            out.push(b'\\');
            rest = tail;
        } else {
            match tail {
                [a @ b'0'..=b'3', b @ b'0'..=b'7', c @ b'0'..=b'7', tail @ ..] => {
                    out.push((a - b'0') << 6 | (b - b'0') << 3 | (c - b'0'));
                    rest = tail;
                }
                _ => return Err("backslash not followed by \\ or three octal digits"),
            }
        }
    }
    Ok(out)
}

fn hex_digit(b: u8) -> Result<u8, &'static str> {
    match b {
        b'0'..=b'9' => Ok(b - b'0'),
        b'a'..=b'f' => Ok(b - b'a' + 10),
        b'A'..=b'F' => Ok(b - b'A' + 10),
        _ => Err("invalid hex digit"),
    }
}

fn parse_uuid(s: &str) -> Result<[u8; 16], &'static str> {
    const BAD: &str = "expected 8-4-4-4-12 hex digits";
    let b = s.as_bytes();
    if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
        return Err(BAD);
    }
    // Where each byte's two digits start. Table lookups rather than branches: random hex
    // digits defeat branch prediction, and this is a hot path of the initial snapshot.
    const AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
    const VALUE: [u8; 256] = {
        let mut t = [0xFF; 256];
        let mut i = 0;
        while i < 256 {
            t[i] = match i as u8 {
                c @ b'0'..=b'9' => c - b'0',
                c @ b'a'..=b'f' => c - b'a' + 10,
                c @ b'A'..=b'F' => c - b'A' + 10,
                _ => 0xFF,
            };
            i += 1;
        }
        t
    };
    let mut out = [0u8; 16];
    let mut invalid = 0u8;
    for (byte, &i) in out.iter_mut().zip(&AT) {
        let (hi, lo) = (VALUE[usize::from(b[i])], VALUE[usize::from(b[i + 1])]);
        invalid |= (hi | lo) & 0xF0;
        *byte = hi << 4 | lo;
    }
    if invalid != 0 {
        return Err("invalid hex digit");
    }
    Ok(out)
}

/// Splits a trailing ` BC` era marker off.
fn strip_bc(s: &str) -> (&str, bool) {
    match s.strip_suffix(" BC") {
        Some(body) => (body, true),
        None => (s, false),
    }
}

fn parse_date(s: &str) -> Result<i32, &'static str> {
    match s {
        "infinity" => return Ok(i32::MAX),
        "-infinity" => return Ok(i32::MIN),
        _ => {}
    }
    let (body, bc) = strip_bc(s);
    let mut c = Cursor::new(body);
    let days = c.date(bc)?;
    c.finish()?;
    i32::try_from(days)
        .ok()
        .filter(|d| (DATE_MIN..=DATE_MAX).contains(d))
        .ok_or("date outside PostgreSQL's range (4714-11-24 BC to 5874897-12-31)")
}

fn parse_time(s: &str) -> Result<i64, &'static str> {
    let mut c = Cursor::new(s);
    let micros = c.time(true)?;
    c.finish()?;
    Ok(micros)
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff]`, then for `timestamptz` a UTC offset, then ` BC`; into
/// microseconds since 2000-01-01 (UTC for `timestamptz`).
fn parse_timestamp(s: &str, with_offset: bool) -> Result<i64, &'static str> {
    match s {
        "infinity" => return Ok(i64::MAX),
        "-infinity" => return Ok(i64::MIN),
        _ => {}
    }
    let (body, bc) = strip_bc(s);
    let mut c = Cursor::new(body);
    let days = c.date(bc)?;
    c.expect(b' ', "expected a space between date and time")?;
    let time = c.time(false)?;
    let offset = if with_offset { c.offset()? } else { 0 };
    c.finish()?;
    (days - i64::from(PG_EPOCH_DAYS))
        .checked_mul(MICROS_PER_DAY)
        .and_then(|m| m.checked_add(time))
        .and_then(|m| m.checked_sub(offset * MICROS_PER_SECOND))
        .filter(|m| (TIMESTAMP_MIN..TIMESTAMP_END).contains(m))
        .ok_or("timestamp outside PostgreSQL's range (4714-11-24 BC to 294276-12-31)")
}

/// A forward-only reader over ASCII date/time text.
struct Cursor<'a> {
    s: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(s: &'a str) -> Self {
        Cursor {
            s: s.as_bytes(),
            pos: 0,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        let hit = self.peek() == Some(b);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn expect(&mut self, b: u8, reason: &'static str) -> Result<(), &'static str> {
        if self.eat(b) { Ok(()) } else { Err(reason) }
    }

    /// Reads between `min` and `max` decimal digits; returns the value and digit count.
    fn digits(&mut self, min: usize, max: usize) -> Result<(i64, usize), &'static str> {
        let start = self.pos;
        let mut value = 0i64;
        while let Some(d @ b'0'..=b'9') = self.peek() {
            if self.pos - start == max {
                return Err("too many digits in a field");
            }
            value = value * 10 + i64::from(d - b'0');
            self.pos += 1;
        }
        if self.pos - start < min {
            return Err("missing digits in a field");
        }
        Ok((value, self.pos - start))
    }

    fn two_digits(&mut self) -> Result<i64, &'static str> {
        Ok(self.digits(2, 2)?.0)
    }

    fn finish(&self) -> Result<(), &'static str> {
        if self.pos == self.s.len() {
            Ok(())
        } else {
            Err("unexpected trailing characters")
        }
    }

    /// `YYYY-MM-DD` (years of 4 to 7 digits) → days since 1970-01-01.
    fn date(&mut self, bc: bool) -> Result<i64, &'static str> {
        let (year, _) = self.digits(4, 7)?;
        self.expect(b'-', "expected '-' after the year")?;
        let month = self.two_digits()?;
        self.expect(b'-', "expected '-' after the month")?;
        let day = self.two_digits()?;
        if year == 0 {
            return Err("year 0 does not exist (1 BC precedes 1 AD)");
        }
        let year = if bc { 1 - year } else { year };
        if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
            return Err("no such calendar date");
        }
        Ok(days_from_civil(year, month, day))
    }

    /// `HH:MM:SS[.f{1,6}]` → microseconds since midnight.
    fn time(&mut self, allow_24: bool) -> Result<i64, &'static str> {
        let hour = self.two_digits()?;
        self.expect(b':', "expected ':' after the hour")?;
        let minute = self.two_digits()?;
        self.expect(b':', "expected ':' after the minute")?;
        let second = self.two_digits()?;
        let mut micros = 0;
        if self.eat(b'.') {
            let (frac, n) = self.digits(1, 6)?;
            micros = frac * 10i64.pow(6 - n as u32);
        }
        let total = ((hour * 60 + minute) * 60 + second) * MICROS_PER_SECOND + micros;
        let max = if allow_24 {
            MICROS_PER_DAY
        } else {
            MICROS_PER_DAY - 1
        };
        if minute > 59 || second > 59 || total > max {
            return Err("time of day out of range");
        }
        Ok(total)
    }

    /// `±HH[:MM[:SS]]` → seconds east of UTC.
    fn offset(&mut self) -> Result<i64, &'static str> {
        let sign = if self.eat(b'+') {
            1
        } else if self.eat(b'-') {
            -1
        } else {
            return Err("expected a UTC offset (+HH, +HH:MM or +HH:MM:SS)");
        };
        let hours = self.two_digits()?;
        let (mut minutes, mut seconds) = (0, 0);
        if self.eat(b':') {
            minutes = self.two_digits()?;
            if self.eat(b':') {
                seconds = self.two_digits()?;
            }
        }
        if hours > 23 || minutes > 59 || seconds > 59 {
            return Err("UTC offset out of range");
        }
        Ok(sign * ((hours * 60 + minutes) * 60 + seconds))
    }
}

fn is_leap(year: i64) -> bool {
    year.rem_euclid(4) == 0 && (year.rem_euclid(100) != 0 || year.rem_euclid(400) == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (astronomical year: 0 = 1 BC).
///
/// Years are counted from March so the leap day is the last day of the year; a 400-year
/// era then always has 146097 days and day-of-year follows from `(153 * m + 2) / 5`.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let march_month = (month + 9) % 12;
    let day_of_year = (153 * march_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * DAYS_PER_ERA + day_of_era - EPOCH_SHIFT_DAYS
}

/// Inverse of [`days_from_civil`]: (astronomical year, month, day).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + EPOCH_SHIFT_DAYS;
    let era = z.div_euclid(DAYS_PER_ERA);
    let day_of_era = z - era * DAYS_PER_ERA;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let march_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * march_month + 2) / 5 + 1;
    let month = if march_month < 10 {
        march_month + 3
    } else {
        march_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Writes `YYYY-MM-DD` (year as PostgreSQL prints it) and returns whether it is BC.
fn write_date(out: &mut String, days: i64) -> bool {
    let (year, month, day) = civil_from_days(days);
    let bc = year <= 0;
    let shown = if bc { 1 - year } else { year };
    let _ = write!(out, "{shown:04}-{month:02}-{day:02}");
    bc
}

/// Writes `HH:MM:SS` plus a fraction with trailing zeros dropped, as PostgreSQL does.
fn write_time(out: &mut String, micros: i64) {
    let secs = micros / MICROS_PER_SECOND;
    let frac = micros % MICROS_PER_SECOND;
    let _ = write!(
        out,
        "{:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    );
    if frac != 0 {
        let digits = format!("{frac:06}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
}

/// Formats days since 1970-01-01 like PostgreSQL's `date` output (`2024-01-31`,
/// `0044-03-15 BC`, `infinity`).
#[allow(
    dead_code,
    reason = "for sinks; drop once `source::postgres::types` is exported"
)]
pub fn format_date(days: i32) -> String {
    match days {
        i32::MAX => "infinity".to_owned(),
        i32::MIN => "-infinity".to_owned(),
        _ => {
            let mut out = String::with_capacity(13);
            if write_date(&mut out, i64::from(days)) {
                out.push_str(" BC");
            }
            out
        }
    }
}

/// Formats microseconds since midnight as `HH:MM:SS[.ffffff]` (trailing zeros of the
/// fraction dropped; `24:00:00` for a full day).
#[allow(
    dead_code,
    reason = "for sinks; drop once `source::postgres::types` is exported"
)]
pub fn format_time(micros: i64) -> String {
    let mut out = String::with_capacity(15);
    write_time(&mut out, micros.clamp(0, MICROS_PER_DAY));
    out
}

fn format_timestamp_with(micros: i64, zone: &str) -> String {
    match micros {
        i64::MAX => "infinity".to_owned(),
        i64::MIN => "-infinity".to_owned(),
        _ => {
            let mut out = String::with_capacity(32);
            let days = micros.div_euclid(MICROS_PER_DAY) + i64::from(PG_EPOCH_DAYS);
            let bc = write_date(&mut out, days);
            out.push(' ');
            write_time(&mut out, micros.rem_euclid(MICROS_PER_DAY));
            out.push_str(zone);
            if bc {
                out.push_str(" BC");
            }
            out
        }
    }
}

/// Formats microseconds since 2000-01-01 as `YYYY-MM-DD HH:MM:SS[.ffffff]` (` BC` suffix,
/// `infinity`/`-infinity` for the sentinels), like PostgreSQL's `timestamp` output.
#[allow(
    dead_code,
    reason = "for sinks; drop once `source::postgres::types` is exported"
)]
pub fn format_timestamp(micros: i64) -> String {
    format_timestamp_with(micros, "")
}

/// Like [`format_timestamp`] with a `+00` offset, as PostgreSQL prints `timestamptz` in UTC.
#[allow(
    dead_code,
    reason = "for sinks; drop once `source::postgres::types` is exported"
)]
pub fn format_timestamptz(micros: i64) -> String {
    format_timestamp_with(micros, "+00")
}

/// Formats a UUID in PostgreSQL's canonical lower-case hyphenated form.
#[allow(
    dead_code,
    reason = "for sinks; drop once `source::postgres::types` is exported"
)]
pub fn format_uuid(bytes: &[u8; 16]) -> String {
    let mut out = String::with_capacity(36);
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_described_with_their_modifiers() {
        assert_eq!(describe_type(INT4, -1), "integer");
        assert_eq!(describe_type(VARCHAR, 68), "character varying(64)");
        assert_eq!(describe_type(NUMERIC, (12 << 16 | 2) + 4), "numeric(12,2)");
        assert_eq!(describe_type(TIMESTAMPTZ, 3), "timestamptz(3)");
        assert_eq!(describe_type(70_000, -1), "type OID 70000 (modifier -1)");
    }

    fn parse(oid: u32, text: &str) -> Value {
        parse_text(oid, text.as_bytes()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn bad(oid: u32, text: &str) -> TypeError {
        parse_text(oid, text.as_bytes()).expect_err(text)
    }

    #[test]
    fn scalars_parse() {
        assert_eq!(parse(BOOL, "t"), Value::Bool(true));
        assert_eq!(parse(BOOL, "f"), Value::Bool(false));
        assert_eq!(parse(INT2, "-32768"), Value::Int2(i16::MIN));
        assert_eq!(parse(INT4, "2147483647"), Value::Int4(i32::MAX));
        assert_eq!(parse(INT8, "-9223372036854775808"), Value::Int8(i64::MIN));
        assert_eq!(parse(OID, "4294967295"), Value::Int8(4_294_967_295));
        assert_eq!(parse(FLOAT4, "1.5"), Value::Float4(1.5));
        assert_eq!(parse(FLOAT4, "1e-07"), Value::Float4(1e-7));
        assert_eq!(parse(FLOAT8, "1e+30"), Value::Float8(1e30));
        assert_eq!(parse(FLOAT8, "-Infinity"), Value::Float8(f64::NEG_INFINITY));
        assert_eq!(parse(FLOAT4, "Infinity"), Value::Float4(f32::INFINITY));
        assert!(matches!(parse(FLOAT8, "NaN"), Value::Float8(f) if f.is_nan()));
        assert!(matches!(parse(FLOAT4, "NaN"), Value::Float4(f) if f.is_nan()));
        let big = "-123456789012345678901234567890.000000000000000000000000000001";
        assert_eq!(parse(NUMERIC, big), Value::Numeric(big.into()));
        assert_eq!(parse(NUMERIC, "NaN"), Value::Numeric("NaN".into()));
        assert_eq!(parse(BPCHAR, "ab  "), Value::Text("ab  ".into()));
        assert_eq!(parse(VARCHAR, "héllo"), Value::Text("héllo".into()));
        assert_eq!(
            parse(JSONB, r#"{"a": 1}"#),
            Value::Json(r#"{"a": 1}"#.into())
        );
        assert_eq!(
            parse(600, "(1,2)"),
            Value::Other {
                type_oid: 600,
                text: "(1,2)".into()
            }
        );
    }

    #[test]
    fn bad_scalars_are_errors_naming_type_and_text() {
        let e = bad(INT2, "32768");
        assert_eq!((e.type_name, e.text.as_str()), ("smallint", "32768"));
        assert!(e.to_string().contains("smallint"), "{e}");
        bad(BOOL, "yes");
        bad(INT4, "");
        bad(FLOAT8, "one");
        bad(OID, "-1");
        let e = parse_text(TEXT, b"\xff\xfe").unwrap_err();
        assert_eq!(e.reason, "not valid UTF-8");
        let long = "x".repeat(100);
        let e = bad(INT8, &long);
        assert_eq!(e.text, format!("{}…", "x".repeat(64)));
    }

    #[test]
    fn bytea_hex_and_escape() {
        assert_eq!(parse(BYTEA, "\\x00ffA0"), Value::Bytes(vec![0, 0xff, 0xa0]));
        assert_eq!(parse(BYTEA, "\\x"), Value::Bytes(vec![]));
        assert_eq!(
            parse(BYTEA, "\\001ab\\\\c\\377"),
            Value::Bytes(vec![1, b'a', b'b', b'\\', b'c', 0xff])
        );
        assert_eq!(parse(BYTEA, ""), Value::Bytes(vec![]));
        bad(BYTEA, "\\x0");
        bad(BYTEA, "\\xzz");
        bad(BYTEA, "\\9");
        bad(BYTEA, "\\400");
        bad(BYTEA, "abc\\");
    }

    #[test]
    fn uuid_round_trips() {
        let text = "93c49a6e-9c1d-4004-b414-60fedd5863cd";
        let Value::Uuid(bytes) = parse(UUID, text) else {
            panic!("not a uuid")
        };
        assert_eq!(bytes[0], 0x93);
        assert_eq!(bytes[15], 0xcd);
        assert_eq!(format_uuid(&bytes), text);
        assert_eq!(parse(UUID, &text.to_uppercase()), Value::Uuid(bytes));
        bad(UUID, "93c49a6e9c1d4004b41460fedd5863cd");
        bad(UUID, "93c49a6e-9c1d-4004-b414-60fedd5863c");
        bad(UUID, "93c49a6e-9c1d-4004-b414-60fedd5863cg");
    }

    #[test]
    fn dates_round_trip() {
        for (text, days) in [
            ("1970-01-01", 0),
            ("1969-12-31", -1),
            ("2000-03-01", 11_017),
            ("2024-02-29", 19_782),
            ("0001-01-01", -719_162),
            ("9999-12-31", 2_932_896),
            ("0001-12-31 BC", -719_163),
            ("0044-03-15 BC", -735_160),
            ("4713-01-01 BC", -2_440_550),
            ("4714-11-24 BC", DATE_MIN),
            ("5874897-12-31", DATE_MAX),
            ("infinity", i32::MAX),
            ("-infinity", i32::MIN),
        ] {
            assert_eq!(parse(DATE, text), Value::Date(days), "{text}");
            assert_eq!(format_date(days), text);
        }
        for text in [
            "2023-02-29",
            "2024-13-01",
            "2024-00-10",
            "2024-01-32",
            "0000-01-01",
            "24-01-01",
            "2024-01-01 AD",
            "2024/01/01",
            "2024-01-01 ",
            // One day past either end of PostgreSQL's range.
            "4714-11-23 BC",
            "5874898-01-01",
        ] {
            bad(DATE, text);
        }
        // Leap years: 1900 is not, 2000 is, 4 BC (astronomical -3) is not, 1 BC is.
        bad(DATE, "1900-02-29");
        parse(DATE, "2000-02-29");
        parse(DATE, "0001-02-29 BC");
        bad(DATE, "0004-02-29 BC");
    }

    #[test]
    fn every_day_of_a_span_round_trips() {
        for days in -800_000..-700_000 {
            assert_eq!(parse(DATE, &format_date(days)), Value::Date(days));
        }
        for days in (DATE_MIN..3_000_000).step_by(997) {
            assert_eq!(parse(DATE, &format_date(days)), Value::Date(days));
        }
        for days in (DATE_MIN..=DATE_MAX).step_by(99_991).chain([DATE_MAX]) {
            assert_eq!(parse(DATE, &format_date(days)), Value::Date(days));
        }
    }

    #[test]
    fn times_round_trip() {
        for (text, micros) in [
            ("00:00:00", 0),
            ("12:34:56.5", 45_296_500_000),
            ("23:59:59.999999", MICROS_PER_DAY - 1),
            ("24:00:00", MICROS_PER_DAY),
            ("01:02:03.000045", 3_723_000_045),
        ] {
            assert_eq!(parse(TIME, text), Value::Time(micros), "{text}");
            assert_eq!(format_time(micros), text);
        }
        assert_eq!(parse(TIME, "01:02:03.45"), Value::Time(3_723_450_000));
        for text in [
            "24:00:01",
            "12:60:00",
            "12:00:60",
            "1:00:00",
            "12:00:00.1234567",
        ] {
            bad(TIME, text);
        }
    }

    /// Microseconds since 2000-01-01 of `unix` microseconds since 1970-01-01.
    fn since_2000(unix: i64) -> i64 {
        unix - crate::change::PG_EPOCH_MICROS
    }

    #[test]
    fn timestamps_round_trip() {
        for (text, micros) in [
            ("2000-01-01 00:00:00", 0),
            ("1999-12-31 23:59:59.999999", -1),
            ("1970-01-01 00:00:00", since_2000(0)),
            ("1969-12-31 23:59:59.999999", since_2000(-1)),
            ("0001-01-01 00:00:00", since_2000(-62_135_596_800_000_000)),
            (
                "9999-12-31 23:59:59.999999",
                since_2000(253_402_300_799_999_999),
            ),
            (
                "0044-03-15 12:00:00 BC",
                since_2000(-63_517_780_800_000_000),
            ),
            (
                "2024-01-02 03:04:05.123456",
                since_2000(1_704_164_645_123_456),
            ),
            // Both ends of PostgreSQL's range; the last 30 years overflowed i64 since 1970.
            ("294276-12-31 23:59:59.999999", TIMESTAMP_END - 1),
            (
                "294247-01-10 04:00:54.775807",
                i64::MAX - crate::change::PG_EPOCH_MICROS,
            ),
            ("4714-11-24 00:00:00 BC", TIMESTAMP_MIN),
            ("4713-11-24 00:00:00 BC", -211_781_865_600_000_000),
            ("infinity", i64::MAX),
            ("-infinity", i64::MIN),
        ] {
            assert_eq!(parse(TIMESTAMP, text), Value::Timestamp(micros), "{text}");
            assert_eq!(format_timestamp(micros), text);
        }
        bad(TIMESTAMP, "2024-01-02 24:00:00");
        bad(TIMESTAMP, "2024-01-02T03:04:05");
        bad(TIMESTAMP, "2024-01-02 03:04:05+00");
        // One microsecond past either end of PostgreSQL's range, and far past it.
        for text in [
            "294277-01-01 00:00:00",
            "4714-11-23 23:59:59.999999 BC",
            "9999999-12-31 00:00:00",
        ] {
            let e = bad(TIMESTAMP, text);
            assert!(e.reason.contains("outside PostgreSQL's range"), "{e}");
        }
    }

    #[test]
    fn timestamptz_offsets() {
        let utc = since_2000(1_704_164_645_123_456);
        assert_eq!(
            parse(TIMESTAMPTZ, "2024-01-02 03:04:05.123456+00"),
            Value::TimestampTz(utc)
        );
        assert_eq!(format_timestamptz(utc), "2024-01-02 03:04:05.123456+00");
        let hour = 3_600 * MICROS_PER_SECOND;
        for (text, expected) in [
            (
                "2024-01-02 03:04:05.123456+05:30",
                utc - 5 * hour - hour / 2,
            ),
            (
                "2024-01-02 03:04:05.123456-03:30",
                utc + 3 * hour + hour / 2,
            ),
            ("2024-01-02 03:04:05.123456-03", utc + 3 * hour),
            ("2024-01-02 03:04:05.123456+00:19:32", utc - 1_172_000_000),
            ("2024-01-02 03:04:05.123456-03:30:52", utc + 12_652_000_000),
        ] {
            assert_eq!(
                parse(TIMESTAMPTZ, text),
                Value::TimestampTz(expected),
                "{text}"
            );
        }
        let bc = "0044-03-15 12:00:00+00 BC";
        let bc_micros = since_2000(-63_517_780_800_000_000);
        assert_eq!(parse(TIMESTAMPTZ, bc), Value::TimestampTz(bc_micros));
        assert_eq!(format_timestamptz(bc_micros), bc);
        assert_eq!(parse(TIMESTAMPTZ, "infinity"), Value::TimestampTz(i64::MAX));
        assert_eq!(
            parse(TIMESTAMPTZ, "-infinity"),
            Value::TimestampTz(i64::MIN)
        );
        for (text, micros) in [
            ("294276-12-31 23:59:59.999999+00", TIMESTAMP_END - 1),
            ("4714-11-24 00:00:00+00 BC", TIMESTAMP_MIN),
            ("4713-11-24 00:00:00+00 BC", -211_781_865_600_000_000),
        ] {
            assert_eq!(
                parse(TIMESTAMPTZ, text),
                Value::TimestampTz(micros),
                "{text}"
            );
            assert_eq!(format_timestamptz(micros), text);
        }
        // Offsets count: an hour west of the last instant is past the range, an hour east
        // of it is inside.
        bad(TIMESTAMPTZ, "294276-12-31 23:59:59.999999-01");
        assert_eq!(
            parse(TIMESTAMPTZ, "294276-12-31 23:59:59.999999+01"),
            Value::TimestampTz(TIMESTAMP_END - 1 - 3_600 * MICROS_PER_SECOND)
        );
        bad(TIMESTAMPTZ, "4714-11-24 00:00:00+01 BC");
        for text in [
            "2024-01-02 03:04:05",
            "2024-01-02 03:04:05+0530",
            "2024-01-02 03:04:05+24",
            "2024-01-02 03:04:05+05:60",
            "2024-01-02 03:04:05 UTC",
        ] {
            bad(TIMESTAMPTZ, text);
        }
    }
}
