//! What a running pipeline exposes to monitoring (`settings.metrics`): every metric's name,
//! type and help in one place, read at scrape time from the counters the stages keep anyway
//! ([`SourceStats`], [`LaneStats`], [`TransformStats`]), so the hot paths pay nothing for
//! being observed; and readiness. [`server`] serves them over HTTP.
//!
//! Names follow Prometheus conventions under `zipline_`; every series has a `pipeline`
//! label, and `connector`, `lane` or `route` where it belongs to one (never a key or a
//! table: label sets stay bounded).

mod counts;
mod exposition;
pub mod server;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

pub use counts::{BATCH_SIZES, ErrorCounts, Histogram, HistogramSnapshot, SECONDS};
pub use exposition::render;

use crate::lane::LaneStats;
use crate::source::{SourceState, SourceStats};
use crate::transform::TransformStats;

/// One metric family: its name as exposed (a counter's samples add `_total`), type and help.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// The family name.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricType,
    /// What it counts.
    pub help: &'static str,
}

const fn metric(name: &'static str, kind: MetricType, help: &'static str) -> Metric {
    Metric { name, kind, help }
}

use MetricType::{Counter, Gauge, Histogram as Hist};

/// Changes the source read (from the slot, or SQL Server's change tables).
pub const CHANGES_READ: Metric =
    metric("zipline_changes_read", Counter, "Changes the source read.");
/// Changes handed to a route's transform.
pub const CHANGES_TRANSFORMED: Metric = metric(
    "zipline_changes_transformed",
    Counter,
    "Changes handed to a route's transform.",
);
/// Changes a route's transform produced nothing for (filtered out, or failed and skipped or
/// dead-lettered).
pub const CHANGES_DROPPED: Metric = metric(
    "zipline_changes_dropped",
    Counter,
    "Changes a route's transform produced nothing for (filtered out, or failed and set aside).",
);
/// Changes committed in a sink, each source change once per sink.
pub const CHANGES_APPLIED: Metric = metric(
    "zipline_changes_applied",
    Counter,
    "Changes committed in the sink by a lane, each source change once.",
);
/// Changes a lane did not apply: `reason="checkpoint"` (already applied before a restart) or
/// `reason="rejected"` (refused by the sink, `on_error: skip`).
pub const CHANGES_SKIPPED: Metric = metric(
    "zipline_changes_skipped",
    Counter,
    "Changes a lane did not apply: already covered by its checkpoint, or rejected under on_error: skip.",
);
/// Batches a lane committed.
pub const BATCHES_APPLIED: Metric = metric(
    "zipline_batches_applied",
    Counter,
    "Batches a lane committed (each with its checkpoint).",
);
/// Changes per committed batch.
pub const BATCH_SIZE: Metric = metric(
    "zipline_batch_size",
    Hist,
    "Changes per committed batch, dead letters included.",
);
/// Seconds from a batch's first attempt to its commit, retries included.
pub const APPLY_DURATION: Metric = metric(
    "zipline_apply_duration_seconds",
    Hist,
    "Seconds from a batch's first attempt to its commit, retries included.",
);
/// Failed sink attempts retried.
pub const RETRIES: Metric = metric(
    "zipline_retries",
    Counter,
    "Failed sink attempts that were retried.",
);
/// Failed attempts by class.
pub const ERRORS: Metric = metric(
    "zipline_errors",
    Counter,
    "Failed attempts by class: transient (retried), definite (settled by on_error), fatal (stopped).",
);
/// Changes waiting in a lane's queue.
pub const LANE_QUEUE_DEPTH: Metric = metric(
    "zipline_lane_queue_depth",
    Gauge,
    "Changes handed to a lane and not yet taken into a batch.",
);
/// The server's WAL end minus the position confirmed to it.
pub const LAG_BYTES: Metric = metric(
    "zipline_lag_bytes",
    Gauge,
    "Bytes of WAL between the server's end (as last reported on the replication stream) and the position Zipline confirmed.",
);
/// Now minus the commit time of the oldest transaction not yet durable in every sink.
pub const LAG_SECONDS: Metric = metric(
    "zipline_lag_seconds",
    Gauge,
    "Seconds since the commit of the oldest source transaction not yet durable in every sink; 0 when caught up.",
);
/// WAL the replication slot retains.
pub const SLOT_RETAINED_BYTES: Metric = metric(
    "zipline_slot_retained_bytes",
    Gauge,
    "Bytes of WAL the replication slot retains on the source server.",
);
/// Rows the initial snapshot copied into the sinks.
pub const SNAPSHOT_ROWS_COPIED: Metric = metric(
    "zipline_snapshot_rows_copied",
    Counter,
    "Rows the initial snapshot loaded into the sinks.",
);
/// Rows the initial snapshot set out to copy.
pub const SNAPSHOT_ROWS: Metric = metric(
    "zipline_snapshot_rows",
    Counter,
    "Rows the initial snapshot set out to copy, by the source's estimate.",
);
/// Calls into a route's transform.
pub const TRANSFORM_CALLS: Metric = metric(
    "zipline_transform_calls",
    Counter,
    "Calls into a route's transform, single-change retries included.",
);
/// Changes a transform failed on.
pub const TRANSFORM_ERRORS: Metric = metric(
    "zipline_transform_errors",
    Counter,
    "Changes a route's transform failed on, whatever on_error then did.",
);
/// Seconds per transform batch.
pub const TRANSFORM_DURATION: Metric = metric(
    "zipline_transform_duration_seconds",
    Hist,
    "Seconds a route's transform took per batch.",
);
/// Changes set aside as dead letters.
pub const DEAD_LETTERS: Metric = metric(
    "zipline_dead_letters",
    Counter,
    "Changes written to a sink's dead-letter table, or a transform's dead-letter file.",
);
/// Whether the pipeline is ready (as `/readyz` says).
pub const READY: Metric = metric(
    "zipline_ready",
    Gauge,
    "1 while the source streams and every lane of every sink is connected (as /readyz), else 0.",
);

