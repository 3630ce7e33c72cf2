//! The live phase: a paced writer on the source and a monitor on the sink, measuring for every
//! transaction how long after its commit the whole of it was visible in the sink.
//!
//! Each transaction ends with `UPDATE ticks SET seq = <n>`, touching every row of `ticks`,
//! whose keys are chosen so that each of Zipline's lanes owns one. A lane applies its changes
//! in source order and commits its batches in order, so once every tick row shows `seq ≥ n`,
//! every change of transaction `n` is committed in the sink, whichever lane it went to (for
//! native replication, which applies whole transactions in order, one row would do). The
//! monitor polls `min(seq)` every 2 ms; a transaction's lag is the first poll that saw it minus
//! the moment its `COMMIT` returned to the writer, so it overstates by at most the poll period
//! plus one query.

use std::time::{Duration, Instant};

use tokio::time::MissedTickBehavior;
use tokio_postgres::Client;

use crate::common_backlog::Generator;

const POLL: Duration = Duration::from_millis(2);

/// What one live run measured.
pub struct Live {
    pub txs: usize,
    pub changes: usize,
    /// Seconds the writer took (at least the offered schedule).
    pub write_secs: f64,
    /// Commit-to-visible lag of every transaction, sorted.
    pub lags: Vec<Duration>,
}

impl Live {
    pub fn percentile(&self, p: f64) -> Duration {
        if self.lags.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.lags.len() as f64 * p).ceil() as usize).clamp(1, self.lags.len()) - 1;
        self.lags[i]
    }

    /// One line; `last` is the last transaction's lag (how long after the writer stopped the
    /// sink was complete).
    pub fn summary(&self, last: Duration) -> String {
        format!(
            "{} changes in {} txns over {:.1}s ({:.0} changes/s achieved); lag p50 {:.1} ms, \
             p99 {:.1} ms, max {:.1} ms; after the writer stopped: {:.1} ms",
            self.changes,
            self.txs,
            self.write_secs,
            self.changes as f64 / self.write_secs,
            ms(self.percentile(0.5)),
            ms(self.percentile(0.99)),
            ms(self.lags.last().copied().unwrap_or_default()),
            ms(last)
        )
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Writes `secs × rate` changes (transactions of 100 plus the tick update) on `writer` at
/// `rate` changes/s, tick values `base + 1 …`, while polling `sink`. Returns the measurements
/// and the last transaction's lag.
pub async fn run(
    writer: &Client,
    sink: Client,
    generator: &mut Generator,
    base: i64,
    secs: usize,
    rate: usize,
) -> (Live, Duration) {
    let txs = (secs * rate / 100).max(1);
    let last_seq = base + txs as i64;
    let monitor = tokio::spawn(async move {
        let mut seen: Vec<(i64, Instant)> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(secs as u64 + 300);
        loop {
            let seq: i64 = sink
                .query_one("SELECT min(seq) FROM ticks", &[])
                .await
                .expect("polling ticks")
                .get(0);
            let now = Instant::now();
            if seen.last().is_none_or(|&(s, _)| seq > s) {
                seen.push((seq, now));
            }
            if seq >= last_seq {
                return seen;
            }
            assert!(now < deadline, "the sink never showed tick {last_seq}");
            tokio::time::sleep(POLL).await;
        }
    });
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(100.0 / rate as f64));
    ticker.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut committed = Vec::with_capacity(txs);
    let started = Instant::now();
    for i in 1..=txs as i64 {
        ticker.tick().await;
        let (sql, _) = generator.next_tx(&format!("UPDATE ticks SET seq = {};", base + i));
        writer.batch_execute(&sql).await.expect("live transaction");
        committed.push(Instant::now());
    }
    let write_secs = started.elapsed().as_secs_f64();
    let seen = monitor.await.expect("monitor task");
    let mut lags: Vec<Duration> = committed
        .iter()
        .enumerate()
        .map(|(i, &at)| {
            let seq = base + i as i64 + 1;
            let n = seen.partition_point(|&(s, _)| s < seq);
            seen[n].1.saturating_duration_since(at)
        })
        .collect();
    let last = lags.last().copied().unwrap_or_default();
    lags.sort_unstable();
    (
        Live {
            txs,
            changes: txs * 100,
            write_secs,
            lags,
        },
        last,
    )
}
