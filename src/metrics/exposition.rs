//! The exposition: every family of [`super::ALL`] with its series, read from the counters
//! at scrape time and written by `prometheus-client`'s text encoder.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use super::*;
use crate::lane::LaneStats;
use crate::transform::TransformStats;

/// The registered collector: reads every counter at scrape time.
#[derive(Debug)]
pub(super) struct Exposition(pub(super) Arc<PipelineMetrics>);

type Labels = Vec<(&'static str, String)>;

/// One family's series as the collector writes them.
pub(super) enum Series {
    Counters(Vec<(Labels, u64)>),
    Gauges(Vec<(Labels, i64)>),
    Seconds(Vec<(Labels, f64)>),
    Histograms(Vec<(Labels, HistogramSnapshot)>),
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        for (family, series) in self.0.families() {
            let mut out = encoder.encode_descriptor(family.name, family.help, None, family.kind)?;
            match series {
                Series::Counters(all) => {
                    for (labels, v) in all {
                        ConstCounter::new(v).encode(out.encode_family(&labels)?)?;
                    }
                }
                Series::Gauges(all) => {
                    for (labels, v) in all {
                        ConstGauge::new(v).encode(out.encode_family(&labels)?)?;
                    }
                }
                Series::Seconds(all) => {
                    for (labels, v) in all {
                        ConstGauge::new(v).encode(out.encode_family(&labels)?)?;
                    }
                }
                Series::Histograms(all) => {
                    for (labels, h) in all {
                        out.encode_family(&labels)?
                            .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn load(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

impl PipelineMetrics {
    fn labels(&self, more: &[(&'static str, &str)]) -> Labels {
        let mut labels = vec![("pipeline", self.pipeline.clone())];
        labels.extend(more.iter().map(|&(k, v)| (k, v.to_owned())));
        labels
    }

    /// `(labels, value)` per lane of every sink.
    fn per_lane<T>(&self, value: impl Fn(&LaneStats) -> T) -> Vec<(Labels, T)> {
        let mut out = Vec::new();
        for sink in &self.sinks {
            for (lane, stats) in sink.lanes.iter().enumerate() {
                let lane = lane.to_string();
                out.push((
                    self.labels(&[("connector", &sink.name), ("lane", &lane)]),
                    value(stats),
                ));
            }
        }
        out
    }

    /// `(labels, value)` per route with a transform.
    fn per_transform<T>(&self, value: impl Fn(&TransformStats) -> T) -> Vec<(Labels, T)> {
        self.routes
            .iter()
            .filter_map(|r| {
                let t = r.transform.as_ref()?;
                Some((self.labels(&[("route", &r.number)]), value(t)))
            })
            .collect()
    }

    fn of_source<T>(&self, value: T) -> Vec<(Labels, T)> {
        vec![(self.labels(&[("connector", &self.source_name)]), value)]
    }

    /// Every family with its series now, in the order of [`ALL`].
    pub(super) fn families(&self) -> Vec<(Metric, Series)> {
        let s = &self.source;
        let skipped = [
            ("checkpoint", self.per_lane(|l| load(&l.skipped))),
            ("rejected", self.per_lane(|l| load(&l.skipped_bad))),
        ]
        .into_iter()
        .flat_map(|(reason, series)| {
            series.into_iter().map(move |(mut labels, v)| {
                labels.push(("reason", reason.to_owned()));
                (labels, v)
            })
        })
        .collect();
        let errors = self
            .of_source(s.errors.by_class())
            .into_iter()
            .chain(self.per_lane(|l| l.errors.by_class()))
            .flat_map(|(labels, classes)| {
                classes.into_iter().map(move |(class, v)| {
                    let mut labels = labels.clone();
                    labels.push(("class", class.to_owned()));
                    (labels, v)
                })
            })
            .collect();
        // Only a PostgreSQL source reports its server's end of WAL.
        let wal_end = load(&s.wal_end);
        let lag_bytes = if wal_end > 0 {
            self.of_source(wal_end.saturating_sub(load(&s.confirmed)) as i64)
        } else {
            Vec::new()
        };
        let lag_micros = s.lag_micros.load(Ordering::Relaxed).max(0);
        let retained = s.retained_bytes.load(Ordering::Relaxed);
        vec![
            (
                CHANGES_READ,
                Series::Counters(self.of_source(load(&s.received))),
            ),
            (
                CHANGES_TRANSFORMED,
                Series::Counters(self.per_transform(|t| load(&t.changes_in))),
            ),
            (
                CHANGES_DROPPED,
                Series::Counters(self.per_transform(|t| load(&t.dropped))),
            ),
            (
                CHANGES_APPLIED,
                Series::Counters(self.per_lane(|l| load(&l.applied))),
            ),
            (CHANGES_SKIPPED, Series::Counters(skipped)),
            (
                BATCHES_APPLIED,
                Series::Counters(self.per_lane(|l| load(&l.batches))),
            ),
            (
                BATCH_SIZE,
                Series::Histograms(self.per_lane(|l| l.batch_size.snapshot())),
            ),
            (
                APPLY_DURATION,
                Series::Histograms(self.per_lane(|l| l.apply_seconds.snapshot())),
            ),
            (
                RETRIES,
                Series::Counters(self.per_lane(|l| load(&l.retries))),
            ),
            (ERRORS, Series::Counters(errors)),
            (
                LANE_QUEUE_DEPTH,
                Series::Gauges(self.per_lane(|l| l.queue_depth() as i64)),
            ),
            (LAG_BYTES, Series::Gauges(lag_bytes)),
            (
                LAG_SECONDS,
                Series::Seconds(vec![(self.labels(&[]), lag_micros as f64 / 1e6)]),
            ),
            (
                SLOT_RETAINED_BYTES,
                Series::Gauges(if retained >= 0 {
                    self.of_source(retained)
                } else {
                    Vec::new()
                }),
            ),
            (
                SNAPSHOT_ROWS_COPIED,
                Series::Counters(self.of_source(load(&s.snapshot_rows_copied))),
            ),
            (
                SNAPSHOT_ROWS,
                Series::Counters(self.of_source(load(&s.snapshot_rows_total))),
            ),
            (
                TRANSFORM_CALLS,
                Series::Counters(self.per_transform(|t| load(&t.calls))),
            ),
            (
                TRANSFORM_ERRORS,
                Series::Counters(self.per_transform(|t| load(&t.failed))),
            ),
            (
                TRANSFORM_DURATION,
                Series::Histograms(self.per_transform(|t| t.seconds.snapshot())),
            ),
            (
                DEAD_LETTERS,
                Series::Counters(
                    self.per_lane(|l| load(&l.dead_lettered))
                        .into_iter()
                        .chain(self.per_transform(|t| load(&t.dead_lettered)))
                        .collect(),
                ),
            ),
            (
                READY,
                Series::Gauges(vec![(
                    self.labels(&[]),
                    i64::from(self.readiness().is_ok()),
                )]),
            ),
        ]
    }
}

/// The registry's text exposition (OpenMetrics text, which Prometheus scrapes).
pub fn render(registry: &Registry) -> Result<String, fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}
