//! What components count into: plain atomics the hot paths update once per batch, and the
//! scrape reads (see [`super::Collector`]). Nothing here knows the exposition format.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ErrorClass;

/// Upper bounds of [`Histogram`] buckets for batch sizes, in changes.
pub const BATCH_SIZES: &[f64] = &[1.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0];

/// Upper bounds of [`Histogram`] buckets for durations, in seconds.
pub const SECONDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A histogram of fixed buckets, lock-free: one observation costs a few relaxed atomic
/// additions, so a lane can observe every batch.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One more than `bounds`: the last counts what is above every bound.
    counts: Box<[AtomicU64]>,
    /// The sum of observations, as `f64` bits.
    sum: AtomicU64,
}

/// A histogram as read at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Sum of the observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
    /// `(upper bound, observations in this bucket only)`, the last bound `f64::MAX` (+Inf).
    pub buckets: Vec<(f64, u64)>,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Counts one observation of `value`.
    pub fn observe(&self, value: f64) {
        let bucket = self.bounds.partition_point(|&b| b < value);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        // One writer per histogram in practice (a lane, a route), so this rarely loops.
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }

    /// The counts now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::MAX))
            .zip(self.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .collect();
        HistogramSnapshot {
            sum: f64::from_bits(self.sum.load(Ordering::Relaxed)),
            count: buckets.iter().map(|(_, n)| n).sum(),
            buckets,
        }
    }
}

/// Errors met, by class (see [`ErrorClass`]): each failed attempt counts once, retried or not.
#[derive(Debug, Default)]
pub struct ErrorCounts {
    /// Retried with backoff.
    pub transient: AtomicU64,
    /// Settled by `on_error`.
    pub definite: AtomicU64,
    /// Stopped the pipeline.
    pub fatal: AtomicU64,
}

impl ErrorCounts {
    /// Counts one error of `class`.
    pub fn count(&self, class: ErrorClass) {
        let counter = match class {
            ErrorClass::Transient => &self.transient,
            ErrorClass::Definite => &self.definite,
            ErrorClass::Fatal => &self.fatal,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// `(class label, count)` for each class.
    pub fn by_class(&self) -> [(&'static str, u64); 3] {
        [
            ("transient", self.transient.load(Ordering::Relaxed)),
            ("definite", self.definite.load(Ordering::Relaxed)),
            ("fatal", self.fatal.load(Ordering::Relaxed)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_whose_bound_holds_them() {
        let h = Histogram::new(&[1.0, 10.0]);
        for v in [0.5, 1.0, 3.0, 10.0, 11.0] {
            h.observe(v);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 5);
        assert_eq!(s.sum, 25.5);
        assert_eq!(s.buckets, vec![(1.0, 2), (10.0, 2), (f64::MAX, 1)]);
    }

    #[test]
    fn errors_count_by_class() {
        let e = ErrorCounts::default();
        e.count(ErrorClass::Transient);
        e.count(ErrorClass::Transient);
        e.count(ErrorClass::Fatal);
        assert_eq!(
            e.by_class(),
            [("transient", 2), ("definite", 0), ("fatal", 1)]
        );
    }
}
