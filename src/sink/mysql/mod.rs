//! MySQL/MariaDB sink.
//!
//! Each lane owns one connection (no pool) with a fixed session:
//! `sql_mode='STRICT_ALL_TABLES,NO_BACKSLASH_ESCAPES,NO_ENGINE_SUBSTITUTION'` (bad values are
//! errors, not silent truncation; `'` is the only escape in string literals),
//! `time_zone='+00:00'` (timestamptz values are written in UTC), utf8mb4, and READ COMMITTED,
//! which takes no gap locks, so lanes upserting neighbouring keys do not deadlock each other
//! (<https://dev.mysql.com/doc/refman/8.0/en/innodb-transaction-isolation-levels.html>).
//! The isolation level is set with `SET SESSION TRANSACTION ISOLATION LEVEL`: MariaDB before
//! 11.1 has no `transaction_isolation` variable.
//!
//! `apply` runs one transaction per batch, on the text protocol with literals built into one
//! reused buffer (see `plan.rs`): `START TRANSACTION` rides with the first statement and the
//! checkpoint upsert with `COMMIT` (multi-statement queries), so a one-table batch costs two
//! round trips. Any error rolls back (or drops the connection when it is broken), so nothing
//! of a failed batch is visible. If the reply to `COMMIT` is lost the commit may or may not
//! have happened; the runtime retries the same batch, which converges.
//!
//! `truncate` uses `DELETE FROM`, not `TRUNCATE TABLE`: the latter commits implicitly in MySQL
//! and would break atomicity with the checkpoint.
//!
//! Sink tables are `<database>.<source table name>`: the source schema is dropped. With
//! `create_tables` missing ones are created from the source's columns (`ddl.rs`); how each
//! PostgreSQL type is written is documented in `docs/types.md`.

use super::coalesce;
mod array;
mod checkpoint;
mod ddl;
mod errors;
mod evolve;
mod fence;
pub(crate) mod literal;
mod plan;
mod schema;
mod snapshot;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder};

use self::errors::sink_error;
use self::literal::{push_ident, push_value};
use self::plan::{Plan, StmtInfo};
use super::{Batch, BoxFuture, LaneSink, Lease, SinkConnector, SinkError};
use crate::change::{Change, Position, Table, Value};
use crate::checkpoint::{Holder, LaneKey};
use crate::error::ErrorClass;

/// Session setup run on every new connection.
const SESSION_SETUP: &str = "SET NAMES utf8mb4, \
     SESSION sql_mode='STRICT_ALL_TABLES,NO_BACKSLASH_ESCAPES,NO_ENGINE_SUBSTITUTION', \
     SESSION time_zone='+00:00', SESSION autocommit=1; \
     SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// How long a graceful close or a ROLLBACK may take before the connection is just dropped.
const CLOSE_TIMEOUT: Duration = Duration::from_millis(500);
const ROLLBACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and how to connect, and whose checkpoints to keep.
#[derive(Clone)]
pub struct MysqlSinkOptions {
    /// The sink connector's name from the pipeline file.
    pub connector: String,
    /// The pipeline's name (part of the checkpoint key).
    pub pipeline: String,
    /// Server host name or IP address.
    pub host: String,
    /// Server TCP port.
    pub port: u16,
    /// Database holding the target tables and the checkpoint table.
    pub database: String,
    /// User name.
    pub user: String,
    /// Password; never logged or printed.
    pub password: Option<String>,
    /// Limit for opening a connection and setting up its session.
    pub connect_timeout: Duration,
}

impl fmt::Debug for MysqlSinkOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlSinkOptions")
            .field("connector", &self.connector)
            .field("pipeline", &self.pipeline)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("database", &self.database)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// Shared by the connector and its lanes.
struct Shared {
    options: MysqlSinkOptions,
    /// Built once; holds the password, so this type has no derived Debug.
    mysql: Opts,
    /// Create missing sink tables when checking them.
    create_tables: bool,
    /// The sink columns' types, which decide how values MySQL cannot hold are written.
    types: schema::SinkTypes,
    /// This instance's claim epoch (0 until claimed); every write is fenced on it.
    epoch: AtomicU64,
}

/// A configured MySQL/MariaDB sink.
pub struct MysqlConnector {
    shared: Arc<Shared>,
    /// Connections for initial snapshot chunks.
    snapshot: snapshot::Loader,
}

