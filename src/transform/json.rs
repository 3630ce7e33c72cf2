//! Changes as JSON lines: the input of `zipline transform test`, its output, and the `change`
//! of a dead-letter record — one format, so a dead letter can be replayed through a fixed
//! transform with `transform test`.
//!
//! ```json
//! {"position":"0/16B3A28#3","table":"public.users","op":"update",
//!  "columns":[{"name":"id","type":"int8","key":true},{"name":"email","type":"text"}],
//!  "key":[42],"values":[42,"a@example.com"]}
//! ```
//!
//! `columns[].type` is a PostgreSQL type name (`int2`, `int4`, `int8`, `float4`, `float8`,
//! `numeric`, `text`, `varchar`, `bpchar`, `name`, `bytea`, `bool`, `date`, `time`,
//! `timestamp`, `timestamptz`, `uuid`, `json`, `jsonb`) or a type OID; `key` defaults to false.
//! Values follow the column type: numbers, strings, booleans, `null`; `numeric` as a string;
//! `bytea` as `"\\x0a0b"`; `uuid` as its usual text; `time` as microseconds since midnight;
//! dates as days and timestamps as microseconds since 1970-01-01, `"infinity"` and
//! `"-infinity"` for the infinities; `{"unchanged": true}` for an untouched TOASTed value. On
//! input `position` may be left out (line N gets `0/1#N`), and `key` may be left out when
//! `values` holds the key columns.
//!
//! Timestamps count from 1970 here although the change model and the WIT count from 2000
//! (PostgreSQL's epoch): this format is for people, who know Unix time, and files written
//! before contract 0.3.0 keep their meaning. It is still lossless: the latest timestamps
//! PostgreSQL holds are past `i64` from 1970, and go out as unsigned integers (JSON has no
//! width; serde_json reads them as `u64`). Those older files wrote the infinities as the
//! extreme integers: `-9223372036854775808` (no timestamp) still reads as `-infinity` and the
//! 32-bit extremes as the date infinities, but `9223372036854775807` is now the instant
//! 294247-01-10 04:00:54.775807 UTC.

use std::sync::Arc;

use serde_json::{Map, Number, Value as Json, json};

use crate::change::{
    Change, Column, Key, Lsn, Op, Position, Table, Value, timestamp_from_unix_micros,
    timestamp_to_unix_micros,
};

const TYPES: &[(&str, u32)] = &[
    ("bool", 16),
    ("bytea", 17),
    ("name", 19),
    ("int8", 20),
    ("int2", 21),
    ("int4", 23),
    ("text", 25),
    ("json", 114),
    ("float4", 700),
    ("float8", 701),
    ("bpchar", 1042),
    ("varchar", 1043),
    ("date", 1082),
    ("time", 1083),
    ("timestamp", 1114),
    ("timestamptz", 1184),
    ("numeric", 1700),
    ("uuid", 2950),
    ("jsonb", 3802),
];

/// A change as one JSON object.
pub fn change_to_json(c: &Change) -> Json {
    let columns: Vec<Json> = c
        .table
        .columns
        .iter()
        .map(|col| {
            let ty = match TYPES.iter().find(|(_, oid)| *oid == col.type_oid) {
                Some((name, _)) => json!(name),
                None => json!(col.type_oid),
            };
            let mut m = Map::new();
            m.insert("name".into(), json!(col.name));
            m.insert("type".into(), ty);
            if col.is_key {
                m.insert("key".into(), json!(true));
            }
            Json::Object(m)
        })
        .collect();
    let mut m = Map::new();
    m.insert("position".into(), json!(c.position.to_string()));
    m.insert("table".into(), json!(c.table.qualified_name()));
    m.insert("op".into(), json!(c.op.as_str()));
    m.insert("columns".into(), Json::Array(columns));
    m.insert(
        "key".into(),
        Json::Array(c.key.iter().map(value_to_json).collect()),
    );
    if let Some(old) = &c.old_key {
        m.insert(
            "old_key".into(),
            Json::Array(old.iter().map(value_to_json).collect()),
        );
    }
    if !c.values.is_empty() {
        m.insert(
            "values".into(),
            Json::Array(c.values.iter().map(value_to_json).collect()),
        );
    }
    Json::Object(m)
}

/// A key's values as a JSON array, the identity of a dead-lettered key (see
/// [`crate::sink::ParkedKey`]): the same key always gives the same text.
pub fn key_to_json(key: &[Value]) -> String {
    Json::Array(key.iter().map(value_to_json).collect()).to_string()
}

