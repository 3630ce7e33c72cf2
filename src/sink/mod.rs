//! Sinks: where changes land.
//!
//! A sink connector ([`SinkConnector`]) opens one [`LaneSink`] per lane; each lane owns its
//! own connection and applies its batches in order. Nothing here assumes the lanes live in one
//! process: a lane needs only its number, the lane count and its own checkpoint row.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::change::{Change, Position, Table};
use crate::error::{Classify, ErrorClass};

pub mod mysql;

/// A boxed, sendable future (keeps the sink traits object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An ordered run of changes for one lane of one sink.
///
/// Changes are in position order and every position is above the lane's checkpoint. For one
/// key, a later change supersedes an earlier one (each insert or update carries the whole row),
/// so a sink may coalesce a batch to the last change per key before writing it.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Lane number, `0..lanes`.
    pub lane: u32,
    /// The changes, in position order. Never empty.
    pub changes: Vec<Arc<Change>>,
}

impl Batch {
    /// The position the lane's checkpoint moves to when this batch commits.
    pub fn last_position(&self) -> Position {
        self.changes.last().map(|c| c.position).unwrap_or_default()
    }
}

/// An error from a sink, classified by what the runtime does next.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct SinkError {
    /// Transient: reconnect and retry the same batch. Definite: that batch's data is bad.
    /// Fatal: stop and tell the operator.
    pub class: ErrorClass,
    /// What went wrong and where (sink, table, column); never contains a secret.
    pub message: String,
}

impl SinkError {
    /// A transient error (retry with backoff).
    pub fn transient(message: impl Into<String>) -> Self {
        SinkError {
            class: ErrorClass::Transient,
            message: message.into(),
        }
    }
    /// A definite error (that data is bad).
    pub fn definite(message: impl Into<String>) -> Self {
        SinkError {
            class: ErrorClass::Definite,
            message: message.into(),
        }
    }
    /// A fatal error (operator action needed).
    pub fn fatal(message: impl Into<String>) -> Self {
        SinkError {
            class: ErrorClass::Fatal,
            message: message.into(),
        }
    }
}

impl Classify for SinkError {
    fn class(&self) -> ErrorClass {
        self.class
    }
}

/// A configured sink: checks the target and opens lanes.
pub trait SinkConnector: Send + Sync {
    /// The connector's name from the pipeline file.
    fn name(&self) -> &str;

    /// Connect once and check that the sink is usable: credentials work, Zipline's checkpoint
    /// table exists (created if absent), and every table in `tables` exists with every column
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
}
