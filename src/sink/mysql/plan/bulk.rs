//! Statements for MariaDB's bulk execution (`COM_STMT_BULK_EXECUTE`, which mysql_async's
//! `exec_batch` uses when the server offers it): the rest of a group as one single-row
//! prepared statement and every row's parameters, in one request that the driver splits at
//! `max_allowed_packet`. The server parses the statement once per connection instead of a
//! multi-row text statement per batch, which spares it a fifth to a third of its CPU
//! (`docs/performance.md`, "MySQL: text upserts, prepared statements or bulk execution").
//!
//! Values are the text path's (`literal.rs`) in binary form, with the same sink classes
//! deciding what happens to values MySQL cannot hold, the same errors and the same NULLs.
//! Integers and finite floats go as 64-bit numbers, text and bytes as strings, timestamps
//! into DATETIME and TIMESTAMP columns and dates into DATE columns as binary temporal values
//! (the server then has no text to parse); the rest (numeric, other temporal cases, UUID,
//! array) as the text its literal would quote, which the server converts as it converts the
//! quoted literal. A key compared with a numeric's text would be
//! compared as a DOUBLE, so deletes of numeric keys stay on the text path.

use mysql_async::{Params, Value as Param};

use super::super::array;
use super::super::coalesce::{DeleteGroup, UpsertGroup};
use super::super::literal::{
    SinkClass, Written, civil_from_days, note_nulled, push_cell, push_ident,
};
use super::{Plan, kept_columns, push_upsert_tail};
use crate::change::{PG_EPOCH_DAYS, Value};
use crate::sink::SinkError;

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// A lane's reused bulk statement and parameters.
#[derive(Debug)]
pub(crate) struct Bulk {
    /// Groups of at least this many rows go bulk; 0 means none.
    min_rows: usize,
    /// The statement, one `?` per value.
    pub(crate) sql: String,
    /// One entry per row.
    pub(crate) params: Vec<Params>,
    /// For values converted through their literal.
    scratch: String,
}

impl Bulk {
    /// Bulk execution for groups of at least `min_rows` rows (0: never).
    pub(crate) fn new(min_rows: usize) -> Self {
        Bulk {
            min_rows,
            sql: String::new(),
            params: Vec::new(),
            scratch: String::new(),
        }
    }

    /// `bulk`, if it takes a group with `rows` rows left.
    pub(super) fn taking<'b>(bulk: &'b mut Option<&mut Bulk>, rows: usize) -> Option<&'b mut Bulk> {
        bulk.as_deref_mut()
            .filter(|b| b.min_rows > 0 && rows >= b.min_rows)
    }
}

impl Plan<'_> {
    /// Whether the keys of `group` from `from` on may be deleted by bulk execution.
    pub(super) fn bulk_deletable(group: &DeleteGroup<'_>, from: usize) -> bool {
        !group.keys[from..]
            .iter()
            .any(|key| key.iter().any(|v| matches!(v, Value::Numeric(_))))
    }

    /// `DELETE … WHERE k1=? AND k2=?` and the parameters of `group`'s keys from `from` on.
    pub(super) fn bulk_delete(
        &self,
        bulk: &mut Bulk,
        group: &DeleteGroup<'_>,
        from: usize,
    ) -> Result<usize, SinkError> {
        let shape = group.shape;
        let sql = &mut bulk.sql;
        sql.clear();
        sql.push_str("DELETE FROM ");
        self.push_table(sql, shape);
        sql.push_str(" WHERE ");
        for (n, &i) in shape.key.iter().enumerate() {
            if n > 0 {
                sql.push_str(" AND ");
            }
            push_ident(sql, &shape.columns[i].name);
            sql.push_str("=?");
        }
        let keys = &group.keys[from..];
        bulk.params.clear();
        bulk.params.reserve(keys.len());
        for key in keys {
            let mut row = Vec::with_capacity(key.len());
            for (value, &i) in key.iter().zip(&shape.key) {
                let (param, _) = param_cell(value, SinkClass::Strict, &mut bulk.scratch)
                    .map_err(|problem| self.value_error(shape, i, &problem, key))?;
                row.push(param);
            }
            bulk.params.push(Params::Positional(row));
        }
        Ok(keys.len())
    }

    /// The guarded single-row upsert and the parameters of `group`'s rows from `from` on.
    pub(super) fn bulk_upsert(
        &self,
        bulk: &mut Bulk,
        group: &UpsertGroup<'_>,
        from: usize,
    ) -> Result<usize, SinkError> {
        let shape = group.shape;
        let sql = &mut bulk.sql;
        sql.clear();
        self.push_upsert_head(sql, group);
        sql.push('(');
        let mut width = 0;
        for _ in kept_columns(group) {
            if width > 0 {
                sql.push(',');
            }
            sql.push('?');
            width += 1;
        }
        sql.push(')');
        push_upsert_tail(sql, group);
        let classes = self.classes(shape);
        let rows = &group.rows[from..];
        bulk.params.clear();
        bulk.params.reserve(rows.len());
        for row in rows {
            let values = row.values();
            let mut out = Vec::with_capacity(width);
            for (i, col) in kept_columns(group) {
                let (param, written) = param_cell(&values[i], classes[i], &mut bulk.scratch)
                    .map_err(|problem| self.value_error(shape, i, &problem, row))?;
                if written == Written::Nulled {
                    note_nulled(self.sink, &shape.name, &col.name, &values[i]);
                }
                out.push(param);
            }
            bulk.params.push(Params::Positional(out));
        }
        Ok(rows.len())
    }
}

