//! SQL literals for MySQL/MariaDB text-protocol statements, written into a reused buffer.
//!
//! Every lane session runs with `sql_mode` containing `NO_BACKSLASH_ESCAPES`
//! (<https://mariadb.com/kb/en/sql-mode/>, <https://dev.mysql.com/doc/refman/8.0/en/sql-mode.html>),
//! so inside `'…'` the only special character is `'` itself, written `''`; backslashes and NUL
//! bytes are ordinary characters. Identifiers are quoted with backticks, a backtick doubled.
//! Bytes go as `X'…'` hex literals, which are binary strings in both servers.
//!
//! Temporal values are written from Zipline's integer representation (days since 1970-01-01,
//! microseconds since 2000-01-01) without a date library. MySQL has no infinities, no BC dates
//! and no years past 9999 (PostgreSQL's reach 294276 for timestamps, 5874897 for dates), and no
//! NaN or infinite numbers. What happens to such a value depends on the sink
//! column ([`SinkClass`], from `information_schema.COLUMNS.DATA_TYPE`): a textual column gets
//! PostgreSQL's text (`'NaN'`, `'infinity'`, `'0044-03-15 BC'`), any other column gets NULL
//! (counted and logged by the caller, see [`note_nulled`]), and where the sink column is not
//! known ([`SinkClass::Strict`]: key columns of deletes, shapes the sink has not described)
//! it is an error rather than a silently wrong row. The full mapping is in `docs/types.md`.
//!
//! Built-in PostgreSQL arrays are written as JSON arrays (see `array.rs`).
//!
//! Floats are written with Rust's shortest round-trip representation in exponent form
//! (`1e-1`), which both servers parse as a DOUBLE literal. A `real` is widened to `f64` first:
//! the shortest *f32* text of `f32::MAX` (`3.4028235e38`) read as a double lies above FLOAT's
//! range and MariaDB rejects it with error 1264, while the exact widened value rounds back to
//! the same `f32` in a FLOAT column.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::array;
use crate::change::{PG_EPOCH_DAYS, Value};

const MICROS_PER_SECOND: i64 = 1_000_000;
const MICROS_PER_DAY: i64 = 86_400 * MICROS_PER_SECOND;
const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends `` `ident` `` with embedded backticks doubled.
pub(crate) fn push_ident(buf: &mut String, ident: &str) {
    buf.push('`');
    push_doubling(buf, ident, '`');
    buf.push('`');
}

/// Appends `'text'` with embedded quotes doubled (valid only under `NO_BACKSLASH_ESCAPES`).
pub(crate) fn push_str(buf: &mut String, text: &str) {
    buf.push('\'');
    push_doubling(buf, text, '\'');
    buf.push('\'');
}

fn push_doubling(buf: &mut String, text: &str, quote: char) {
    let mut rest = text;
    while let Some(i) = rest.find(quote) {
        buf.push_str(&rest[..=i]);
        buf.push(quote);
        rest = &rest[i + 1..];
    }
    buf.push_str(rest);
}

/// Appends `X'…'` (lower-case hex).
fn push_bytes(buf: &mut String, bytes: &[u8]) {
    buf.reserve(bytes.len() * 2 + 3);
    buf.push_str("X'");
    for &b in bytes {
        buf.push(char::from(HEX[usize::from(b >> 4)]));
        buf.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    buf.push('\'');
}

/// What a sink column can take, from its `information_schema.COLUMNS.DATA_TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum SinkClass {
    /// Not known: a value MySQL cannot represent is an error.
    #[default]
    Strict,
    /// CHAR, VARCHAR, TEXT and friends (and ENUM/SET): unrepresentable values are written as
    /// PostgreSQL's text for them.
    Text,
    /// Any other column (numbers, JSON, binary): unrepresentable values are written as NULL.
    Typed,
    /// DATETIME and TIMESTAMP: as [`SinkClass::Typed`]; bulk execution sends timestamps to
    /// them in binary.
    DateTime,
    /// DATE: as [`SinkClass::Typed`]; bulk execution sends dates to it in binary.
    Date,
}

