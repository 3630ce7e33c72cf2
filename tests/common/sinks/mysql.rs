//! The MariaDB sink under test: database `shop` on a throwaway `mariadbd`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use zipline::change::{PG_EPOCH_MICROS, Table, Value};
use zipline::config::{self, ConnectorKind, LoadOptions};
use zipline::sink::mysql::MysqlConnector;

use super::{PIPELINE, SinkUnderTest, col};
use crate::common::MariaDb;

pub const DB: &str = "shop";

pub fn options(db: &MariaDb) -> config::MysqlSink {
    let entry = format!(
        "name: mysql-out\ntype: sink/mysql\nhost: {}\nport: {}\ndatabase: {DB}\nuser: root\n\
         connect_timeout: 5s\n",
        db.host(),
        db.port
    );
    let opts = LoadOptions {
        secrets_dir: None,
        env: Box::new(|_| None),
    };
    match config::load_connector("test.yaml", &entry, PIPELINE, &opts)
        .expect("the sink's settings load")
        .kind
    {
        ConnectorKind::MysqlSink(sink) => sink,
        other => panic!("not a MysqlSink: {}", other.type_name()),
    }
}

/// Source table `public.<name>` of text columns (`(name, is_key)`): the MySQL sink writes
/// each value by its variant, whatever the source type.
pub fn table(name: &str, cols: &[(&str, bool)]) -> Arc<Table> {
    super::table(
        name,
        cols.iter()
            .map(|&(name, is_key)| col(name, 25, -1, is_key))
            .collect(),
    )
}

/// `orders` with its source types (a dead letter's change is stored as JSON and read back
/// by them).
pub fn orders() -> Arc<Table> {
    super::table(
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
        ],
    )
}

pub const ORDERS_DDL: &str = "CREATE TABLE orders (id INT PRIMARY KEY, note TEXT NULL, \
    qty BIGINT NOT NULL, price DOUBLE NULL, weight FLOAT NULL, placed DATETIME(6) NULL, \
    paid_at TIMESTAMP(6) NULL, due DATE NULL, ref CHAR(36) NULL, `blob` BLOB NULL)";

pub fn order_row(id: i32, note: &str, qty: i64) -> Vec<Value> {
    vec![
        Value::Int4(id),
        Value::Text(note.into()),
        Value::Int8(qty),
        Value::Float8(0.1),
        Value::Float4(f32::MAX),
        // 2024-01-31 12:34:56.123456 and 1970-01-01 00:00:01.000001 UTC.
        Value::Timestamp(1_706_704_496_123_456 - PG_EPOCH_MICROS),
        Value::TimestampTz(1_000_001 - PG_EPOCH_MICROS),
        Value::Date(19_753),
        Value::Uuid([0xab; 16]),
        Value::Bytes(vec![0, 0xff, b'\'']),
    ]
}

/// A server with database `shop` holding `orders` (and whatever `extra_ddl` creates).
pub fn server(extra_ddl: &str) -> MariaDb {
    let db = MariaDb::start();
    db.create_database(DB);
    db.sql(DB, &format!("{ORDERS_DDL}; {extra_ddl}"));
    db
}

pub fn checkpoints(db: &MariaDb) -> String {
    db.sql(
        DB,
        "SELECT pipeline, connector, lane, lanes, lsn, ordinal FROM _zipline_checkpoints \
         ORDER BY pipeline, connector, lane",
    )
}

pub fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02X}")).collect()
}

fn unhex(s: &str) -> String {
    let bytes: Vec<u8> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("HEX() output"))
        .collect();
    String::from_utf8(bytes).expect("UTF-8 note")
}

/// The sink writing every group as multi-row SQL text (`BULK` false) or every group by
/// MariaDB's bulk execution (`BULK` true).
pub struct MysqlUnderTest<const BULK: bool = false> {
    pub db: MariaDb,
}

impl<const BULK: bool> MysqlUnderTest<BULK> {
    fn options(&self) -> config::MysqlSink {
        let mut opts = options(&self.db);
        opts.bulk_min_rows = usize::from(BULK);
        opts
    }
}

