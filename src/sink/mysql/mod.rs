//! MySQL/MariaDB sink.
//!
//! Each lane owns one connection (no pool) with a fixed session:
//! `sql_mode='STRICT_ALL_TABLES,NO_BACKSLASH_ESCAPES,NO_ENGINE_SUBSTITUTION,
//! ERROR_FOR_DIVISION_BY_ZERO'` (bad values are errors, not silent truncation; `'` is the only
//! escape in string literals; the upserts' key guard fails with a division by zero, see
//! `plan::push_key_guard`),
//! `time_zone='+00:00'` (timestamptz values are written in UTC), utf8mb4, and READ COMMITTED,
//! which takes no gap locks, so lanes upserting neighbouring keys do not deadlock each other
//! (<https://dev.mysql.com/doc/refman/8.0/en/innodb-transaction-isolation-levels.html>).
//! The isolation level is set with `SET SESSION TRANSACTION ISOLATION LEVEL`: MariaDB before
//! 11.1 has no `transaction_isolation` variable.
//!
//! `apply` runs one transaction per batch, on the text protocol with literals built into one
//! reused buffer (see `plan.rs`): `START TRANSACTION` rides with the first statement and the
//! checkpoint upsert with `COMMIT` (multi-statement queries), so a one-table batch costs two
//! round trips. On MariaDB a group of at least `bulk_min_rows` rows goes instead as one
//! prepared single-row statement with every row's parameters (`plan/bulk.rs`), which costs
//! the server less; `START TRANSACTION` then takes a round trip of its own. Any error rolls back (or drops the connection when it is broken), so nothing
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
#[cfg(feature = "bench")]
pub(crate) mod bench;
mod checkpoint;
mod ddl;
mod dead_letter;
mod errors;
mod evolve;
mod fence;
mod infile;
mod lane;
mod lifecycle;

use self::lane::MysqlLane;
pub(crate) mod literal;
mod plan;
mod schema;
mod snapshot;
mod tables;
mod unique;

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder};

use crate::config;

use self::errors::sink_error;
use super::{
    BoxFuture, CheckpointStore, LaneSink, Lease, SinkConnector, SinkError, SnapshotTarget,
};
use crate::change::{Change, Position, Table, Value};
use crate::checkpoint::{Holder, LaneKey};

/// Session setup run on every new connection.
const SESSION_SETUP: &str = "SET NAMES utf8mb4, \
     SESSION sql_mode='STRICT_ALL_TABLES,NO_BACKSLASH_ESCAPES,NO_ENGINE_SUBSTITUTION,\
     ERROR_FOR_DIVISION_BY_ZERO', \
     SESSION time_zone='+00:00', SESSION autocommit=1; \
     SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// How long a graceful close or a ROLLBACK may take before the connection is just dropped.
const CLOSE_TIMEOUT: Duration = Duration::from_millis(500);
const ROLLBACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Shared by the connector and its lanes.
struct Shared {
    /// The pipeline's name (part of the checkpoint key).
    pipeline: String,
    /// The connector's settings as loaded.
    options: config::MysqlSink,
    /// Built once; holds the password, so this type has no derived Debug.
    mysql: Opts,
    /// `ssl_mode: PREFERRED` only: the same without TLS, for a server that has none.
    plaintext: Option<Opts>,
    /// Create missing sink tables when checking them.
    create_tables: bool,
    /// The sink columns' types, which decide how values MySQL cannot hold are written.
    types: schema::SinkTypes,
    /// This instance's claim epoch (0 until claimed); every write is fenced on it.
    epoch: AtomicU64,
    /// The server is MariaDB, which has bulk execution (asked once, on the first connection).
    mariadb: OnceLock<bool>,
}

/// A configured MySQL/MariaDB sink.
pub struct MysqlConnector {
    shared: Arc<Shared>,
    /// Connections for initial snapshot chunks.
    snapshot: infile::Loader,
}

impl fmt::Debug for MysqlConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlConnector")
            .field("pipeline", &self.shared.pipeline)
            .field("options", &self.shared.options)
            .finish()
    }
}

