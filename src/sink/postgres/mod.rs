//! PostgreSQL sink.
//!
//! Each lane owns one tokio-postgres connection (no pool) and writes each batch as one
//! transaction, sent as a single pipelined round trip (`pipeline.rs`): `BEGIN`, the batch's
//! statements, the lane's checkpoint upsert, `COMMIT`. A batch is coalesced to the last effect
//! per key (`crate::sink::coalesce`), then each table gets `TRUNCATE`, one `DELETE … USING
//! unnest(…)` per key shape and one `INSERT … SELECT … FROM unnest(…) ON CONFLICT … DO UPDATE`
//! per row shape, with every column sent as one binary array parameter (`sql.rs`,
//! `encode.rs`). Statements are prepared once per connection and shape, so a batch costs no
//! parsing and one network round trip. Any error leaves nothing of the batch visible (the
//! pipelined `COMMIT` of an aborted transaction is a rollback; a failure before it was sent is
//! followed by an explicit `ROLLBACK`). If the connection dies after `COMMIT` was sent, the
//! commit may or may not have happened; the runtime retries the same batch, which converges.
//!
//! Sessions use the server's defaults except: `TimeZone=UTC`, `DateStyle=ISO, YMD` and
//! `IntervalStyle=postgres` (what the PostgreSQL source's text values are written in, so
//! values that travel as text parse back the same), `plan_cache_mode=force_custom_plan` (the
//! planner sees each batch's real row count instead of a generic guess), and
//! `application_name=zipline`. READ COMMITTED takes no predicate locks, so lanes writing
//! different keys of one table never block each other. `synchronous_commit` is left alone:
//! a committed batch must be durable before its positions are acknowledged upstream.
//!
//! Sink tables are `<schema>.<source table name>`, `<schema>` being the connector's `schema`
//! or the source table's schema; the checkpoint table lives in `schema`, else `public`. An
//! update that moved its row to a new key without sending its TOASTed columns arrives alone in
//! its batch and moves the stored row in place (`UPDATE … SET key = new WHERE key = old`).
//! TRUNCATE is transactional in PostgreSQL, so unlike the MySQL sink it is a real `TRUNCATE`
//! committed together with the checkpoint.
//!
//! Rows whose key the batch itself inserted first (`fresh`, see `crate::sink::coalesce`) are
//! written with `COPY … FROM STDIN (FORMAT binary)` when every column's values have the sink
//! column type's binary form (`copy.rs`), else with a plain `INSERT`; either is about half
//! the server's work of `INSERT … ON CONFLICT`, and `COPY` a third less again. If one meets
//! an existing key after all — a replayed batch, a restart from an older
//! checkpoint, rows the sink had before — the transaction is rolled back and the same batch
//! is written again with upserts only, as are the next `SAFE_AFTER_CONFLICT` batches and
//! any batch retried after a transient error (it may have committed).
//!
//! The initial snapshot's bulk path (`COPY` into the target tables) and the snapshot state
//! table are in `snapshot.rs`.

#[cfg(feature = "bench")]
pub(crate) mod bench;
mod bulk;
mod checkpoint;
mod copy;
mod dead_letter;
mod diagnose;
mod encode;
mod errors;
mod fence;
mod lane;
mod lifecycle;
mod pipeline;
mod schema;
mod snapshot;
pub(crate) mod sql;
mod tables;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio_postgres::Client;

use crate::config;

use self::errors::sink_error;
use self::lane::PostgresLane;
use self::sql::qualified;
use super::{
    BoxFuture, CheckpointStore, CopyTextTarget, LaneSink, Lease, SinkConnector, SinkError,
    SnapshotChunk, SnapshotState, SnapshotTarget,
};
use crate::change::{Change, Position, Table};
use crate::checkpoint::{Holder, LaneKey};

/// Startup options of every session (see the module docs).
const SESSION_OPTIONS: &str = "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=postgres \
     -c plan_cache_mode=force_custom_plan";