/// The parameter for `value` going into a column of class `class`: what
/// [`push_cell`] writes, in binary form (see the module docs).
fn param_cell(
    value: &Value,
    class: SinkClass,
    scratch: &mut String,
) -> Result<(Param, Written), String> {
    let param = match value {
        Value::Null => Param::NULL,
        Value::Bool(b) => Param::Int(i64::from(*b)),
        Value::Int2(i) => Param::Int(i64::from(*i)),
        Value::Int4(i) => Param::Int(i64::from(*i)),
        Value::Int8(i) => Param::Int(*i),
        Value::Float4(f) if f.is_finite() => Param::Double(f64::from(*f)),
        Value::Float8(f) if f.is_finite() => Param::Double(*f),
        Value::Text(text) | Value::Json(text) => Param::Bytes(text.as_bytes().to_vec()),
        Value::Other { type_oid, text } if !array::is_builtin_array(*type_oid) => {
            Param::Bytes(text.as_bytes().to_vec())
        }
        Value::Bytes(bytes) => Param::Bytes(bytes.to_vec()),
        Value::Timestamp(micros) | Value::TimestampTz(micros)
            if class == SinkClass::DateTime
                && let Some(param) = datetime(*micros) =>
        {
            param
        }
        Value::Date(days)
            if class == SinkClass::Date
                && let Some(param) = date(*days) =>
        {
            param
        }
        _ => {
            scratch.clear();
            let written = push_cell(scratch, value, class)?;
            return Ok((from_literal(scratch), written));
        }
    };
    Ok((param, Written::Value))
}

/// MySQL's binary DATETIME for microseconds since 2000-01-01 (UTC for a timestamptz, as the
/// lane session's time zone expects); `None` outside years 1..=9999, which the text path
/// handles.
fn datetime(micros: i64) -> Option<Param> {
    let days = micros.div_euclid(MICROS_PER_DAY) + i64::from(PG_EPOCH_DAYS);
    let time = micros.rem_euclid(MICROS_PER_DAY);
    let (year, month, day) = civil_date(days)?;
    // 0..MICROS_PER_DAY, so every part fits.
    let secs = (time / 1_000_000) as u32;
    Some(Param::Date(
        year,
        month,
        day,
        (secs / 3600) as u8,
        (secs / 60 % 60) as u8,
        (secs % 60) as u8,
        (time % 1_000_000) as u32,
    ))
}

/// MySQL's binary DATE for days since 1970-01-01; `None` as for [`datetime`].
fn date(days: i32) -> Option<Param> {
    let (year, month, day) = civil_date(i64::from(days))?;
    Some(Param::Date(year, month, day, 0, 0, 0, 0))
}

fn civil_date(days: i64) -> Option<(u16, u8, u8)> {
    let (year, month, day) = civil_from_days(days);
    // Month 1..=12 and day 1..=31 by construction.
    (1..=9999)
        .contains(&year)
        .then_some((year as u16, month as u8, day as u8))
}

