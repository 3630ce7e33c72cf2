//! Sources of changes, and the contract every source keeps.
//!
//! A source produces and nothing more: it emits changes in commit order, transaction by
//! transaction, each stamped with a deterministic [`Position`] (the same change replayed
//! after a restart carries the same position), into its [`Emitter`], and is handed back the
//! durable frontier, which is all it may confirm upstream. It never sees lanes, routers, the
//! ack tracker or sink connectors: the runtime ([`crate::runtime`]) owns those. A snapshot's
//! chunks go to a [`snapshot::SnapshotWriter`] the runtime provides.
//!
//! [`Position`]: crate::change::Position

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};

use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, watch};

use crate::change::{Position, Table};
use crate::checkpoint::TableRecord;
use crate::error::{Cause, Classify, ErrorClass};
use crate::metrics::ErrorCounts;

pub mod emitter;
pub mod lifecycle;
pub mod postgres;
pub mod snapshot;
pub mod sqlserver;

pub use emitter::{Emitter, Event, Frontier};
pub use lifecycle::{SourceDropped, SourceStatus};

/// An error from the source, classified by what the runtime does next: `Transient`
/// (reconnect and resume from the frontier) or `Fatal` (stop and tell the operator). A
/// source has no per-row policy: a change it cannot read stops it, naming the change. It
/// prints its context; what the server said is its [`Cause`].
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct SourceError {
    /// Transient errors are retried with backoff; fatal ones stop the pipeline.
    pub class: ErrorClass,
    /// What was being done and where, and what to do; never contains a secret.
    pub message: String,
    /// Where the runtime reacts to more than the class.
    pub kind: SourceErrorKind,
    /// What the server or driver reported, when there was something.
    #[source]
    pub cause: Option<Box<Cause>>,
}

/// What kind of stop a [`SourceError`] is, where the runtime acts on it.
#[derive(Debug, Clone, Default)]
pub enum SourceErrorKind {
    /// Nothing more to say than the class.
    #[default]
    Other,
    /// A column changed type: the source stopped right before the first row of the new type,
    /// with everything before it applied and confirmed. `record` is the table's new shape:
    /// recorded, so the next start (after the operator altered the sink column) goes on.
    TypeChanged {
        /// The table's new shape.
        record: Box<TableRecord>,
        /// The column whose type changed.
        column: String,
    },
    /// A table the pipeline applied was dropped and created again, or left the publication,
    /// seen at position `at` (everything before it applied and confirmed).
    TableChanged {
        /// `schema.name`.
        table: String,
        /// What happened to it.
        change: TableChange,
        /// Where in the stream it was noticed.
        at: crate::change::Lsn,
    },
}

/// What happened to a table the pipeline applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableChange {
    /// Dropped and created again: another relation id under the same name.
    Recreated {
        /// The relation id the pipeline applied.
        old: u32,
        /// The relation id now.
        new: u32,
    },
    /// No longer in the publication (removed from it, or dropped).
    Unpublished,
}

impl SourceError {
    fn new(class: ErrorClass, message: String) -> Self {
        SourceError {
            class,
            message,
            kind: SourceErrorKind::Other,
            cause: None,
        }
    }
    /// Reconnect and resume from the frontier.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Transient, message.into())
    }
    /// Stop and tell the operator.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Fatal, message.into())
    }
    /// The same error with `cause` under it.
    pub fn caused_by(mut self, cause: Cause) -> Self {
        self.cause = Some(Box::new(cause));
        self
    }
    /// The same error (kind, cause) said in other words, of class `class`: `message`
    /// replaces the context, e.g. to say that retrying gave up.
    pub fn reworded(self, class: ErrorClass, message: String) -> Self {
        SourceError {
            class,
            message,
            ..self
        }
    }
    /// The whole error on one line: context, then the cause.
    pub fn report(&self) -> String {
        crate::error::report(self)
    }
}

impl Classify for SourceError {
    fn class(&self) -> ErrorClass {
        self.class
    }
}

/// How the pipeline asks the source to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// Keep streaming.
    Run,
    /// Stop reading, let the lanes commit what they hold, confirm the frontier, return.
    Drain,
    /// Return now (a lane failed); confirm only what is already durable.
    Abort,
}

/// The tables the pipeline applied before, and where a source sends the shapes it starts
/// applying once their first change is durable (the runtime records them in the sinks; see
/// [`crate::checkpoint::tables`]).
#[derive(Debug)]
pub struct Ledger {
    /// The records read from the sinks at start.
    pub known: Vec<TableRecord>,
    /// Where new records go.
    pub record: mpsc::UnboundedSender<TableRecord>,
}

/// What a running source works with besides its own connections.
#[derive(Debug)]
pub struct SourceIo {
    /// Where its events go, and the frontier comes back.
    pub emitter: Emitter,
    /// The tables applied before, and where new shapes are recorded.
    pub ledger: Ledger,
    /// For a source without an upstream cursor ([`Upstream::NoCursor`]): the position every
    /// lane of every sink has made durable, where it resumes; `None` when some lane holds
    /// none (nothing durable: start from the beginning, with a snapshot).
    pub resume: Option<Position>,
}

