//! The PostgreSQL sink's `COPY` path for fresh rows (`src/sink/postgres/copy.rs`), against a
//! throwaway cluster: every type it writes in binary lands exactly as PostgreSQL parses the
//! same values from SQL (widening, type modifiers, numeric edge values, jsonb), a replayed
//! batch falls back to upserts and converges, a value the column refuses is definite and
//! names its row, and a table `COPY` must not write (rules) still gets its rows by `INSERT`.

use crate::common;

use std::sync::Arc;

use common::Postgres;
use common::changes::apply;
use common::changes::{change, claimed, open, pos};
use common::sinks::PIPELINE;
use common::sinks::postgres::{DB, col, options, server, table};
use zipline::change::{Change, Op, PG_EPOCH_MICROS, Position, Table, Value};
use zipline::error::ErrorClass;
use zipline::sink::postgres::PostgresConnector;
use zipline::sink::{Batch, SinkConnector};

const DDL: &str = "CREATE TABLE kinds (id int8 PRIMARY KEY, i2 int2, i4 int4, wide int8,
      f4 float4, f8 float8, b bool, by bytea, d date, t time, ts timestamp(3), tz timestamptz,
      u uuid, price numeric(12,2), n numeric, j jsonb, js json, tx text, vc varchar(5));
    CREATE TABLE expected (LIKE kinds);";

fn kinds() -> Arc<Table> {
    table(
        "kinds",
        vec![
            col("id", 20, -1, true),
            col("i2", 21, -1, false),
            col("i4", 23, -1, false),
            col("wide", 23, -1, false),
            col("f4", 700, -1, false),
            col("f8", 701, -1, false),
            col("b", 16, -1, false),
            col("by", 17, -1, false),
            col("d", 1082, -1, false),
            col("t", 1083, -1, false),
            col("ts", 1114, -1, false),
            col("tz", 1184, -1, false),
            col("u", 2950, -1, false),
            col("price", 1700, 786_438, false),
            col("n", 1700, -1, false),
            col("j", 3802, -1, false),
            col("js", 114, -1, false),
            col("tx", 25, -1, false),
            col("vc", 1043, 9, false),
        ],
    )
}

