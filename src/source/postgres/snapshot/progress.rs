//! Snapshot progress: per table, rows copied out of the estimate, rate and ETA.
//!
//! Workers count rows and chunks into [`Progress`]; [`report`] shows them. When stderr is a
//! terminal it redraws one progress line there (`\r`, erase to end of line) twice a second;
//! otherwise it logs a structured `snapshot progress` line per table being copied every
//! `progress_interval`. Estimates come from the planner's statistics and are scaled down on a
//! resumed snapshot to the chunks still to copy, so a table may finish above or below 100%.

use std::io::{IsTerminal, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::source::SourceStats;

/// How often the terminal line is redrawn.
const REDRAW_EVERY: Duration = Duration::from_millis(500);
/// Width of the terminal bar, in characters.
const BAR_WIDTH: usize = 24;

/// One table's counters.
#[derive(Debug)]
pub(crate) struct TableProgress {
    /// `schema.name`.
    pub(crate) name: String,
    /// Rows expected in the chunks this run copies.
    pub(crate) estimate: u64,
    /// Chunks this run copies.
    pub(crate) chunks: u32,
    rows: AtomicU64,
    chunks_done: AtomicU32,
    /// Microseconds after [`Progress::started`] when the first chunk started, plus one
    /// (0: not started).
    started_at: AtomicU64,
}

impl TableProgress {
    pub(crate) fn new(name: String, estimate: u64, chunks: u32) -> Self {
        TableProgress {
            name,
            estimate,
            chunks,
            rows: AtomicU64::new(0),
            chunks_done: AtomicU32::new(0),
            started_at: AtomicU64::new(0),
        }
    }

    pub(crate) fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    fn done(&self) -> bool {
        self.chunks_done.load(Ordering::Relaxed) >= self.chunks
    }
}

/// Counters for a whole snapshot run.
#[derive(Debug)]
pub(crate) struct Progress {
    pub(crate) tables: Vec<TableProgress>,
    started: Instant,
    /// The source's counters, which add up every snapshot's rows for the metrics.
    stats: Option<Arc<SourceStats>>,
}

impl Progress {
    pub(crate) fn new(tables: Vec<TableProgress>) -> Self {
        Progress {
            tables,
            started: Instant::now(),
            stats: None,
        }
    }

    /// Also counts rows (the estimate now, rows copied as chunks load) into `stats`.
    pub(crate) fn counting_into(mut self, stats: Option<Arc<SourceStats>>) -> Self {
        if let Some(stats) = &stats {
            let estimate = self.tables.iter().map(|t| t.estimate).sum();
            stats
                .snapshot_rows_total
                .fetch_add(estimate, Ordering::Relaxed);
        }
        self.stats = stats;
        self
    }

    /// A worker starts copying a chunk of table `t`.
    pub(crate) fn chunk_started(&self, t: usize) {
        let at = self.started.elapsed().as_micros() as u64 + 1;
        let _ =
            self.tables[t]
                .started_at
                .compare_exchange(0, at, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// A chunk of table `t` holding `rows` rows is in every sink; true when it was the
    /// table's last.
    pub(crate) fn chunk_done(&self, t: usize, rows: u64) -> bool {
        let table = &self.tables[t];
        table.rows.fetch_add(rows, Ordering::Relaxed);
        if let Some(stats) = &self.stats {
            stats
                .snapshot_rows_copied
                .fetch_add(rows, Ordering::Relaxed);
        }
        table.chunks_done.fetch_add(1, Ordering::Relaxed) + 1 == table.chunks
    }

    /// Rows copied so far, all tables.
    pub(crate) fn total_rows(&self) -> u64 {
        self.tables.iter().map(TableProgress::rows).sum()
    }

    /// Time since the run started.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Seconds table `t` has been copying (0 before its first chunk).
    pub(crate) fn table_seconds(&self, t: usize) -> f64 {
        match self.tables[t].started_at.load(Ordering::Relaxed) {
            0 => 0.0,
            at => (self.started.elapsed().as_micros() as f64 - (at - 1) as f64) / 1e6,
        }
    }
}

/// Shows progress until dropped (aborted): a terminal line or periodic log lines.
pub(crate) async fn report(progress: Arc<Progress>, log_every: Duration) {
    let tty = std::io::stderr().is_terminal();
    let mut ticker = tokio::time::interval(if tty { REDRAW_EVERY } else { log_every });
    ticker.tick().await;
    loop {
        ticker.tick().await;
        if tty {
            let line = terminal_line(&progress);
            let mut err = std::io::stderr().lock();
            // Ends in \r: a log line written meanwhile overwrites the bar instead of
            // continuing after it.
            let _ = write!(err, "\r\x1b[K{line}\r");
            let _ = err.flush();
        } else {
            log_lines(&progress);
        }
    }
}

/// Erases the terminal line [`report`] draws (call once it is aborted).
pub(crate) fn clear_terminal_line() {
    if std::io::stderr().is_terminal() {
        let _ = write!(std::io::stderr().lock(), "\r\x1b[K");
    }
}

fn log_lines(progress: &Progress) {
    for (t, table) in progress.tables.iter().enumerate() {
        let seconds = progress.table_seconds(t);
        if seconds == 0.0 || table.done() {
            continue;
        }
        let rows = table.rows();
        let rate = rows as f64 / seconds.max(1e-3);
        tracing::info!(
            table = %table.name,
            rows,
            estimate = table.estimate,
            percent = percent(rows, table.estimate),
            rows_per_sec = rate.round() as u64,
            eta_s = eta(rows, table.estimate, rate).map(|d| d.as_secs()),
            chunks_done = table.chunks_done.load(Ordering::Relaxed),
            chunks = table.chunks,
            "snapshot progress"
        );
    }
}

fn terminal_line(progress: &Progress) -> String {
    let rows = progress.total_rows();
    let estimate: u64 = progress.tables.iter().map(|t| t.estimate).sum();
    let rate = rows as f64 / progress.elapsed().as_secs_f64().max(1e-3);
    let mut line = format!(
        "snapshot {} {:>3}% {rows}/{estimate} rows {:.0} rows/s ETA {}",
        bar(rows, estimate),
        percent(rows, estimate),
        rate,
        eta(rows, estimate, rate).map_or_else(|| "?".to_owned(), clock)
    );
    for (t, table) in progress.tables.iter().enumerate() {
        if progress.table_seconds(t) > 0.0 && !table.done() {
            line.push_str(&format!(
                " | {} {}%",
                table.name,
                percent(table.rows(), table.estimate)
            ));
        }
    }
    line
}

fn percent(done: u64, estimate: u64) -> u64 {
    if estimate == 0 {
        return 100;
    }
    done.saturating_mul(100) / estimate
}

fn bar(done: u64, estimate: u64) -> String {
    let filled = if estimate == 0 {
        BAR_WIDTH
    } else {
        ((done.min(estimate) as f64 / estimate as f64) * BAR_WIDTH as f64) as usize
    };
    format!("[{}{}]", "#".repeat(filled), ".".repeat(BAR_WIDTH - filled))
}

/// Time left at `rate` rows per second; `None` before anything was copied.
fn eta(done: u64, estimate: u64, rate: f64) -> Option<Duration> {
    if rate <= 0.0 {
        return None;
    }
    Some(Duration::from_secs_f64(
        estimate.saturating_sub(done) as f64 / rate,
    ))
}

/// `1:02:03` or `2:03`.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_bar_percent_eta() {
        assert_eq!(percent(50, 200), 25);
        assert_eq!(percent(5, 0), 100);
        assert_eq!(percent(300, 200), 150);
        assert_eq!(bar(0, 10), format!("[{}]", ".".repeat(BAR_WIDTH)));
        assert_eq!(bar(20, 10), format!("[{}]", "#".repeat(BAR_WIDTH)));
        assert_eq!(bar(5, 10).matches('#').count(), BAR_WIDTH / 2);
        assert_eq!(eta(50, 150, 10.0), Some(Duration::from_secs(10)));
        assert_eq!(eta(0, 150, 0.0), None);
        assert_eq!(clock(Duration::from_secs(62)), "1:02");
        assert_eq!(clock(Duration::from_secs(3723)), "1:02:03");
    }

    #[tokio::test]
    async fn counts_chunks_and_rows_per_table() {
        let progress = Progress::new(vec![
            TableProgress::new("public.a".into(), 100, 2),
            TableProgress::new("public.b".into(), 10, 1),
        ]);
        assert_eq!(progress.table_seconds(0), 0.0);
        progress.chunk_started(0);
        assert!(!progress.chunk_done(0, 60));
        assert!(progress.chunk_done(0, 45));
        assert!(progress.tables[0].done());
        assert!(!progress.tables[1].done());
        assert_eq!(progress.total_rows(), 105);
        let line = terminal_line(&progress);
        assert!(line.starts_with("snapshot ["), "{line}");
        assert!(line.contains("95% 105/110 rows"), "{line}");
    }
}
