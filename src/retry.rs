//! The one retry policy every connector and lane uses between attempts: exponential backoff
//! from 100 ms, doubling to a 5 s cap, with ±25 % jitter so lanes and connections that failed
//! together do not retry in lockstep. Each caller decides what is worth retrying (transient
//! errors only) and for how long (attempts, or a time budget such as `sink_outage_timeout`),
//! and logs the attempt number with the cause.

use std::time::Duration;

/// Delay before retry number `attempt` (from 1).
pub fn delay(attempt: u32) -> Duration {
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
    fn delay_grows_and_caps() {
        assert!(delay(1) <= Duration::from_millis(125));
        assert!(delay(3) >= Duration::from_millis(300));
        assert!(delay(30) <= Duration::from_millis(6_250));
    }
}