/// Shared by the connector and its lanes.
struct Shared {
    /// The pipeline's name (part of the checkpoint key).
    pipeline: String,
    /// The connector's settings as loaded.
    options: config::PostgresSink,
    /// Built once; holds the password, so this type has no derived Debug.
    config: tokio_postgres::Config,
    /// This instance's claim epoch (0 until claimed); every write is fenced on it.
    epoch: AtomicU64,
    /// The advisory lock keys of the claim: (live, fence), see `fence.rs`.
    fence_keys: (i64, i64),
}

/// A configured PostgreSQL sink.
pub struct PostgresConnector {
    shared: Arc<Shared>,
    /// Connections of the snapshot's bulk path.
    snapshot: bulk::Pool,
}

impl fmt::Debug for PostgresConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConnector")
            .field("pipeline", &self.shared.pipeline)
            .field("options", &self.shared.options)
            .finish()
    }
}

impl PostgresConnector {
    /// The sink `opts` of `pipeline`; connects only when checking tables or opening lanes.
    pub fn new(pipeline: &str, opts: config::PostgresSink) -> Self {
        let mut config = tokio_postgres::Config::new();
        config
            .host(&opts.host)
            .port(opts.port)
            .user(&opts.user)
            .dbname(&opts.database)
            .application_name("zipline")
            .options(SESSION_OPTIONS)
            .connect_timeout(opts.connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30))
            // A peer that vanished without a reset fails the batch instead of hanging it.
            .tcp_user_timeout(Duration::from_secs(60));
        if let Some(password) = &opts.password {
            // The secret leaves its wrapper here, into the driver's connection settings.
            config.password(password.expose());
        }
        let fence_keys = crate::checkpoint::fence::lock_keys(
            opts.schema.as_deref().unwrap_or("public"),
            pipeline,
            &opts.name,
        );
        PostgresConnector {
            shared: Arc::new(Shared {
                pipeline: pipeline.to_owned(),
                options: opts,
                config,
                epoch: AtomicU64::new(0),
                fence_keys,
            }),
            snapshot: bulk::Pool::default(),
        }
    }
}

impl Shared {
    fn sink(&self) -> &str {
        &self.options.name
    }

    fn checkpoint_schema(&self) -> &str {
        self.options.schema.as_deref().unwrap_or("public")
    }

    fn target_schema<'t>(&'t self, table: &'t Table) -> &'t str {
        self.options.schema.as_deref().unwrap_or(&table.schema)
    }

    /// A new connection, within the connect timeout; its I/O runs on a spawned task.
    async fn connect(&self) -> Result<Client, SinkError> {
        let o = &self.options;
        let doing = format!(
            "connecting to PostgreSQL at {}:{} as user {} (database {})",
            o.host, o.port, o.user, o.database
        );
        let connect = async {
            let tls_failed = |problem: String| {
                SinkError::fatal(format!(
                    "sink {}: {doing}: TLS ({}): {problem}",
                    self.sink(),
                    crate::tls::mode_name(o.tls.mode, false)
                ))
            };
            let (mode, tls) = crate::tls::postgres::for_driver(&o.host, &o.tls)
                .map_err(|e| tls_failed(e.to_string()))?;
            let mut config = self.config.clone();
            config.ssl_mode(mode);
            let (client, connection) =
                config
                    .connect(tls)
                    .await
                    .map_err(|e| match crate::tls::tls_problem(&e) {
                        Some(problem) => tls_failed(problem),
                        None if std::error::Error::source(&e)
                            .is_some_and(|c| c.to_string() == "server does not support TLS") =>
                        {
                            tls_failed("the server does not support TLS".into())
                        }
                        None => sink_error(self.sink(), &doing, &e),
                    })?;
            let sink = self.sink().to_owned();
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(sink, error = %e, "sink connection ended");
                }
            });
            Ok(client)
        };
        super::within_connect_timeout(self.sink(), &doing, o.connect_timeout, connect).await
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