/// The parameter a literal from [`push_cell`] stands for: NULL, a quoted string, or an
/// unquoted decimal number (only bytes are written as `X'…'`, and they do not come here).
fn from_literal(literal: &str) -> Param {
    if literal == "NULL" {
        return Param::NULL;
    }
    match literal
        .strip_prefix('\'')
        .and_then(|l| l.strip_suffix('\''))
    {
        Some(body) if body.contains('\'') => Param::Bytes(body.replace("''", "'").into_bytes()),
        Some(body) => Param::Bytes(body.as_bytes().to_vec()),
        None => Param::Bytes(literal.as_bytes().to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(value: &Value, class: SinkClass) -> (Param, Written) {
        param_cell(value, class, &mut String::new()).unwrap()
    }

    fn bytes(text: &str) -> Param {
        Param::Bytes(text.as_bytes().to_vec())
    }

    #[test]
    fn values_become_the_parameters_their_literals_stand_for() {
        use SinkClass::{Strict, Text, Typed};
        let ok = Written::Value;
        assert_eq!(param(&Value::Int4(-7), Strict), (Param::Int(-7), ok));
        assert_eq!(param(&Value::Bool(true), Typed), (Param::Int(1), ok));
        assert_eq!(
            param(&Value::Float4(0.1), Typed),
            (Param::Double(f64::from(0.1f32)), ok)
        );
        assert_eq!(
            param(&Value::Text("it's".into()), Strict),
            (bytes("it's"), ok)
        );
        assert_eq!(
            param(&Value::Bytes(vec![0, 0xff]), Strict),
            (Param::Bytes(vec![0, 0xff]), ok)
        );
        assert_eq!(
            param(&Value::Numeric("-1.50".into()), Typed),
            (bytes("-1.50"), ok)
        );
        assert_eq!(param(&Value::Numeric("12".into()), Text), (bytes("12"), ok));
        assert_eq!(param(&Value::Date(0), Typed), (bytes("1970-01-01"), ok));
        assert_eq!(
            param(&Value::Date(-719_162), SinkClass::Date),
            (Param::Date(1, 1, 1, 0, 0, 0, 0), ok)
        );
        // 2024-01-31 12:34:56.123456 and the last microsecond of 9999.
        assert_eq!(
            param(&Value::Timestamp(760_019_696_123_456), SinkClass::DateTime),
            (Param::Date(2024, 1, 31, 12, 34, 56, 123_456), ok)
        );
        assert_eq!(
            param(
                &Value::TimestampTz(252_455_615_999_999_999),
                SinkClass::DateTime
            ),
            (Param::Date(9999, 12, 31, 23, 59, 59, 999_999), ok)
        );
        // A timestamp bound for a DATE column goes as text, which the server truncates.
        assert_eq!(
            param(&Value::Timestamp(0), SinkClass::Date),
            (bytes("2000-01-01 00:00:00.000000"), ok)
        );
        assert_eq!(
            param(&Value::TimestampTz(0), Typed),
            (bytes("2000-01-01 00:00:00.000000"), ok)
        );
        assert_eq!(
            param(&Value::Uuid([0xab; 16]), Strict),
            (bytes("abababab-abab-abab-abab-abababababab"), ok)
        );
        // An array becomes its JSON, quotes and all.
        let array = Value::Other {
            type_oid: 1009,
            text: r#"{"it's",b}"#.into(),
        };
        assert_eq!(param(&array, Typed), (bytes(r#"["it's","b"]"#), ok));
        assert_eq!(param(&Value::Null, Strict), (Param::NULL, ok));
    }

    #[test]
    fn values_mysql_cannot_hold_follow_the_column_class() {
        let nan = Value::Float8(f64::NAN);
        assert_eq!(
            param(&nan, SinkClass::Typed),
            (Param::NULL, Written::Nulled)
        );
        assert_eq!(param(&nan, SinkClass::Text), (bytes("NaN"), Written::Value));
        assert!(param_cell(&nan, SinkClass::Strict, &mut String::new()).is_err());
        let infinite = Value::Date(i32::MAX);
        assert_eq!(
            param(&infinite, SinkClass::Text),
            (bytes("infinity"), Written::Value)
        );
        assert_eq!(
            param(&infinite, SinkClass::Date),
            (Param::NULL, Written::Nulled)
        );
        // Year 10000 has no binary DATETIME either: NULL, as on the text path.
        let late = Value::Timestamp(252_455_616_000_000_000);
        assert_eq!(
            param(&late, SinkClass::DateTime),
            (Param::NULL, Written::Nulled)
        );
        let bad = Value::Numeric("1;DROP TABLE t".into());
        let err = param_cell(&bad, SinkClass::Typed, &mut String::new()).unwrap_err();
        assert!(err.contains("not a decimal"), "{err}");
    }
}