impl MysqlConnector {
    /// The sink `opts` of `pipeline`; connects only when checking tables or opening lanes.
    pub fn new(pipeline: &str, opts: config::MysqlSink) -> Self {
        let builder = OptsBuilder::default()
            .ip_or_hostname(opts.host.clone())
            .tcp_port(opts.port)
            .user(Some(opts.user.clone()))
            // The secret leaves its wrapper here, into the driver's connection options.
            .pass(opts.password.as_ref().map(|p| p.expose().to_owned()))
            .db_name(Some(opts.database.clone()))
            // Stay on TCP: on a loopback address mysql_async would otherwise switch to the
            // server's Unix socket.
            .prefer_socket(false)
            .tcp_keepalive(Some(Duration::from_secs(30)));
        let plaintext =
            (opts.tls.mode == crate::config::SslMode::Prefer).then(|| Opts::from(builder.clone()));
        let mysql = builder
            .ssl_opts(crate::tls::mysql::ssl_opts(&opts.tls))
            .into();
        MysqlConnector {
            shared: Arc::new(Shared {
                pipeline: pipeline.to_owned(),
                create_tables: opts.create_tables,
                options: opts,
                mysql,
                plaintext,
                types: schema::SinkTypes::default(),
                epoch: AtomicU64::new(0),
                mariadb: OnceLock::new(),
            }),
            snapshot: infile::Loader::default(),
        }
    }
}

impl MysqlConnector {
    /// Whether checking the tables creates missing ones (overrides `create_tables`).
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
        &self.options.name
    }

    /// A new connection with the lane session set up, within the connect timeout.
    async fn connect(&self) -> Result<Conn, SinkError> {
        let o = &self.options;
        let doing = format!(
            "connecting to MySQL at {}:{} as user {} (database {})",
            o.host, o.port, o.user, o.database
        );
        let connect = async {
            let opts = self.tls_opts(&doing).await?;
            let mut conn = match Conn::new(opts).await {
                Ok(conn) => conn,
                Err(e) if crate::tls::mysql::server_without_tls(&e) && self.plaintext.is_some() => {
                    let plain = self.plaintext.clone().unwrap_or_else(|| self.mysql.clone());
                    Conn::new(plain)
                        .await
                        .map_err(|e| sink_error(self.sink(), &doing, &e))?
                }
                Err(e) => return Err(self.connect_error(&doing, &e)),
            };
            conn.query_drop(SESSION_SETUP)
                .await
                .map_err(|e| sink_error(self.sink(), "setting up the session", &e))?;
            if self.mariadb.get().is_none() {
                // The driver knows but does not say; MySQL has no bulk execution, and its
                // `exec_batch` would run one statement per row.
                let mariadb: Option<bool> = conn
                    .query_first("SELECT VERSION() LIKE '%MariaDB%'")
                    .await
                    .map_err(|e| sink_error(self.sink(), "reading the server's version", &e))?;
                let _ = self.mariadb.set(mariadb.unwrap_or(false));
            }
            Ok(conn)
        };
        super::within_connect_timeout(self.sink(), &doing, o.connect_timeout, connect).await
    }

    /// The connection options; for `VERIFY_CA`, with the TLS host name taken from the
    /// server's certificate after checking its chain (see [`crate::tls::mysql::certificate_name`]).
    async fn tls_opts(&self, doing: &str) -> Result<Opts, SinkError> {
        let o = &self.options;
        if o.tls.mode != crate::config::SslMode::VerifyCa {
            return Ok(self.mysql.clone());
        }
        let name = crate::tls::mysql::certificate_name(&o.host, o.port, &o.tls)
            .await
            .map_err(|e| {
                let message = format!(
                    "sink {}: {doing}: TLS ({}): {e}",
                    self.sink(),
                    crate::tls::mode_name(o.tls.mode, true)
                );
                // The server is down or the connection broke: worth another try.
                if e.is_broken_connection() {
                    SinkError::transient(message)
                } else {
                    SinkError::fatal(message)
                }
            })?;
        let ssl = self
            .mysql
            .ssl_opts()
            .cloned()
            .map(|ssl| ssl.with_danger_tls_hostname_override(Some(name)));
        Ok(OptsBuilder::from_opts(self.mysql.clone())
            .ssl_opts(ssl)
            .into())
    }

    /// A failed connect; TLS failures (a refused certificate, no TLS on the server) are
    /// fatal and say so, the rest are classified as usual.
    fn connect_error(&self, doing: &str, e: &mysql_async::Error) -> SinkError {
        let problem = if crate::tls::mysql::server_without_tls(e) {
            Some("the server does not support TLS".to_owned())
        } else {
            crate::tls::tls_problem(e)
        };
        match problem {
            Some(problem) => SinkError::fatal(format!(
                "sink {}: {doing}: TLS ({}): {problem}",
                self.sink(),
                crate::tls::mode_name(self.options.tls.mode, true)
            )),
            None => sink_error(self.sink(), doing, e),
        }
    }

    fn lane_key(&self, lane: u32, lanes: u32) -> LaneKey<'_> {
        LaneKey {
            pipeline: &self.pipeline,
            connector: &self.options.name,
            lane,
            lanes,
        }
    }
}

