//! Coalescing for the micro-benchmarks (see `crate::bench`).

use super::SinkError;
use super::coalesce::coalesce;
use crate::change::Change;

/// Coalesces a lane batch as every SQL sink does before building statements; the number of
/// rows to upsert and keys to delete that remain.
pub fn coalesced(changes: &[Change]) -> Result<usize, SinkError> {
    let tables = coalesce(changes, "bench")?;
    Ok(tables
        .iter()
        .map(|t| {
            t.deletes.iter().map(|g| g.keys.len()).sum::<usize>()
                + t.upserts.iter().map(|g| g.rows.len()).sum::<usize>()
        })
        .sum())
}