impl fmt::Debug for MysqlConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlConnector")
            .field("options", &self.shared.options)
            .finish()
    }
}

impl MysqlConnector {
    /// A connector for `opts`; connects only when checking tables or opening lanes.
    pub fn new(opts: MysqlSinkOptions) -> Self {
        let mysql = OptsBuilder::default()
            .ip_or_hostname(opts.host.clone())
            .tcp_port(opts.port)
            .user(Some(opts.user.clone()))
            .pass(opts.password.clone())
            .db_name(Some(opts.database.clone()))
            // Stay on TCP: on a loopback address mysql_async would otherwise switch to the
            // server's Unix socket.
            .prefer_socket(false)
            .tcp_keepalive(Some(Duration::from_secs(30)))
            .into();
        MysqlConnector {
            shared: Arc::new(Shared {
                options: opts,
                mysql,
                create_tables: false,
                types: schema::SinkTypes::default(),
                epoch: AtomicU64::new(0),
            }),
            snapshot: snapshot::Loader::default(),
        }
    }
}

impl MysqlConnector {
    /// Whether checking the tables creates missing ones (`create_tables`; default false).
    #[must_use]
    pub fn with_create_tables(mut self, create: bool) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.create_tables = create;
        }
        self
    }
}

impl Shared {
    fn sink(&self) -> &str {
        &self.options.connector
    }

    /// A new connection with the lane session set up, within the connect timeout.
    async fn connect(&self) -> Result<Conn, SinkError> {
        let o = &self.options;
        let doing = format!(
            "connecting to MySQL at {}:{} as user {} (database {})",
            o.host, o.port, o.user, o.database
        );
        let connect = async {
            let mut conn = Conn::new(self.mysql.clone())
                .await
                .map_err(|e| sink_error(self.sink(), &doing, &e))?;
            conn.query_drop(SESSION_SETUP)
                .await
                .map_err(|e| sink_error(self.sink(), "setting up the session", &e))?;
            Ok(conn)
        };
        super::within_connect_timeout(self.sink(), &doing, o.connect_timeout, connect).await
    }

    fn lane_key(&self, lane: u32, lanes: u32) -> LaneKey<'_> {
        LaneKey {
            pipeline: &self.options.pipeline,
            connector: &self.options.connector,
            lane,
            lanes,
        }
    }
}

impl SinkConnector for MysqlConnector {
    fn name(&self) -> &str {
        self.shared.sink()
    }