/// What a source counts, for the progress line and the metrics.
#[derive(Debug)]
pub struct SourceStats {
    /// Changes received from the slot.
    pub received: AtomicU64,
    /// The durable frontier last confirmed upstream.
    pub confirmed: AtomicU64,
    /// The server's end of WAL as it last said on the replication stream (0: not known, or
    /// not a PostgreSQL source).
    pub wal_end: AtomicU64,
    /// Microseconds between the commit of the oldest not-yet-durable transaction and now
    /// (0 when caught up).
    pub lag_micros: AtomicI64,
    /// WAL the source's slot retains, in bytes (-1 when unknown).
    pub retained_bytes: AtomicI64,
    /// Rows the initial snapshot has loaded into every sink.
    pub snapshot_rows_copied: AtomicU64,
    /// Rows the snapshots so far set out to copy, by the server's estimate.
    pub snapshot_rows_total: AtomicU64,
    /// Failed attempts: transient ones (the stream reconnects), fatal ones (it stops).
    pub errors: ErrorCounts,
    state: AtomicU8,
}

/// Where a source stands (`/readyz` is ready only while it streams).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceState {
    /// Not yet reading: preflight, setup, or waiting for the sinks.
    Starting,
    /// Copying the initial snapshot (or a table again).
    Snapshot,
    /// Reading changes on a live connection.
    Streaming,
    /// The connection was lost; reconnecting with backoff.
    Reconnecting,
    /// Stopped reading (a graceful stop, or a failure).
    Stopped,
}

impl SourceState {
    const ALL: [SourceState; 5] = [
        SourceState::Starting,
        SourceState::Snapshot,
        SourceState::Streaming,
        SourceState::Reconnecting,
        SourceState::Stopped,
    ];

    /// What it means, for `/readyz`.
    pub fn describe(self) -> &'static str {
        match self {
            SourceState::Starting => "starting (not streaming yet)",
            SourceState::Snapshot => "copying the initial snapshot",
            SourceState::Streaming => "streaming",
            SourceState::Reconnecting => "replication connection lost; reconnecting",
            SourceState::Stopped => "stopped",
        }
    }
}

impl SourceStats {
    /// The source is now in `state`.
    pub fn set_state(&self, state: SourceState) {
        let n = SourceState::ALL
            .iter()
            .position(|s| *s == state)
            .unwrap_or(0);
        self.state.store(n as u8, Ordering::Relaxed);
    }

    /// Where the source stands.
    pub fn state(&self) -> SourceState {
        SourceState::ALL
            .get(usize::from(self.state.load(Ordering::Relaxed)))
            .copied()
            .unwrap_or(SourceState::Starting)
    }
}

/// What a source found of its cursor upstream at preflight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// The source keeps no cursor upstream (SQL Server: positions live in the sinks).
    NoCursor,
    /// No cursor (yet, or any more).
    Missing,
    /// A cursor to resume from, at this position.
    Resumable {
        /// Where it stands, as the source prints positions.
        position: String,
    },
    /// A cursor that cannot be streamed from.
    Unusable {
        /// Why, as a sentence.
        reason: String,
    },
}

impl Default for SourceStats {
    fn default() -> Self {
        SourceStats {
            received: AtomicU64::new(0),
            confirmed: AtomicU64::new(0),
            wal_end: AtomicU64::new(0),
            lag_micros: AtomicI64::new(0),
            retained_bytes: AtomicI64::new(-1),
            snapshot_rows_copied: AtomicU64::new(0),
            snapshot_rows_total: AtomicU64::new(0),
            errors: ErrorCounts::default(),
            state: AtomicU8::new(0),
        }
    }
}

/// A configured source, after a read-only preflight (reachable, permitted, tables known).
///
/// Contract: `prepare` may create what the source owns upstream (a publication and a slot)
/// and is called only after every sink accepted [`Source::tables`]. `run` emits into
/// `io.emitter` until `stop` asks it to stop, and confirms upstream only the durable frontier
/// the emitter hands back. With [`StopMode::Drain`] it stops reading, closes its emitter
/// (the runtime lets every lane commit what it holds), keeps serving its upstream until the
/// last frontier arrives, confirms it and returns `Ok`. With [`StopMode::Abort`], or when the
/// emitter reports the runtime gone, it confirms what is durable and returns at once.
pub trait Source: Send {
    /// The connector's name from the pipeline file.
    fn name(&self) -> &str;
    /// The tables this source streams, as preflight found them.
    fn tables(&self) -> &[Arc<Table>];
    /// What preflight found of the cursor upstream.
    fn upstream(&self) -> Upstream;
    /// Whether creating the cursor also copies the existing rows (an initial snapshot).
    fn takes_snapshot(&self) -> bool;
    /// `Ok` when every update of `table` carries the whole new row (no unchanged placeholder
    /// for a value the sink may never have had), as a row filter needs; otherwise why not
    /// and the fix.
    fn whole_rows(&self, table: &Table) -> Result<(), String>;
    /// Drop the cursor upstream, so that `prepare` creates a new one and, with it, takes a
    /// whole new snapshot. Called only when the pipeline starts over (`--resnapshot`,
    /// `snapshot: when_needed`).
    fn reset(&mut self) -> BoxFuture<'_, Result<(), SourceError>>;
    /// Create what the source owns upstream, when absent.
    fn prepare(&mut self) -> BoxFuture<'_, Result<(), SourceError>>;
    /// Copies the tables named `tables` (`schema.name`) again into the sinks, from a new
    /// snapshot, and returns their records (shape and relation id as the catalog has them
    /// now; `since` left at zero for the caller). For a table dropped and created again
    /// (`on_table_recreate: resnapshot`); the caller emptied their sink tables first.
    fn recopy<'a>(
        &'a mut self,
        tables: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<TableRecord>, SourceError>>;
    /// Stream until stopped or a non-retryable error.
    fn run(
        self: Box<Self>,
        io: SourceIo,
        stop: watch::Receiver<StopMode>,
        stats: Arc<SourceStats>,
    ) -> BoxFuture<'static, Result<(), SourceError>>;
}
