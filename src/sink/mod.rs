//! Sinks: where changes land.
//!
//! A sink connector ([`SinkConnector`]) opens one [`LaneSink`] per lane; each lane owns its
//! own connection and applies its batches in order. Nothing here assumes the lanes live in one
//! process: a lane needs only its number, the lane count and its own checkpoint row.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::change::{Change, Position, Table};
use crate::error::{Cause, Classify, ErrorClass};

#[cfg(feature = "bench")]
pub(crate) mod bench;
mod coalesce;
pub mod lifecycle;
pub mod mysql;
pub mod postgres;
mod shapes;
mod snapshot;
mod store;

pub use lifecycle::{ClaimStatus, Forgotten, LaneCheckpoint, Lifecycle, SinkStatus};
pub use snapshot::{
    CopyTextTarget, SnapshotChunk, SnapshotState, SnapshotTarget,
    unsupported as snapshot_unsupported,
};
pub use store::CheckpointStore;

/// A boxed, sendable future (keeps the sink traits object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An ordered run of changes for one lane of one sink.
///
/// Changes are in position order and every position is above the lane's checkpoint. For one
/// key, a later change supersedes an earlier one (each insert or update carries the whole row),
/// so a sink may coalesce a batch to the last change per key before writing it.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// Lane number, `0..lanes`.
    pub lane: u32,
    /// The changes to apply, in position order.
    pub changes: Vec<Change>,
    /// Changes set aside instead of applied (`on_error: dead_letter`): the sink records them
    /// in its dead-letter table in the same transaction as `changes` and the checkpoint.
    pub dead_letters: Vec<DeadLetter>,
    /// A position the batch covers without writing anything for it (a change skipped by
    /// `on_error: skip`): the checkpoint moves at least this far.
    pub skipped_to: Option<Position>,
}

impl Batch {
    /// A batch of `changes` for `lane`.
    pub fn new(lane: u32, changes: Vec<Change>) -> Self {
        Batch {
            lane,
            changes,
            ..Batch::default()
        }
    }

    /// The position the lane's checkpoint moves to when this batch commits: the highest of
    /// its changes, dead letters and skipped position.
    pub fn last_position(&self) -> Position {
        let changes = self.changes.last().map(|c| c.position);
        let dead = self.dead_letters.iter().map(|d| d.change.position).max();
        changes.max(dead).max(self.skipped_to).unwrap_or_default()
    }

    /// True when the batch writes nothing and covers no position.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.dead_letters.is_empty() && self.skipped_to.is_none()
    }
}

/// A change a sink rejected for good (or one parked behind such a change of the same key),
/// recorded instead of applied.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The original change.
    pub change: Change,
    /// Why: the sink's error message.
    pub reason: String,
    /// The sink's error code (a SQLSTATE, or a MySQL error number), when it gave one.
    pub code: Option<String>,
}

/// A key that has a dead letter: later changes of it are dead-lettered too, behind it, so a
/// replay can restore the key's changes in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ParkedKey {
    /// The change's table, `schema.name`.
    pub table: String,
    /// The key values as JSON (see [`crate::transform::json::key_to_json`]).
    pub key: String,
}

/// A dead-letter record as stored in a sink (`zipline dlq list`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterRecord {
    /// The record's id in the dead-letter table.
    pub id: u64,
    /// The change's position, e.g. `0/16B3A28#3`.
    pub position: String,
    /// The change's table, `schema.name`.
    pub table: String,
    /// `insert`, `update`, `delete` or `truncate`.
    pub op: String,
    /// The key values as JSON.
    pub key: String,
    /// The sink's error code, if any.
    pub code: Option<String>,
    /// Why the change was set aside.
    pub reason: String,
    /// When it was recorded, `YYYY-MM-DD HH:MM:SS` UTC.
    pub created_at: String,
    /// The whole change, in the `zipline transform test` JSON format.
    pub change: String,
}

/// An error from a sink, classified by what the runtime does next. It prints its context
/// (sink, what it was doing, table, row key); the server's error is its [`Cause`], printed
/// after it by [`SinkError::report`] or any chain printer.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct SinkError {
    /// Transient: reconnect and retry the same batch. Definite: that batch's data is bad
    /// (the sink's `on_error` applies). Fatal: stop and tell the operator.
    pub class: ErrorClass,
    /// What was being done and where (sink, table, column, key); never contains a secret.
    pub message: String,
    /// Where the runtime reacts to more than the class.
    pub kind: SinkErrorKind,
    /// What the server or driver reported, when there was something.
    #[source]
    pub cause: Option<Box<Cause>>,
}

