//! Statement building for the micro-benchmarks (see `crate::bench`).

use super::plan::{Bulk, Plan};
use crate::change::Change;
use crate::sink::SinkError;

/// Appends every statement of a lane batch (coalesced first, as the lane does) to `buf`; the
/// number of statements.
pub fn statements(changes: &[Change], buf: &mut String) -> Result<usize, SinkError> {
    let mut plan = Plan::build(changes, "bench", "bench")?;
    let mut n = 0;
    while plan.next_statement(buf)?.is_some() {
        n += 1;
    }
    Ok(n)
}

/// Builds every statement of a lane batch for bulk execution (every group bulk, as with
/// `bulk_min_rows: 1`), the rows' parameters included; the number of statements. The
/// driver's encoding of the parameters is not included.
pub fn bulk_statements(changes: &[Change], buf: &mut String) -> Result<usize, SinkError> {
    let mut plan = Plan::build(changes, "bench", "bench")?;
    let mut bulk = Bulk::new(1);
    let mut n = 0;
    while plan.next_step(buf, Some(&mut bulk))?.is_some() {
        n += 1;
    }
    Ok(n)
}