impl SinkClass {
    /// The class of a column of `information_schema` `DATA_TYPE` `data_type`.
    pub(crate) fn of(data_type: &str) -> Self {
        match data_type.to_ascii_lowercase().as_str() {
            "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" | "enum"
            | "set" => SinkClass::Text,
            "datetime" | "timestamp" => SinkClass::DateTime,
            "date" => SinkClass::Date,
            _ => SinkClass::Typed,
        }
    }
}

/// How [`push_cell`] wrote a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// The value itself (or NULL for a NULL).
    Value,
    /// NULL in place of a value the sink column cannot hold; the caller reports it with
    /// [`note_nulled`].
    Nulled,
}

/// Appends the literal for `value` as if for a column of unknown type: values MySQL cannot
/// represent are errors. See [`push_cell`].
pub(crate) fn push_value(buf: &mut String, value: &Value) -> Result<(), String> {
    push_cell(buf, value, SinkClass::Strict).map(|_| ())
}

/// Appends the literal for `value` going into a column of class `class`. On error the buffer
/// may hold a partial literal (the caller abandons the statement) and the message says what is
/// wrong with the value, without naming the column (the caller knows it).
pub(crate) fn push_cell(
    buf: &mut String,
    value: &Value,
    class: SinkClass,
) -> Result<Written, String> {
    let mark = buf.len();
    if let (SinkClass::Text, Value::Numeric(text)) = (class, value)
        && push_numeric(buf, text).is_ok()
    {
        // Unquoted, MySQL would read a long number as a DOUBLE before storing its text.
        buf.insert(mark, '\'');
        buf.push('\'');
        return Ok(Written::Value);
    }
    buf.truncate(mark);
    match push_known(buf, value) {
        Ok(()) => Ok(Written::Value),
        Err(Unrepresentable { pg_text, problem }) => {
            buf.truncate(mark);
            match (class, pg_text) {
                (SinkClass::Strict, _) | (_, None) => Err(problem),
                (SinkClass::Text, Some(text)) => {
                    push_str(buf, &text);
                    Ok(Written::Value)
                }
                (SinkClass::Typed | SinkClass::DateTime | SinkClass::Date, Some(_)) => {
                    buf.push_str("NULL");
                    Ok(Written::Nulled)
                }
            }
        }
    }
}

/// A value MySQL has no equivalent for: PostgreSQL's text for it (`None` when the value is
/// simply malformed) and why it cannot be written.
struct Unrepresentable {
    pg_text: Option<String>,
    problem: String,
}

impl Unrepresentable {
    fn malformed(problem: String) -> Self {
        Unrepresentable {
            pg_text: None,
            problem,
        }
    }
}

fn push_known(buf: &mut String, value: &Value) -> Result<(), Unrepresentable> {
    // `write!` into a String cannot fail.
    match value {
        Value::Null => buf.push_str("NULL"),
        Value::Bool(b) => buf.push(if *b { '1' } else { '0' }),
        Value::Int2(i) => push_int(buf, i64::from(*i)),
        Value::Int4(i) => push_int(buf, i64::from(*i)),
        Value::Int8(i) => push_int(buf, *i),
        Value::Float4(f) => push_float(buf, f64::from(*f), "real")?,
        Value::Float8(f) => push_float(buf, *f, "double precision")?,
        Value::Numeric(text) => push_numeric(buf, text)?,
        Value::Other { type_oid, text } if array::is_builtin_array(*type_oid) => {
            let mut json = String::with_capacity(text.len() + 8);
            array::push_json_array(&mut json, *type_oid, text)
                .map_err(Unrepresentable::malformed)?;
            push_str(buf, &json);
        }
        Value::Text(text) | Value::Json(text) | Value::Other { text, .. } => push_str(buf, text),
        Value::Bytes(bytes) => push_bytes(buf, bytes),
        Value::Date(days) => {
            buf.push('\'');
            push_date(buf, *days)?;
            buf.push('\'');
        }
        Value::Time(micros) => {
            if !(0..=MICROS_PER_DAY).contains(micros) {
                return Err(Unrepresentable::malformed(format!(
                    "time value of {micros} microseconds is outside 00:00:00..24:00:00"
                )));
            }
            buf.push('\'');
            push_time_of_day(buf, *micros);
            buf.push('\'');
        }
        Value::Timestamp(micros) => push_timestamp(buf, *micros, "timestamp", "")?,
        Value::TimestampTz(micros) => push_timestamp(buf, *micros, "timestamptz", "+00")?,
        Value::Uuid(bytes) => push_uuid(buf, bytes),
        Value::Unchanged => {
            return Err(Unrepresentable::malformed(
                "an unchanged-TOAST marker where a value is required".to_owned(),
            ));
        }
    }
    Ok(())
}