impl<const BULK: bool> SinkUnderTest for MysqlUnderTest<BULK> {
    type Connector = MysqlConnector;

    const CONNECTOR: &'static str = "mysql-out";
    const TRICKY: &'static str = "it's a \\ backslash, a NUL \0, a quote \" and 🐢";
    const KILLED_CODE: Option<&'static str> = None;
    const TOO_LONG_EVIDENCE: &'static [&'static str] = &["1406", "'name'"];

    fn start(extra_ddl: &str) -> Self {
        MysqlUnderTest {
            db: server(extra_ddl),
        }
    }

    fn connector(&self) -> MysqlConnector {
        MysqlConnector::new(PIPELINE, self.options())
    }

    fn connector_with_dead_letters(&self) -> MysqlConnector {
        let mut opts = self.options();
        opts.on_error = config::OnError::DeadLetter;
        MysqlConnector::new(PIPELINE, opts)
    }

    fn orders() -> Arc<Table> {
        orders()
    }

    fn order_row(id: i32, note: &str, qty: i64) -> Vec<Value> {
        order_row(id, note, qty)
    }

    fn orders_rows(&self) -> String {
        // paid_at is a TIMESTAMP: shown in the session zone, so read it in UTC.
        self.query(
            "SET time_zone='+00:00'; SELECT id, HEX(note), qty, price, weight, placed, paid_at, \
             due, ref, HEX(`blob`) FROM orders ORDER BY id",
        )
    }

    fn expected_orders_rows(&self, rows: &[(i32, &str, i64)]) -> String {
        rows.iter()
            .map(|(id, note, qty)| {
                format!(
                    "{id}\t{}\t{qty}\t0.1\t3.40282e38\t2024-01-31 12:34:56.123456\t\
                     1970-01-01 00:00:01.000001\t2024-01-31\t\
                     abababab-abab-abab-abab-abababababab\t00FF27",
                    hex(note)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn order_notes(&self) -> String {
        // HEX() keeps a NUL, a tab or a backslash the client would escape.
        self.query("SELECT id, HEX(note), qty FROM orders ORDER BY id")
            .lines()
            .map(|line| {
                let mut f = line.split('\t');
                let (id, note, qty) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
                format!("{id}\t{}\t{qty}", unhex(note))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn query(&self, sql: &str) -> String {
        self.db.sql(DB, sql)
    }

    fn checkpoints(&self) -> String {
        checkpoints(&self.db)
    }

    fn checkpoint_row(pipeline: &str, lane: u32, lanes: u32, lsn: u64, ordinal: u32) -> String {
        format!("{pipeline}\tmysql-out\t{lane}\t{lanes}\t{lsn}\t{ordinal}")
    }

    fn quoted(table: &str) -> String {
        format!("`{DB}`.`{table}`")
    }

    async fn kill_while_waiting<T>(&self, apply: impl Future<Output = T>) -> T {
        let mut locker = self.db.conn(DB).await;
        locker
            .query_drop("START TRANSACTION; SELECT id FROM orders WHERE id = 1 FOR UPDATE")
            .await
            .unwrap();
        let mut admin = self.db.conn("").await;
        let killer = async {
            // Wait until the lane's upsert is waiting for the lock, then kill its connection.
            for _ in 0..500 {
                let ids: Vec<u64> = admin
                    .query(
                        "SELECT ID FROM information_schema.PROCESSLIST \
                         WHERE INFO LIKE 'INSERT INTO `shop`.`orders`%'",
                    )
                    .await
                    .unwrap();
                if let Some(id) = ids.first() {
                    admin
                        .query_drop(format!("KILL CONNECTION {id}"))
                        .await
                        .unwrap();
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("the lane's upsert never showed up waiting for the lock");
        };
        let (result, ()) = tokio::join!(apply, killer);
        locker.query_drop("ROLLBACK").await.unwrap();
        result
    }
}
