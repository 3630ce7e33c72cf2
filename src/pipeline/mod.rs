//! Wiring and the run loop: preflight everything, then create the slot, open the lanes, stream,
//! and on shutdown drain: stop reading, let every lane commit what it holds, confirm the
//! durable frontier, exit. Before anything else the process claims the pipeline in every
//! sink ([`instance`]), so a second instance is refused at once.

pub mod dlq;
mod instance;
mod origin;
mod progress;
mod tables;
mod wiring;

use self::progress::report_progress;
use self::wiring::{preflight_source, sink_plan};

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::change::Lsn;
use crate::config::{self, ConnectorKind};
use crate::lane::{self, LaneConfig, LaneError, LaneStats, Router};
use crate::sink::{SinkConnector, SinkError};
use crate::source::{Ledger, Outputs, SourceError, SourceStats, StopMode};

/// Why a pipeline stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The pipeline file is inconsistent in a way only the runtime sees.
    #[error("pipeline {pipeline}: {message}")]
    Invalid {
        /// Pipeline name.
        pipeline: String,
        /// What is wrong.
        message: String,
    },
    /// The source failed.
    #[error("{}", named("source", connector, &error.message))]
    Source {
        /// Source connector name.
        connector: String,
        /// The error (its text is part of this one's).
        error: SourceError,
    },
    /// A sink failed before streaming started.
    #[error("{}", named("sink", connector, &error.message))]
    Sink {
        /// Sink connector name.
        connector: String,
        /// The error (its text is part of this one's).
        error: SinkError,
    },
    /// A lane failed while streaming; the pipeline halted without acknowledging its batch.
    #[error("{0}; the pipeline halted: nothing past the last committed batch was acknowledged")]
    Lane(#[from] LaneError),
    /// The route's transform could not start.
    #[error("{0}")]
    Transform(#[from] crate::transform::TransformError),
}

struct SinkPlan {
    connector: Arc<dyn SinkConnector>,
    lanes: u32,
    queue_capacity: usize,
    lane_cfg: LaneConfig,
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
    let route = match pipeline.routes.as_slice() {
        [route] => route.clone(),
        _ => {
            return Err(PipelineError::Invalid {
                pipeline: pipeline.name.clone(),
                message: format!(
                    "has {} routes; this release runs exactly one route per pipeline (run one pipeline per source)",
                    pipeline.routes.len()
                ),
            });
        }
    };
    let sinks: Vec<SinkPlan> = route
        .to
        .iter()
        .map(|name| sink_plan(&pipeline, name))
        .collect::<Result<_, _>>()?;
    let connectors: Vec<Arc<dyn SinkConnector>> =
        sinks.iter().map(|s| Arc::clone(&s.connector)).collect();
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
            route: &route,
            sinks: &sinks,
            connectors: &connectors,
        };
        match run.once(&mut claims, shutdown_rx.clone()).await {
            Ok(Ended::Stopped) => break,
            Ok(Ended::Recopy { table, at }) => {
                result = tables::recopy(&pipeline, &route, &connectors, &table, at).await;
                // Starting over once is enough.
                options.resnapshot = false;
            }
            Err(e) => result = Err(e),
        }
    }
    signal.abort();
    claims.end(true).await;
    result
}

