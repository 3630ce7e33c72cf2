//! One lane: take changes from a bounded queue, batch them (maximum size, maximum wait),
//! commit each batch with the lane's checkpoint (retrying what a retry can fix, `apply.rs`;
//! settling rows the sink rejects for good by its `on_error`, `settle.rs`), and report what
//! became durable to the ack tracker.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::apply::{Conflicts, Work, apply};
use super::queue::{Empty, LaneReceiver, QueueDepth, Queued};
use super::settle::{Parked, Settled, count, counted, settle};
use super::tracker::Ack;
use crate::change::{Change, Op, Position};
use crate::config::OnError;
use crate::error::ErrorClass;
use crate::metrics::{BATCH_SIZES, ErrorCounts, Histogram, SECONDS};
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

/// What a lane counts, for the progress line and the metrics. Updated once per batch.
#[derive(Debug)]
pub struct LaneStats {
    /// Changes committed in the sink, each source change once (the delete half of a key
    /// move to another lane does not count; see [`super::plan`]).
    pub applied: AtomicU64,
    /// Changes skipped because the checkpoint already covered them.
    pub skipped: AtomicU64,
    /// Transient failures retried.
    pub retries: AtomicU64,
    /// Changes recorded in the dead-letter table (`on_error: dead_letter`).
    pub dead_lettered: AtomicU64,
    /// Changes the sink rejected and the lane skipped (`on_error: skip`).
    pub skipped_bad: AtomicU64,
    /// Batches committed.
    pub batches: AtomicU64,
    /// Changes per committed batch (dead letters included).
    pub batch_size: Histogram,
    /// Seconds from a batch's first attempt to its commit, retries included.
    pub apply_seconds: Histogram,
    /// Failed attempts, by class.
    pub errors: ErrorCounts,
    /// Whether the lane is up with a working sink connection: set when it starts and by
    /// every successful write, cleared by a failed attempt and when it ends.
    pub connected: AtomicBool,
    /// The lane's queue, once one is made for it.
    queue: Mutex<Option<QueueDepth>>,
}

impl Default for LaneStats {
    fn default() -> Self {
        LaneStats {
            applied: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            skipped_bad: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            batch_size: Histogram::new(BATCH_SIZES),
            apply_seconds: Histogram::new(SECONDS),
            errors: ErrorCounts::default(),
            connected: AtomicBool::new(false),
            queue: Mutex::new(None),
        }
    }
}

impl LaneStats {
    /// Reports the depth of `queue` from now on (each run of the pipeline makes new queues).
    pub fn watch_queue(&self, queue: QueueDepth) {
        *self
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(queue);
    }

    /// Changes waiting in the lane's queue (0 before it has one).
    pub fn queue_depth(&self) -> usize {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map_or(0, QueueDepth::get)
    }
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
    let mut batch: Vec<Change> = Vec::with_capacity(cfg.batch_size);
    let mut uncounted: Vec<Position> = Vec::new();
    let mut ack = Ack::default();
    let mut parked = Parked::new(sink.parked());
    let _up = Up::new(Arc::clone(&stats));
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
            uncounted: &mut uncounted,
        };
        loop {
            if let Some(Queued { change, counts }) = next.take() {
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
                    if !counts {
                        lane_state.uncounted.push(change.position);
                    }
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

/// Marks a lane connected while it runs; cleared however it ends (an abort drops it).
struct Up(Arc<LaneStats>);

impl Up {
    fn new(stats: Arc<LaneStats>) -> Self {
        stats.connected.store(true, Ordering::Relaxed);
        Up(stats)
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        self.0.connected.store(false, Ordering::Relaxed);
    }
}

/// What committing needs, borrowed for one batch.
struct LaneState<'s> {
    sink: &'s mut dyn LaneSink,
    lane: u32,
    ack: &'s mut Ack,
    cfg: &'s LaneConfig,
    stats: &'s LaneStats,
    parked: &'s mut Parked,
    /// Positions of the changes taken since the last commit that do not count as applied.
    uncounted: &'s mut Vec<Position>,
}

impl LaneState<'_> {
    /// Commits `batch` (emptied, its allocation kept), settling rows the sink rejects.
    async fn commit(&mut self, batch: &mut Vec<Change>) -> Result<(), SinkError> {
        if batch.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let mut b = Batch::new(self.lane, std::mem::take(batch));
        self.parked.divert(&mut b);
        let positions: Vec<_> = b
            .changes
            .iter()
            .chain(b.dead_letters.iter().map(|d| &d.change))
            .map(|c| c.position.lsn)
            .collect();
        let uncounted = std::mem::take(self.uncounted);
        let done = match apply(
            self.sink,
            self.cfg,
            self.stats,
            Work::Batch(&b),
            Conflicts::Retry,
        )
        .await
        {
            Ok(()) => {
                let done = Settled {
                    applied: counted(&b.changes, &uncounted),
                    dead_lettered: b.dead_letters.len() as u64,
                    ..Settled::default()
                };
                let mut reuse = b.changes;
                reuse.clear();
                *batch = reuse;
                done
            }
            // Nothing to blame when it holds no change: the dead letters themselves cannot
            // be written.
            Err(e) if e.class == ErrorClass::Definite && !b.changes.is_empty() => {
                *batch = Vec::with_capacity(b.changes.len());
                settle(
                    self.sink,
                    self.cfg,
                    self.stats,
                    self.parked,
                    b,
                    e,
                    &uncounted,
                )
                .await?
            }
            Err(e) => return Err(e),
        };
        count(self.stats, &done);
        positions.iter().for_each(|&lsn| self.ack.add(lsn, 1));
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.batch_size.observe(positions.len() as f64);
        self.stats
            .apply_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Applies a truncate on its own; the sink removes the table's dead letters with it.
    async fn truncate(&mut self, change: &Change) -> Result<(), SinkError> {
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