    fn check_tables<'a>(
        &'a self,
        tables: &'a [Arc<Table>],
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let shared = &self.shared;
            let o = &shared.options;
            super::check_checkpoint_names(&o.pipeline, &o.connector)?;
            let mut conn = shared.connect().await?;
            let create = checkpoint::create_table_sql(&o.database);
            conn.query_drop(create).await.map_err(|e| {
                sink_error(
                    shared.sink(),
                    &format!("creating the checkpoint table {}", crate::checkpoint::TABLE),
                    &e,
                )
            })?;
            // Columns the source gained while Zipline was stopped are added as they would be
            // mid-stream.
            for table in tables {
                let fitted = evolve::fit(&mut conn, shared.sink(), &o.database, table, false);
                if let Err(e) = fitted.await {
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, conn.disconnect()).await;
                    return Err(e);
                }
            }
            let result = schema::check(
                &mut conn,
                shared.sink(),
                &o.database,
                tables,
                shared.create_tables,
                &shared.types,
            )
            .await;
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, conn.disconnect()).await;
            result
        })
    }

    fn open_lane(
        &self,
        lane: u32,
        lanes: u32,
    ) -> BoxFuture<'_, Result<Box<dyn LaneSink>, SinkError>> {
        Box::pin(async move {
            let shared = Arc::clone(&self.shared);
            let mut conn = shared.connect().await?;
            let key = shared.lane_key(lane, lanes);
            fence::epoch(&shared)?;
            let checkpoint = checkpoint::load(&mut conn, &shared, &key).await?;
            tracing::debug!(
                sink = shared.sink(),
                lane,
                lanes,
                checkpoint = ?checkpoint.map(|p| p.to_string()),
                "lane opened"
            );
            Ok(Box::new(MysqlLane {
                shared,
                conn: Some(conn),
                lane,
                lanes,
                checkpoint,
                buf: String::new(),
                in_tx: false,
                shapes: super::shapes::KnownShapes::default(),
            }) as Box<dyn LaneSink>)
        })
    }

    fn durable_frontier(&self, lanes: u32) -> BoxFuture<'_, Result<Option<Position>, SinkError>> {
        Box::pin(async move {
            let shared = &self.shared;
            let mut conn = shared.connect().await?;
            let key = shared.lane_key(0, lanes);
            let result = checkpoint::frontier(&mut conn, &shared.options.database, &key)
                .await
                .map_err(|e| {
                    sink_error(
                        shared.sink(),
                        &format!(
                            "reading the durable frontier from {}",
                            crate::checkpoint::TABLE
                        ),
                        &e,
                    )
                });
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, conn.disconnect()).await;
            result
        })
    }

    fn advance_frontier(
        &self,
        lanes: u32,
        frontier: Position,
    ) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            let shared = &self.shared;
            let mut conn = shared.connect().await?;
            let mut sql = String::new();
            checkpoint::push_advance(
                &mut sql,
                &shared.options.database,
                &shared.lane_key(0, lanes),
                frontier,
            );
            let doing = format!(
                "raising idle lanes' checkpoints in {} to {frontier}",
                crate::checkpoint::TABLE
            );
            let result = async {
                let err = |e: mysql_async::Error| sink_error(shared.sink(), &doing, &e);
                conn.query_drop("START TRANSACTION").await.map_err(err)?;
                fence::check_locked(&mut conn, shared).await?;
                sql.push_str(";COMMIT");
                conn.query_drop(sql).await.map_err(err)
            }
            .await;
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, conn.disconnect()).await;
            result
        })
    }

    fn claim<'a>(
        &'a self,
        holder: &'a Holder,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Box<dyn Lease>, SinkError>> {
        Box::pin(async move {
            let lease = fence::claim(Arc::clone(&self.shared), holder, lease).await?;
            Ok(Box::new(lease) as Box<dyn Lease>)
        })
    }

    fn snapshot_state(&self) -> BoxFuture<'_, Result<super::SnapshotState, SinkError>> {
        Box::pin(snapshot::state(&self.shared))
    }

    fn snapshot_begin<'a>(
        &'a self,
        chunks: &'a [super::SnapshotChunk],
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(snapshot::begin(&self.shared, chunks))
    }

    fn snapshot_clear<'a>(
        &'a self,
        tables: &'a [Arc<Table>],
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(snapshot::clear(&self.shared, tables))
    }

    fn snapshot_load<'a>(
        &'a self,
        chunk: &'a super::SnapshotChunk,
        changes: &'a [Arc<Change>],
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        let input = snapshot::Input::Changes(changes);
        Box::pin(snapshot::load(&self.shared, &self.snapshot, chunk, input))
    }

    fn snapshot_load_rows<'a>(
        &'a self,
        chunk: &'a super::SnapshotChunk,
        table: &'a Arc<Table>,
        rows: &'a [Vec<Value>],
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        let input = snapshot::Input::Rows(table, rows);
        Box::pin(snapshot::load(&self.shared, &self.snapshot, chunk, input))
    }

    fn snapshot_finish(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(snapshot::finish(&self.shared))
    }
}

/// One lane's writer: its connection, checkpoint and SQL buffer.
struct MysqlLane {
    shared: Arc<Shared>,
    /// `None` after a broken connection; `apply` connects again.
    conn: Option<Conn>,
    lane: u32,
    lanes: u32,
    checkpoint: Option<Position>,
    /// Reused for every statement.
    buf: String,
    /// A transaction was started and not yet ended: a previous call was cancelled midway.
    in_tx: bool,
    /// Table shapes the sink tables are known to fit (see `evolve.rs`).
    shapes: super::shapes::KnownShapes,
}

impl fmt::Debug for MysqlLane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlLane")
            .field("sink", &self.shared.sink())
            .field("lane", &self.lane)
            .field("lanes", &self.lanes)
            .field("checkpoint", &self.checkpoint)
            .finish_non_exhaustive()
    }
}