/// Values written as NULL since the process started, for every sink.
static NULLED: AtomicU64 = AtomicU64::new(0);
/// When [`note_nulled`] last logged, and how many it kept quiet about since.
static LAST_WARN: Mutex<Option<(Instant, u64)>> = Mutex::new(None);
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Counts a value written as NULL because sink column `table.column` cannot hold it, and logs
/// a warning at most every ten seconds (with the number of such values since the last one).
pub(crate) fn note_nulled(sink: &str, table: &str, column: &str, value: &Value) {
    let total = NULLED.fetch_add(1, Ordering::Relaxed) + 1;
    let now = Instant::now();
    let mut last = LAST_WARN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let quiet = match *last {
        Some((at, quiet)) if now.duration_since(at) < WARN_EVERY => {
            *last = Some((at, quiet + 1));
            return;
        }
        Some((_, quiet)) => quiet,
        None => 0,
    };
    *last = Some((now, 0));
    drop(last);
    let mut shown = String::new();
    let _ = push_cell(&mut shown, value, SinkClass::Text);
    tracing::warn!(
        sink,
        column = %format_args!("{table}.{column}"),
        value = %shown,
        suppressed = quiet,
        total,
        "the sink column cannot hold this value (MySQL has no NaN, infinity, BC or \
         year-10000+ values); wrote NULL instead (see docs/types.md)"
    );
}

fn push_float(buf: &mut String, f: f64, type_name: &str) -> Result<(), Unrepresentable> {
    if !f.is_finite() {
        let pg = if f.is_nan() {
            "NaN"
        } else if f > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        };
        return Err(Unrepresentable {
            pg_text: Some(pg.to_owned()),
            problem: format!(
                "{type_name} value {pg} has no MySQL equivalent (MySQL has no NaN or infinity)"
            ),
        });
    }
    let _ = write!(buf, "{f:e}");
    Ok(())
}

/// Writes PostgreSQL's numeric text unquoted, after checking it is a plain decimal number:
/// the text may come from a transform, and it is spliced into SQL without quotes.
fn push_numeric(buf: &mut String, text: &str) -> Result<(), Unrepresentable> {
    let body = text.strip_prefix(['-', '+']).unwrap_or(text);
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some((int, frac)) => {
            (int.is_empty() || digits(int))
                && (frac.is_empty() || digits(frac))
                && !(int.is_empty() && frac.is_empty())
        }
        None => digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['-', '+']).unwrap_or(e)));
    if mantissa_ok && exponent_ok {
        buf.push_str(text);
        Ok(())
    } else if matches!(body, "NaN" | "Infinity" | "inf" | "Inf") {
        Err(Unrepresentable {
            pg_text: Some(text.to_owned()),
            problem: format!(
                "numeric value {text} has no MySQL equivalent (MySQL has no NaN or infinity)"
            ),
        })
    } else {
        Err(Unrepresentable::malformed(format!(
            "numeric value {text:?} is not a decimal number"
        )))
    }
}

/// Writes `YYYY-MM-DD` (no quotes) for days since 1970-01-01.
fn push_date(buf: &mut String, days: i32) -> Result<(), Unrepresentable> {
    let infinite = match days {
        i32::MAX => "infinity",
        i32::MIN => "-infinity",
        _ => return push_civil_date(buf, i64::from(days), "date", |d| d),
    };
    Err(Unrepresentable {
        pg_text: Some(infinite.to_owned()),
        problem: format!("date value {infinite} has no MySQL equivalent"),
    })
}

