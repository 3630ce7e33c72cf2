//! Where a source's initial snapshot goes: the runtime's [`SnapshotWriter`], which writes each
//! chunk through the sinks' snapshot targets (through the route's transform on the way, where
//! the route has one) and keeps each sink's record of the snapshot.
//!
//! A *target* is one sink fed by the source; targets are numbered in a fixed order for the
//! whole run. The source plans the chunks, reads them, and asks the writer which targets still
//! need which chunk (from their states) and which tables each target takes (its route's).

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;

use super::SourceError;
use crate::change::{Position, Table, Value};
use crate::checkpoint::{SnapshotChunk, SnapshotState};

/// A chunk's rows as the source read them.
#[derive(Debug, Clone, Copy)]
pub enum Rows<'a> {
    /// Decoded values, one `Vec` per row, in the table's column order.
    Decoded(&'a [Vec<Value>]),
    /// The server's `COPY` text output and its number of rows, for targets that parse it
    /// themselves ([`SnapshotWriter::takes_text`]).
    Text(&'a Bytes, u64),
}

/// The runtime's side of a source's snapshot.
///
/// Contract: `load` writes the chunk's rows and marks the chunk loaded in one sink
/// transaction, retrying what a retry can fix; `Ok` means both are durable. `clear` and
/// `begin` forget what the target recorded of an earlier snapshot. Errors name the sink.
pub trait SnapshotWriter: Send + Sync {
    /// Number of targets.
    fn targets(&self) -> usize;
    /// The sink behind `target`, for logs.
    fn name(&self, target: usize) -> &str;
    /// Whether `target` takes rows of `table` (`schema.name`) at all.
    fn wants(&self, target: usize, table: &str) -> bool;
    /// Whether `target` takes chunks as COPY text ([`Rows::Text`]).
    fn takes_text(&self, target: usize) -> bool;
    /// What `target` recorded of the snapshot.
    fn state(&self, target: usize) -> BoxFuture<'_, Result<SnapshotState, SourceError>>;
    /// Empties `target`'s sink tables of `tables` (it holds rows of an earlier slot). `false`
    /// when it cannot: the route's transform decides the sink tables.
    fn clear<'a>(
        &'a self,
        target: usize,
        tables: &'a [Arc<Table>],
    ) -> BoxFuture<'a, Result<bool, SourceError>>;
    /// Records a pending snapshot of `plan` (empty: not planned yet) at `target`, forgetting
    /// any earlier one.
    fn begin<'a>(
        &'a self,
        target: usize,
        plan: &'a [SnapshotChunk],
    ) -> BoxFuture<'a, Result<(), SourceError>>;
    /// Records the snapshot complete at `target`.
    fn finish(&self, target: usize) -> BoxFuture<'_, Result<(), SourceError>>;
    /// Loads one chunk of `table` into `target` (see the contract). `position` is stamped on
    /// the rows as changes, where a transform or a dead letter sees them.
    fn load<'a>(
        &'a self,
        target: usize,
        chunk: &'a SnapshotChunk,
        table: &'a Arc<Table>,
        rows: Rows<'a>,
        position: Position,
    ) -> BoxFuture<'a, Result<(), SourceError>>;
}