impl SinkConnector for PostgresConnector {
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
            let client = shared.connect().await?;
            let create = checkpoint::create_table_sql(shared.checkpoint_schema());
            client.batch_execute(&create).await.map_err(|e| {
                sink_error(
                    shared.sink(),
                    &format!(
                        "creating the checkpoint table {}",
                        qualified(shared.checkpoint_schema(), crate::checkpoint::TABLE)
                    ),
                    &e,
                )
            })?;
            let create = tables::create_table_sql(shared.checkpoint_schema());
            client
                .batch_execute(&create)
                .await
                .map_err(|e| sink_error(shared.sink(), "creating the table records", &e))?;
            if o.on_error == config::OnError::DeadLetter {
                let create =
                    dead_letter::create_table_sql(shared.checkpoint_schema(), &o.dead_letter_table);
                client.batch_execute(&create).await.map_err(|e| {
                    sink_error(
                        shared.sink(),
                        &format!(
                            "creating the dead-letter table {} (dead_letter_table)",
                            qualified(shared.checkpoint_schema(), &o.dead_letter_table)
                        ),
                        &e,
                    )
                })?;
            }
            schema::check(
                &client,
                shared.sink(),
                o.schema.as_deref(),
                o.create_tables,
                tables,
            )
            .await
        })
    }

    fn open_lane(
        &self,
        lane: u32,
        lanes: u32,
    ) -> BoxFuture<'_, Result<Box<dyn LaneSink>, SinkError>> {
        Box::pin(async move {
            let shared = Arc::clone(&self.shared);
            let client = shared.connect().await?;
            let key = shared.lane_key(lane, lanes);
            fence::epoch(&shared)?;
            let checkpoint = checkpoint::load(&client, &shared, &key).await?;
            tracing::debug!(
                sink = shared.sink(),
                lane,
                lanes,
                checkpoint = ?checkpoint.map(|p| p.to_string()),
                "lane opened"
            );
            let parked = dead_letter::parked(&client, &shared, lane, lanes)
                .await
                .map_err(|e| {
                    sink_error(
                        shared.sink(),
                        &format!("reading lane {lane}'s dead-lettered keys"),
                        &e,
                    )
                })?;
            let writer = PostgresLane::new(shared, client, lane, lanes, checkpoint, parked);
            Ok(Box::new(writer) as Box<dyn LaneSink>)
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
            let client = self.shared.connect().await?;
            tables::recreated_empty(&client, &self.shared).await
        })
    }

    fn alter_column_sql<'a>(
        &'a self,
        table: &'a Table,
        column: &'a str,
    ) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            let col = table.columns.iter().find(|c| c.name == column)?;
            let client = self.shared.connect().await.ok()?;
            let type_name: String = client
                .query_one(
                    "SELECT format_type($1::oid, $2::int4)",
                    &[&col.type_oid, &col.type_modifier],
                )
                .await
                .ok()?
                .get(0);
            let target = qualified(self.shared.target_schema(table), &table.name);
            let mut name = String::new();
            sql::push_ident(&mut name, column);
            Some(format!(
                "ALTER TABLE {target} ALTER COLUMN {name} TYPE {type_name}"
            ))
        })
    }

    fn dead_letters(&self) -> BoxFuture<'_, Result<Vec<super::DeadLetterRecord>, SinkError>> {
        Box::pin(async move {
            let shared = &self.shared;
            let client = shared.connect().await?;
            dead_letter::list(&client, shared).await.map_err(|e| {
                sink_error(
                    shared.sink(),
                    &format!("reading {}", shared.options.dead_letter_table),
                    &e,
                )
            })
        })
    }

    fn checkpoints(&self) -> &dyn CheckpointStore {
        self
    }

    fn snapshot(&self) -> Option<&dyn SnapshotTarget> {
        Some(self)
    }
}