/// Closes a connection, giving the server at most [`CLOSE_TIMEOUT`] to say goodbye.
async fn close(conn: Conn) {
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, conn.disconnect()).await;
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
            super::check_checkpoint_names(&shared.pipeline, &o.name)?;
            let mut conn = shared.connect().await?;
            let create = checkpoint::create_table_sql(&o.database);
            conn.query_drop(create).await.map_err(|e| {
                sink_error(
                    shared.sink(),
                    &format!("creating the checkpoint table {}", crate::checkpoint::TABLE),
                    &e,
                )
            })?;
            let create = tables::create_table_sql(&o.database);
            conn.query_drop(create).await.map_err(|e| {
                sink_error(
                    shared.sink(),
                    &format!(
                        "creating the table records {}",
                        crate::checkpoint::tables::TABLES_TABLE
                    ),
                    &e,
                )
            })?;
            if o.on_error == config::OnError::DeadLetter {
                let create = dead_letter::create_table_sql(&o.database, &o.dead_letter_table);
                conn.query_drop(create).await.map_err(|e| {
                    sink_error(
                        shared.sink(),
                        &format!(
                            "creating the dead-letter table {} (dead_letter_table)",
                            o.dead_letter_table
                        ),
                        &e,
                    )
                })?;
            }
            // Columns the source gained while Zipline was stopped are added as they would be
            // mid-stream.
            for table in tables {
                let fitted = evolve::fit(&mut conn, shared.sink(), &o.database, table, false);
                if let Err(e) = fitted.await {
                    close(conn).await;
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
            close(conn).await;
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
            let table = &shared.options.dead_letter_table;
            let parked = dead_letter::parked(&mut conn, &shared, table, lane, lanes)
                .await
                .map_err(|e| {
                    sink_error(
                        shared.sink(),
                        &format!("reading lane {lane}'s dead-lettered keys from {table}"),
                        &e,
                    )
                })?;
            let dead_letter_table =
                shared.options.on_error == config::OnError::DeadLetter || !parked.is_empty();
            tracing::debug!(
                sink = shared.sink(),
                lane,
                lanes,
                checkpoint = ?checkpoint.map(|p| p.to_string()),
                "lane opened"
            );
            let bulk = plan::Bulk::new(shared.options.bulk_min_rows);
            Ok(Box::new(MysqlLane {
                shared,
                conn: Some(conn),
                lane,
                lanes,
                checkpoint,
                buf: String::new(),
                bulk,
                in_tx: false,
                shapes: super::shapes::KnownShapes::default(),
                parked,
                dead_letter_table,
            }) as Box<dyn LaneSink>)
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

    fn recreated_tables(&self) -> BoxFuture<'_, Result<Vec<String>, SinkError>> {
        Box::pin(async move {
            let mut conn = self.shared.connect().await?;
            let result = tables::recreated_empty(&mut conn, &self.shared).await;
            close(conn).await;
            result
        })
    }

    fn alter_column_sql<'a>(
        &'a self,
        table: &'a Table,
        column: &'a str,
    ) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            let col = table.columns.iter().find(|c| c.name == column)?;
            let kind = ddl::column_type(col, col.is_key).ok()?;
            let mut sql = String::from("ALTER TABLE ");
            sql.push_str(&schema::target(&self.shared.options.database, table));
            sql.push_str(" MODIFY ");
            literal::push_ident(&mut sql, column);
            sql.push(' ');
            sql.push_str(&kind);
            sql.push_str(" (keep the column's NULL or NOT NULL and its default)");
            Some(sql)
        })
    }

    fn dead_letters(&self) -> BoxFuture<'_, Result<Vec<super::DeadLetterRecord>, SinkError>> {
        Box::pin(async move {
            let shared = &self.shared;
            let table = &shared.options.dead_letter_table;
            let mut conn = shared.connect().await?;
            let result = dead_letter::list(&mut conn, shared, table)
                .await
                .map_err(|e| sink_error(shared.sink(), &format!("reading {table}"), &e));
            close(conn).await;
            result
        })
    }

    fn checkpoints(&self) -> &dyn CheckpointStore {
        self
    }

    fn snapshot(&self) -> Option<&dyn SnapshotTarget> {
        Some(self)
    }
}

