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
pub use crate::checkpoint::snapshot::{SnapshotChunk, SnapshotState};

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
