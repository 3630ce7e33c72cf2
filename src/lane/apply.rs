//! Applying one unit of work to a lane's sink, riding out what a retry can fix.
//!
//! - A transient failure (connection lost, deadlock, lock wait timeout, the sink down or
//!   restarting) is retried with capped exponential backoff and jitter, reconnecting first,
//!   for as long as the sink keeps failing within `sink_outage_timeout`; then the pipeline
//!   stops, confirming only what is durable.
//! - A call that gets no answer within `statement_timeout` (a stalled connection: a
//!   partition sends no reset) counts as transient: the call is dropped, which leaves nothing
//!   of its transaction visible, and the connection replaced.
//! - A unique-key conflict with another row can come from lanes applying different keys'
//!   changes in different orders, so it is retried a few times before it counts as a row the
//!   sink rejects for good (see [`crate::sink::SinkErrorKind::UniqueConflict`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::worker::{LaneConfig, LaneStats};
use crate::change::Change;
use crate::error::ErrorClass;
use crate::retry::{Backoff, Budget};
use crate::sink::{Batch, LaneSink, SinkError, SinkErrorKind};

/// Retries of a unique-key conflict before it counts as definite.
const CONFLICT_RETRIES: u32 = 5;

/// One unit of sink work, retried whole.
pub(super) enum Work<'w> {
    Batch(&'w Batch),
    Truncate(&'w Change),
}

/// Whether a unique-key conflict is retried first (only for a lane's own batches: the
/// pieces of a batch being settled have had their chance).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Conflicts {
    Retry,
    Definite,
}

/// Runs `work` until it succeeds, fails for good, or the sink stays unreachable for longer
/// than the outage timeout (see the module docs).
pub(super) async fn apply(
    sink: &mut dyn LaneSink,
    cfg: &LaneConfig,
    stats: &LaneStats,
    work: Work<'_>,
    conflicts: Conflicts,
) -> Result<(), SinkError> {
    let mut conflicts_seen: u32 = 0;
    // Made at the first transient failure: most batches never need one.
    let mut retrying: Option<Backoff> = None;
    loop {
        let call = async {
            match &work {
                Work::Batch(b) => sink.apply(b).await,
                Work::Truncate(c) => sink.truncate(&c.table, c.position).await,
            }
        };
        let result = match tokio::time::timeout(cfg.statement_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(SinkError::transient(format!(
                "sink {}: no answer within {:?} (statement_timeout); the connection is \
                 presumed stalled",
                cfg.sink, cfg.statement_timeout
            ))),
        };
        let err = match result {
            Ok(()) => {
                stats.connected.store(true, Ordering::Relaxed);
                return Ok(());
            }
            Err(e) => e,
        };
        if err.kind == SinkErrorKind::UniqueConflict
            && conflicts == Conflicts::Retry
            && conflicts_seen < CONFLICT_RETRIES
        {
            conflicts_seen += 1;
            stats.errors.count(ErrorClass::Transient);
            stats.retries.fetch_add(1, Ordering::Relaxed);
            tracing::info!(sink = %cfg.sink, attempt = conflicts_seen, error = %crate::error::Report(&err), "unique-key conflict with another row; retrying in case another lane has yet to move that row's value away");
            tokio::time::sleep(Duration::from_millis(100 * u64::from(conflicts_seen))).await;
            continue;
        }
        if err.class != ErrorClass::Transient {
            stats.errors.count(err.class);
            return Err(err);
        }
        stats.connected.store(false, Ordering::Relaxed);
        let backoff = retrying.get_or_insert_with(|| {
            Backoff::new(
                format!(
                    "sink {}: transient sink error; retrying the batch",
                    cfg.sink
                ),
                Budget::For(cfg.outage_timeout),
            )
        });
        if !backoff.wait(&err).await {
            stats.errors.count(ErrorClass::Fatal);
            let message = format!(
                "{} (the sink kept failing for {:.0?}, longer than sink_outage_timeout {:?}, over \
                 {} retries; check that it is up and reachable, then start Zipline again: \
                 it resumes from the last committed batch)",
                err.message,
                backoff.failing_for(),
                cfg.outage_timeout,
                backoff.attempts()
            );
            return Err(SinkError {
                class: ErrorClass::Fatal,
                ..err.reworded(message)
            });
        }
        stats.errors.count(ErrorClass::Transient);
        stats.retries.fetch_add(1, Ordering::Relaxed);
        // A failed reconnect counts as the next attempt's failure.
        match tokio::time::timeout(cfg.statement_timeout, sink.reconnect()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.class != ErrorClass::Transient => {
                stats.errors.count(e.class);
                return Err(e);
            }
            Ok(Err(e)) => {
                tracing::warn!(sink = %cfg.sink, attempt = backoff.attempts(), error = %crate::error::Report(&e), "reconnect failed")
            }
            Err(_) => {
                tracing::warn!(sink = %cfg.sink, attempt = backoff.attempts(), "reconnect got no answer within statement_timeout")
            }
        }
    }
}