/// Removes the records of tables the pipeline no longer replicates (`--forget-table`).
async fn forget(sinks: &[Arc<dyn SinkConnector>], tables: &[String]) -> Result<(), PipelineError> {
    for table in tables {
        for sink in sinks {
            sink.forget_table(table)
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

/// One run of the stage chain: preflight, start, lanes, stream, until a stop.
struct Run<'r> {
    pipeline: &'r config::Pipeline,
    options: &'r RunOptions,
    route: &'r config::Route,
    sinks: &'r [SinkPlan],
    connectors: &'r [Arc<dyn SinkConnector>],
}

impl Run<'_> {
    async fn once(
        &self,
        claims: &mut instance::Claims,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<Ended, PipelineError> {
        let Run {
            pipeline,
            options,
            route,
            sinks,
            connectors,
        } = *self;
        let source_err = |error| PipelineError::Source {
            connector: route.from.clone(),
            error,
        };
        // Preflight: nothing is created until every check has passed.
        let mut source = preflight_source(pipeline, &route.from, connectors).await?;
        // A transform may drop, rename or add tables, so what reaches the sinks is known only
        // change by change: their tables are then checked when changes are applied.
        let sink_tables = if route.transform.is_some() {
            &[][..]
        } else {
            source.tables()
        };
        for sink in sinks {
            sink.connector
                .check_tables(sink_tables)
                .await
                .map_err(|error| PipelineError::Sink {
                    connector: sink.connector.name().to_owned(),
                    error,
                })?;
        }
        let (cursor, when_needed) = match pipeline.connector(&route.from).map(|c| &c.kind) {
            Some(ConnectorKind::PostgresSource(pg)) => (
                pg.slot_name.as_str(),
                pg.snapshot == config::PostgresSnapshot::WhenNeeded,
            ),
            _ => ("", false),
        };
        let cx = origin::Context {
            file: &options.file,
            source: &route.from,
            cursor,
            forced: options.resnapshot,
            when_needed,
        };
        let source_tables = source.tables().to_vec();
        origin::establish(
            &cx,
            &mut *source,
            connectors,
            &source_tables,
            route.transform.is_some(),
        )
        .await?;
        let known = tables::known(connectors).await?;
        if route.transform.is_none()
            && let Some((table, at)) =
                tables::emptied(pipeline, route, &options.file, connectors, &known).await?
        {
            return Ok(Ended::Recopy { table, at });
        }
        let transform = match &route.transform {
            None => None,
            Some(spec) => {
                let postgres = matches!(
                    pipeline.connector(&route.from).map(|c| &c.kind),
                    Some(ConnectorKind::PostgresSource(_))
                );
                if !postgres {
                    return Err(PipelineError::Invalid {
                        pipeline: pipeline.name.clone(),
                        message: format!(
                            "route from {}: transforms run on source/postgres routes only in this release",
                            route.from
                        ),
                    });
                }
                Some(crate::transform::RouteTransform::start(&route.from, spec).await?)
            }
        };
        source.prepare().await.map_err(&source_err)?;

        // Lanes.
        let (ack_tx, ack_rx) = mpsc::unbounded_channel();
        let mut lanes_set: JoinSet<Result<(), LaneError>> = JoinSet::new();
        let mut routers = Vec::new();
        let mut lane_stats = Vec::new();
        for sink in sinks {
            let mut senders = Vec::new();
            for lane in 0..sink.lanes {
                let writer = sink
                    .connector
                    .open_lane(lane, sink.lanes)
                    .await
                    .map_err(|error| PipelineError::Sink {
                        connector: sink.connector.name().to_owned(),
                        error,
                    })?;
                tracing::info!(sink = %sink.connector.name(), lane, checkpoint = ?writer.checkpoint().map(|p| p.to_string()), "lane open");
                let (tx, rx) = mpsc::channel(sink.queue_capacity);
                senders.push(tx);
                let stats = Arc::new(LaneStats::default());
                lane_stats.push(stats.clone());
                lanes_set.spawn(lane::run_lane(
                    lane,
                    writer,
                    rx,
                    ack_tx.clone(),
                    sink.lane_cfg.clone(),
                    stats,
                ));
            }
            routers.push(Router::new(senders));
        }
        // Only lanes may hold ack senders: the source's drain ends when the last lane finishes.
        drop(ack_tx);

        let (record, recorder) = tables::recorder(connectors.to_vec());
        let (stop_tx, stop_rx) = watch::channel(StopMode::Run);
        let source_stats = Arc::new(SourceStats::default());
        let mut source_task = tokio::spawn(source.run(
            Outputs {
                routers,
                acks: ack_rx,
                transform,
                ledger: Ledger { known, record },
            },
            stop_rx,
            source_stats.clone(),
        ));
        let reporter = tokio::spawn(report_progress(
            pipeline.settings.progress_interval,
            source_stats,
            lane_stats,
        ));

        let mut first_error: Option<PipelineError> = None;
        let mut stopping = *shutdown.borrow();
        if stopping {
            let _ = stop_tx.send(StopMode::Drain);
        }
        let mut drain_deadline =
            stopping.then(|| tokio::time::Instant::now() + pipeline.settings.drain_timeout);
        let mut claim_lost = false;
        let source_result = loop {
            tokio::select! {
                _ = shutdown.changed(), if !stopping => {
                    tracing::info!(pipeline = %pipeline.name, "shutdown requested; draining");
                    stopping = true;
                    drain_deadline =
                        Some(tokio::time::Instant::now() + pipeline.settings.drain_timeout);
                    let _ = stop_tx.send(StopMode::Drain);
                }
                () = sleep_until(drain_deadline) => {
                    drain_deadline = None;
                    tracing::error!(pipeline = %pipeline.name, drain_timeout = ?pipeline.settings.drain_timeout, "the lanes did not drain within drain_timeout; stopping with only what is durable confirmed");
                    first_error.get_or_insert(PipelineError::Invalid {
                        pipeline: pipeline.name.clone(),
                        message: format!(
                            "the lanes did not commit what they held within drain_timeout ({:?}); \
                             stopped, confirming only what was durable (the next start replays \
                             the rest)",
                            pipeline.settings.drain_timeout
                        ),
                    });
                    let _ = stop_tx.send(StopMode::Abort);
                    lanes_set.abort_all();
                }
                Some(done) = lanes_set.join_next() => {
                    if let Some(err) = lane_failure(done) {
                        tracing::error!(pipeline = %pipeline.name, error = %err, "lane failed; halting the pipeline");
                        first_error.get_or_insert(err);
                        let _ = stop_tx.send(StopMode::Abort);
                    }
                }
                lost = &mut claims.lost, if !claim_lost => {
                    claim_lost = true;
                    // Err: the renewing task ended, which happens only once the run is over.
                    let Ok((connector, error)) = lost else { continue };
                    tracing::error!(pipeline = %pipeline.name, sink = %connector, error = %error, "another instance took over; stopping without writing");
                    first_error.get_or_insert(PipelineError::Sink { connector, error });
                    let _ = stop_tx.send(StopMode::Abort);
                }
                res = &mut source_task => break res,
            }
        };
        // The source has returned and dropped its routers, so the lanes end by themselves.
        while let Some(done) = lanes_set.join_next().await {
            if let Some(err) = lane_failure(done) {
                first_error.get_or_insert(err);
            }
        }
        reporter.abort();
        // Every record the source sent is written before the run ends.
        let _ = recorder.await;
        if let Some(err) = first_error {
            return Err(err);
        }
        match source_result {
            Ok(Ok(())) => {
                tracing::info!(pipeline = %pipeline.name, "stopped cleanly");
                Ok(Ended::Stopped)
            }
            Ok(Err(e)) => {
                match tables::on_source_error(pipeline, route, &options.file, connectors, e).await {
                    tables::Next::Stop(e) => Err(e),
                    tables::Next::Recopy { table, at } => Ok(Ended::Recopy { table, at }),
                }
            }
            Err(join) => Err(source_err(SourceError::fatal(format!(
                "source task failed: {join}"
            )))),
        }
    }
}

/// Resolves at `deadline`, never without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn lane_failure(
    done: Result<Result<(), LaneError>, tokio::task::JoinError>,
) -> Option<PipelineError> {
    match done {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(PipelineError::Lane(e)),
        Err(join) => Some(PipelineError::Invalid {
            pipeline: String::new(),
            message: format!("a lane task failed: {join}"),
        }),
    }
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
