//! What a sink keeps of the pipeline next to its rows: each lane's checkpoint, the table
//! records, and from them its history. Each sink keeps its SQL in its own folder
//! (`sink/mysql/checkpoint.rs`, `tables.rs`; likewise for PostgreSQL); the decisions shared by
//! both live in [`crate::checkpoint`].

use super::{BoxFuture, Lifecycle, SinkError, SinkHistory};
use crate::change::Position;
use crate::checkpoint::TableRecord;

/// The pipeline's positions and records in one sink. Every write is fenced (see
/// [`crate::checkpoint::fence`]): it fails once another instance took the sink over. Its
/// [`Lifecycle`] half reads and removes the same records for `pipeline status` and `drop`.
pub trait CheckpointStore: Lifecycle + Send + Sync {
    /// For a source that keeps no cursor upstream (SQL Server): the lowest position that
    /// every one of `lanes` lanes has committed, i.e. where the source resumes (lanes skip
    /// what their own checkpoints cover). `None` when unknown: nothing committed yet, or some
    /// lane never committed.
    fn durable_frontier(&self, lanes: u32) -> BoxFuture<'_, Result<Option<Position>, SinkError>>;

    /// Everything at or below `frontier` is durable in every sink: raise each of the `lanes`
    /// lane checkpoints that is lower to `frontier` (never lower one), so lanes that receive
    /// nothing do not hold [`CheckpointStore::durable_frontier`] back.
    fn advance_frontier(
        &self,
        lanes: u32,
        frontier: Position,
    ) -> BoxFuture<'_, Result<(), SinkError>>;

    /// What the sink holds of the pipeline (see [`SinkHistory`]); reads only.
    fn history(&self) -> BoxFuture<'_, Result<SinkHistory, SinkError>>;

    /// Forgets the pipeline's lane checkpoints and table records, before a new slot and a
    /// whole new snapshot: positions of the old slot mean nothing for the new one's changes.
    fn reset_checkpoints(&self) -> BoxFuture<'_, Result<(), SinkError>>;

    /// The source tables the pipeline applied into this sink, as last recorded (see
    /// [`crate::checkpoint::tables`]).
    fn table_records(&self) -> BoxFuture<'_, Result<Vec<TableRecord>, SinkError>>;

    /// Records a source table's shape once its first change of that shape is durable (a
    /// record older than the stored one is ignored).
    fn record_table<'a>(&'a self, record: &'a TableRecord) -> BoxFuture<'a, Result<(), SinkError>>;

    /// Forgets the record of `table` (`schema.name`): the pipeline no longer replicates it.
    fn forget_table<'a>(&'a self, table: &'a str) -> BoxFuture<'a, Result<(), SinkError>>;
}
