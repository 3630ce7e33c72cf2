//! The initial snapshot: copy every row of every published table into the sinks, consistently
//! with the change stream that follows. Operator-facing account:
//! `docs/connectors/postgres-source.md` (Initial snapshot).
//!
//! Flow, when Zipline creates the slot with `snapshot: initial`:
//! 1. Every sink records a pending snapshot ([`begin`]), *then* the slot is created with
//!    `CREATE_REPLICATION_SLOT … EXPORT_SNAPSHOT`: its consistent point is where streaming
//!    starts, and the exported snapshot shows the database exactly as of that point. The
//!    creating connection stays open and idle — the export lives only until its next command
//!    (<https://www.postgresql.org/docs/15/protocol-replication.html>).
//! 2. [`run`], before streaming: `snapshot_parallelism` readers ([`reader`]) each open a
//!    REPEATABLE READ transaction importing the export; then the export connection closes.
//! 3. The first reader plans chunks (ranges of a key column, [`plan`]) and every sink saves
//!    the plan. Workers, one per reader, take chunks off a shared queue: `COPY` the range,
//!    decode it ([`copy_text`]) unless every target takes the server's text, and hand it to
//!    the runtime's [`SnapshotWriter`], which writes it into each sink that needs it (through
//!    the route's transform where there is one) and marks the chunk loaded in the same sink
//!    transaction. While a worker's chunk is being loaded, its next one is read, so source and
//!    sink work at once. Snapshot rows bypass the lanes.
//! 4. Every sink marks the snapshot complete; streaming starts at the consistent point, so
//!    every change committed after the snapshot — also during the copy — is applied on top.
//!
//! Resuming: after a crash the slot still stands at its consistent point (nothing was
//! confirmed), but the export is gone. The chunks a sink has not loaded are copied from a new
//! snapshot, newer than the consistent point; the stream then replays from the consistent
//! point over them. Each change carries its whole row and is applied by key in commit order,
//! so the sink converges to the source (a row may show an older state while the replay
//! passes it). A slot that has to be created again (dropped, or lost with its server) gets a
//! whole new snapshot: chunks loaded under an older one are forgotten, because the changes
//! between that snapshot and the new slot's consistent point are in no stream.
//!
//! Snapshot changes carry `Position { lsn: <slot position>, ordinal: 0, sub: 0 }`: only a
//! transform or a dead-letter record ever sees it.
//!
//! [`SnapshotWriter`]: crate::source::snapshot::SnapshotWriter

mod chunks;
mod copy_text;
mod plan;
mod progress;
mod reader;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use self::chunks::{Engine, Job};
use self::progress::{Progress, TableProgress};
use self::reader::Reader;
use super::conn::{ConnectParams, ReplicationConn};
use crate::change::{Lsn, Position, Table};
use crate::checkpoint::SnapshotState;
use crate::config;
use crate::source::snapshot::SnapshotWriter;
use crate::source::{SourceError, StopMode};

/// Attempts per chunk and sink, and per chunk read, before a transient error is given up on.
const MAX_ATTEMPTS: u32 = 10;

/// What the snapshot needs besides the source options.
pub(crate) struct Setup {
    /// Readers (and concurrent chunk loads).
    pub(crate) parallelism: u32,
    /// Target rows per chunk.
    pub(crate) chunk_rows: u64,
    /// Period of the progress log lines.
    pub(crate) progress_interval: Duration,
    /// Where the chunks go.
    pub(crate) writer: Arc<dyn SnapshotWriter>,
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup")
            .field("parallelism", &self.parallelism)
            .field("chunk_rows", &self.chunk_rows)
            .field("targets", &self.writer.targets())
            .finish_non_exhaustive()
    }
}

/// A snapshot exported by the slot's creation, alive while `conn` is open and idle.
pub(crate) struct Exported {
    pub(crate) conn: ReplicationConn,
    pub(crate) name: String,
}

impl std::fmt::Debug for Exported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exported")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How [`run`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Done (or nothing to do): stream.
    Continue,
    /// This run copied the tables and recorded the snapshot complete: stream.
    Copied,
    /// Asked to stop; the chunks loaded so far stay recorded.
    Stopped,
}