/// Every metric family, in exposition order.
pub const ALL: &[Metric] = &[
    CHANGES_READ,
    CHANGES_TRANSFORMED,
    CHANGES_DROPPED,
    CHANGES_APPLIED,
    CHANGES_SKIPPED,
    BATCHES_APPLIED,
    BATCH_SIZE,
    APPLY_DURATION,
    RETRIES,
    ERRORS,
    LANE_QUEUE_DEPTH,
    LAG_BYTES,
    LAG_SECONDS,
    SLOT_RETAINED_BYTES,
    SNAPSHOT_ROWS_COPIED,
    SNAPSHOT_ROWS,
    TRANSFORM_CALLS,
    TRANSFORM_ERRORS,
    TRANSFORM_DURATION,
    DEAD_LETTERS,
    READY,
];

/// One sink's lanes.
#[derive(Debug)]
struct SinkLanes {
    name: String,
    lanes: Vec<Arc<LaneStats>>,
}

/// One route, with its transform's counters when it has one.
#[derive(Debug)]
struct RouteCounters {
    /// `1`, `2`, … in file order.
    number: String,
    transform: Option<Arc<TransformStats>>,
}

/// Every counter of one pipeline, made once when it starts and kept across its runs (a
/// table copied again restarts the stage chain, not the counts).
#[derive(Debug)]
pub struct PipelineMetrics {
    pipeline: String,
    source_name: String,
    source: Arc<SourceStats>,
    sinks: Vec<SinkLanes>,
    routes: Vec<RouteCounters>,
}

/// One sink of a pipeline, for [`PipelineMetrics::new`].
#[derive(Debug, Clone)]
pub struct SinkShape {
    /// Connector name.
    pub name: String,
    /// Its lanes.
    pub lanes: u32,
}

impl PipelineMetrics {
    /// Counters for pipeline `pipeline` reading `source` into `sinks`, over routes of which
    /// those in `transformed` (by index) have a transform.
    pub fn new(pipeline: &str, source: &str, sinks: &[SinkShape], transformed: &[bool]) -> Self {
        PipelineMetrics {
            pipeline: pipeline.to_owned(),
            source_name: source.to_owned(),
            source: Arc::new(SourceStats::default()),
            sinks: sinks
                .iter()
                .map(|s| SinkLanes {
                    name: s.name.clone(),
                    lanes: (0..s.lanes).map(|_| Arc::default()).collect(),
                })
                .collect(),
            routes: transformed
                .iter()
                .enumerate()
                .map(|(r, &t)| RouteCounters {
                    number: (r + 1).to_string(),
                    transform: t.then(Arc::default),
                })
                .collect(),
        }
    }

    /// The source's counters.
    pub fn source(&self) -> &Arc<SourceStats> {
        &self.source
    }