/// What kind of failure a [`SinkError`] is, where that matters beyond its class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SinkErrorKind {
    /// Nothing more to say than the class.
    #[default]
    Other,
    /// A row conflicts on a unique key other than its own key with *another* row of the
    /// sink table (class Definite). Lanes apply different keys' changes in different orders,
    /// so a row can meet for a moment a value another lane has yet to move away (the source
    /// held the constraint at every commit): the runtime retries a few times before it treats
    /// the row as definitely bad.
    UniqueConflict,
}

impl SinkError {
    fn new(class: ErrorClass, message: String) -> Self {
        SinkError {
            class,
            message,
            kind: SinkErrorKind::Other,
            cause: None,
        }
    }
    /// A transient error (retry with backoff).
    pub fn transient(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Transient, message.into())
    }
    /// A definite error (that data is bad).
    pub fn definite(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Definite, message.into())
    }
    /// A fatal error (operator action needed).
    pub fn fatal(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Fatal, message.into())
    }
    /// The server's error code (a SQLSTATE, or a MySQL error number), when there was one.
    pub fn code(&self) -> Option<&str> {
        self.cause.as_ref()?.code.as_deref()
    }
    /// The same error (class, kind, cause) said in other words: `message` replaces the
    /// context, e.g. to add what the operator must do.
    pub fn reworded(self, message: String) -> Self {
        SinkError { message, ..self }
    }
    /// The whole error on one line: context, then the cause.
    pub fn report(&self) -> String {
        crate::error::report(self)
    }
}

impl Classify for SinkError {
    fn class(&self) -> ErrorClass {
        self.class
    }
}

/// Runs a sink's `connect` (described by `doing`, e.g. "connecting to MySQL at h:3306 as
/// user u") within `timeout`; no answer in time is transient, like a refused connection.
async fn within_connect_timeout<T>(
    sink: &str,
    doing: &str,
    timeout: std::time::Duration,
    connect: impl Future<Output = Result<T, SinkError>>,
) -> Result<T, SinkError> {
    match tokio::time::timeout(timeout, connect).await {
        Ok(result) => result,
        Err(_) => Err(SinkError::transient(format!(
            "sink {sink}: {doing}: no answer within {timeout:?}"
        ))),
    }
}

/// Refuses pipeline and connector names the checkpoint table cannot hold, before anything
/// is written.
fn check_checkpoint_names(pipeline: &str, connector: &str) -> Result<(), SinkError> {
    for (what, name) in [("pipeline", pipeline), ("connector", connector)] {
        if name.chars().count() > crate::checkpoint::MAX_NAME_CHARS {
            return Err(SinkError::fatal(format!(
                "sink {connector}: the {what} name is longer than {} characters, which the \
                 checkpoint table cannot hold",
                crate::checkpoint::MAX_NAME_CHARS
            )));
        }
    }
    Ok(())
}

/// A sink's claim of a pipeline for this process (see [`crate::checkpoint::fence`]): while
/// it holds, no other instance of the pipeline can claim the sink, and once another instance
/// took it over every write of this one fails.
pub trait Lease: Send {
    /// The claim's epoch, which every write of this process into the sink is fenced on.
    fn epoch(&self) -> u64;
    /// Renews the claim's heartbeat. `Err` of class Fatal: another instance took the sink
    /// over (stop). Transient: the sink could not be reached; the claim may still hold, and the
    /// writes stay fenced either way.
    fn renew(&mut self) -> BoxFuture<'_, Result<(), SinkError>>;
    /// Marks the claim released, so the next instance need not wait, with the error the
    /// pipeline stopped with (`None`: a clean stop), which `pipeline status` shows.
    fn release(self: Box<Self>, failure: Option<String>) -> BoxFuture<'static, ()>;
}

/// What a sink holds of a pipeline, for telling a first start from lost state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkHistory {
    /// Nothing: the sink is new to the pipeline, or lost its state (a re-created database).
    Empty,
    /// Set up for the pipeline (its snapshot recorded), nothing applied yet.
    Prepared,
    /// Rows were applied: lane checkpoints, or snapshot chunks loaded.
    Applied,
}

/// A configured sink, by job: opening and checking here (claims, tables, lanes), the
/// pipeline's checkpoints and records in its [`CheckpointStore`], and, where the sink can
/// take one, an initial snapshot through its [`SnapshotTarget`].
pub trait SinkConnector: Send + Sync {
    /// The connector's name from the pipeline file.
    fn name(&self) -> &str;