fn value_to_json(v: &Value) -> Json {
    match v {
        Value::Null => Json::Null,
        Value::Bool(b) => json!(b),
        Value::Int2(i) => json!(i),
        Value::Int4(i) => json!(i),
        Value::Int8(i) => json!(i),
        Value::Float4(f) => float_to_json(f64::from(*f)),
        Value::Float8(f) => float_to_json(*f),
        Value::Numeric(s) | Value::Text(s) | Value::Json(s) => json!(s),
        Value::Bytes(b) => {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            json!(format!("\\x{hex}"))
        }
        Value::Date(i32::MAX) => json!("infinity"),
        Value::Date(i32::MIN) => json!("-infinity"),
        Value::Date(d) => json!(d),
        Value::Time(t) => json!(t),
        Value::Timestamp(t) | Value::TimestampTz(t) => match timestamp_to_unix_micros(*t) {
            None if *t > 0 => json!("infinity"),
            None => json!("-infinity"),
            // From 2000, i64::MIN + 1 ..= i64::MAX - 1 is within i64 or u64 from 1970.
            Some(unix) => Number::from_i128(unix)
                .map(Json::Number)
                .unwrap_or_else(|| unreachable!("{unix} fits i64 or u64")),
        },
        Value::Uuid(u) => {
            let h: String = u.iter().map(|x| format!("{x:02x}")).collect();
            json!(format!(
                "{}-{}-{}-{}-{}",
                &h[..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..]
            ))
        }
        Value::Other { text, .. } => json!(text),
        Value::Unchanged => json!({"unchanged": true}),
    }
}

fn float_to_json(f: f64) -> Json {
    if f.is_nan() {
        json!("NaN")
    } else if f.is_infinite() {
        json!(if f > 0.0 { "Infinity" } else { "-Infinity" })
    } else {
        json!(f)
    }
}

/// Parses one line of changes; `line` (1-based) becomes the ordinal of a missing position.
/// Tables are shared between lines through `tables` when their shapes are equal.
pub fn change_from_json(
    text: &str,
    line: u32,
    tables: &mut Vec<Arc<Table>>,
) -> Result<Change, String> {
    let v: Json = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let o = v.as_object().ok_or("expected a JSON object")?;
    let table_name = o
        .get("table")
        .and_then(Json::as_str)
        .ok_or("`table` is missing or not a string")?;
    let (schema, name) = table_name.split_once('.').unwrap_or(("public", table_name));
    let op = match o.get("op").and_then(Json::as_str) {
        Some("insert") => Op::Insert,
        Some("update") => Op::Update,
        Some("delete") => Op::Delete,
        Some("truncate") => Op::Truncate,
        _ => return Err("`op` must be insert, update, delete or truncate".into()),
    };
    let position = match o.get("position").and_then(Json::as_str) {
        None => Position::new(Lsn(1), line),
        Some(p) => parse_position(p)?,
    };
    let columns = o
        .get("columns")
        .and_then(Json::as_array)
        .ok_or("`columns` is missing or not a list")?
        .iter()
        .enumerate()
        .map(|(i, c)| column_from_json(c).map_err(|m| format!("columns[{i}]: {m}")))
        .collect::<Result<Vec<_>, _>>()?;
    let shape = Table::new(schema.to_owned(), name.to_owned(), columns);
    let table = match tables.iter().find(|t| ***t == shape) {
        Some(t) => t.clone(),
        None => {
            tables.push(Arc::new(shape));
            tables[tables.len() - 1].clone()
        }
    };
    let values = match o.get("values") {
        None | Some(Json::Null) => Vec::new(),
        Some(v) => values_from_json(
            v,
            "values",
            &table,
            &(0..table.columns.len()).collect::<Vec<_>>(),
        )?,
    };
    if matches!(op, Op::Insert | Op::Update) && values.len() != table.columns.len() {
        return Err(format!(
            "`values` has {} items for {} columns",
            values.len(),
            table.columns.len()
        ));
    }
    let key = match o.get("key") {
        Some(k) if !k.is_null() => values_from_json(k, "key", &table, &table.key)?.into(),
        _ if op == Op::Truncate => Key::new(),
        _ if values.len() == table.columns.len() => {
            table.key.iter().map(|&i| values[i].clone()).collect()
        }
        _ => return Err("`key` is missing (and `values` does not hold the key columns)".into()),
    };
    let old_key = match o.get("old_key") {
        Some(k) if !k.is_null() => Some(Box::new(
            values_from_json(k, "old_key", &table, &table.key)?.into(),
        )),
        _ => None,
    };
    Ok(Change {
        position,
        op,
        table,
        key,
        old_key,
        values: if matches!(op, Op::Delete | Op::Truncate) {
            Vec::new()
        } else {
            values
        },
    })
}

