//! What a sink keeps of a source's initial snapshot, so an interrupted snapshot resumes.
//!
//! A snapshot copies every row of every table in chunks: ranges of the first key column,
//! planned once ([`SnapshotChunk`]). A sink records, next to its lane checkpoints, that a
//! snapshot is pending, the plan, and which chunks it has loaded — each chunk's rows and its
//! "loaded" mark are one transaction ([`SnapshotTarget::load`]), so after a crash
//! the sink says exactly which chunks are still to copy. Once every chunk is loaded the
//! source marks the snapshot complete. See `docs/connectors/postgres-source.md` (Initial
//! snapshot) for how resuming stays consistent with the change stream.

use std::sync::Arc;

use super::{BoxFuture, SinkError};
use crate::change::{Change, Position, Table, Value};
pub use crate::checkpoint::snapshot::{SnapshotChunk, SnapshotState};

/// A sink's bulk path for a source's initial snapshot, and its record of it. Every write is
/// fenced (see [`crate::checkpoint::fence`]).
pub trait SnapshotTarget: Send + Sync {
    /// What this sink has recorded of the pipeline's initial snapshot.
    fn state(&self) -> BoxFuture<'_, Result<SnapshotState, SinkError>>;

    /// Forget any earlier snapshot of this pipeline and record a pending one planned as
    /// `chunks`, none loaded (empty `chunks`: pending, not planned yet). Loaded rows stay.
    fn begin<'a>(&'a self, chunks: &'a [SnapshotChunk]) -> BoxFuture<'a, Result<(), SinkError>>;

    /// Remove every row of the sink tables of `tables`: what an earlier snapshot or stream of
    /// this pipeline left may hold rows the source deleted meanwhile, which no stream carries;
    /// the new snapshot copies it all.
    fn clear<'a>(&'a self, tables: &'a [Arc<Table>]) -> BoxFuture<'a, Result<(), SinkError>>;

    /// Write `changes` — whole-row inserts (`Op::Insert`, no `Value::Unchanged`) of one or
    /// more tables, at most one per key — replacing any row with the same key, and mark
    /// `chunk` loaded, in one transaction: after `Ok` both are durable, after `Err` neither is
    /// visible. May be called concurrently (one call per chunk); the sink uses connections of
    /// its own, not the lanes'.
    fn load<'a>(
        &'a self,
        chunk: &'a SnapshotChunk,
        changes: &'a [Change],
    ) -> BoxFuture<'a, Result<(), SinkError>>;

    /// [`SnapshotTarget::load`] for rows of one table as read from the source (the common
    /// case: no transform), so a sink can write them without building a change per row. The
    /// default builds the changes and calls `load`.
    fn load_rows<'a>(
        &'a self,
        chunk: &'a SnapshotChunk,
        table: &'a Arc<Table>,
        rows: &'a [Vec<Value>],
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        let changes: Vec<Change> = rows
            .iter()
            .map(|values| Change {
                position: Position::default(),
                op: crate::change::Op::Insert,
                table: table.clone(),
                key: table.key.iter().map(|&i| values[i].clone()).collect(),
                old_key: None,
                values: values.clone(),
            })
            .collect();
        Box::pin(async move { self.load(chunk, &changes).await })
    }

    /// Record the snapshot as complete (every chunk loaded).
    fn finish(&self) -> BoxFuture<'_, Result<(), SinkError>>;

    /// The sink's path for rows still in PostgreSQL's `COPY` text format, where it has one.
    fn copy_text(&self) -> Option<&dyn CopyTextTarget> {
        None
    }
}

/// A sink that parses snapshot rows in PostgreSQL's `COPY` text format with PostgreSQL's own
/// input functions, which saves decoding every value into a [`Value`] and printing it again.
pub trait CopyTextTarget: Send + Sync {
    /// [`SnapshotTarget::load_rows`] for rows of `table` in `COPY` text format (one line per
    /// row, columns in `table.columns` order, printed by a session with `DateStyle=ISO`,
    /// `TimeZone=UTC`, `IntervalStyle=postgres`), `rows` of them.
    fn load_text<'a>(
        &'a self,
        chunk: &'a SnapshotChunk,
        table: &'a Arc<Table>,
        text: &'a bytes::Bytes,
        rows: u64,
    ) -> BoxFuture<'a, Result<(), SinkError>>;
}

/// A sink's history of a pipeline from its snapshot marker (a snapshot was started or taken,
/// or `snapshot: never` recorded its start), whether snapshot chunks loaded rows, and whether
/// lanes committed checkpoints.
pub(crate) fn history(marker: bool, loaded_rows: bool, checkpoints: bool) -> super::SinkHistory {
    if checkpoints || loaded_rows {
        super::SinkHistory::Applied
    } else if marker {
        super::SinkHistory::Prepared
    } else {
        super::SinkHistory::Empty
    }
}

/// The error a sink without snapshot support returns.
pub fn unsupported(sink: &str) -> SinkError {
    SinkError::fatal(format!(
        "sink {sink} cannot take an initial snapshot; set `snapshot: never` on the source to \
         stream only changes made from now on"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_print_their_range() {
        let chunk = SnapshotChunk {
            table: "public.orders".into(),
            index: 3,
            column: "id".into(),
            lower: Some("100".into()),
            upper: None,
        };
        assert_eq!(chunk.to_string(), "public.orders chunk 3 (id in [100, +∞))");
        assert_eq!(SnapshotState::default(), SnapshotState::None);
        assert!(unsupported("out").message.contains("snapshot: never"));
    }
}
