//! PostgreSQL logical replication source (pgoutput).
//!
//! Zipline creates and owns a publication and a logical slot, then streams from the slot with
//! `START_REPLICATION`. It never polls: its load follows the write rate, not the table size —
//! except once, when it creates the slot and copies the existing rows (`snapshot`, unless
//! `snapshot: never`). The slot's confirmed flush position only ever moves to the durable
//! frontier reported by the lanes' ack tracker.

#[cfg(feature = "bench")]
pub(crate) mod bench;
mod conn;
mod lifecycle;
mod monitor;
pub(crate) mod pgoutput;
pub(crate) mod replication;
mod setup;
mod snapshot;
mod spill;
pub(crate) mod types;

use std::sync::Arc;
use std::time::Duration;

pub use lifecycle::{drop_owned, status};

use crate::change::{Lsn, Table};
use crate::config;
use crate::source::snapshot::SnapshotWriter;
use crate::source::{Source, SourceError, SourceIo, SourceState, SourceStats, StopMode};
use futures_util::future::BoxFuture;

/// How the initial snapshot runs (`snapshot: initial`); see the `snapshot` module.
pub struct PostgresSnapshotOptions {
    /// Reader connections (and concurrent chunk loads).
    pub parallelism: u32,
    /// Target rows per chunk.
    pub chunk_rows: u64,
    /// Period of the progress log lines.
    pub progress_interval: Duration,
    /// Where the chunks go (the runtime writes them through the sinks' snapshot targets).
    pub writer: Arc<dyn SnapshotWriter>,
}

impl std::fmt::Debug for PostgresSnapshotOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSnapshotOptions")
            .field("parallelism", &self.parallelism)
            .field("chunk_rows", &self.chunk_rows)
            .field("targets", &self.writer.targets())
            .finish_non_exhaustive()
    }
}

/// A PostgreSQL source, between preflight and streaming.
#[derive(Debug)]
pub struct PostgresSource {
    opts: config::PostgresSource,
    tables: Vec<Arc<Table>>,
    /// `None` with `snapshot: never`.
    snapshot: Option<snapshot::Setup>,
    /// Set by `prepare` when it created the slot with an exported snapshot.
    exported: Option<snapshot::Exported>,
    /// The slot's position when `prepare` found or created it (stamped on snapshot rows).
    slot_lsn: Lsn,
    /// The slot as preflight found it.
    slot: Option<setup::SlotInfo>,
    /// Whether the publication existed at preflight.
    publication_exists: bool,
    /// The relation id of each of `tables`.
    relations: Vec<u32>,
    /// Whether each of `tables` has `REPLICA IDENTITY FULL` (updates carry whole rows).
    whole_rows: Vec<bool>,
    /// The server's WAL position at preflight: a table change seen in the catalog then is
    /// behind it in the stream.
    started_at: Lsn,
}

impl PostgresSource {
    fn connect_params(opts: &config::PostgresSource) -> conn::ConnectParams {
        conn::ConnectParams {
            host: opts.host.clone(),
            port: opts.port,
            user: opts.user.clone(),
            database: opts.database.clone(),
            password: opts.password.clone(),
            connect_timeout: opts.connect_timeout,
            tls: opts.tls.clone(),
        }
    }