fn parse_position(p: &str) -> Result<Position, String> {
    let bad = || format!("invalid position `{p}`: expected LSN#ordinal, like 0/16B3A28#3");
    let (lsn, rest) = p.split_once('#').ok_or_else(bad)?;
    let (ordinal, sub) = rest.split_once('.').unwrap_or((rest, "0"));
    let lsn = match lsn.strip_prefix("0x") {
        // SQL Server's 80-bit LSNs print as hex (see `Lsn`'s Display).
        Some(hex) => Lsn(u128::from_str_radix(hex, 16).map_err(|_| bad())?),
        None => lsn.parse().map_err(|_| bad())?,
    };
    Ok(Position {
        lsn,
        ordinal: ordinal.parse().map_err(|_| bad())?,
        sub: sub.parse().map_err(|_| bad())?,
    })
}

fn column_from_json(c: &Json) -> Result<Column, String> {
    let name = c
        .get("name")
        .and_then(Json::as_str)
        .ok_or("`name` is missing")?;
    let type_oid = match c.get("type") {
        None => 25,
        Some(Json::String(t)) => TYPES
            .iter()
            .find(|(n, _)| n == t)
            .map(|(_, oid)| *oid)
            .ok_or_else(|| format!("unknown type `{t}`; use a type name or an OID"))?,
        Some(Json::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or("bad type OID")?,
        Some(_) => return Err("`type` must be a name or an OID".into()),
    };
    Ok(Column {
        name: name.to_owned(),
        type_oid,
        type_modifier: -1,
        is_key: c.get("key").and_then(Json::as_bool).unwrap_or(false),
    })
}

fn values_from_json(
    v: &Json,
    field: &str,
    table: &Table,
    cols: &[usize],
) -> Result<Vec<Value>, String> {
    let items = v
        .as_array()
        .ok_or_else(|| format!("`{field}` must be a list"))?;
    if items.len() != cols.len() {
        return Err(format!(
            "`{field}` has {} items for {} columns",
            items.len(),
            cols.len()
        ));
    }
    items
        .iter()
        .zip(cols)
        .enumerate()
        .map(|(i, (item, &c))| {
            let col = &table.columns[c];
            value_from_json(item, col.type_oid)
                .map_err(|m| format!("{field}[{i}] (column {}): {m}", col.name))
        })
        .collect()
}

fn value_from_json(v: &Json, oid: u32) -> Result<Value, String> {
    if v.is_null() {
        return Ok(Value::Null);
    }
    if v.get("unchanged").and_then(Json::as_bool) == Some(true) {
        return Ok(Value::Unchanged);
    }
    let int = || {
        v.as_i64()
            .ok_or_else(|| format!("expected an integer, found {v}"))
    };
    let text = || {
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("expected a string, found {v}"))
    };
    let small = |n: i64| format!("{n} is out of range");
    Ok(match oid {
        16 => Value::Bool(
            v.as_bool()
                .ok_or_else(|| format!("expected a boolean, found {v}"))?,
        ),
        21 => Value::Int2(i16::try_from(int()?).map_err(|_| small(int().unwrap_or(0)))?),
        23 => Value::Int4(i32::try_from(int()?).map_err(|_| small(int().unwrap_or(0)))?),
        20 => Value::Int8(int()?),
        700 | 701 => {
            let f = match v {
                Json::String(s) => match s.as_str() {
                    "NaN" => f64::NAN,
                    "Infinity" => f64::INFINITY,
                    "-Infinity" => f64::NEG_INFINITY,
                    _ => return Err(format!("expected a number, found {v}")),
                },
                _ => v
                    .as_f64()
                    .ok_or_else(|| format!("expected a number, found {v}"))?,
            };
            if oid == 700 {
                Value::Float4(f as f32)
            } else {
                Value::Float8(f)
            }
        }
        1700 => Value::Numeric(match v {
            Json::Number(n) => n.to_string().into(),
            _ => text()?.into(),
        }),
        25 | 1043 | 1042 | 19 => Value::Text(text()?.into()),
        114 | 3802 => Value::Json(match v {
            Json::String(s) => s.as_str().into(),
            other => other.to_string().into(),
        }),
        17 => {
            let s = text()?;
            let hex = s
                .strip_prefix("\\x")
                .ok_or("expected bytea as \"\\\\x<hex>\"")?;
            if hex.len() % 2 != 0 {
                return Err("odd number of hex digits".into());
            }
            Value::Bytes(
                (0..hex.len())
                    .step_by(2)
                    .map(|i| {
                        u8::from_str_radix(&hex[i..i + 2], 16)
                            .map_err(|_| "bad hex digit".to_owned())
                    })
                    .collect::<Result<_, _>>()?,
            )
        }
        1082 => match infinity(v) {
            Some(true) => Value::Date(i32::MAX),
            Some(false) => Value::Date(i32::MIN),
            None => Value::Date(i32::try_from(int()?).map_err(|_| small(int().unwrap_or(0)))?),
        },
        1083 => Value::Time(int()?),
        1114 => Value::Timestamp(timestamp_from_json(v)?),
        1184 => Value::TimestampTz(timestamp_from_json(v)?),
        2950 => {
            let s = text()?.replace('-', "");
            let n = u128::from_str_radix(&s, 16)
                .ok()
                .filter(|_| s.len() == 32)
                .ok_or("invalid uuid")?;
            Value::Uuid(n.to_be_bytes())
        }
        other => Value::Other {
            type_oid: other,
            text: text()?.into(),
        },
    })
}

