//! One lane: take changes from a bounded queue, batch them (maximum size, maximum wait),
//! commit each batch with the lane's checkpoint (retrying what a retry can fix, `apply.rs`;
//! settling rows the sink rejects for good by its `on_error`, `settle.rs`), and report what
//! became durable to the ack tracker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::apply::{Conflicts, Work, apply};
use super::queue::{Empty, LaneReceiver};
use super::settle::{Parked, Settled, count, settle};
use super::tracker::Ack;
use crate::change::{Change, Op};
use crate::config::OnError;
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
    /// Longest one call to the sink may go unanswered before its connection counts as stalled.
    pub statement_timeout: Duration,
    /// How long the sink may keep failing transiently before the lane gives up.
    pub outage_timeout: Duration,
    /// What a change the sink rejects for good does.
    pub on_error: OnError,
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
    /// Changes recorded in the dead-letter table (`on_error: dead_letter`).
    pub dead_lettered: AtomicU64,
    /// Changes the sink rejected and the lane skipped (`on_error: skip`).
    pub skipped_bad: AtomicU64,
}

/// Why a lane stopped.
#[derive(Debug, thiserror::Error)]
#[error("lane {lane}")]
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
    mut queue: LaneReceiver,
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
    let mut parked = Parked::new(sink.parked());
    let mut open = true;
    while open {
        // Wait for the first change of a batch as long as it takes.
        let Some(first) = queue.recv().await else {
            break;
        };
        let deadline = Instant::now() + cfg.max_wait;
        let mut next = Some(first);
        let mut lane_state = LaneState {
            sink: &mut *sink,
            lane,
            ack: &mut ack,
            cfg: &cfg,
            stats: &stats,
            parked: &mut parked,
        };
        loop {
            if let Some(change) = next.take() {
                if lane_state
                    .sink
                    .checkpoint()
                    .is_some_and(|cp| change.position <= cp)
                {
                    stats.skipped.fetch_add(1, Ordering::Relaxed);
                    lane_state.ack.add(change.position.lsn, 1);
                } else if crate::lane::is_toast_move(&change) {
                    // Alone in its batch: the sink moves the stored row (see is_toast_move).
                    lane_state.commit(&mut batch).await.map_err(&fail)?;
                    batch.push(change);
                    lane_state.commit(&mut batch).await.map_err(&fail)?;
                } else if change.op == Op::Truncate {
                    // A truncate is applied on its own, after everything before it in this
                    // lane; the source makes it a barrier across lanes.
                    lane_state.commit(&mut batch).await.map_err(&fail)?;
                    lane_state.truncate(&change).await.map_err(&fail)?;
                } else {
                    batch.push(change);
                }
            }
            if batch.len() >= cfg.batch_size {
                break;
            }
            let taken = match queue.try_recv() {
                Err(Empty::Now) if !batch.is_empty() => queue.recv_until(deadline).await,
                other => other,
            };
            match taken {
                Ok(change) => next = Some(change),
                Err(Empty::Closed) => {
                    open = false;
                    break;
                }
                Err(Empty::Now) => break,
            }
        }
        lane_state.commit(&mut batch).await.map_err(&fail)?;
        if !ack.is_empty() {
            // The tracker lives as long as the pipeline; if it is gone we are shutting down.
            let _ = acks.send(std::mem::take(&mut ack));
        }
    }
    Ok(())
}

/// What committing needs, borrowed for one batch.
struct LaneState<'s> {
    sink: &'s mut dyn LaneSink,
    lane: u32,
    ack: &'s mut Ack,
    cfg: &'s LaneConfig,
    stats: &'s LaneStats,
    parked: &'s mut Parked,
}

impl LaneState<'_> {
    /// Commits `batch` (emptied, its allocation kept), settling rows the sink rejects.
    async fn commit(&mut self, batch: &mut Vec<Arc<Change>>) -> Result<(), SinkError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut b = Batch::new(self.lane, std::mem::take(batch));
        self.parked.divert(&mut b);
        let positions: Vec<_> = b
            .changes
            .iter()
            .chain(b.dead_letters.iter().map(|d| &d.change))
            .map(|c| c.position.lsn)
            .collect();
        let done = match apply(
            self.sink,
            self.cfg,
            self.stats,
            Work::Batch(&b),
            Conflicts::Retry,
        )
        .await
        {
            Ok(()) => Settled {
                applied: b.changes.len() as u64,
                dead_lettered: b.dead_letters.len() as u64,
                ..Settled::default()
            },
            Err(e)
                if e.class == ErrorClass::Definite
                    && (self.cfg.on_error != OnError::Halt || b.changes.len() > 1) =>
            {
                let reuse = Vec::with_capacity(b.changes.len());
                let done = settle(self.sink, self.cfg, self.stats, self.parked, b, e).await?;
                *batch = reuse;
                count(self.stats, &done);
                positions.iter().for_each(|&lsn| self.ack.add(lsn, 1));
                return Ok(());
            }
            Err(e) if e.class == ErrorClass::Definite => {
                let mut one = b;
                let change = one.changes.pop();
                let e = match change {
                    Some(c) => {
                        one.changes.push(c);
                        return settle(self.sink, self.cfg, self.stats, self.parked, one, e)
                            .await
                            .map(|done| {
                                count(self.stats, &done);
                                positions.iter().for_each(|&lsn| self.ack.add(lsn, 1));
                            });
                    }
                    None => e,
                };
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        count(self.stats, &done);
        positions.iter().for_each(|&lsn| self.ack.add(lsn, 1));
        let mut reuse = b.changes;
        reuse.clear();
        *batch = reuse;
        Ok(())
    }

    /// Applies a truncate on its own; the sink removes the table's dead letters with it.
    async fn truncate(&mut self, change: &Arc<Change>) -> Result<(), SinkError> {
        apply(
            self.sink,
            self.cfg,
            self.stats,
            Work::Truncate(change),
            Conflicts::Definite,
        )
        .await?;
        self.parked.forget_table(&change.table.qualified_name());
        self.ack.add(change.position.lsn, 1);
        Ok(())
    }
}
