//! Statement building for the micro-benchmarks (see `crate::bench`).

use std::sync::Arc;

use super::plan::Plan;
use crate::change::Change;
use crate::sink::SinkError;

/// Appends every statement of a lane batch (coalesced first, as the lane does) to `buf`; the
/// number of statements.
pub fn statements(changes: &[Arc<Change>], buf: &mut String) -> Result<usize, SinkError> {
    let mut plan = Plan::build(changes, "bench", "bench")?;
    let mut n = 0;
    while plan.next_statement(buf)?.is_some() {
        n += 1;
    }
    Ok(n)
}