/// Before the slot is created: every sink forgets any earlier snapshot and records a pending
/// one, so that a crash from here on is recognised as an interrupted snapshot. A sink that
/// recorded loading rows of an earlier snapshot holds rows of an earlier slot, which may
/// include rows deleted since (no stream carries what happened while no slot existed): its
/// tables are emptied first, so the new snapshot leaves an exact copy.
pub(crate) async fn begin(
    connector: &str,
    setup: &Setup,
    tables: &[Arc<Table>],
) -> Result<(), SourceError> {
    let writer = &*setup.writer;
    for target in 0..writer.targets() {
        // Rows of an earlier slot: a complete snapshot (then the stream), or loaded chunks.
        let wrote = match writer.state(target).await? {
            SnapshotState::None => false,
            SnapshotState::Pending(chunks) => chunks.iter().any(|(_, loaded)| *loaded),
            SnapshotState::Complete => true,
        };
        if wrote {
            if writer.clear(target, tables).await? {
                tracing::warn!(
                    connector,
                    sink = writer.name(target),
                    "the slot had to be created again: emptied the sink's tables, which may have held rows deleted on the source while no slot existed; the new snapshot copies every row"
                );
            } else {
                tracing::warn!(
                    connector,
                    sink = writer.name(target),
                    "the slot had to be created again: the new snapshot overwrites the sink's rows, but rows deleted on the source while no slot existed may remain (the route's transform decides the sink tables, so Zipline cannot empty them)"
                );
            }
        }
        writer.begin(target, &[]).await?;
    }
    Ok(())
}

/// Everything [`run`] works with.
pub(crate) struct Context<'a> {
    pub(crate) opts: &'a config::PostgresSource,
    pub(crate) params: &'a ConnectParams,
    pub(crate) tables: &'a [Arc<Table>],
    /// Stamped on snapshot changes (see the module docs).
    pub(crate) lsn: Lsn,
    /// Where rows copied are counted, for the metrics.
    pub(crate) stats: Option<&'a Arc<crate::source::SourceStats>>,
}

/// Takes or resumes the snapshot (see the module docs); `Continue` when there is none to
/// take.
pub(crate) async fn run(
    cx: Context<'_>,
    setup: Setup,
    exported: Option<Exported>,
    stop: &mut watch::Receiver<StopMode>,
) -> Result<Outcome, SourceError> {
    let connector = &cx.opts.name;
    let writer = &setup.writer;
    let mut states = Vec::with_capacity(writer.targets());
    for target in 0..writer.targets() {
        states.push(writer.state(target).await?);
    }
    let pending = |s: &SnapshotState| matches!(s, SnapshotState::Pending(_));
    if !states.iter().any(pending) {
        if let Some(exported) = exported {
            exported.conn.close().await;
        }
        return Ok(Outcome::Continue);
    }
    let fresh = exported.is_some();
    if fresh {
        tracing::info!(connector = %connector, lsn = %cx.lsn, parallelism = setup.parallelism, "initial snapshot: copying every table as of the slot's consistent point");
    } else {
        tracing::warn!(connector = %connector, "resuming an interrupted initial snapshot from a new snapshot: chunks already loaded are kept, the rest is copied as of now, and the stream replays changes from the slot's consistent point on top (rows may show older states until it has caught up)");
    }

    // Readers first: the export must be imported before its connection goes.
    let retries = cx.opts.connect_retries;
    let opened = futures_util::future::try_join_all((0..setup.parallelism.max(1)).map(|_| {
        Reader::open(
            cx.params,
            retries,
            exported.as_ref().map(|e| e.name.as_str()),
        )
    }))
    .await;
    if let Some(exported) = exported {
        exported.conn.close().await;
    }
    let readers = opened?;

    let planner = readers[0].client();
    let mut plan = plan::saved_plan(&states);
    let current: Vec<String> = cx.tables.iter().map(|t| t.qualified_name()).collect();
    if let Some(saved) = &plan {
        let planned: BTreeSet<&str> = saved.iter().map(|c| c.table.as_str()).collect();
        if planned != current.iter().map(String::as_str).collect() {
            tracing::warn!(connector = %connector, planned = ?planned, tables = ?current, "the published tables changed since the snapshot was planned; planning it again (every chunk is copied again)");
            plan = None;
        }
    }
    let plan = match plan {
        Some(plan) => plan,
        None => {
            let mut plan = Vec::new();
            for table in cx.tables {
                let column = plan::key_column(planner, table).await?;
                plan.extend(plan::plan_table(planner, table, &column, setup.chunk_rows).await?);
            }
            plan
        }
    };
    let work = plan::work(&states, &plan, |target, table| writer.wants(target, table));
    for &target in &work.save_plan {
        writer.begin(target, &plan).await?;
    }
    if !fresh {
        tracing::info!(connector = %connector, chunks = plan.len(), loaded = work.done, to_copy = work.todo.len(), "snapshot resumes: chunks every sink already holds are not copied again");
    }

    // Progress: estimates scaled to the chunks this run copies.
    let mut tables_progress = Vec::with_capacity(cx.tables.len());
    for table in cx.tables {
        let name = table.qualified_name();
        let total = plan.iter().filter(|c| c.table == name).count() as u64;
        let todo = work.todo.iter().filter(|(c, _)| c.table == name).count() as u64;
        let estimate = plan::estimate_rows(planner, table).await?;
        let scaled = (estimate * todo).checked_div(total).unwrap_or(0);
        tables_progress.push(TableProgress::new(name, scaled, todo as u32));
    }
    let progress = Arc::new(Progress::new(tables_progress).counting_into(cx.stats.cloned()));
    let jobs: Vec<Job> = work
        .todo
        .into_iter()
        .map(|(chunk, sinks)| Job {
            table: current
                .iter()
                .position(|t| *t == chunk.table)
                .unwrap_or_default(),
            chunk,
            sinks,
        })
        .collect();
    let chunks = jobs.len();
    let engine = Engine {
        connector: connector.clone(),
        params: cx.params.clone(),
        retries,
        tables: cx.tables.to_vec(),
        writer: setup.writer.clone(),
        position: Position {
            lsn: cx.lsn,
            ordinal: 0,
            sub: 0,
        },
        progress_interval: setup.progress_interval,
    };
    match chunks::copy(engine, readers, jobs, progress.clone(), stop).await? {
        Outcome::Stopped => {
            tracing::info!(connector = %connector, rows = progress.total_rows(), "snapshot interrupted; the chunks loaded so far are kept and the next start resumes it");
            return Ok(Outcome::Stopped);
        }
        Outcome::Continue | Outcome::Copied => {}
    }
    for (target, state) in states.iter().enumerate() {
        if pending(state) {
            writer.finish(target).await?;
        }
    }
    let seconds = progress.elapsed().as_secs_f64();
    let rows = progress.total_rows();
    tracing::info!(
        connector = %connector,
        rows,
        chunks,
        seconds,
        rows_per_sec = (rows as f64 / seconds.max(1e-3)).round() as u64,
        "snapshot complete; streaming from the slot's consistent point"
    );
    Ok(Outcome::Copied)
}

