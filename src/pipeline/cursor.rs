//! For a source that keeps no cursor upstream (SQL Server, [`Upstream::NoCursor`]): the
//! sinks' checkpoints are the cursor. At start, the lowest position every lane of every sink
//! has committed is where the source resumes; while running, the durable frontier is recorded
//! into every sink's lanes that are behind it (an idle lane's row would otherwise hold the
//! restart point back until the change tables' retention has passed it).
//!
//! [`Upstream::NoCursor`]: crate::source::Upstream::NoCursor

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::PipelineError;
use super::plan::Plan;
use crate::change::Position;
use crate::error::ErrorClass;
use crate::retry::{Backoff, Budget};
use crate::source::Frontier;

/// Record the frontier in the sinks at most this often while running.
const RECORD_EVERY: Duration = Duration::from_secs(2);
/// Further attempts at reading a sink's checkpoints at start.
const READ_RETRIES: u32 = 5;

/// A frontier recorded as a position: the whole transaction committed at its LSN.
fn whole(frontier: Frontier) -> Position {
    Position::new(frontier.lsn, u32::MAX)
}

/// The lowest position every lane of every sink has committed; `None` when some lane has
/// none.
pub(super) async fn resume(plan: &Plan) -> Result<Option<Position>, PipelineError> {
    let mut lowest: Option<Position> = None;
    for sink in &plan.sinks {
        let mut backoff = Backoff::new(
            format!(
                "sink {}: cannot read the checkpoints yet; retrying",
                sink.connector.name()
            ),
            Budget::Retries(READ_RETRIES),
        );
        let frontier = loop {
            match sink
                .connector
                .checkpoints()
                .durable_frontier(sink.lanes)
                .await
            {
                Ok(f) => break f,
                Err(e) if e.class == ErrorClass::Transient && backoff.wait(&e).await => {}
                Err(error) => {
                    return Err(PipelineError::Sink {
                        connector: sink.connector.name().to_owned(),
                        error,
                    });
                }
            }
        };
        match frontier {
            None => return Ok(None),
            Some(f) => lowest = Some(lowest.map_or(f, |l| l.min(f))),
        }
    }
    Ok(lowest)
}

/// Records the frontier into the plan's sinks when it moves (every [`RECORD_EVERY`] at most),
/// and once more when the runtime ends. A failure only delays the record.
pub(super) fn keep(plan: &Plan, mut frontier: watch::Receiver<Frontier>) -> JoinHandle<()> {
    let sinks: Vec<_> = plan
        .sinks
        .iter()
        .map(|s| (Arc::clone(&s.connector), s.lanes))
        .collect();
    tokio::spawn(async move {
        let mut recorded = frontier.borrow_and_update().lsn;
        loop {
            let ended = frontier.changed().await.is_err();
            if !ended {
                tokio::time::sleep(RECORD_EVERY).await;
            }
            let now = *frontier.borrow_and_update();
            if now.lsn > recorded {
                let mut all = true;
                for (sink, lanes) in &sinks {
                    if let Err(e) = sink
                        .checkpoints()
                        .advance_frontier(*lanes, whole(now))
                        .await
                    {
                        all = false;
                        tracing::warn!(sink = %sink.name(), frontier = %now.lsn, error = %crate::error::Report(&e), "cannot record the durable frontier in the sink yet");
                    }
                }
                if all {
                    tracing::debug!(frontier = %now.lsn, "recorded the durable frontier in the sinks");
                    recorded = now.lsn;
                }
            }
            if ended {
                return;
            }
        }
    })
}