    /// Lane `lane` of sink `sink` (indices in the pipeline's order).
    pub fn lane(&self, sink: usize, lane: u32) -> Arc<LaneStats> {
        self.sinks
            .get(sink)
            .and_then(|s| s.lanes.get(lane as usize))
            .cloned()
            .unwrap_or_default()
    }

    /// Every lane of every sink.
    pub fn lanes(&self) -> Vec<Arc<LaneStats>> {
        self.sinks
            .iter()
            .flat_map(|s| s.lanes.iter().cloned())
            .collect()
    }

    /// Route `route`'s transform counters (fresh ones for a route without a transform).
    pub fn transform(&self, route: usize) -> Arc<TransformStats> {
        self.routes
            .get(route)
            .and_then(|r| r.transform.clone())
            .unwrap_or_default()
    }

    /// `Ok` while the source streams and every lane of every sink is connected; otherwise
    /// what is not ready, one line per connector.
    pub fn readiness(&self) -> Result<(), String> {
        let mut not_ready = Vec::new();
        let state = self.source.state();
        if state != SourceState::Streaming {
            not_ready.push(format!("source {}: {}", self.source_name, state.describe()));
        }
        for sink in &self.sinks {
            let down: Vec<String> = sink
                .lanes
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.connected.load(Ordering::Relaxed))
                .map(|(i, _)| i.to_string())
                .collect();
            if !down.is_empty() {
                not_ready.push(format!(
                    "sink {}: {} of {} lanes not connected (lanes {})",
                    sink.name,
                    down.len(),
                    sink.lanes.len(),
                    down.join(", ")
                ));
            }
        }
        if not_ready.is_empty() {
            Ok(())
        } else {
            Err(not_ready.join("\n"))
        }
    }

    /// A registry that exposes these counters.
    pub fn registry(self: &Arc<Self>) -> Registry {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(exposition::Exposition(Arc::clone(self))));
        registry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_a_zipline_name_and_series_with_a_pipeline_label() {
        let m = Arc::new(PipelineMetrics::new(
            "orders",
            "pg",
            &[SinkShape {
                name: "out".into(),
                lanes: 2,
            }],
            &[true],
        ));
        m.lane(0, 1).applied.fetch_add(7, Ordering::Relaxed);
        m.lane(0, 0).batch_size.observe(3.0);
        m.source().wal_end.store(1000, Ordering::Relaxed);
        m.source().confirmed.store(400, Ordering::Relaxed);
        let text = render(&m.registry()).expect("rendered");
        let order: Vec<&str> = m.families().iter().map(|(f, _)| f.name).collect();
        assert_eq!(order, ALL.iter().map(|f| f.name).collect::<Vec<_>>());
        for family in ALL {
            assert!(family.name.starts_with("zipline_"), "{}", family.name);
            assert!(
                text.contains(&format!("# TYPE {} ", family.name)),
                "{} missing from:\n{text}",
                family.name
            );
        }
        assert!(
            text.contains(
                "zipline_changes_applied_total{pipeline=\"orders\",connector=\"out\",lane=\"1\"} 7"
            ),
            "{text}"
        );
        assert!(
            text.contains("zipline_lag_bytes{pipeline=\"orders\",connector=\"pg\"} 600"),
            "{text}"
        );
        assert!(
            text.contains(
                "zipline_batch_size_bucket{le=\"10.0\",pipeline=\"orders\",connector=\"out\",lane=\"0\"} 1"
            ),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn ready_only_while_the_source_streams_and_every_lane_is_connected() {
        let m = PipelineMetrics::new(
            "orders",
            "pg",
            &[SinkShape {
                name: "out".into(),
                lanes: 2,
            }],
            &[false],
        );
        assert_eq!(
            m.readiness(),
            Err("source pg: starting (not streaming yet)\n\
                 sink out: 2 of 2 lanes not connected (lanes 0, 1)"
                .to_owned())
        );
        m.source().set_state(SourceState::Streaming);
        m.lane(0, 0).connected.store(true, Ordering::Relaxed);
        assert_eq!(
            m.readiness(),
            Err("sink out: 1 of 2 lanes not connected (lanes 1)".to_owned())
        );
        m.lane(0, 1).connected.store(true, Ordering::Relaxed);
        assert_eq!(m.readiness(), Ok(()));
        m.source().set_state(SourceState::Reconnecting);
        assert_eq!(
            m.readiness(),
            Err("source pg: replication connection lost; reconnecting".to_owned())
        );
    }
}