/// Copies `tables` again, each chunk from a fresh snapshot, into every sink (a table dropped
/// and created again, with `on_table_recreate: resnapshot`): the caller emptied their sink
/// tables, and the stream resumes from before the copy and replays every later change over
/// it, so the copy's own moment does not matter. The chunks are marked loaded like the
/// initial snapshot's; its state is otherwise left alone.
pub(crate) async fn recopy(
    cx: Context<'_>,
    setup: &Setup,
    tables: &[Arc<Table>],
    stop: &mut watch::Receiver<StopMode>,
) -> Result<u64, SourceError> {
    let connector = &cx.opts.name;
    let retries = cx.opts.connect_retries;
    let readers = futures_util::future::try_join_all(
        (0..setup.parallelism.max(1)).map(|_| Reader::open(cx.params, retries, None)),
    )
    .await?;
    let planner = readers[0].client();
    let mut plan = Vec::new();
    let mut progress = Vec::new();
    for table in tables {
        let column = plan::key_column(planner, table).await?;
        let chunks = plan::plan_table(planner, table, &column, setup.chunk_rows).await?;
        let estimate = plan::estimate_rows(planner, table).await?;
        progress.push(TableProgress::new(
            table.qualified_name(),
            estimate,
            chunks.len() as u32,
        ));
        plan.extend(chunks);
    }
    let writer = &setup.writer;
    let jobs: Vec<Job> = plan
        .into_iter()
        .map(|chunk| Job {
            table: tables
                .iter()
                .position(|t| t.qualified_name() == chunk.table)
                .unwrap_or_default(),
            sinks: (0..writer.targets())
                .filter(|&t| writer.wants(t, &chunk.table))
                .collect(),
            chunk,
        })
        .collect();
    let progress = Arc::new(Progress::new(progress).counting_into(cx.stats.cloned()));
    tracing::info!(connector = %connector, tables = ?tables.iter().map(|t| t.qualified_name()).collect::<Vec<_>>(), chunks = jobs.len(), "copying tables again from a new snapshot");
    let engine = Engine {
        connector: connector.clone(),
        params: cx.params.clone(),
        retries,
        tables: tables.to_vec(),
        writer: setup.writer.clone(),
        position: Position {
            lsn: cx.lsn,
            ordinal: 0,
            sub: 0,
        },
        progress_interval: setup.progress_interval,
    };
    match chunks::copy(engine, readers, jobs, progress.clone(), stop).await? {
        Outcome::Continue | Outcome::Copied => Ok(progress.total_rows()),
        Outcome::Stopped => Err(SourceError::fatal(format!(
            "{connector}: stopped while copying tables again; the next start copies them again"
        ))),
    }
}