/// `Some(true)` for `"infinity"`, `Some(false)` for `"-infinity"`.
fn infinity(v: &Json) -> Option<bool> {
    match v.as_str() {
        Some("infinity") => Some(true),
        Some("-infinity") => Some(false),
        _ => None,
    }
}

/// A timestamp: `"infinity"`, `"-infinity"`, or microseconds since 1970-01-01 (`u64` past
/// `i64::MAX`), as a count from 2000-01-01.
fn timestamp_from_json(v: &Json) -> Result<i64, String> {
    match infinity(v) {
        Some(true) => return Ok(i64::MAX),
        Some(false) => return Ok(i64::MIN),
        None => {}
    }
    let unix = match v.as_number().and_then(Number::as_i128) {
        // How files from before contract 0.3.0 spelled -infinity; no timestamp is that early.
        Some(unix) if unix == i128::from(i64::MIN) => return Ok(i64::MIN),
        Some(unix) => unix,
        None => {
            return Err(format!(
                "expected microseconds since 1970-01-01 (an integer), \"infinity\" or \
                 \"-infinity\", found {v}"
            ));
        }
    };
    timestamp_from_unix_micros(unix).ok_or_else(|| {
        format!("{unix} microseconds since 1970-01-01 is beyond the 64-bit count from 2000-01-01")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_type() {
        let line = r#"{"position":"0/16B3A28#3.1","table":"app.t","op":"update",
            "columns":[{"name":"id","type":"int8","key":true},{"name":"a","type":"bool"},
              {"name":"b","type":"int2"},{"name":"c","type":"int4"},{"name":"d","type":"float4"},
              {"name":"e","type":"float8"},{"name":"f","type":"numeric"},{"name":"g"},
              {"name":"h","type":"bytea"},{"name":"i","type":"date"},{"name":"j","type":"time"},
              {"name":"k","type":"timestamp"},{"name":"l","type":"timestamptz"},
              {"name":"m","type":"uuid"},{"name":"n","type":"jsonb"},{"name":"o","type":600}],
            "old_key":[41],
            "values":[42,true,-3,70000,1.5,"-Infinity","12.50","x","\\x0aff",-1,5,6,7,
              "00112233-4455-6677-8899-aabbccddeeff",{"k":[1]},"(1,2)"]}"#
            .replace('\n', " ");
        let mut tables = Vec::new();
        let c = change_from_json(&line, 1, &mut tables).unwrap();
        assert_eq!(c.position.to_string(), "0/16B3A28#3.1");
        assert_eq!(c.table.qualified_name(), "app.t");
        assert_eq!(c.key[..], [Value::Int8(42)]);
        assert_eq!(
            c.old_key,
            Some(Box::new(smallvec::smallvec![Value::Int8(41)]))
        );
        assert_eq!(c.values[5], Value::Float8(f64::NEG_INFINITY));
        assert_eq!(c.values[8], Value::Bytes(vec![0x0a, 0xff]));
        assert_eq!(
            c.values[13],
            Value::Uuid(0x0011_2233_4455_6677_8899_aabb_ccdd_eeff_u128.to_be_bytes())
        );
        assert_eq!(c.values[14], Value::Json("{\"k\":[1]}".into()));
        assert_eq!(
            c.values[15],
            Value::Other {
                type_oid: 600,
                text: "(1,2)".into()
            }
        );
        let again = change_from_json(&change_to_json(&c).to_string(), 9, &mut tables).unwrap();
        assert_eq!(again, c);
        assert_eq!(tables.len(), 1, "equal shapes share one table");
    }

    #[test]
    fn dates_and_timestamps_are_unix_counts_over_postgresql_s_whole_range() {
        use crate::change::{DATE_MAX, DATE_MIN, TIMESTAMP_END, TIMESTAMP_MIN};
        let line = |values: &str| {
            format!(
                r#"{{"table":"t","op":"insert","columns":[{{"name":"id","type":"int4","key":true}},
                {{"name":"d","type":"date"}},{{"name":"ts","type":"timestamp"}},
                {{"name":"tz","type":"timestamptz"}}],"values":[1,{values}]}}"#
            )
            .replace('\n', " ")
        };
        let read = |values: &str| {
            let c = change_from_json(&line(values), 1, &mut Vec::new())
                .unwrap_or_else(|e| panic!("{values}: {e}"));
            c.values[1..].to_vec()
        };
        let cases = [
            // The last date and timestamp: microseconds since 1970 past i64::MAX.
            (
                "2145042905,9224318015999999999,9224318015999999999",
                vec![
                    Value::Date(DATE_MAX),
                    Value::Timestamp(TIMESTAMP_END - 1),
                    Value::TimestampTz(TIMESTAMP_END - 1),
                ],
            ),
            (
                "-2440588,-210866803200000000,0",
                vec![
                    Value::Date(DATE_MIN),
                    Value::Timestamp(TIMESTAMP_MIN),
                    Value::TimestampTz(-crate::change::PG_EPOCH_MICROS),
                ],
            ),
            (
                r#""infinity","infinity","-infinity""#,
                vec![
                    Value::Date(i32::MAX),
                    Value::Timestamp(i64::MAX),
                    Value::TimestampTz(i64::MIN),
                ],
            ),
        ];
        for (text, want) in cases {
            let got = read(text);
            assert_eq!(got, want, "{text}");
            // And they print back as they were read.
            let c = change_from_json(&line(text), 1, &mut Vec::new()).unwrap();
            let back = change_to_json(&c)["values"].as_array().unwrap()[1..].to_vec();
            let same: Vec<Json> = serde_json::from_str(&format!("[{text}]")).unwrap();
            assert_eq!(back, same, "{text}");
        }
        // Files from before contract 0.3.0 spelled the infinities as the extreme integers.
        assert_eq!(
            read("2147483647,-9223372036854775808,-9223372036854775808"),
            [
                Value::Date(i32::MAX),
                Value::Timestamp(i64::MIN),
                Value::TimestampTz(i64::MIN)
            ]
        );
        let err = |values: &str| change_from_json(&line(values), 1, &mut Vec::new()).unwrap_err();
        assert!(err("0,1.5,0").contains("expected microseconds since 1970-01-01"));
        assert!(err(r#"0,"2024-01-01",0"#).contains("\"infinity\""));
        assert!(err("0,18446744073709551615,0").contains("beyond the 64-bit count"));
    }

    #[test]
    fn defaults_and_errors() {
        let mut tables = Vec::new();
        let c = change_from_json(
            r#"{"table":"users","op":"insert","columns":[{"name":"id","type":"int4","key":true},{"name":"e"}],"values":[1,{"unchanged":true}]}"#,
            7,
            &mut tables,
        )
        .unwrap();
        assert_eq!(c.position, Position::new(Lsn(1), 7));
        assert_eq!(c.table.schema, "public");
        assert_eq!(c.key[..], [Value::Int4(1)]);
        assert_eq!(c.values[1], Value::Unchanged);
        let err = |s: &str| change_from_json(s, 1, &mut Vec::new()).unwrap_err();
        assert_eq!(err("[1]"), "expected a JSON object");
        assert_eq!(
            err(
                r#"{"table":"t","op":"insert","columns":[{"name":"id","type":"int2","key":true}],"values":[70000]}"#
            ),
            "values[0] (column id): 70000 is out of range"
        );
        assert_eq!(
            err(r#"{"table":"t","op":"delete","columns":[{"name":"id","key":true}]}"#),
            "`key` is missing (and `values` does not hold the key columns)"
        );
        assert_eq!(
            err(r#"{"table":"t","op":"upsert"}"#),
            "`op` must be insert, update, delete or truncate"
        );
        assert!(
            err(r#"{"table":"t","op":"insert","columns":[{"name":"x","type":"money"}]}"#)
                .contains("unknown type `money`")
        );
    }
}
