//! `zipline dlq list` and `zipline dlq replay`: the dead letters a pipeline's sinks hold
//! (`on_error: dead_letter`), and applying them again once the sink is fixed.
//!
//! Replay takes the pipeline's claim like `apply` (so it is refused while the pipeline runs:
//! the lanes could write the same keys meanwhile), and replays a key's dead letters together,
//! in position order, in one transaction that also removes them, so a replay is idempotent and
//! never applies a key's later change without its earlier one. A key whose changes the sink
//! still rejects keeps its dead letters, with the new reason reported.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{PipelineError, SinkPlan, instance, sink_plan};
use crate::change::Change;
use crate::config;
use crate::error::ErrorClass;
use crate::sink::{DeadLetterRecord, SinkConnector};
use crate::transform::json::change_from_json;

/// The dead letters of one sink.
#[derive(Debug)]
pub struct SinkDeadLetters {
    /// The sink connector's name.
    pub sink: String,
    /// Its records, oldest position first.
    pub records: Vec<DeadLetterRecord>,
}

/// Which dead letters to replay.
#[derive(Debug, Clone)]
pub enum Selection {
    /// Every one.
    All,
    /// These records, each with the other dead letters of its key (they replay together, in
    /// order).
    Ids(Vec<u64>),
}

/// What a replay did in one sink.
#[derive(Debug, Default)]
pub struct ReplayReport {
    /// The sink connector's name.
    pub sink: String,
    /// Records applied and removed.
    pub replayed: usize,
    /// Records kept because the sink still rejects their key's changes: (record ids, reason).
    pub failed: Vec<(Vec<u64>, String)>,
}

/// Every sink the routes write to, once each, by name.
pub(super) fn sinks(pipeline: &config::Pipeline) -> Result<Vec<SinkPlan>, PipelineError> {
    let mut names: Vec<&str> = pipeline
        .routes
        .iter()
        .flat_map(|r| r.to.iter().map(String::as_str))
        .collect();
    names.sort_unstable();
    names.dedup();
    names.into_iter().map(|n| sink_plan(pipeline, n)).collect()
}

fn sink_error(sink: &SinkPlan, error: crate::sink::SinkError) -> PipelineError {
    PipelineError::Sink {
        connector: sink.connector.name().to_owned(),
        error,
    }
}

/// Every dead letter in every sink of the pipeline (read only; works while it runs).
pub async fn list(pipeline: &config::Pipeline) -> Result<Vec<SinkDeadLetters>, PipelineError> {
    let mut out = Vec::new();
    for sink in sinks(pipeline)? {
        let records = sink
            .connector
            .dead_letters()
            .await
            .map_err(|e| sink_error(&sink, e))?;
        out.push(SinkDeadLetters {
            sink: sink.connector.name().to_owned(),
            records,
        });
    }
    Ok(out)
}

/// Replays the selected dead letters (see the module docs).
pub async fn replay(
    pipeline: &config::Pipeline,
    selection: &Selection,
) -> Result<Vec<ReplayReport>, PipelineError> {
    let plans = sinks(pipeline)?;
    let connectors: Vec<Arc<dyn SinkConnector>> =
        plans.iter().map(|s| Arc::clone(&s.connector)).collect();
    let claims = instance::claim(&connectors, pipeline.settings.instance_lease)
        .await
        .map_err(|(connector, error)| PipelineError::Sink { connector, error })?;
    let mut reports = Vec::new();
    let mut result = Ok(());
    for sink in &plans {
        match replay_sink(sink, selection).await {
            Ok(report) => reports.push(report),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    claims.end(true, None).await;
    result.map(|()| reports)
}

async fn replay_sink(
    sink: &SinkPlan,
    selection: &Selection,
) -> Result<ReplayReport, PipelineError> {
    let connector = &sink.connector;
    let mut report = ReplayReport {
        sink: connector.name().to_owned(),
        ..ReplayReport::default()
    };
    let records = connector
        .dead_letters()
        .await
        .map_err(|e| sink_error(sink, e))?;
    // A key's records replay together, oldest first.
    let mut groups: BTreeMap<(String, String), Vec<&DeadLetterRecord>> = BTreeMap::new();
    for r in &records {
        groups
            .entry((r.table.clone(), r.key.clone()))
            .or_default()
            .push(r);
    }
    let chosen = |group: &[&DeadLetterRecord]| match selection {
        Selection::All => true,
        Selection::Ids(ids) => group.iter().any(|r| ids.contains(&r.id)),
    };
    let mut lane = None;
    for group in groups.values().filter(|g| chosen(g)) {
        let lane = match &mut lane {
            Some(lane) => lane,
            None => lane.insert(
                // Lane 0 of the configured count: no checkpoint is rewritten or moved.
                connector
                    .open_lane(0, sink.lanes)
                    .await
                    .map_err(|e| sink_error(sink, e))?,
            ),
        };
        let mut tables = Vec::new();
        let mut changes: Vec<Change> = Vec::with_capacity(group.len());
        for r in group {
            let change = change_from_json(&r.change, 0, &mut tables).map_err(|e| {
                sink_error(
                    sink,
                    crate::sink::SinkError::fatal(format!(
                        "sink {}: dead letter {} holds no readable change: {e}",
                        connector.name(),
                        r.id
                    )),
                )
            })?;
            changes.push(change);
        }
        let ids: Vec<u64> = group.iter().map(|r| r.id).collect();
        match lane.replay(&changes, &ids).await {
            Ok(()) => {
                report.replayed += ids.len();
                tracing::info!(sink = connector.name(), table = %group[0].table, key = %group[0].key, records = ids.len(), "replayed dead letters");
            }
            Err(e) if e.class == ErrorClass::Definite => {
                tracing::warn!(sink = connector.name(), table = %group[0].table, key = %group[0].key, error = %crate::error::Report(&e), "the sink still rejects these dead letters; kept");
                report.failed.push((ids, e.report()));
            }
            Err(e) => return Err(sink_error(sink, e)),
        }
    }
    Ok(report)
}
