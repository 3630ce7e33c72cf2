//! The PostgreSQL sink under test: database `replica` on a throwaway cluster, with an
//! `orders` table holding every kind of value the sink maps, and an `expected` table of the
//! same shape where PostgreSQL parses the same values from SQL literals.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use zipline::change::{PG_EPOCH_MICROS, Table, Value};
use zipline::config::{self, ConnectorKind, LoadOptions};
use zipline::sink::postgres::PostgresConnector;

use super::{PIPELINE, SinkUnderTest};
pub use super::{col, table};
use crate::common::Postgres;

/// The sink database (on the sink cluster).
pub const DB: &str = "replica";

pub fn options(pg: &Postgres) -> config::PostgresSink {
    let entry = format!(
        "name: pg-out\ntype: sink/postgres\nhost: {}\nport: {}\ndatabase: {DB}\n\
         user: postgres\nconnect_timeout: 5s\n",
        pg.host(),
        pg.port
    );
    let opts = LoadOptions {
        secrets_dir: None,
        env: Box::new(|_| None),
    };
    match config::load_connector("test.yaml", &entry, PIPELINE, &opts)
        .expect("the sink's settings load")
        .kind
    {
        ConnectorKind::PostgresSink(sink) => sink,
        other => panic!("not a PostgresSink: {}", other.type_name()),
    }
}

/// A source enum's OID: meaningless on the sink, which casts the text to its own enum.
pub const SOURCE_MOOD_OID: u32 = 91_234;

pub fn orders() -> Arc<Table> {
    table(
        "orders",
        vec![
            col("id", 23, -1, true),
            col("note", 25, -1, false),
            col("qty", 20, -1, false),
            col("price", 701, -1, false),
            col("weight", 700, -1, false),
            col("placed", 1114, -1, false),
            col("paid_at", 1184, -1, false),
            col("due", 1082, -1, false),
            col("ref", 2950, -1, false),
            col("blob", 17, -1, false),
            col("amount", 1700, 786_438, false),
            col("doc", 3802, -1, false),
            col("mood", SOURCE_MOOD_OID, -1, false),
            col("tags", 1007, -1, false),
            col("span", 1186, -1, false),
            col("at", 1083, -1, false),
            col("flag", 16, -1, false),
            col("small", 21, -1, false),
        ],
    )
}

pub const ORDERS_DDL: &str = "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
    CREATE TABLE orders (id int4 PRIMARY KEY, note text, qty int8 NOT NULL, price float8,
      weight float4, placed timestamp, paid_at timestamptz, due date, ref uuid, blob bytea,
      amount numeric(12,2), doc jsonb, mood mood, tags int4[], span interval, at time,
      flag bool, small int2);
    CREATE TABLE expected (LIKE orders);";

