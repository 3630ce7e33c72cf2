//! Wiring and the run loop: preflight everything, then create the slot, open the lanes, stream,
//! and on shutdown drain: stop reading, let every lane commit what it holds, confirm the
//! durable frontier, exit. Before anything else the process claims the pipeline in every
//! sink ([`instance`]), so a second instance is refused at once.

mod chain;
mod cursor;
pub mod dlq;
mod instance;
pub mod lifecycle;
mod origin;
mod plan;
mod progress;
mod tables;
mod wiring;

use self::chain::Run;
use self::plan::Plan;
use self::plan::SinkPlan;
use self::wiring::sink_plan;

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

use crate::change::Lsn;
use crate::config;
use crate::lane::LaneError;
use crate::sink::{SinkConnector, SinkError};
use crate::source::SourceError;

/// Why a pipeline stopped with an error. Each variant prints its own context; what went
/// wrong underneath is its [`std::error::Error::source`], so a chain printer (`{:#}`,
/// [`crate::error::report`]) says each cause once.
#[derive(Debug)]
pub enum PipelineError {
    /// The pipeline file is inconsistent in a way only the runtime sees.
    Invalid {
        /// Pipeline name.
        pipeline: String,
        /// What is wrong.
        message: String,
    },
    /// The source failed.
    Source {
        /// Source connector name.
        connector: String,
        /// The error; its context is named after the connector once.
        error: Box<SourceError>,
    },
    /// A sink failed before streaming started.
    Sink {
        /// Sink connector name.
        connector: String,
        /// The error; its context is named after the connector once.
        error: SinkError,
    },
    /// A lane failed while streaming; the pipeline halted without acknowledging its batch.
    Lane(LaneError),
    /// The route's transform could not start.
    Transform(crate::transform::TransformError),
    /// The dispatcher halted the pipeline (a route's transform failed).
    Dispatch(crate::runtime::DispatchError),
}

impl std::fmt::Display for PipelineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PipelineError::Invalid { pipeline, message } => {
                write!(f, "pipeline {pipeline}: {message}")
            }
            PipelineError::Source { connector, error } => {
                f.write_str(&named("source", connector, &error.message))
            }
            PipelineError::Sink { connector, error } => {
                f.write_str(&named("sink", connector, &error.message))
            }
            PipelineError::Lane(_) => f.write_str(
                "the pipeline halted; nothing past the last committed batch was acknowledged",
            ),
            PipelineError::Transform(e) => e.fmt(f),
            PipelineError::Dispatch(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for PipelineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PipelineError::Invalid { .. } => None,
            PipelineError::Source { error, .. } => error.source(),
            PipelineError::Sink { error, .. } => error.source(),
            PipelineError::Lane(e) => Some(e),
            PipelineError::Transform(e) => e.source(),
            PipelineError::Dispatch(e) => e.source(),
        }
    }
}

impl From<LaneError> for PipelineError {
    fn from(e: LaneError) -> Self {
        PipelineError::Lane(e)
    }
}

impl From<crate::transform::TransformError> for PipelineError {
    fn from(e: crate::transform::TransformError) -> Self {
        PipelineError::Transform(e)
    }
}

impl From<crate::runtime::DispatchError> for PipelineError {
    fn from(e: crate::runtime::DispatchError) -> Self {
        PipelineError::Dispatch(e)
    }
}

/// How `zipline pipeline apply` was asked to run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The pipeline file as the operator named it, for the commands in messages.
    pub file: String,
    /// `--resnapshot`: drop the slot, empty the sinks' tables and copy every table again.
    pub resnapshot: bool,
    /// `--forget-table`: tables (`schema.name`) the pipeline no longer replicates; their
    /// records are removed before the start's checks.
    pub forget_tables: Vec<String>,
}

/// How one run of the stage chain ended.
enum Ended {
    /// Stopped (cleanly, or with an error the caller returns).
    Stopped,
    /// A table to copy again (`on_table_recreate: resnapshot`) before the next run: the
    /// source stopped at it dropped and created again, or its sink table was created again
    /// empty.
    Recopy { table: String, at: Lsn },
}