/// Writes the date of `days`, or fails for years outside 1..=9999 with PostgreSQL's text,
/// which `pg_text` completes from the date's text (adding the time of day for timestamps).
fn push_civil_date(
    buf: &mut String,
    days: i64,
    type_name: &str,
    pg_text: impl FnOnce(String) -> String,
) -> Result<(), Unrepresentable> {
    let (year, month, day) = civil_from_days(days);
    if !(1..=9999).contains(&year) {
        let date = if year <= 0 {
            format!("{:04}-{month:02}-{day:02}", 1 - year)
        } else {
            format!("{year}-{month:02}-{day:02}")
        };
        let mut text = pg_text(date);
        if year <= 0 {
            text.push_str(" BC");
        }
        return Err(Unrepresentable {
            problem: format!("{type_name} {text} is outside MySQL's range (years 0001..9999)"),
            pg_text: Some(text),
        });
    }
    // 1..=9999, checked above.
    let mut date = *b"0000-00-00";
    put_digits(&mut date[0..4], year as u32);
    put_digits(&mut date[5..7], month);
    put_digits(&mut date[8..10], day);
    buf.push_str(ascii(&date));
    Ok(())
}

/// Writes `HH:MM:SS.ffffff` (no quotes) for microseconds since midnight.
fn push_time_of_day(buf: &mut String, micros: i64) {
    // 0..=24h, checked by the callers, so every part fits a u32.
    let secs = (micros / MICROS_PER_SECOND) as u32;
    let mut time = *b"00:00:00.000000";
    put_digits(&mut time[0..2], secs / 3600);
    put_digits(&mut time[3..5], secs / 60 % 60);
    put_digits(&mut time[6..8], secs % 60);
    put_digits(&mut time[9..15], (micros % MICROS_PER_SECOND) as u32);
    buf.push_str(ascii(&time));
}

/// Fills `field` with the last `field.len()` decimal digits of `n`, zero-padded. Temporal
/// fields are written into a stack buffer and appended as one `&str`: a `String::push` per
/// digit was the main cost of timestamp literals.
fn put_digits(field: &mut [u8], mut n: u32) {
    for d in field.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// `bytes`, which the callers fill with ASCII only, as text.
fn ascii(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).expect("ASCII digits and separators")
}

/// Appends a decimal integer (`itoa`: two digits per step, no `fmt`).
fn push_int(buf: &mut String, value: i64) {
    buf.push_str(itoa::Buffer::new().format(value));
}

/// Writes `'YYYY-MM-DD HH:MM:SS.ffffff'` for microseconds since 2000-01-01 (any `i64`: the
/// day count cannot overflow); for `timestamptz` the value is UTC, which is what the
/// lane session's `time_zone='+00:00'` expects for TIMESTAMP columns. `offset` is what
/// PostgreSQL prints after the time in UTC (`+00` for timestamptz), for the text of values
/// MySQL cannot hold.
fn push_timestamp(
    buf: &mut String,
    micros: i64,
    type_name: &str,
    offset: &str,
) -> Result<(), Unrepresentable> {
    let infinite = match micros {
        i64::MAX => "infinity",
        i64::MIN => "-infinity",
        _ => "",
    };
    if !infinite.is_empty() {
        return Err(Unrepresentable {
            pg_text: Some(infinite.to_owned()),
            problem: format!("{type_name} value {infinite} has no MySQL equivalent"),
        });
    }
    let time = micros.rem_euclid(MICROS_PER_DAY);
    buf.push('\'');
    let days = micros.div_euclid(MICROS_PER_DAY) + i64::from(PG_EPOCH_DAYS);
    push_civil_date(buf, days, type_name, |date| {
        let mut text = date;
        text.push(' ');
        push_time_of_day(&mut text, time);
        // PostgreSQL prints no trailing fractional zeros.
        let trimmed = text.trim_end_matches('0').trim_end_matches('.').len();
        text.truncate(trimmed);
        text.push_str(offset);
        text
    })?;
    buf.push(' ');
    push_time_of_day(buf, time);
    buf.push('\'');
    Ok(())
}