impl MysqlLane {
    /// Writes `plan` and the checkpoint in one transaction.
    async fn write(
        &mut self,
        mut plan: Plan<'_>,
        prelude: Option<&str>,
        position: Position,
    ) -> Result<(), SinkError> {
        if self.in_tx {
            // A cancelled call left a transaction open; closing the connection rolls it back.
            self.drop_conn().await;
        }
        if self.conn.is_none() {
            self.conn = Some(self.shared.connect().await?);
        }
        let conn = self.conn.as_mut().expect("connected above");
        let shared = &self.shared;
        if let Err(e) = shared
            .types
            .ensure(conn, &shared.options.database, plan.shapes())
            .await
        {
            let err = sink_error(shared.sink(), "reading the sink tables' column types", &e);
            if errors::connection_lost(&e) {
                self.drop_conn().await;
            }
            return Err(err);
        }
        let result = self.run(&mut plan, prelude, position).await;
        if let Err((err, broken)) = &result {
            if *broken {
                self.drop_conn().await;
            } else if self.in_tx {
                self.rollback().await;
            }
            tracing::debug!(sink = self.shared.sink(), lane = self.lane, error = %err.message, "batch failed");
        }
        result.map_err(|(err, _)| err)?;
        self.checkpoint = Some(position);
        Ok(())
    }

    /// The transaction itself. On error, also says whether the connection is unusable.
    async fn run(
        &mut self,
        plan: &mut Plan<'_>,
        prelude: Option<&str>,
        position: Position,
    ) -> Result<(), (SinkError, bool)> {
        let Self {
            shared,
            conn,
            buf,
            in_tx,
            lane,
            lanes,
            ..
        } = self;
        let conn = conn.as_mut().expect("connected above");
        let sink = shared.sink();
        buf.clear();
        buf.push_str("START TRANSACTION;");
        if let Some(prelude) = prelude {
            buf.push_str(prelude);
            *in_tx = true;
            if let Err(e) = conn.query_drop(buf.as_str()).await {
                let err = sink_error(sink, "moving a row to its new key", &e);
                return Err((err, errors::connection_lost(&e)));
            }
            buf.clear();
        }
        loop {
            let info: StmtInfo = match plan.next_statement(buf) {
                Ok(Some(info)) => info,
                Ok(None) => break,
                Err(e) => return Err((e, false)),
            };
            *in_tx = true;
            if let Err(e) = conn.query_drop(buf.as_str()).await {
                let mut err = sink_error(sink, &plan.describe(info), &e);
                if err.class == ErrorClass::Definite
                    && let Some(key) = errors::row_number(&e).and_then(|n| plan.row_key(info, n))
                {
                    err.message.push_str(&format!(" (row key {key})"));
                }
                return Err((err, errors::connection_lost(&e)));
            }
            buf.clear();
        }
        if !*in_tx {
            buf.clear();
            buf.push_str("START TRANSACTION;");
        }
        *in_tx = true;
        let key = shared.lane_key(*lane, *lanes);
        let epoch = fence::epoch(shared).map_err(|e| (e, false))?;
        checkpoint::push_upsert(buf, &shared.options.database, &key, position, epoch);
        buf.push_str(";COMMIT");
        if let Err(e) = conn.query_drop(buf.as_str()).await {
            if fence::is_guard_failure(&e) {
                return Err((fence::fenced(shared).await, false));
            }
            let doing = format!(
                "moving lane {lane}'s checkpoint in {} to {position} and committing",
                crate::checkpoint::TABLE
            );
            return Err((sink_error(sink, &doing, &e), errors::connection_lost(&e)));
        }
        *in_tx = false;
        Ok(())
    }

    async fn rollback(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        match tokio::time::timeout(ROLLBACK_TIMEOUT, conn.query_drop("ROLLBACK")).await {
            Ok(Ok(())) => self.in_tx = false,
            _ => self.drop_conn().await,
        }
    }

    /// Drops the connection without waiting long for a graceful close (the socket may be
    /// dead); the server rolls back whatever transaction it had open.
    async fn drop_conn(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, conn.disconnect()).await;
        }
        self.in_tx = false;
    }
}

impl LaneSink for MysqlLane {
    fn checkpoint(&self) -> Option<Position> {
        self.checkpoint
    }