    /// Claims the sink for this process's instance of the pipeline, before anything else is
    /// read or written (see [`crate::checkpoint::fence`]). `Err` of class Fatal when another
    /// live instance holds it (the message names it: process, host, since when). Every write
    /// of the sink fails until the claim succeeded, and fails for good once another instance
    /// took the sink over. `lease`: how old a holder's heartbeat must be before it is taken
    /// over.
    fn claim<'a>(
        &'a self,
        holder: &'a crate::checkpoint::Holder,
        lease: std::time::Duration,
    ) -> BoxFuture<'a, Result<Box<dyn Lease>, SinkError>>;

    /// Connect once and check that the sink is usable: credentials work, Zipline's own
    /// tables exist (created if absent), and every table in `tables` exists with every column
    /// the source has. Called before the source touches its slot, and again when the source
    /// reports a table shape it has not seen. `Ok` means a lane can write these tables.
    fn check_tables<'a>(&'a self, tables: &'a [Arc<Table>])
    -> BoxFuture<'a, Result<(), SinkError>>;

    /// Open lane `lane` of `lanes`: its own connection, with its checkpoint loaded.
    fn open_lane(
        &self,
        lane: u32,
        lanes: u32,
    ) -> BoxFuture<'_, Result<Box<dyn LaneSink>, SinkError>>;

    /// The source tables (`schema.name`) whose sink table was dropped and created again since
    /// its record was written, and is empty now: the rows applied to it are gone, and those the
    /// source does not change again would never arrive. A sink table rebuilt by an `ALTER`
    /// that kept its rows is not one (its new identity is recorded). Meaningful where sink
    /// tables are named after source tables (routes without a transform).
    fn recreated_tables(&self) -> BoxFuture<'_, Result<Vec<String>, SinkError>>;

    /// The statement, in this sink's SQL, that makes the sink column of `column` of source
    /// table `table` (its new shape) take the new type; `None` when the sink cannot say. For
    /// the message of a stop at a column's type change.
    fn alter_column_sql<'a>(
        &'a self,
        table: &'a Table,
        column: &'a str,
    ) -> BoxFuture<'a, Option<String>>;

    /// The dead letters this sink holds for the pipeline, oldest position first (none when
    /// the dead-letter table does not exist).
    fn dead_letters(&self) -> BoxFuture<'_, Result<Vec<DeadLetterRecord>, SinkError>>;

    /// Where the sink keeps the pipeline's positions and records.
    fn checkpoints(&self) -> &dyn CheckpointStore;

    /// The sink's bulk path for a source's initial snapshot; `None` for a sink that cannot
    /// take one (its sources must run with `snapshot: never`).
    fn snapshot(&self) -> Option<&dyn SnapshotTarget>;
}

/// One lane's writer.
///
/// Contract: `apply` and `truncate` are all-or-nothing. `Ok` means the batch's effects **and**
/// the lane checkpoint (the batch's last position) are durably committed in one sink
/// transaction; only then may the runtime acknowledge those positions upstream. `Err` means
/// nothing of the call is visible; after a transient error the runtime calls `reconnect` and
/// retries the very same batch, which must converge to the same rows (upserts, deletes by key).
pub trait LaneSink: Send {
    /// The last position this lane committed, as loaded when the lane opened (then kept up to
    /// date by `apply`). Changes at or below it are skipped.
    fn checkpoint(&self) -> Option<Position>;

    /// Apply a batch and move the checkpoint to its last position, atomically.
    fn apply<'a>(&'a mut self, batch: &'a Batch) -> BoxFuture<'a, Result<(), SinkError>>;

    /// Remove every row of `table` and move this lane's checkpoint to `position`, atomically.
    fn truncate<'a>(
        &'a mut self,
        table: &'a Table,
        position: Position,
    ) -> BoxFuture<'a, Result<(), SinkError>>;

    /// Drop the current connection and open a new one (after a transient error).
    fn reconnect(&mut self) -> BoxFuture<'_, Result<(), SinkError>>;

    /// The keys of this lane that have dead letters, as loaded when the lane opened: their
    /// later changes are dead-lettered too (see [`ParkedKey`]).
    fn parked(&self) -> Vec<ParkedKey>;

    /// Applies `changes` (dead-lettered changes of one key, in position order) and removes
    /// their dead-letter records `ids`, in one fenced transaction; the lane's checkpoint does
    /// not move (`zipline dlq replay`). `Err` leaves both as they were.
    fn replay<'a>(
        &'a mut self,
        changes: &'a [Change],
        ids: &'a [u64],
    ) -> BoxFuture<'a, Result<(), SinkError>>;
}