/// Row `id` as values and as the SQL literals PostgreSQL should read the same from.
fn row(id: i64) -> (Vec<Value>, String) {
    let (numeric, numeric_sql) = match id % 6 {
        0 => ("NaN", "'NaN'"),
        1 => ("-Infinity", "'-Infinity'"),
        2 => (
            "123456789012345678901234567890.000000000000000000000001",
            "123456789012345678901234567890.000000000000000000000001",
        ),
        3 => ("-0.0001", "-0.0001"),
        4 => ("0.000", "0.000"),
        _ => ("10000", "10000"),
    };
    let values = vec![
        Value::Int8(id),
        Value::Int2(i16::MIN),
        Value::Int2(-7),
        Value::Int4(i32::MAX),
        Value::Float4(f32::MIN_POSITIVE),
        Value::Float4(0.1),
        Value::Bool(id % 2 == 0),
        Value::Bytes(vec![0, 0xff, b'\\', b'\t']),
        Value::Date(if id % 3 == 0 {
            i32::MAX
        } else {
            -719_528 - 400
        }),
        Value::Time(86_399_999_999),
        Value::Timestamp(1_706_704_496_123_456 - PG_EPOCH_MICROS),
        Value::TimestampTz(if id % 3 == 0 {
            i64::MIN
        } else {
            -1 - PG_EPOCH_MICROS
        }),
        Value::Uuid(*b"0123456789abcdef"),
        Value::Numeric("1234.565".into()),
        Value::Numeric(numeric.into()),
        Value::Json(r#"{"b": [1, "x\ty"], "a": null}"#.into()),
        Value::Json(r#"{"b": 1,  "a": 2}"#.into()),
        if id % 4 == 0 {
            Value::Null
        } else {
            Value::Text(format!("tab\tnl\n{id} ✓").into())
        },
        Value::Text("héllo".into()),
    ];
    let (date, tz) = if id % 3 == 0 {
        ("'infinity'", "'-infinity'")
    } else {
        ("'0003-11-27 BC'", "'1969-12-31 23:59:59.999999+00'")
    };
    let text = if id % 4 == 0 {
        "NULL".to_owned()
    } else {
        format!("E'tab\\tnl\\n{id} ✓'")
    };
    let sql = format!(
        "({id}, -32768, -7, 2147483647, '1.1754944e-38', 0.1::float4, {}, '\\x00ff5c09', {date}, \
         '23:59:59.999999', '2024-01-31 12:34:56.123456', {tz}, \
         '30313233-3435-3637-3839-616263646566', 1234.565, {numeric_sql}, \
         '{{\"b\": [1, \"x\\ty\"], \"a\": null}}', '{{\"b\": 1,  \"a\": 2}}', {text}, 'héllo')",
        id % 2 == 0
    );
    (values, sql)
}

fn insert(t: &Arc<Table>, at: Position, values: Vec<Value>) -> Change {
    let key = vec![values[0].clone()];
    change(t, at, Op::Insert, key, None, values)
}

/// The sink connector for `pg`, its tables checked against `t`.
async fn checked(pg: &Postgres, t: &Arc<Table>) -> PostgresConnector {
    let connector = claimed(PostgresConnector::new(PIPELINE, options(pg))).await;
    connector
        .check_tables(std::slice::from_ref(t))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    connector
}

fn compare(pg: &common::Postgres) {
    let query = |t: &str| {
        pg.psql(
            DB,
            &format!("SET TimeZone = 'UTC'; SELECT x::text FROM {t} x ORDER BY id"),
        )
    };
    assert_eq!(query("kinds"), query("expected"));
}

#[tokio::test]
async fn fresh_rows_of_every_binary_type_copy_exactly_and_replays_converge() {
    let pg = logged_server(DDL);
    let t = kinds();
    let connector = checked(&pg, &t).await;
    let rows: Vec<(Vec<Value>, String)> = (1..=12).map(row).collect();
    let literals: Vec<&str> = rows.iter().map(|(_, sql)| sql.as_str()).collect();
    pg.psql(
        DB,
        &format!("INSERT INTO expected VALUES {}", literals.join(",")),
    );
    let batch: Vec<Change> = rows
        .iter()
        .enumerate()
        .map(|(n, (values, _))| insert(&t, pos(10, n as u32 + 1), values.clone()))
        .collect();

    let mut lane = open(&connector, 0, 1).await;
    apply(&mut lane, batch.clone()).await;
    assert_eq!(pg.psql(DB, "SELECT count(*) FROM kinds"), "12");
    compare(&pg);
    assert_eq!(
        (logged(&pg, "COPY", "kinds"), logged(&pg, "INSERT", "kinds")),
        (1, 0),
        "the fresh rows should have gone by one COPY and no INSERT"
    );

    // The same batch again on a new lane (a restart from an older checkpoint): COPY meets
    // the keys, and the batch is written again with upserts.
    let mut again = open(&connector, 0, 1).await;
    apply(&mut again, batch).await;
    compare(&pg);
    assert_eq!(again.checkpoint(), Some(pos(10, 12)));
    assert_eq!(
        logged(&pg, "COPY", "kinds"),
        2,
        "the replay tries COPY first"
    );
    assert!(logged(&pg, "INSERT", "kinds") >= 1, "then upserts");
}

/// A cluster that logs every statement, with database `replica` and `ddl` in it.
fn logged_server(ddl: &str) -> Postgres {
    let pg = Postgres::start_with(&[("log_statement", "all")]);
    pg.create_database(DB);
    pg.psql(DB, ddl);
    pg
}

/// The statements the server ran that write `table` with `verb` (`COPY` or `INSERT`).
fn logged(pg: &Postgres, verb: &str, table: &str) -> usize {
    let needle = format!("{verb} \"public\".\"{table}\"");
    let into = format!("{verb} INTO \"public\".\"{table}\"");
    pg.log()
        .lines()
        // `LOG:  execute <name>: <statement>`, not the `STATEMENT:` line after an error.
        .filter(|l| l.contains("execute") && (l.contains(&needle) || l.contains(&into)))
        .count()
}

#[tokio::test]
async fn a_value_the_column_refuses_is_definite_and_names_its_row() {
    let pg = server(DDL);
    let t = kinds();
    let connector = checked(&pg, &t).await;
    let mut lane = open(&connector, 0, 1).await;
    let mut changes = Vec::new();
    for id in 1..=3 {
        let (mut values, _) = row(id);
        if id == 2 {
            // Six characters into varchar(5).
            values[18] = Value::Text("toolong".into());
        }
        changes.push(insert(&t, pos(20, id as u32), values));
    }
    let err = lane
        .apply(&Batch {
            lane: 0,
            changes,
            ..Batch::default()
        })
        .await
        .expect_err("varchar(5) refuses six characters");
    assert_eq!(err.class, ErrorClass::Definite, "{}", err.report());
    assert!(
        err.report().contains("22001") && err.report().contains("(row key (id)=(2))"),
        "{}",
        err.report()
    );
    assert_eq!(pg.psql(DB, "SELECT count(*) FROM kinds"), "0");
}

#[tokio::test]
async fn tables_with_rules_get_their_fresh_rows_by_insert() {
    // COPY FROM ignores rules; INSERT applies them. The sink must keep INSERT's meaning.
    let pg = logged_server(
        "CREATE TABLE notes (id int8 PRIMARY KEY, body text);
         CREATE TABLE audit (id int8, body text);
         CREATE RULE keep AS ON INSERT TO notes DO ALSO INSERT INTO audit VALUES (NEW.id, NEW.body);",
    );
    let t = table(
        "notes",
        vec![col("id", 20, -1, true), col("body", 25, -1, false)],
    );
    let connector = checked(&pg, &t).await;
    let mut lane = open(&connector, 0, 1).await;
    let changes = (1..=3)
        .map(|id| {
            insert(
                &t,
                pos(30, id as u32),
                vec![Value::Int8(id), Value::Text(format!("n{id}").into())],
            )
        })
        .collect();
    apply(&mut lane, changes).await;
    assert_eq!(
        pg.psql(
            DB,
            "SELECT string_agg(id || ':' || body, ',' ORDER BY id) FROM audit"
        ),
        "1:n1,2:n2,3:n3"
    );
    assert_eq!(logged(&pg, "COPY", "notes"), 0);
}
