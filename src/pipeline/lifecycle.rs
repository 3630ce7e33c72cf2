//! `zipline pipeline status` and `zipline pipeline drop`: what a pipeline owns upstream (its
//! slot and the publication it made) and in its sinks (checkpoints, table records, snapshot
//! state, the instance's claim), read whether or not it runs, and removed when it is
//! dropped. Drop refuses while the pipeline runs: its slot is active, or an instance holds a
//! sink's claim with a fresh heartbeat.

use serde::Serialize;

use super::{PipelineError, dlq};
use crate::config::{self, ConnectorKind};
use crate::sink::{Forgotten, SinkStatus};
use crate::source::{SourceDropped, SourceError, SourceStatus};

/// One sink's part of the status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SinkReport {
    /// The sink connector's name.
    pub name: String,
    /// Whether an instance holds the pipeline here now (a fresh heartbeat, not released).
    pub running: bool,
    /// What the sink holds of the pipeline (`None` when it could not be read: see `error`).
    #[serde(flatten)]
    pub status: Option<SinkStatus>,
    /// Why the sink could not be read.
    pub error: Option<String>,
}

/// One source's part of the status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceReport {
    /// The slot, publication and lag (`None` when they could not be read: see `error`).
    #[serde(flatten)]
    pub status: Option<SourceStatus>,
    /// The source connector's name.
    pub name: String,
    /// Why the source could not be read.
    pub error: Option<String>,
}

/// A pipeline's status (the JSON of `pipeline status --json`; documented in the README).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PipelineStatus {
    /// The pipeline's name.
    pub pipeline: String,
    /// Whether an instance runs it: a source's slot is active or a sink's claim is live.
    pub running: bool,
    /// Each source, in file order.
    pub sources: Vec<SourceReport>,
    /// Each sink, by name.
    pub sinks: Vec<SinkReport>,
    /// The error the last instance stopped with, if it stopped on one (from the sinks'
    /// claims; the most recent).
    pub last_error: Option<String>,
}

impl PipelineStatus {
    /// Why the pipeline counts as running, if it does.
    pub fn running_because(&self) -> Option<String> {
        for s in &self.sources {
            if let Some(st) = s.status.as_ref().filter(|st| st.active) {
                return Some(format!(
                    "source {}: replication slot {} is active (walsender process {})",
                    s.name,
                    st.slot.as_deref().unwrap_or("?"),
                    st.active_pid.unwrap_or_default()
                ));
            }
        }
        self.sinks
            .iter()
            .find(|s| s.running)
            .and_then(|s| {
                s.status
                    .as_ref()
                    .and_then(|st| st.claim.as_ref())
                    .map(|c| (s, c))
            })
            .map(|(s, c)| {
                format!(
                    "sink {}: process {} on host {} holds the pipeline (last heartbeat {:.1}s ago)",
                    s.name, c.pid, c.host, c.heartbeat_age_seconds
                )
            })
    }
}

/// The source connectors the routes read from, in file order.
fn sources(pipeline: &config::Pipeline) -> Vec<&config::Connector> {
    pipeline
        .connectors
        .iter()
        .filter(|c| pipeline.routes.iter().any(|r| r.from == c.name))
        .collect()
}

async fn source_status(connector: &config::Connector) -> Result<SourceStatus, SourceError> {
    match &connector.kind {
        ConnectorKind::PostgresSource(pg) => crate::source::postgres::status(pg).await,
        ConnectorKind::SqlServerSource(_) => Ok(SourceStatus {
            name: connector.name.clone(),
            kind: "sqlserver",
            note: Some(
                "SQL Server keeps no cursor for Zipline: the sinks' lane checkpoints are where \
                 it resumes"
                    .into(),
            ),
            ..SourceStatus::default()
        }),
        _ => Err(SourceError::fatal(format!(
            "{} is not a source connector",
            connector.name
        ))),
    }
}

/// Reads the pipeline's state in every source and sink. A connector that cannot be read is
/// reported with its error; the others are still read.
pub async fn status(pipeline: &config::Pipeline) -> Result<PipelineStatus, PipelineError> {
    let mut out = PipelineStatus {
        pipeline: pipeline.name.clone(),
        running: false,
        sources: Vec::new(),
        sinks: Vec::new(),
        last_error: None,
    };
    for connector in sources(pipeline) {
        let (status, error) = match source_status(connector).await {
            Ok(s) => (Some(s), None),
            Err(e) => (None, Some(crate::error::report(&e))),
        };
        out.sources.push(SourceReport {
            status,
            name: connector.name.clone(),
            error,
        });
    }
    let lease = pipeline.settings.instance_lease.as_secs_f64();
    let mut last_error: Option<(String, String)> = None;
    for sink in dlq::sinks(pipeline)? {
        let name = sink.connector.name().to_owned();
        let (status, error) = match sink.connector.checkpoints().status().await {
            Ok(s) => (Some(s), None),
            Err(e) => (None, Some(crate::error::report(&e))),
        };
        let claim = status.as_ref().and_then(|s| s.claim.as_ref());
        let running =
            claim.is_some_and(|c| c.stopped_at.is_none() && c.heartbeat_age_seconds < lease);
        if let Some(c) = claim
            && let (Some(at), Some(text)) = (&c.stopped_at, &c.last_error)
            && last_error.as_ref().is_none_or(|(t, _)| at > t)
        {
            last_error = Some((at.clone(), text.clone()));
        }
        out.sinks.push(SinkReport {
            name,
            running,
            status,
            error,
        });
    }
    out.last_error = last_error.map(|(at, text)| format!("{at}: {text}"));
    out.running = out.running_because().is_some();
    Ok(out)
}

/// What `drop` removed.
#[derive(Debug, Default)]
pub struct Dropped {
    /// Per source: its name and what was removed upstream.
    pub sources: Vec<(String, SourceDropped)>,
    /// Per sink: its name and what was removed there.
    pub sinks: Vec<(String, Forgotten)>,
}

/// Drops what the pipeline owns: each source's slot and the publication Zipline created,
/// then its records in every sink. Call after [`status`] showed it not running (`drop`
/// checks the slot again itself; a sink's claim is checked by the caller's status).
pub async fn drop(pipeline: &config::Pipeline) -> Result<Dropped, PipelineError> {
    let mut dropped = Dropped::default();
    for connector in sources(pipeline) {
        let removed = match &connector.kind {
            ConnectorKind::PostgresSource(pg) => crate::source::postgres::drop_owned(pg).await,
            _ => Ok(SourceDropped::default()),
        }
        .map_err(|error| PipelineError::Source {
            connector: connector.name.clone(),
            error: Box::new(error),
        })?;
        dropped.sources.push((connector.name.clone(), removed));
    }
    for sink in dlq::sinks(pipeline)? {
        let name = sink.connector.name().to_owned();
        let forgotten = sink
            .connector
            .checkpoints()
            .forget_pipeline()
            .await
            .map_err(|error| PipelineError::Sink {
                connector: name.clone(),
                error,
            })?;
        dropped.sinks.push((name, forgotten));
    }
    Ok(dropped)
}
