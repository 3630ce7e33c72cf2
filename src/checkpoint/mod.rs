//! Checkpoints committed inside the sink's own transaction.
//!
//! Each lane of each sink keeps one row in the sink database, keyed by (pipeline, connector,
//! lane): the position of the last change the lane committed, and the lane count it was
//! written under. The row is upserted by the same transaction that writes the batch, so "rows
//! written" and "checkpoint moved" are one atomic fact; after a crash a lane resumes right
//! after its row and replays nothing twice that it had committed (and anything replayed anyway
//! converges, because every write is an upsert or a delete by key).
//!
//! When the operator changes the lane count, keys move between lanes, so per-lane positions no
//! longer mean anything for the new lanes. [`restart_position`] decides where every new lane
//! starts: the minimum stored position (every change at or below it was committed by whichever
//! old lane owned its key), or no position at all when some old lane never committed. Replaying
//! from there converges because upserts carry whole rows.
//!
//! Each sink keeps its own SQL next to it (`sink/mysql/checkpoint.rs`,
//! `sink/postgres/checkpoint.rs`); the decisions here are sink-generic. [`fence`] keeps a
//! second instance of a pipeline from writing.

pub(crate) mod fence;
pub mod snapshot;
pub mod tables;

pub use fence::Holder;
pub use snapshot::{SnapshotChunk, SnapshotState};
pub use tables::TableRecord;

use crate::change::Position;

/// Name of the checkpoint table, created in the sink database.
pub(crate) const TABLE: &str = "_zipline_checkpoints";

/// Longest pipeline or connector name the table holds (`VARCHAR(128)`).
pub(crate) const MAX_NAME_CHARS: usize = 128;

/// Identifies one lane's checkpoint row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneKey<'a> {
    pub(crate) pipeline: &'a str,
    pub(crate) connector: &'a str,
    pub(crate) lane: u32,
    pub(crate) lanes: u32,
}

/// One stored checkpoint row of a (pipeline, connector).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) lane: u32,
    pub(crate) lanes: u32,
    pub(crate) position: Position,
}

/// `None` when the stored rows already belong to `lanes` lanes (nothing to do). Otherwise the
/// lane count changed and `Some(start)` is where every new lane must start: the minimum stored
/// position, or `None` (replay everything the source still has) when some lane of an old lane
/// count has no row, i.e. never committed anything.
pub(crate) fn restart_position(rows: &[Stored], lanes: u32) -> Option<Option<Position>> {
    if rows.iter().all(|r| r.lanes == lanes && r.lane < lanes) {
        return None;
    }
    let complete = rows.iter().all(|r| {
        (0..r.lanes).all(|lane| rows.iter().any(|o| o.lanes == r.lanes && o.lane == lane))
    });
    if !complete {
        return Some(None);
    }
    Some(rows.iter().map(|r| r.position).min())
}

/// Where a source without an upstream cursor resumes, from the stored rows of its sink run
/// on `lanes` lanes: the lowest committed position when every lane has a row (every change
/// at or below it is durable, whichever lane owns its key), `None` when some lane has none.
/// Rows of another lane count resolve as [`restart_position`] does, which is where the
/// lanes themselves will restart.
pub(crate) fn durable_frontier(rows: &[Stored], lanes: u32) -> Option<Position> {
    if let Some(start) = restart_position(rows, lanes) {
        return start;
    }
    let complete = (0..lanes).all(|lane| rows.iter().any(|r| r.lane == lane));
    if !complete {
        return None;
    }
    rows.iter().map(|r| r.position).min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::Lsn;

    fn pos(lsn: u64, ordinal: u32) -> Position {
        Position::new(Lsn::from(lsn), ordinal)
    }

    fn row(lane: u32, lanes: u32, p: Position) -> Stored {
        Stored {
            lane,
            lanes,
            position: p,
        }
    }

    #[test]
    fn same_lane_count_needs_nothing() {
        assert_eq!(restart_position(&[], 4), None);
        let rows = [row(0, 2, pos(5, 1)), row(1, 2, pos(3, 9))];
        assert_eq!(restart_position(&rows, 2), None);
        // A lane that never committed has no row; with the same count that is fine.
        assert_eq!(restart_position(&rows[..1], 2), None);
    }

    #[test]
    fn changed_lane_count_restarts_at_the_minimum() {
        let rows = [row(0, 2, pos(5, 1)), row(1, 2, pos(3, 9))];
        assert_eq!(restart_position(&rows, 3), Some(Some(pos(3, 9))));
        assert_eq!(restart_position(&rows, 1), Some(Some(pos(3, 9))));
        // Ordinal breaks ties on the commit LSN.
        let rows = [row(0, 2, pos(3, 2)), row(1, 2, pos(3, 1))];
        assert_eq!(restart_position(&rows, 4), Some(Some(pos(3, 1))));
    }

    #[test]
    fn an_old_lane_without_a_row_means_replay_everything() {
        let rows = [row(0, 3, pos(5, 1)), row(2, 3, pos(7, 1))];
        assert_eq!(restart_position(&rows, 2), Some(None));
    }

    #[test]
    fn durable_frontier_needs_every_lane() {
        let rows = [row(0, 2, pos(5, 1)), row(1, 2, pos(3, 9))];
        assert_eq!(durable_frontier(&rows, 2), Some(pos(3, 9)));
        assert_eq!(
            durable_frontier(&rows[..1], 2),
            None,
            "lane 1 never committed"
        );
        assert_eq!(durable_frontier(&[], 1), None);
        // Another lane count: where the lanes will restart.
        assert_eq!(durable_frontier(&rows, 4), Some(pos(3, 9)));
        let partial = [row(0, 3, pos(5, 1))];
        assert_eq!(durable_frontier(&partial, 2), None);
    }
}