/// A row with every kind of value; `id`, `note` and `qty` vary.
pub fn order_row(id: i32, note: &str, qty: i64) -> Vec<Value> {
    vec![
        Value::Int4(id),
        Value::Text(note.into()),
        Value::Int8(qty),
        Value::Float8(0.1),
        Value::Float4(f32::MAX),
        Value::Timestamp(1_706_704_496_123_456 - PG_EPOCH_MICROS),
        Value::TimestampTz(-62_135_596_800_000_001 - PG_EPOCH_MICROS),
        Value::Date(i32::MAX),
        Value::Uuid([0xab; 16]),
        Value::Bytes(vec![0, 0xff, b'\'', b'\\']),
        Value::Numeric("-1234567890.12".into()),
        Value::Json(r#"{"a": [1, "x\"y"], "b": null}"#.into()),
        Value::Other {
            type_oid: SOURCE_MOOD_OID,
            text: "happy".into(),
        },
        Value::Other {
            type_oid: 1007,
            text: "{1,NULL,-3}".into(),
        },
        Value::Other {
            type_oid: 1186,
            text: "1 year 2 mons -3 days +04:05:06.789".into(),
        },
        Value::Time(86_400_000_000),
        Value::Bool(false),
        Value::Int2(i16::MIN),
    ]
}

/// The same row as SQL literals, for the `expected` table PostgreSQL parses itself.
pub fn order_literal(id: i32, note: &str, qty: i64) -> String {
    format!(
        "({id}, '{}', {qty}, 0.1, '3.4028235e38', '2024-01-31 12:34:56.123456', \
         '0001-12-31 23:59:59.999999+00 BC', 'infinity', 'abababab-abab-abab-abab-abababababab', \
         '\\x00ff275c', -1234567890.12, '{{\"a\": [1, \"x\\\"y\"], \"b\": null}}', 'happy', \
         '{{1,NULL,-3}}', '1 year 2 mons -3 days +04:05:06.789', '24:00:00', false, -32768)",
        note.replace('\'', "''")
    )
}

/// A cluster with database `replica` and whatever `ddl` creates there.
pub fn server(ddl: &str) -> Postgres {
    let pg = Postgres::start();
    pg.create_database(DB);
    if !ddl.is_empty() {
        pg.psql(DB, ddl);
    }
    pg
}

pub fn checkpoints(pg: &Postgres) -> String {
    pg.psql(
        DB,
        "SELECT pipeline, connector, lane, lanes, lsn, ordinal, sub FROM _zipline_checkpoints \
         ORDER BY pipeline, connector, lane",
    )
}

/// Whole rows of `table` as text, in UTC.
pub fn rows(pg: &Postgres, table: &str) -> String {
    pg.psql(
        DB,
        &format!("SET TimeZone = 'UTC'; SELECT t::text FROM {table} t ORDER BY id"),
    )
}

pub struct PostgresUnderTest {
    pub pg: Postgres,
}

impl SinkUnderTest for PostgresUnderTest {
    type Connector = PostgresConnector;

    const CONNECTOR: &'static str = "pg-out";
    const TRICKY: &'static str = "it's a \\ backslash, a quote \" and 🐢";
    const KILLED_CODE: Option<&'static str> = Some("57P01");
    const TOO_LONG_EVIDENCE: &'static [&'static str] = &["22001"];

    fn start(extra_ddl: &str) -> Self {
        PostgresUnderTest {
            pg: server(&format!("{ORDERS_DDL}; {extra_ddl}")),
        }
    }

    fn connector(&self) -> PostgresConnector {
        PostgresConnector::new(PIPELINE, options(&self.pg))
    }

    fn connector_with_dead_letters(&self) -> PostgresConnector {
        let mut opts = options(&self.pg);
        opts.on_error = config::OnError::DeadLetter;
        PostgresConnector::new(PIPELINE, opts)
    }

    fn orders() -> Arc<Table> {
        orders()
    }

    fn order_row(id: i32, note: &str, qty: i64) -> Vec<Value> {
        order_row(id, note, qty)
    }

    fn orders_rows(&self) -> String {
        rows(&self.pg, "orders")
    }

    fn expected_orders_rows(&self, rows: &[(i32, &str, i64)]) -> String {
        let values: Vec<String> = rows
            .iter()
            .map(|&(id, note, qty)| order_literal(id, note, qty))
            .collect();
        self.pg.psql(
            DB,
            &format!(
                "DELETE FROM expected; INSERT INTO expected VALUES {}",
                values.join(", ")
            ),
        );
        self::rows(&self.pg, "expected")
    }

    fn order_notes(&self) -> String {
        self.query("SELECT id, note, qty FROM orders ORDER BY id")
    }

    fn query(&self, sql: &str) -> String {
        self.pg.psql(DB, &format!("\\pset fieldsep '\\t'\n{sql}"))
    }

    fn checkpoints(&self) -> String {
        checkpoints(&self.pg).replace('|', "\t")
    }

    fn checkpoint_row(pipeline: &str, lane: u32, lanes: u32, lsn: u64, ordinal: u32) -> String {
        // `sub` (a position within one source change) is 0 for every change here.
        format!("{pipeline}\tpg-out\t{lane}\t{lanes}\t{lsn}\t{ordinal}\t0")
    }

    fn quoted(table: &str) -> String {
        format!("\"public\".\"{table}\"")
    }

    async fn kill_while_waiting<T>(&self, apply: impl Future<Output = T>) -> T {
        let locker = self.pg.client(DB).await;
        locker
            .batch_execute("BEGIN; SELECT id FROM orders WHERE id = 1 FOR UPDATE")
            .await
            .unwrap();
        let admin = self.pg.client(DB).await;
        let killer = async {
            // Wait until the lane's upsert waits for the lock, then end its backend.
            for _ in 0..500 {
                let killed: Vec<bool> = admin
                    .query(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE application_name = 'zipline' AND wait_event_type = 'Lock' \
                         AND query LIKE 'INSERT INTO \"public\".\"orders\"%'",
                        &[],
                    )
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                if killed == [true] {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("the lane's upsert never showed up waiting for the lock");
        };
        let (result, ()) = tokio::join!(apply, killer);
        locker.batch_execute("ROLLBACK").await.unwrap();
        result
    }
}