impl CheckpointStore for PostgresConnector {
    fn durable_frontier(&self, lanes: u32) -> BoxFuture<'_, Result<Option<Position>, SinkError>> {
        Box::pin(async move {
            let shared = &self.shared;
            let client = shared.connect().await?;
            let key = shared.lane_key(0, lanes);
            checkpoint::frontier(&client, shared.checkpoint_schema(), &key)
                .await
                .map_err(|e| {
                    sink_error(
                        shared.sink(),
                        &format!(
                            "reading the durable frontier from {}",
                            qualified(shared.checkpoint_schema(), crate::checkpoint::TABLE)
                        ),
                        &e,
                    )
                })
        })
    }

    fn advance_frontier(
        &self,
        lanes: u32,
        frontier: Position,
    ) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            let shared = &self.shared;
            let client = shared.connect().await?;
            let key = shared.lane_key(0, lanes);
            checkpoint::advance(&client, shared, &key, frontier).await
        })
    }

    fn history(&self) -> BoxFuture<'_, Result<super::SinkHistory, SinkError>> {
        Box::pin(snapshot::history(&self.shared))
    }

    fn reset_checkpoints(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            let client = self.shared.connect().await?;
            checkpoint::reset(&client, &self.shared).await?;
            tables::forget(&client, &self.shared, None).await
        })
    }

    fn table_records(
        &self,
    ) -> BoxFuture<'_, Result<Vec<crate::checkpoint::TableRecord>, SinkError>> {
        Box::pin(async move {
            let client = self.shared.connect().await?;
            tables::load(&client, &self.shared).await
        })
    }

    fn record_table<'a>(
        &'a self,
        record: &'a crate::checkpoint::TableRecord,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let client = self.shared.connect().await?;
            tables::record(&client, &self.shared, record).await
        })
    }

    fn forget_table<'a>(&'a self, table: &'a str) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let client = self.shared.connect().await?;
            tables::forget(&client, &self.shared, Some(table)).await
        })
    }
}

impl SnapshotTarget for PostgresConnector {
    fn state(&self) -> BoxFuture<'_, Result<SnapshotState, SinkError>> {
        Box::pin(snapshot::state(&self.shared))
    }

    fn begin<'a>(&'a self, chunks: &'a [SnapshotChunk]) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(snapshot::begin(&self.shared, chunks))
    }

    fn clear<'a>(&'a self, tables: &'a [Arc<Table>]) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(snapshot::clear(&self.shared, tables))
    }

    fn load<'a>(
        &'a self,
        chunk: &'a SnapshotChunk,
        changes: &'a [Change],
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(bulk::load(&self.shared, &self.snapshot, chunk, changes))
    }

    fn load_rows<'a>(
        &'a self,
        chunk: &'a SnapshotChunk,
        table: &'a Arc<Table>,
        rows: &'a [Vec<crate::change::Value>],
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(bulk::load_rows(
            &self.shared,
            &self.snapshot,
            chunk,
            table,
            rows,
        ))
    }

    fn finish(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(snapshot::finish(&self.shared))
    }

    fn copy_text(&self) -> Option<&dyn CopyTextTarget> {
        Some(self)
    }
}

impl CopyTextTarget for PostgresConnector {
    fn load_text<'a>(
        &'a self,
        chunk: &'a SnapshotChunk,
        table: &'a Arc<Table>,
        text: &'a bytes::Bytes,
        rows: u64,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(bulk::load_text(
            &self.shared,
            &self.snapshot,
            chunk,
            table,
            text,
            rows,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_redacts_the_password() {
        let entry = "name: out\ntype: sink/postgres\nhost: db\ndatabase: shop\nuser: zipline\n\
                     password: hunter2-secret\n";
        let crate::config::ConnectorKind::PostgresSink(opts) =
            crate::config::connector_for_tests(entry)
        else {
            panic!("not a postgres sink");
        };
        let connector = PostgresConnector::new("p", opts.clone());
        for text in [format!("{opts:?}"), format!("{connector:?}")] {
            assert!(!text.contains("hunter2"), "{text}");
            assert!(text.contains("<redacted>"), "{text}");
        }
    }
}