impl CheckpointStore for MysqlConnector {
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
            close(conn).await;
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
            close(conn).await;
            result
        })
    }

    fn history(&self) -> BoxFuture<'_, Result<super::SinkHistory, SinkError>> {
        Box::pin(snapshot::history(&self.shared))
    }

    fn reset_checkpoints(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            let mut conn = self.shared.connect().await?;
            let mut result = checkpoint::reset(&mut conn, &self.shared).await;
            if result.is_ok() {
                result = tables::forget(&mut conn, &self.shared, None).await;
            }
            close(conn).await;
            result
        })
    }

    fn table_records(
        &self,
    ) -> BoxFuture<'_, Result<Vec<crate::checkpoint::TableRecord>, SinkError>> {
        Box::pin(async move {
            let mut conn = self.shared.connect().await?;
            let result = tables::load(&mut conn, &self.shared).await;
            close(conn).await;
            result
        })
    }

    fn record_table<'a>(
        &'a self,
        record: &'a crate::checkpoint::TableRecord,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let mut conn = self.shared.connect().await?;
            let result = tables::record(&mut conn, &self.shared, record).await;
            close(conn).await;
            result
        })
    }

    fn forget_table<'a>(&'a self, table: &'a str) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let mut conn = self.shared.connect().await?;
            let result = tables::forget(&mut conn, &self.shared, Some(table)).await;
            close(conn).await;
            result
        })
    }
}

impl SnapshotTarget for MysqlConnector {
    fn state(&self) -> BoxFuture<'_, Result<super::SnapshotState, SinkError>> {
        Box::pin(snapshot::state(&self.shared))
    }

    fn begin<'a>(
        &'a self,
        chunks: &'a [super::SnapshotChunk],
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(snapshot::begin(&self.shared, chunks))
    }

    fn clear<'a>(&'a self, tables: &'a [Arc<Table>]) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(snapshot::clear(&self.shared, tables))
    }

    fn load<'a>(
        &'a self,
        chunk: &'a super::SnapshotChunk,
        changes: &'a [Change],
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        let input = infile::Input::Changes(changes);
        Box::pin(infile::load(&self.shared, &self.snapshot, chunk, input))
    }

    fn load_rows<'a>(
        &'a self,
        chunk: &'a super::SnapshotChunk,
        table: &'a Arc<Table>,
        rows: &'a [Vec<Value>],
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        let input = infile::Input::Rows(table, rows);
        Box::pin(infile::load(&self.shared, &self.snapshot, chunk, input))
    }

    fn finish(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(snapshot::finish(&self.shared))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_redacts_the_password() {
        let entry = "name: out\ntype: sink/mysql\nhost: db\ndatabase: shop\nuser: zipline\n\
                     password: hunter2-secret\n";
        let crate::config::ConnectorKind::MysqlSink(opts) =
            crate::config::connector_for_tests(entry)
        else {
            panic!("not a mysql sink");
        };
        let shown = format!("{opts:?}");
        assert!(
            shown.contains("<redacted>") && shown.contains("zipline"),
            "{shown}"
        );
        assert!(!shown.contains("hunter2"));
        let shown = format!("{:?}", MysqlConnector::new("p", opts));
        assert!(
            shown.contains("<redacted>") && !shown.contains("hunter2"),
            "{shown}"
        );
    }
}