    /// Read-only preflight: reach the server (bounded retries), log in, check `wal_level`,
    /// resolve the published tables and their keys. Creates nothing. The source keeps its
    /// settings as loaded; the password stays a [`config::Secret`] until the login.
    pub async fn preflight(mut opts: config::PostgresSource) -> Result<Self, SourceError> {
        let params = Self::connect_params(&opts);
        let client = setup::connect_sql(&params, opts.connect_retries).await?;
        setup::check_wal_level(&client).await?;
        let version = setup::server_version(&client).await?;
        if opts.stream_in_progress && version < 140_000 {
            tracing::info!(connector = %opts.name, server_version = version, "the server cannot stream transactions in progress (PostgreSQL 14+); large transactions arrive after commit");
            opts.stream_in_progress = false;
        }
        if opts.binary_values && version < 140_000 {
            tracing::info!(connector = %opts.name, server_version = version, "values arrive in text: the server sends them in binary from PostgreSQL 14");
            opts.binary_values = false;
        }
        let resolved =
            setup::resolve_tables(&client, &opts.publication, opts.tables.as_deref()).await?;
        let relations: Vec<u32> = resolved.iter().map(|d| d.oid).collect();
        let whole_rows: Vec<bool> = resolved.iter().map(|d| d.whole_rows).collect();
        let tables: Vec<Arc<Table>> = resolved.into_iter().map(|d| d.table).collect();
        if opts.binary_values
            && let Some((table, column)) = tables
                .iter()
                .find_map(|t| types::text_only_column(t).map(|c| (t, c)))
        {
            tracing::info!(connector = %opts.name, table = %table.qualified_name(), column = %column.name, type_oid = column.type_oid, "values arrive in text: Zipline reads this column's type only in text");
            opts.binary_values = false;
        }
        let started_at = setup::current_wal_lsn(&client).await?;
        let slot = setup::find_slot(&client, &opts.slot_name, &opts.database).await?;
        let publication_exists = setup::publication_exists(&client, &opts.publication).await?;
        if tables.is_empty() {
            tracing::warn!(connector = %opts.name, publication = %opts.publication, "no tables to replicate yet");
        }
        // Unanswered keepalives end the stream after wal_sender_timeout: report at least twice
        // as often, whatever status_interval says.
        if let Some(timeout) = setup::wal_sender_timeout(&client).await?
            && opts.status_interval > timeout / 2
        {
            tracing::info!(connector = %opts.name, status_interval_ms = opts.status_interval.as_millis() as u64, wal_sender_timeout_ms = timeout.as_millis() as u64, "status updates go out every half wal_sender_timeout (status_interval is longer)");
            opts.status_interval = timeout / 2;
        }
        Ok(PostgresSource {
            opts,
            tables,
            snapshot: None,
            exported: None,
            slot_lsn: Lsn(0),
            slot,
            publication_exists,
            relations,
            whole_rows,
            started_at,
        })
    }

    /// Take an initial snapshot when `prepare` creates the slot (`snapshot: initial`), and
    /// resume one a sink records as interrupted.
    pub fn with_snapshot(mut self, options: PostgresSnapshotOptions) -> Self {
        self.snapshot = Some(snapshot::Setup {
            parallelism: options.parallelism,
            chunk_rows: options.chunk_rows,
            progress_interval: options.progress_interval,
            writer: options.writer,
        });
        self
    }

    /// The tables this source publishes, as preflight found them.
    pub fn tables(&self) -> &[Arc<Table>] {
        &self.tables
    }

    /// Create the publication and the slot when absent. Call after every sink has accepted
    /// the tables, so that a bad configuration never leaves a slot behind. With a snapshot to
    /// take, the sinks record it as pending first and the slot exports its snapshot.
    pub async fn ensure_publication_and_slot(&mut self) -> Result<(), SourceError> {
        let params = Self::connect_params(&self.opts);
        let client = setup::connect_sql(&params, self.opts.connect_retries).await?;
        setup::ensure_publication(
            &client,
            &self.opts.publication,
            &self.opts.slot_name,
            self.opts.tables.as_deref(),
            &self.tables,
        )
        .await?;
        match setup::find_slot(&client, &self.opts.slot_name, &self.opts.database).await? {
            Some(slot) => {
                tracing::info!(slot = %self.opts.slot_name, confirmed_flush = slot.confirmed_flush.as_deref().unwrap_or("none"), wal_status = slot.wal_status.as_deref().unwrap_or("unknown"), retained_bytes = slot.retained_bytes.unwrap_or(-1), active_pid = slot.active_pid.unwrap_or(0), "resuming from existing slot");
                self.slot_lsn = slot
                    .confirmed_flush
                    .as_deref()
                    .and_then(|l| l.parse().ok())
                    .unwrap_or_default();
            }
            None => {
                if let Some(setup) = &self.snapshot {
                    snapshot::begin(&self.opts.name, setup, &self.tables).await?;
                }
                let mut repl = conn::ReplicationConn::connect(&params)
                    .await
                    .map_err(|e| SourceError::transient(format!("replication connection: {e}")))?;
                let export = if self.snapshot.is_some() {
                    "EXPORT_SNAPSHOT"
                } else {
                    "NOEXPORT_SNAPSHOT"
                };
                let sql = format!(
                    "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput {export}",
                    quote_ident(&self.opts.slot_name)
                );
                let rows = repl.simple_query(&sql).await.map_err(|e| {
                    SourceError::fatal(format!(
                        "creating replication slot {}: {e}",
                        self.opts.slot_name
                    ))
                })?;
                // Columns: slot_name, consistent_point, snapshot_name, output_plugin.
                let column = |i: usize| rows.first().and_then(|r| r.get(i).cloned().flatten());
                let point = column(1).unwrap_or_default();
                tracing::info!(slot = %self.opts.slot_name, consistent_point = %point, "created replication slot");
                self.slot_lsn = point.parse().unwrap_or_default();
                if self.snapshot.is_some() {
                    let name = column(2).ok_or_else(|| {
                        SourceError::fatal(format!(
                            "{}: creating slot {} exported no snapshot",
                            self.opts.name, self.opts.slot_name
                        ))
                    })?;
                    self.exported = Some(snapshot::Exported { conn: repl, name });
                }
            }
        }
        Ok(())
    }
}

