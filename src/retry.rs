//! The one retry policy every connector and lane uses between attempts: exponential backoff
//! from 100 ms, doubling to a 5 s cap, with ±25 % jitter so lanes and connections that failed
//! together do not retry in lockstep. Each loop decides what is worth retrying (transient
//! errors only) and gives [`Backoff`] its budget (a number of retries, or a time such as
//! `sink_outage_timeout`); every retry is logged once with what is retried, the attempt
//! number, the delay and the cause.

use std::time::Duration;

use tokio::time::Instant;

/// Delay before retry number `attempt` (from 1).
pub fn delay(attempt: u32) -> Duration {
    let base = 100u64
        .saturating_mul(1 << attempt.min(6).saturating_sub(1))
        .min(5_000);
    let jitter = rand::random_range(0.75..1.25);
    Duration::from_millis((base as f64 * jitter) as u64)
}

/// How long a retrying loop keeps at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// At most this many retries.
    Retries(u32),
    /// Retries for this long after the first failure.
    For(Duration),
}

/// One retrying loop's state: after each transient failure, [`Backoff::wait`] says whether to
/// go on and waits the policy's delay.
#[derive(Debug, Clone)]
pub struct Backoff {
    what: String,
    budget: Budget,
    attempt: u32,
    since: Option<Instant>,
}

impl Backoff {
    /// A loop within `budget`; `what` is the log line of each retry, saying what failed and
    /// what happens next (e.g. `orders-db: replication stream lost; reconnecting`).
    pub fn new(what: impl Into<String>, budget: Budget) -> Self {
        Backoff {
            what: what.into(),
            budget,
            attempt: 0,
            since: None,
        }
    }

    /// After a transient failure (`cause`): `false` when the budget is spent (give up with
    /// it); otherwise logs the retry and waits before it.
    pub async fn wait(&mut self, cause: &(dyn std::error::Error + Sync)) -> bool {
        let since = *self.since.get_or_insert_with(Instant::now);
        let spent = match self.budget {
            Budget::Retries(n) => self.attempt >= n,
            Budget::For(d) => since.elapsed() >= d,
        };
        if spent {
            return false;
        }
        self.attempt += 1;
        let delay = delay(self.attempt);
        tracing::warn!(attempt = self.attempt, delay_ms = delay.as_millis() as u64, failing_for_s = since.elapsed().as_secs(), error = %crate::error::Report(cause), "{}", self.what);
        tokio::time::sleep(delay).await;
        true
    }

    /// Retries so far.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// How long it has been failing (zero before the first failure).
    pub fn failing_for(&self) -> Duration {
        self.since.map_or(Duration::ZERO, |s| s.elapsed())
    }

    /// Progress was made: the next failure starts a fresh count.
    pub fn reset(&mut self) {
        self.attempt = 0;
        self.since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_grows_and_caps() {
        assert!(delay(1) <= Duration::from_millis(125));
        assert!(delay(3) >= Duration::from_millis(300));
        assert!(delay(30) <= Duration::from_millis(6_250));
    }

    fn err() -> Box<dyn std::error::Error + Send + Sync> {
        "e".into()
    }

    #[tokio::test(start_paused = true)]
    async fn budgets_count_retries_or_time() {
        let mut retries = Backoff::new("x", Budget::Retries(2));
        assert!(retries.wait(&*err()).await);
        assert!(retries.wait(&*err()).await);
        assert!(!retries.wait(&*err()).await, "two retries, then give up");
        assert_eq!(retries.attempts(), 2);
        retries.reset();
        assert!(retries.wait(&*err()).await, "a reset starts a fresh count");

        let mut timed = Backoff::new("y", Budget::For(Duration::from_secs(1)));
        let mut n = 0;
        while timed.wait(&*err()).await {
            n += 1;
        }
        assert!(
            n >= 3 && timed.failing_for() >= Duration::from_secs(1),
            "{n}"
        );
    }
}