/// Writes `'xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx'` (lower case).
fn push_uuid(buf: &mut String, bytes: &[u8; 16]) {
    buf.push('\'');
    for (i, &b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            buf.push('-');
        }
        buf.push(char::from(HEX[usize::from(b >> 4)]));
        buf.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    buf.push('\'');
}

/// Proleptic Gregorian (year, month, day) for days since 1970-01-01; year 0 is 1 BC.
/// Howard Hinnant's `civil_from_days`: <https://howardhinnant.github.io/date_algorithms.html>.
pub(super) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // month and day are small positive numbers by construction.
    (year, month as u32, day as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::{DATE_MAX, DATE_MIN, PG_EPOCH_MICROS, TIMESTAMP_END, TIMESTAMP_MIN};

    fn lit(value: Value) -> String {
        let mut buf = String::new();
        push_value(&mut buf, &value).unwrap_or_else(|e| panic!("{value:?}: {e}"));
        buf
    }

    fn err(value: Value) -> String {
        let mut buf = String::new();
        push_value(&mut buf, &value).expect_err("value must be rejected")
    }

    #[test]
    fn strings_double_only_the_quote() {
        assert_eq!(lit(Value::Text("it's".into())), "'it''s'");
        assert_eq!(lit(Value::Text("''".into())), "''''''");
        // Backslashes stay literal under NO_BACKSLASH_ESCAPES.
        assert_eq!(lit(Value::Text(r"a\'b\".into())), r"'a\''b\'");
        assert_eq!(lit(Value::Text("nul\0byte".into())), "'nul\0byte'");
        assert_eq!(lit(Value::Text("żółw 🐢".into())), "'żółw 🐢'");
        assert_eq!(
            lit(Value::Json(r#"{"a":"it's"}"#.into())),
            r#"'{"a":"it''s"}'"#
        );
        assert_eq!(
            lit(Value::Other {
                type_oid: 869,
                text: "10.0.0.1".into()
            }),
            "'10.0.0.1'"
        );
    }

    #[test]
    fn identifiers_double_backticks() {
        let mut buf = String::new();
        push_ident(&mut buf, "we`ird``name");
        assert_eq!(buf, "`we``ird````name`");
        buf.clear();
        push_ident(&mut buf, "it's");
        assert_eq!(buf, "`it's`");
    }

    #[test]
    fn scalars() {
        assert_eq!(lit(Value::Null), "NULL");
        assert_eq!(lit(Value::Bool(true)), "1");
        assert_eq!(lit(Value::Bool(false)), "0");
        assert_eq!(lit(Value::Int2(i16::MIN)), "-32768");
        assert_eq!(lit(Value::Int4(42)), "42");
        assert_eq!(lit(Value::Int8(i64::MAX)), "9223372036854775807");
        assert_eq!(lit(Value::Int8(i64::MIN)), "-9223372036854775808");
        assert_eq!(lit(Value::Int4(0)), "0");
        assert_eq!(lit(Value::Int4(-7)), "-7");
        assert_eq!(lit(Value::Bytes(vec![0, 0xab, 0xff])), "X'00abff'");
        assert_eq!(lit(Value::Bytes(vec![])), "X''");
        assert_eq!(
            lit(Value::Uuid([
                0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38,
                0x0a, 0x11
            ])),
            "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"
        );
    }

    #[test]
    fn floats_round_trip_in_exponent_form() {
        for f in [0.1, -2.5, 1e300, 5e-324, f64::MAX, 123_456.789, 0.0, -0.0] {
            let text = lit(Value::Float8(f));
            assert!(text.contains('e'), "{text}");
            assert_eq!(
                text.parse::<f64>().unwrap().to_bits(),
                f.to_bits(),
                "{text}"
            );
        }
        // A real is written as its exact double value, which lies inside FLOAT's range.
        let text = lit(Value::Float4(f32::MAX));
        assert_eq!(text, "3.4028234663852886e38");
        assert_eq!(text.parse::<f64>().unwrap() as f32, f32::MAX);
        assert_eq!(lit(Value::Float4(0.5)), "5e-1");
    }

    #[test]
    fn non_finite_numbers_are_rejected() {
        assert!(err(Value::Float8(f64::NAN)).contains("NaN"));
        assert!(err(Value::Float4(f32::INFINITY)).contains("real value Infinity"));
        assert!(err(Value::Float8(f64::NEG_INFINITY)).contains("-Infinity"));
        for text in ["NaN", "Infinity", "-Infinity"] {
            let e = err(Value::Numeric(text.into()));
            assert!(e.contains(text) && e.contains("no MySQL equivalent"), "{e}");
        }
    }

    #[test]
    fn numerics_are_checked_before_going_unquoted() {
        for ok in [
            "0",
            "-12.5000",
            "+3",
            ".5",
            "5.",
            "1e10",
            "1.5E-3",
            "123456789012345678901234567890",
        ] {
            assert_eq!(lit(Value::Numeric(ok.into())), ok);
        }
        for bad in [
            "",
            ".",
            "1;DROP TABLE t",
            "1 2",
            "0x10",
            "1e",
            "--1",
            "1.2.3",
        ] {
            assert!(
                err(Value::Numeric(bad.into())).contains("not a decimal"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn dates_and_times() {
        assert_eq!(lit(Value::Date(0)), "'1970-01-01'");
        assert_eq!(lit(Value::Date(19_753)), "'2024-01-31'");
        assert_eq!(lit(Value::Date(-1)), "'1969-12-31'");
        assert_eq!(lit(Value::Date(11_016)), "'2000-02-29'");
        assert_eq!(lit(Value::Date(-719_162)), "'0001-01-01'");
        assert_eq!(lit(Value::Date(2_932_896)), "'9999-12-31'");
        assert_eq!(lit(Value::Time(0)), "'00:00:00.000000'");
        assert_eq!(lit(Value::Time(45_296_000_001)), "'12:34:56.000001'");
        assert_eq!(lit(Value::Time(MICROS_PER_DAY)), "'24:00:00.000000'");
        assert_eq!(lit(Value::Timestamp(0)), "'2000-01-01 00:00:00.000000'");
        assert_eq!(lit(Value::Timestamp(-1)), "'1999-12-31 23:59:59.999999'");
        assert_eq!(
            lit(Value::Timestamp(-PG_EPOCH_MICROS)),
            "'1970-01-01 00:00:00.000000'"
        );
        assert_eq!(
            lit(Value::TimestampTz(1_706_704_496_123_456 - PG_EPOCH_MICROS)),
            "'2024-01-31 12:34:56.123456'"
        );
        assert_eq!(
            lit(Value::Timestamp(253_402_300_799_999_999 - PG_EPOCH_MICROS)),
            "'9999-12-31 23:59:59.999999'"
        );
    }

    #[test]
    fn dates_outside_mysql_range_are_rejected() {
        assert!(err(Value::Date(i32::MAX)).contains("infinity"));
        assert!(err(Value::Date(i32::MIN)).contains("-infinity"));
        assert!(err(Value::Timestamp(i64::MAX)).contains("timestamp value infinity"));
        assert!(err(Value::TimestampTz(i64::MIN)).contains("timestamptz value -infinity"));
        // 0044-03-15 BC
        let e = err(Value::Date(-735_160));
        assert!(e.contains("0044-03-15 BC") && e.contains("outside"), "{e}");
        assert!(err(Value::Date(2_932_897)).contains("10000-01-01"));
        // The far ends of PostgreSQL's ranges, and any other i64, take the same path.
        let e = err(Value::Timestamp(TIMESTAMP_END - 1));
        assert!(
            e.contains("timestamp 294276-12-31 23:59:59.999999 is outside MySQL's range"),
            "{e}"
        );
        let e = err(Value::TimestampTz(TIMESTAMP_MIN));
        assert!(e.contains("timestamptz 4714-11-24 00:00:00+00 BC"), "{e}");
        assert!(err(Value::Date(DATE_MAX)).contains("date 5874897-12-31 is outside"));
        assert!(err(Value::Date(DATE_MIN)).contains("date 4714-11-24 BC is outside"));
        for t in [i64::MIN + 1, i64::MAX - 1] {
            assert!(err(Value::Timestamp(t)).contains("outside MySQL's range"));
        }
        assert!(err(Value::Time(-1)).contains("outside"));
        assert!(err(Value::Unchanged).contains("unchanged"));
    }

    fn cell(value: Value, class: SinkClass) -> (String, Written) {
        let mut buf = String::from("x,");
        let written = push_cell(&mut buf, &value, class).unwrap_or_else(|e| panic!("{e}"));
        (buf[2..].to_owned(), written)
    }

    #[test]
    fn unrepresentable_values_become_text_or_null_by_sink_column() {
        let cases = [
            (Value::Float8(f64::NAN), "'NaN'"),
            (Value::Float4(f32::INFINITY), "'Infinity'"),
            (Value::Float8(f64::NEG_INFINITY), "'-Infinity'"),
            (Value::Numeric("NaN".into()), "'NaN'"),
            (Value::Numeric("-Infinity".into()), "'-Infinity'"),
            (Value::Date(i32::MAX), "'infinity'"),
            (Value::Date(-735_160), "'0044-03-15 BC'"),
            (Value::Timestamp(i64::MIN), "'-infinity'"),
            // 0044-03-15 12:00:00.5 BC
            (
                Value::Timestamp(-735_160 * MICROS_PER_DAY + 43_200_500_000 - PG_EPOCH_MICROS),
                "'0044-03-15 12:00:00.5 BC'",
            ),
            (
                Value::TimestampTz(-735_160 * MICROS_PER_DAY - PG_EPOCH_MICROS),
                "'0044-03-15 00:00:00+00 BC'",
            ),
            (
                Value::Timestamp(TIMESTAMP_END - 1),
                "'294276-12-31 23:59:59.999999'",
            ),
            (
                Value::TimestampTz(TIMESTAMP_END - 1),
                "'294276-12-31 23:59:59.999999+00'",
            ),
            (Value::Timestamp(TIMESTAMP_MIN), "'4714-11-24 00:00:00 BC'"),
            (Value::Date(DATE_MAX), "'5874897-12-31'"),
            (Value::Date(DATE_MIN), "'4714-11-24 BC'"),
        ];
        for (value, text) in cases {
            assert_eq!(
                cell(value.clone(), SinkClass::Text),
                (text.to_owned(), Written::Value)
            );
            assert_eq!(
                cell(value, SinkClass::Typed),
                ("NULL".to_owned(), Written::Nulled)
            );
        }
        // Representable values and malformed ones do not depend on the column.
        assert_eq!(
            cell(Value::Numeric("1.5".into()), SinkClass::Typed),
            ("1.5".to_owned(), Written::Value)
        );
        assert_eq!(
            cell(Value::Null, SinkClass::Typed),
            ("NULL".to_owned(), Written::Value)
        );
        let mut buf = String::new();
        assert!(push_cell(&mut buf, &Value::Numeric("1;x".into()), SinkClass::Text).is_err());
        assert_eq!(SinkClass::of("LONGTEXT"), SinkClass::Text);
        assert_eq!(SinkClass::of("varchar"), SinkClass::Text);
        assert_eq!(SinkClass::of("decimal"), SinkClass::Typed);
        assert_eq!(SinkClass::of("json"), SinkClass::Typed);
        assert_eq!(SinkClass::of("timestamp"), SinkClass::DateTime);
        assert_eq!(SinkClass::of("DATE"), SinkClass::Date);
    }

    #[test]
    fn builtin_arrays_become_json_and_user_arrays_stay_text() {
        assert_eq!(
            lit(Value::Other {
                type_oid: 1009,
                text: r#"{a,"it's",NULL}"#.into()
            }),
            r#"'["a","it''s",null]'"#
        );
        assert_eq!(
            lit(Value::Other {
                type_oid: 1007,
                text: "{}".into()
            }),
            "'[]'"
        );
        assert_eq!(
            lit(Value::Other {
                type_oid: 16_501,
                text: "{red,green}".into()
            }),
            "'{red,green}'"
        );
        assert!(
            err(Value::Other {
                type_oid: 1007,
                text: "{1,".into()
            })
            .contains("malformed")
        );
    }
}