impl Source for PostgresSource {
    fn name(&self) -> &str {
        &self.opts.name
    }

    fn tables(&self) -> &[Arc<Table>] {
        &self.tables
    }

    fn upstream(&self) -> crate::source::Upstream {
        use crate::source::Upstream;
        let name = &self.opts.slot_name;
        match &self.slot {
            None => Upstream::Missing,
            Some(slot) => match slot.unusable(name) {
                Some(reason) => Upstream::Unusable { reason },
                None if !self.publication_exists => Upstream::Unusable {
                    reason: format!(
                        "publication {} does not exist, but replication slot {name} does: the \
                         publication was dropped while the slot kept its position, and \
                         PostgreSQL reads the slot's changes with the catalog as of that \
                         position, where a publication created now does not exist yet (the \
                         stream would fail with \"publication does not exist\")",
                        self.opts.publication
                    ),
                },
                None => Upstream::Resumable {
                    position: slot
                        .confirmed_flush
                        .clone()
                        .unwrap_or_else(|| "(none)".to_owned()),
                },
            },
        }
    }

    fn takes_snapshot(&self) -> bool {
        self.snapshot.is_some()
    }

    fn whole_rows(&self, table: &Table) -> Result<(), String> {
        let full = self
            .tables
            .iter()
            .zip(&self.whole_rows)
            .any(|(t, full)| *full && t.schema == table.schema && t.name == table.name);
        if full {
            return Ok(());
        }
        let name = format!(
            "{}.{}",
            quote_ident(&table.schema),
            quote_ident(&table.name)
        );
        Err(format!(
            "its updates leave unchanged TOASTed values out of the new row (REPLICA IDENTITY \
             is not FULL); run ALTER TABLE {name} REPLICA IDENTITY FULL"
        ))
    }

