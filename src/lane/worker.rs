//! One lane: take changes from a bounded queue, batch them (maximum size, maximum wait),
//! commit each batch with the lane's checkpoint, retry transient failures with backoff, and
//! report what became durable to the ack tracker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::tracker::Ack;
use crate::change::{Change, Op};
use crate::error::ErrorClass;
use crate::sink::{Batch, LaneSink, SinkError};

/// How a lane batches and retries.
#[derive(Debug, Clone)]
pub struct LaneConfig {
    /// Sink connector name, for logs and errors.
    pub sink: String,
    /// Most changes in one batch.
    pub batch_size: usize,
    /// Longest a partial batch waits for more changes.
    pub max_wait: Duration,
    /// Transient failures tolerated for one batch before the lane gives up.
    pub max_retries: u32,
}

/// Counters a lane keeps for the progress report.
#[derive(Debug, Default)]
pub struct LaneStats {
    /// Changes committed in the sink.
    pub applied: AtomicU64,
    /// Changes skipped because the checkpoint already covered them.
    pub skipped: AtomicU64,
    /// Transient failures retried.
    pub retries: AtomicU64,
}

/// Why a lane stopped.
#[derive(Debug, thiserror::Error)]
#[error("sink {sink}, lane {lane}: {source}")]
pub struct LaneError {
    /// Sink connector name.
    pub sink: String,
    /// Lane number.
    pub lane: u32,
    /// The sink's error (never transient: those were retried).
    #[source]
    pub source: SinkError,
}

/// Run one lane until its queue closes (graceful drain) or a non-retryable error.
pub async fn run_lane(
    lane: u32,
    mut sink: Box<dyn LaneSink>,
    mut queue: mpsc::Receiver<Arc<Change>>,
    acks: mpsc::UnboundedSender<Ack>,
    cfg: LaneConfig,
    stats: Arc<LaneStats>,
) -> Result<(), LaneError> {
    let fail = |source: SinkError| LaneError {
        sink: cfg.sink.clone(),
        lane,
        source,
    };
    let mut batch: Vec<Arc<Change>> = Vec::with_capacity(cfg.batch_size);
    let mut ack = Ack::default();
    let mut open = true;
    while open {
        // Wait for the first change of a batch as long as it takes.
        let Some(first) = queue.recv().await else {
            break;
        };
        let deadline = Instant::now() + cfg.max_wait;
        let mut next = Some(first);
        loop {
            if let Some(change) = next.take() {
                if sink.checkpoint().is_some_and(|cp| change.position <= cp) {
                    stats.skipped.fetch_add(1, Ordering::Relaxed);
                    ack.add(change.position.lsn, 1);
                } else if crate::lane::is_toast_move(&change) {
                    // Alone in its batch: the sink moves the stored row (see is_toast_move).
                    commit(&mut *sink, lane, &mut batch, &mut ack, &cfg, &stats)
                        .await
                        .map_err(&fail)?;
                    batch.push(change);
                    commit(&mut *sink, lane, &mut batch, &mut ack, &cfg, &stats)
                        .await
                        .map_err(&fail)?;
                } else if change.op == Op::Truncate {
                    // A truncate is applied on its own, after everything before it in this
                    // lane; the source makes it a barrier across lanes.
                    commit(&mut *sink, lane, &mut batch, &mut ack, &cfg, &stats)
                        .await
                        .map_err(&fail)?;
                    apply_with_retry(&mut *sink, &cfg, &stats, Work::Truncate(&change))
                        .await
                        .map_err(&fail)?;
                    ack.add(change.position.lsn, 1);
                } else {
                    batch.push(change);
                }
            }
            if batch.len() >= cfg.batch_size {
                break;
            }
            match queue.try_recv() {
                Ok(change) => next = Some(change),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
                Err(mpsc::error::TryRecvError::Empty) => {
                    if batch.is_empty() {
                        break;
                    }
                    match tokio::time::timeout_at(deadline, queue.recv()).await {
                        Ok(Some(change)) => next = Some(change),
                        Ok(None) => {
                            open = false;
                            break;
                        }
                        Err(_) => break,
                    }
                }
            }
        }
        commit(&mut *sink, lane, &mut batch, &mut ack, &cfg, &stats)
            .await
            .map_err(&fail)?;
        if !ack.is_empty() {
            // The tracker lives as long as the pipeline; if it is gone we are shutting down.
            let _ = acks.send(std::mem::take(&mut ack));
        }
    }
    Ok(())
}

async fn commit(
    sink: &mut dyn LaneSink,
    lane: u32,
    batch: &mut Vec<Arc<Change>>,
    ack: &mut Ack,
    cfg: &LaneConfig,
    stats: &LaneStats,
) -> Result<(), SinkError> {
    if batch.is_empty() {
        return Ok(());
    }
    let b = Batch {
        lane,
        changes: std::mem::take(batch),
    };
    apply_with_retry(sink, cfg, stats, Work::Batch(&b)).await?;
    for c in &b.changes {
        ack.add(c.position.lsn, 1);
    }
    stats
        .applied
        .fetch_add(b.changes.len() as u64, Ordering::Relaxed);
    let mut reuse = b.changes;
    reuse.clear();
    *batch = reuse;
    Ok(())
}

/// One unit of sink work, retried whole.
enum Work<'w> {
    Batch(&'w Batch),
    Truncate(&'w Change),
}

/// Run `work`, retrying transient errors with capped exponential backoff and jitter, and
/// reconnecting before each retry.
async fn apply_with_retry(
    sink: &mut dyn LaneSink,
    cfg: &LaneConfig,
    stats: &LaneStats,
    work: Work<'_>,
) -> Result<(), SinkError> {
    let mut attempt: u32 = 0;
    loop {
        let result = match &work {
            Work::Batch(b) => sink.apply(b).await,
            Work::Truncate(c) => sink.truncate(&c.table, c.position).await,
        };
        let err = match result {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if err.class != ErrorClass::Transient {
            return Err(err);
        }
        attempt += 1;
        if attempt > cfg.max_retries {
            return Err(SinkError::fatal(format!(
                "{} (still failing after {} retries; check that the sink is up and reachable)",
                err.message, cfg.max_retries
            )));
        }
        stats.retries.fetch_add(1, Ordering::Relaxed);
        let delay = backoff(attempt);
        tracing::warn!(sink = %cfg.sink, attempt, delay_ms = delay.as_millis() as u64, error = %err, "transient sink error; retrying the batch");
        tokio::time::sleep(delay).await;
        // A failed reconnect counts as the next attempt's failure.
        if let Err(e) = sink.reconnect().await {
            if e.class != ErrorClass::Transient {
                return Err(e);
            }
            tracing::warn!(sink = %cfg.sink, error = %e, "reconnect failed");
        }
    }
}

/// Delay before retry number `attempt` (from 1): 100 ms doubling to 5 s, with ±25% jitter so lanes do not retry in lockstep.
pub fn backoff(attempt: u32) -> Duration {
    let base = 100u64
        .saturating_mul(1 << attempt.min(6).saturating_sub(1))
        .min(5_000);
    let jitter = rand::random_range(0.75..1.25);
    Duration::from_millis((base as f64 * jitter) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        assert!(backoff(1) <= Duration::from_millis(125));
        assert!(backoff(3) >= Duration::from_millis(300));
        assert!(backoff(30) <= Duration::from_millis(6_250));
    }
}
