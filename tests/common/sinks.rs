//! A sink under test: a throwaway server holding the sink database and its `orders` table,
//! the connector Zipline writes there with, and the ways a test reads it back and breaks it.
//! The sink contract suite (`tests/sinks/contract.rs`) is written once against
//! [`SinkUnderTest`] and run against [`mysql::MysqlUnderTest`] and
//! [`postgres::PostgresUnderTest`]; each sink's own scenarios use the fixtures of its module.

pub mod mysql;
pub mod postgres;

use std::future::Future;
use std::sync::Arc;

use zipline::change::{Column, Table, Value};
use zipline::sink::{CheckpointStore, SinkConnector};

/// The pipeline every sink test writes for.
pub const PIPELINE: &str = "orders-pipe";

/// What the contract suite needs of a sink.
///
/// Contract: [`SinkUnderTest::start`] gives a fresh server whose sink database holds `orders`
/// (the columns of [`SinkUnderTest::orders`]) and whatever the extra DDL creates (written in
/// SQL both dialects read); [`SinkUnderTest::query`] renders rows with a tab between columns
/// and a newline between rows, trimmed, as the sink's own client shows them; everything is
/// blocking or awaited to completion, so a test's next step sees its effect.
pub trait SinkUnderTest: Sized {
    type Connector: SinkConnector + CheckpointStore;

    /// The connector's name: every message of it starts with `sink NAME: `.
    const CONNECTOR: &'static str;
    /// A note with the characters this sink's text type must carry through unchanged.
    const TRICKY: &'static str;
    /// The SQLSTATE or error number a killed connection's error carries, if it names one.
    const KILLED_CODE: Option<&'static str>;
    /// What the error of a value too long for `VARCHAR(5)` must contain besides the key.
    const TOO_LONG_EVIDENCE: &'static [&'static str];

    fn start(extra_ddl: &str) -> Self;
    /// A connector for pipeline [`PIPELINE`] on the sink database.
    fn connector(&self) -> Self::Connector;
    /// The same with the dead-letter table created on first use.
    fn connector_with_dead_letters(&self) -> Self::Connector;

    /// `orders` as the source describes it, and a row of it with every kind of value this
    /// sink maps (`id`, `note` and `qty` vary).
    fn orders() -> Arc<Table>;
    fn order_row(id: i32, note: &str, qty: i64) -> Vec<Value>;
    /// Every column of `orders` as the sink stores it, in UTC, one line per row by `id`.
    fn orders_rows(&self) -> String;
    /// What [`SinkUnderTest::orders_rows`] shows for these `order_row(id, note, qty)` rows.
    fn expected_orders_rows(&self, rows: &[(i32, &str, i64)]) -> String;
    /// `id`, `note` (exactly as stored, whatever it holds) and `qty` of every order, by `id`.
    fn order_notes(&self) -> String;

    /// Rows of `sql` on the sink database (see the trait's contract for the format).
    fn query(&self, sql: &str) -> String;
    /// `_zipline_checkpoints`, every row, as [`SinkUnderTest::checkpoint_row`] renders them.
    fn checkpoints(&self) -> String;
    /// A checkpoint row of connector [`SinkUnderTest::CONNECTOR`] as `checkpoints` shows it.
    fn checkpoint_row(pipeline: &str, lane: u32, lanes: u32, lsn: u64, ordinal: u32) -> String;
    /// `public.<table>` as the sink's messages quote it.
    fn quoted(table: &str) -> String;

    /// Runs `apply`, a batch whose upsert into `orders` touches row 1, while another session
    /// holds that row's lock; kills the lane's connection once that upsert waits for the lock,
    /// then releases the lock and returns what `apply` returned.
    fn kill_while_waiting<T>(&self, apply: impl Future<Output = T>) -> impl Future<Output = T>;
}

/// A source column: name, type OID, type modifier, part of the key.
pub fn col(name: &str, type_oid: u32, type_modifier: i32, is_key: bool) -> Column {
    Column {
        name: name.into(),
        type_oid,
        type_modifier,
        is_key,
    }
}

/// Source table `public.<name>`.
pub fn table(name: &str, cols: Vec<Column>) -> Arc<Table> {
    Arc::new(Table::new("public".into(), name.into(), cols))
}