    fn apply<'a>(&'a mut self, batch: &'a Batch) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let shared = Arc::clone(&self.shared);
            // Columns the source gained are added first, outside the batch's transaction.
            self.fit_shapes(&batch.changes).await?;
            if let [change] = batch.changes.as_slice()
                && let Some(old_key) = &change.old_key
                && change.values.contains(&Value::Unchanged)
            {
                // The lane worker isolates such a change in its own batch (see
                // `crate::lane::is_toast_move`); the row moves in place so the TOASTed values
                // the update did not send stay with it.
                let prelude = move_sql(&shared.options.database, change, old_key)
                    .map_err(|m| SinkError::definite(format!("sink {}: {m}", shared.sink())))?;
                let upsert = [Arc::new(Change {
                    old_key: None,
                    ..Change::clone(change)
                })];
                let plan = Plan::build(&upsert, &shared.options.database, shared.sink())?
                    .with_types(&shared.types);
                return self
                    .write(plan, Some(&prelude), batch.last_position())
                    .await;
            }
            let plan = Plan::build(&batch.changes, &shared.options.database, shared.sink())?
                .with_types(&shared.types);
            self.write(plan, None, batch.last_position()).await
        })
    }

    fn truncate<'a>(
        &'a mut self,
        table: &'a Table,
        position: Position,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let shared = Arc::clone(&self.shared);
            let plan = Plan::delete_all(table, &shared.options.database, shared.sink());
            self.write(plan, None, position).await
        })
    }

    fn reconnect(&mut self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            self.drop_conn().await;
            // The sink may have restarted with other tables: match shapes against them again.
            self.shapes.clear();
            self.conn = Some(self.shared.connect().await?);
            Ok(())
        })
    }
}

/// `UPDATE` that moves the row at `old_key` to the change's key and sets the columns the
/// change carries, leaving unchanged (TOASTed) columns as stored. A following upsert of the
/// known columns covers a sink that never had the old row.
fn move_sql(database: &str, change: &Change, old_key: &[Value]) -> Result<String, String> {
    let table = &change.table;
    let mut sql = String::from("UPDATE ");
    push_ident(&mut sql, database);
    sql.push('.');
    push_ident(&mut sql, &table.name);
    sql.push_str(" SET ");
    let mut first = true;
    for (column, value) in table.columns.iter().zip(&change.values) {
        if matches!(value, Value::Unchanged) {
            continue;
        }
        if !first {
            sql.push(',');
        }
        first = false;
        push_ident(&mut sql, &column.name);
        sql.push('=');
        push_value(&mut sql, value).map_err(|e| {
            format!(
                "table {}, column {}: {e}",
                table.qualified_name(),
                column.name
            )
        })?;
    }
    sql.push_str(" WHERE ");
    for (n, (&index, value)) in table.key.iter().zip(old_key).enumerate() {
        if n > 0 {
            sql.push_str(" AND ");
        }
        push_ident(&mut sql, &table.columns[index].name);
        sql.push('=');
        push_value(&mut sql, value)
            .map_err(|e| format!("table {}, key column: {e}", table.qualified_name()))?;
    }
    Ok(sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_toast_move_updates_the_key_in_place() {
        use crate::change::{Column, Op};
        let col = |name: &str, is_key| Column {
            name: name.into(),
            type_oid: 25,
            type_modifier: -1,
            is_key,
        };
        let table = Arc::new(Table::new(
            "public".into(),
            "orders".into(),
            vec![col("id", true), col("status", false), col("note", false)],
        ));
        let change = Change {
            position: Position::default(),
            op: Op::Update,
            table,
            key: vec![Value::Int8(2)],
            old_key: Some(vec![Value::Int8(1)]),
            values: vec![Value::Int8(2), Value::Text("it's".into()), Value::Unchanged],
        };
        let sql = move_sql("shop", &change, &[Value::Int8(1)]).unwrap();
        assert_eq!(
            sql,
            "UPDATE `shop`.`orders` SET `id`=2,`status`='it''s' WHERE `id`=1"
        );
    }

    #[test]
    fn debug_output_redacts_the_password() {
        let opts = MysqlSinkOptions {
            connector: "out".into(),
            pipeline: "p".into(),
            host: "db".into(),
            port: 3306,
            database: "shop".into(),
            user: "zipline".into(),
            password: Some("hunter2-secret".into()),
            connect_timeout: Duration::from_secs(1),
        };
        let shown = format!("{opts:?}");
        assert!(
            shown.contains("<redacted>") && shown.contains("zipline"),
            "{shown}"
        );
        assert!(!shown.contains("hunter2"));
        let shown = format!("{:?}", MysqlConnector::new(opts));
        assert!(
            shown.contains("<redacted>") && !shown.contains("hunter2"),
            "{shown}"
        );
    }
}
