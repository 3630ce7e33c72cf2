//! The progress line every `progress_interval`: throughput, what was applied (each source
//! change once per sink) and received, lag, the slot's retained WAL, the confirmed position,
//! retries and rows set aside.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::change::Lsn;
use crate::lane::LaneStats;
use crate::source::SourceStats;

pub(super) async fn report_progress(
    every: Duration,
    source: Arc<SourceStats>,
    lanes: Vec<Arc<LaneStats>>,
) {
    let sum = |field: fn(&LaneStats) -> &AtomicU64| -> u64 {
        lanes.iter().map(|l| field(l).load(Ordering::Relaxed)).sum()
    };
    // The counters outlive a run of the stage chain: the rate counts from here.
    let mut last_applied = sum(|l| &l.applied);
    let mut last = Instant::now();
    let mut ticker = tokio::time::interval(every);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let applied = sum(|l| &l.applied);
        let secs = last.elapsed().as_secs_f64().max(1e-3);
        let rate = (applied - last_applied) as f64 / secs;
        tracing::info!(
            changes_per_sec = rate.round() as u64,
            applied,
            received = source.received.load(Ordering::Relaxed),
            lag_ms = source.lag_micros.load(Ordering::Relaxed) / 1000,
            slot_retained_bytes = source.retained_bytes.load(Ordering::Relaxed),
            confirmed = %Lsn::from(source.confirmed.load(Ordering::Relaxed)),
            retries = sum(|l| &l.retries),
            dead_lettered = sum(|l| &l.dead_lettered),
            skipped_bad = sum(|l| &l.skipped_bad),
            "progress"
        );
        last_applied = applied;
        last = Instant::now();
    }
}
