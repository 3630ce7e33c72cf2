//! What a sink keeps of a source's initial snapshot, so an interrupted snapshot resumes.
//!
//! A snapshot copies every row of every table in chunks: ranges of the first key column,
//! planned once ([`SnapshotChunk`]). A sink records, next to its lane checkpoints, that a
//! snapshot is pending, the plan, and which chunks it has loaded — each chunk's rows and its
//! "loaded" mark are one transaction
//! ([`SinkConnector::snapshot_load`](super::SinkConnector::snapshot_load)), so after a crash
//! the sink says exactly which chunks are still to copy. Once every chunk is loaded the
//! source marks the snapshot complete. See `docs/connectors/postgres-source.md` (Initial
//! snapshot) for how resuming stays consistent with the change stream.

use super::SinkError;

/// One range of one table's rows: those whose `column` is `>= lower` and `< upper` (`None`:
/// unbounded), the bounds written as the source prints the values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SnapshotChunk {
    /// The source table, `schema.name`.
    pub table: String,
    /// Position of the chunk in its table's plan, from 0 in key order.
    pub index: u32,
    /// The key column the table's chunks range over.
    pub column: String,
    /// Inclusive lower bound; `None` for the first chunk of a table.
    pub lower: Option<String>,
    /// Exclusive upper bound; `None` for the last chunk of a table.
    pub upper: Option<String>,
}

impl std::fmt::Display for SnapshotChunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} chunk {} ({} in [{}, {}))",
            self.table,
            self.index,
            self.column,
            self.lower.as_deref().unwrap_or("-∞"),
            self.upper.as_deref().unwrap_or("+∞")
        )
    }
}

/// What a sink has recorded of the initial snapshot of its pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SnapshotState {
    /// Nothing: no snapshot was ever started into this sink.
    #[default]
    None,
    /// Started and not finished: the planned chunks (empty until the plan is saved), each
    /// with whether this sink has loaded it.
    Pending(Vec<(SnapshotChunk, bool)>),
    /// Every chunk was loaded into every sink.
    Complete,
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
pub(crate) fn unsupported(sink: &str) -> SinkError {
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