/// Run a pipeline until `shutdown` resolves (then drain and return `Ok`) or an error.
pub async fn run(
    pipeline: config::Pipeline,
    options: RunOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), PipelineError> {
    let plan = Plan::new(&pipeline)?;
    let metrics = Arc::new(plan.metrics(&pipeline.name));
    // Listening comes first: an address that cannot be used stops before any database is.
    let _endpoint = match pipeline.settings.metrics {
        Some(addr) => Some(
            crate::metrics::server::MetricsServer::start(addr, Arc::clone(&metrics))
                .await
                .map_err(|e| PipelineError::Invalid {
                    pipeline: pipeline.name.clone(),
                    message: crate::error::report(&e),
                })?,
        ),
        None => None,
    };
    let connectors = plan.connectors();
    // The shutdown signal outlives one run of the stage chain.
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let signal = tokio::spawn(async move {
        shutdown.await;
        let _ = shutdown_tx.send(true);
    });

    // One live instance per pipeline, before the first step that reads or writes anything.
    let mut claims = instance::claim(&connectors, pipeline.settings.instance_lease)
        .await
        .map_err(|(connector, error)| PipelineError::Sink { connector, error })?;
    let mut result = forget(&connectors, &options.forget_tables).await;
    let mut options = options;
    while result.is_ok() {
        let run = Run {
            pipeline: &pipeline,
            options: &options,
            plan: &plan,
            connectors: &connectors,
            metrics: &metrics,
        };
        match run.once(&mut claims, shutdown_rx.clone()).await {
            Ok(Ended::Stopped) => break,
            Ok(Ended::Recopy { table, at }) => {
                result = tables::recopy(&pipeline, &plan, &table, at).await;
                // Starting over once is enough.
                options.resnapshot = false;
            }
            Err(e) => result = Err(e),
        }
    }
    signal.abort();
    let failure = result.as_ref().err().map(|e| crate::error::report(e));
    claims.end(true, failure).await;
    result
}

/// `sink`'s snapshot target, or the error saying it cannot take a snapshot.
fn snapshot_target(
    sink: &Arc<dyn SinkConnector>,
) -> Result<&dyn crate::sink::SnapshotTarget, PipelineError> {
    sink.snapshot().ok_or_else(|| PipelineError::Sink {
        connector: sink.name().to_owned(),
        error: crate::sink::snapshot_unsupported(sink.name()),
    })
}

/// Removes the records of tables the pipeline no longer replicates (`--forget-table`).
async fn forget(sinks: &[Arc<dyn SinkConnector>], tables: &[String]) -> Result<(), PipelineError> {
    for table in tables {
        for sink in sinks {
            sink.checkpoints()
                .forget_table(table)
                .await
                .map_err(|error| PipelineError::Sink {
                    connector: sink.name().to_owned(),
                    error,
                })?;
        }
        tracing::warn!(table = %table, "forgot the table's record: the pipeline no longer replicates it (its sink tables are left as they are)");
    }
    Ok(())
}

/// `kind name: message`, unless the message already starts by naming the connector (as
/// `kind name` or as `name:`).
fn named(kind: &str, connector: &str, message: &str) -> String {
    let prefix = format!("{kind} {connector}");
    if message.starts_with(&prefix) {
        message.to_owned()
    } else if message.starts_with(&format!("{connector}: ")) {
        format!("{kind} {message}")
    } else {
        format!("{prefix}: {message}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Cause, System, report};

    fn refused() -> Cause {
        Cause {
            system: System::MySql,
            code: Some("4025".into()),
            text: "MySQL error 4025 (23000): CONSTRAINT `qty` failed".into(),
            hint: None,
        }
    }

    #[test]
    fn each_link_of_a_stop_is_said_once_with_the_connector_named_once() {
        let mut sink = SinkError::definite("sink out: upserting 1 row into `shop`.`t`");
        sink.cause = Some(Box::new(refused()));
        let lane = PipelineError::Lane(LaneError {
            sink: "out".into(),
            lane: 3,
            source: sink,
        });
        assert_eq!(
            report(&lane),
            "the pipeline halted; nothing past the last committed batch was acknowledged: \
             lane 3: sink out: upserting 1 row into `shop`.`t`: MySQL error 4025 (23000): \
             CONSTRAINT `qty` failed"
        );

        let source = PipelineError::Source {
            connector: "orders-db".into(),
            error: Box::new(
                SourceError::fatal("orders-db: reading the slot").caused_by(Cause {
                    system: System::Postgres,
                    code: Some("42501".into()),
                    text: "PostgreSQL error 42501: permission denied".into(),
                    hint: None,
                }),
            ),
        };
        assert_eq!(
            report(&source),
            "source orders-db: reading the slot: PostgreSQL error 42501: permission denied"
        );
    }
}