    fn reset(&mut self) -> BoxFuture<'_, Result<(), SourceError>> {
        Box::pin(async move {
            let params = Self::connect_params(&self.opts);
            let client = setup::connect_sql(&params, self.opts.connect_retries).await?;
            if self.slot.is_some() {
                // A walsender of an earlier instance may hold it until wal_sender_timeout.
                let patience = setup::wal_sender_timeout(&client)
                    .await?
                    .map_or(Duration::from_secs(120), |t| t * 3);
                setup::drop_slot(&client, &self.opts.slot_name, patience).await?;
                tracing::warn!(slot = %self.opts.slot_name, "dropped the replication slot to start over");
            }
            self.slot = None;
            Ok(())
        })
    }

    fn prepare(&mut self) -> BoxFuture<'_, Result<(), SourceError>> {
        Box::pin(self.ensure_publication_and_slot())
    }

    fn recopy<'a>(
        &'a mut self,
        names: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<crate::checkpoint::TableRecord>, SourceError>> {
        Box::pin(async move {
            let connector = &self.opts.name;
            let Some(setup) = &self.snapshot else {
                return Err(SourceError::fatal(format!(
                    "{connector}: copying a table again needs a snapshot, which `snapshot: \
                     never` forbids"
                )));
            };
            let mut tables = Vec::new();
            let mut records = Vec::new();
            for name in names {
                let Some(i) = self.tables.iter().position(|t| t.qualified_name() == *name) else {
                    return Err(SourceError::fatal(format!(
                        "{connector}: cannot copy table {name} again: it is not in publication \
                         {} (add it back, or list it in `tables:` so Zipline does)",
                        self.opts.publication
                    )));
                };
                tables.push(Arc::clone(&self.tables[i]));
                records.push(crate::checkpoint::TableRecord {
                    table: (*self.tables[i]).clone(),
                    relation: self.relations[i],
                    since: Lsn(0),
                });
            }
            let params = Self::connect_params(&self.opts);
            let cx = snapshot::Context {
                opts: &self.opts,
                params: &params,
                tables: &self.tables,
                lsn: self.slot_lsn,
                stats: None,
            };
            let (_keep, mut stop) = tokio::sync::watch::channel(StopMode::Run);
            snapshot::recopy(cx, setup, &tables, &mut stop).await?;
            Ok(records)
        })
    }

    fn run(
        self: Box<Self>,
        io: SourceIo,
        stop: tokio::sync::watch::Receiver<StopMode>,
        stats: Arc<SourceStats>,
    ) -> BoxFuture<'static, Result<(), SourceError>> {
        Box::pin(async move {
            let params = Self::connect_params(&self.opts);
            let mut this = *self;
            let (mut io, mut stop) = (io, stop);
            if let Some(setup) = this.snapshot.take() {
                let cx = snapshot::Context {
                    opts: &this.opts,
                    params: &params,
                    tables: &this.tables,
                    lsn: this.slot_lsn,
                    stats: Some(&stats),
                };
                stats.set_state(SourceState::Snapshot);
                let outcome = snapshot::run(cx, setup, this.exported.take(), &mut stop).await;
                let outcome = match outcome {
                    Ok(outcome) => outcome,
                    Err(e) => {
                        stats.errors.count(e.class);
                        stats.set_state(SourceState::Stopped);
                        return Err(e);
                    }
                };
                if let snapshot::Outcome::Stopped = outcome {
                    stats.set_state(SourceState::Stopped);
                }
                match outcome {
                    snapshot::Outcome::Stopped => return Ok(()),
                    // The copy is durable in every sink: each table is recorded as copied
                    // (so a table dropped and created again before its first change is
                    // noticed too).
                    snapshot::Outcome::Copied => {
                        for (table, &relation) in this.tables.iter().zip(&this.relations) {
                            let record = crate::checkpoint::TableRecord {
                                table: (**table).clone(),
                                relation,
                                since: this.slot_lsn,
                            };
                            let ledger = &mut io.ledger;
                            ledger.known.retain(|r| r.name() != record.name());
                            ledger.known.push(record.clone());
                            let _ = ledger.record.send(record);
                        }
                    }
                    snapshot::Outcome::Continue => {}
                }
            }
            // Relation messages of REPLICA IDENTITY FULL tables flag every column as key.
            let keys = this
                .tables
                .iter()
                .map(|t| {
                    let key = t.key.iter().map(|&i| t.columns[i].name.clone()).collect();
                    ((t.schema.clone(), t.name.clone()), key)
                })
                .collect();
            let published: Vec<(String, u32)> = this
                .tables
                .iter()
                .zip(&this.relations)
                .map(|(t, oid)| (t.qualified_name(), *oid))
                .collect();
            let events = Arc::new(std::sync::Mutex::new(catalog_events(
                &io.ledger.known,
                &published,
                this.started_at,
            )));
            let monitor = monitor::spawn(
                params.clone(),
                monitor::Watch {
                    connector: this.opts.name.clone(),
                    slot: this.opts.slot_name.clone(),
                    publication: this.opts.publication.clone(),
                    warn_bytes: this.opts.slot_warn_bytes,
                    heartbeat: this.opts.heartbeat_interval,
                    tables: published,
                    events: Arc::clone(&events),
                },
                Arc::clone(&stats),
            );
            let start = replication::Start {
                keys: Arc::new(keys),
                events,
                slot_lsn: this.slot_lsn,
            };
            let result =
                replication::run(&this.opts, params, start, io, stop, Arc::clone(&stats)).await;
            monitor.abort();
            if let Err(e) = &result {
                stats.errors.count(e.class);
            }
            stats.set_state(SourceState::Stopped);
            result
        })
    }
}

/// What the catalog at start says of the tables the pipeline applied: one dropped and created
/// again (another relation id), or no longer published, is a change the stream may never
/// show; it is due once the stream has passed `at`, the WAL position then.
fn catalog_events(
    known: &[crate::checkpoint::TableRecord],
    published: &[(String, u32)],
    at: Lsn,
) -> Vec<replication::tables::TableEvent> {
    use crate::source::TableChange;
    known
        .iter()
        .filter_map(|record| {
            let name = record.name();
            let change = match published.iter().find(|(n, _)| *n == name) {
                None => TableChange::Unpublished,
                Some((_, oid)) if *oid != record.relation => TableChange::Recreated {
                    old: record.relation,
                    new: *oid,
                },
                Some(_) => return None,
            };
            tracing::info!(table = %name, ?change, "the catalog differs from what the pipeline applied; due once the stream reaches the position of this start");
            Some(replication::tables::TableEvent {
                table: name,
                change,
                at,
            })
        })
        .collect()
}

/// Quote an SQL identifier.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quote an SQL string literal.
pub(crate) fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}
