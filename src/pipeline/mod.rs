//! Wiring and the run loop: preflight everything, then create the slot, open the lanes, stream,
//! and on shutdown drain: stop reading, let every lane commit what it holds, confirm the
//! durable frontier, exit. Before anything else the process claims the pipeline in every
//! sink ([`instance`]), so a second instance is refused at once.

pub mod dlq;
mod instance;
mod origin;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::change::Lsn;
use crate::config::{self, ConnectorKind};
use crate::lane::{self, LaneConfig, LaneError, LaneStats, Router};
use crate::sink::mysql::{MysqlConnector, MysqlSinkOptions};
use crate::sink::{SinkConnector, SinkError};
use crate::source::postgres::{PostgresSource, PostgresSourceOptions};
use crate::source::{Outputs, Source, SourceError, SourceStats, StopMode};

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
    #[error("source {connector}: {error}")]
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
}

/// Run a pipeline until `shutdown` resolves (then drain and return `Ok`) or an error.
pub async fn run(
    pipeline: config::Pipeline,
    options: RunOptions,
    shutdown: impl Future<Output = ()> + Send,
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

    // One live instance per pipeline, before the first step that reads or writes anything.
    let mut claims = instance::claim(&connectors, pipeline.settings.instance_lease)
        .await
        .map_err(|(connector, error)| PipelineError::Sink { connector, error })?;
    let result = run_claimed(
        pipeline,
        &options,
        route,
        sinks,
        connectors,
        &mut claims,
        shutdown,
    )
    .await;
    claims.end(true).await;
    result
}

async fn run_claimed(
    pipeline: config::Pipeline,
    options: &RunOptions,
    route: config::Route,
    sinks: Vec<SinkPlan>,
    connectors: Vec<Arc<dyn SinkConnector>>,
    claims: &mut instance::Claims,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), PipelineError> {
    let source_err = |error| PipelineError::Source {
        connector: route.from.clone(),
        error,
    };
    // Preflight: nothing is created until every check has passed.
    let mut source = preflight_source(&pipeline, &route.from, &connectors).await?;
    // A transform may drop, rename or add tables, so what reaches the sinks is known only
    // change by change: their tables are then checked when changes are applied.
    let sink_tables = if route.transform.is_some() {
        &[][..]
    } else {
        source.tables()
    };
    for sink in &sinks {
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
        &connectors,
        &source_tables,
        route.transform.is_some(),
    )
    .await?;
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
    for sink in &sinks {
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

    let (stop_tx, stop_rx) = watch::channel(StopMode::Run);
    let source_stats = Arc::new(SourceStats::default());
    let mut source_task = tokio::spawn(source.run(
        Outputs {
            routers,
            acks: ack_rx,
            transform,
        },
        stop_rx,
        source_stats.clone(),
    ));
    let reporter = tokio::spawn(report_progress(
        pipeline.settings.progress_interval,
        source_stats,
        lane_stats,
    ));

    let mut shutdown = std::pin::pin!(shutdown);
    let mut first_error: Option<PipelineError> = None;
    let mut stopping = false;
    let mut claim_lost = false;
    let source_result = loop {
        tokio::select! {
            () = &mut shutdown, if !stopping => {
                tracing::info!(pipeline = %pipeline.name, "shutdown requested; draining");
                stopping = true;
                let _ = stop_tx.send(StopMode::Drain);
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
    if let Some(err) = first_error {
        return Err(err);
    }
    match source_result {
        Ok(Ok(())) => {
            tracing::info!(pipeline = %pipeline.name, "stopped cleanly");
            Ok(())
        }
        Ok(Err(e)) => Err(source_err(e)),
        Err(join) => Err(source_err(SourceError {
            class: crate::error::ErrorClass::Fatal,
            message: format!("source task failed: {join}"),
        })),
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

/// Build the route's source and run its read-only preflight.
async fn preflight_source(
    pipeline: &config::Pipeline,
    name: &str,
    connectors: &[Arc<dyn SinkConnector>],
) -> Result<Box<dyn Source>, PipelineError> {
    let shared = |to: &str| -> Result<Arc<dyn SinkConnector>, PipelineError> {
        connectors
            .iter()
            .find(|c| c.name() == to)
            .cloned()
            .ok_or_else(|| PipelineError::Invalid {
                pipeline: pipeline.name.clone(),
                message: format!("route target {to} is not a sink connector"),
            })
    };
    let source_err = |error| PipelineError::Source {
        connector: name.to_owned(),
        error,
    };
    match pipeline.connector(name).map(|c| &c.kind) {
        Some(ConnectorKind::PostgresSource(pg)) => {
            let opts = PostgresSourceOptions {
                connector: name.to_owned(),
                host: pg.host.clone(),
                port: pg.port,
                database: pg.database.clone(),
                user: pg.user.clone(),
                password: pg.password.as_ref().map(|s| s.expose().to_owned()),
                publication: pg.publication.clone(),
                slot_name: pg.slot_name.clone(),
                tables: pg.tables.clone(),
                connect_timeout: pg.connect_timeout,
                connect_retries: pg.connect_retries,
                status_interval: pg.status_interval,
                receive_timeout: pg.receive_timeout,
                stream_in_progress: pg.stream_in_progress,
                slot_warn_bytes: pg.slot_warn_bytes,
                heartbeat_interval: pg.heartbeat_interval,
                spill_dir: pg.spill_dir.clone().unwrap_or_else(|| {
                    std::env::temp_dir()
                        .join("zipline-spill")
                        .join(format!("{}-{}", pipeline.name, pg.slot_name))
                }),
            };
            let mut source = PostgresSource::preflight(opts).await.map_err(source_err)?;
            if pg.snapshot != config::PostgresSnapshot::Never {
                // The snapshot records its progress in, and writes rows to, the route's sinks
                // (connector instances of its own).
                let mut sinks = Vec::new();
                let mut transformed = false;
                for route in pipeline.routes.iter().filter(|r| r.from == name) {
                    transformed |= route.transform.is_some();
                    for to in &route.to {
                        sinks.push(shared(to)?);
                    }
                }
                source = source.with_snapshot(crate::source::postgres::PostgresSnapshotOptions {
                    parallelism: pg.snapshot_parallelism,
                    chunk_rows: pg.snapshot_chunk_rows,
                    progress_interval: pipeline.settings.progress_interval,
                    sinks,
                    transformed,
                });
            }
            Ok(Box::new(source))
        }
        Some(ConnectorKind::SqlServerSource(ms)) => {
            // SQL Server keeps no reader position, so the source asks the route's sinks
            // where to resume and tells them what is durable (own connector instances).
            let mut sinks = Vec::new();
            for route in pipeline.routes.iter().filter(|r| r.from == name) {
                for to in &route.to {
                    sinks.push(crate::source::sqlserver::SinkLanes {
                        connector: shared(to)?,
                        lanes: sink_plan(pipeline, to)?.lanes,
                    });
                }
            }
            let opts = crate::source::sqlserver::SqlServerSourceOptions {
                connector: name.to_owned(),
                host: ms.host.clone(),
                port: ms.port,
                database: ms.database.clone(),
                user: ms.user.clone(),
                password: ms.password.as_ref().map(|s| s.expose().to_owned()),
                tables: ms.tables.clone(),
                poll_interval: ms.poll_interval,
                encrypt: ms.encrypt,
                trust_server_certificate: ms.trust_server_certificate,
                snapshot: match ms.snapshot {
                    config::SqlServerSnapshot::Initial => {
                        crate::source::sqlserver::SnapshotMode::Initial
                    }
                    config::SqlServerSnapshot::Never => {
                        crate::source::sqlserver::SnapshotMode::Never
                    }
                },
                connect_timeout: ms.connect_timeout,
                connect_retries: ms.connect_retries,
            };
            let source = crate::source::sqlserver::SqlServerSource::preflight(opts, sinks)
                .await
                .map_err(source_err)?;
            Ok(Box::new(source))
        }
        _ => Err(PipelineError::Invalid {
            pipeline: pipeline.name.clone(),
            message: format!("route source {name} is not a source connector"),
        }),
    }
}

fn sink_plan(pipeline: &config::Pipeline, name: &str) -> Result<SinkPlan, PipelineError> {
    let (connector, tuning): (Arc<dyn SinkConnector>, _) =
        match pipeline.connector(name).map(|c| &c.kind) {
            Some(ConnectorKind::MysqlSink(my)) => (
                Arc::new(
                    MysqlConnector::new(MysqlSinkOptions {
                        connector: name.to_owned(),
                        pipeline: pipeline.name.clone(),
                        host: my.host.clone(),
                        port: my.port,
                        database: my.database.clone(),
                        user: my.user.clone(),
                        password: my.password.as_ref().map(|s| s.expose().to_owned()),
                        connect_timeout: my.tuning.connect_timeout,
                        dead_letter_table: my.tuning.dead_letter_table.clone(),
                        create_dead_letter_table: my.tuning.on_error == config::OnError::DeadLetter,
                    })
                    .with_create_tables(my.create_tables),
                ),
                &my.tuning,
            ),
            Some(ConnectorKind::PostgresSink(pg)) => (
                Arc::new(crate::sink::postgres::PostgresConnector::new(
                    crate::sink::postgres::PostgresSinkOptions {
                        connector: name.to_owned(),
                        pipeline: pipeline.name.clone(),
                        host: pg.host.clone(),
                        port: pg.port,
                        database: pg.database.clone(),
                        user: pg.user.clone(),
                        password: pg.password.as_ref().map(|s| s.expose().to_owned()),
                        schema: pg.schema.clone(),
                        create_tables: pg.create_tables,
                        connect_timeout: pg.tuning.connect_timeout,
                        dead_letter_table: pg.tuning.dead_letter_table.clone(),
                        create_dead_letter_table: pg.tuning.on_error == config::OnError::DeadLetter,
                    },
                )),
                &pg.tuning,
            ),
            _ => {
                return Err(PipelineError::Invalid {
                    pipeline: pipeline.name.clone(),
                    message: format!("route target {name} is not a sink connector"),
                });
            }
        };
    Ok(SinkPlan {
        connector,
        lanes: tuning.lanes,
        queue_capacity: tuning.queue_capacity,
        lane_cfg: LaneConfig {
            sink: name.to_owned(),
            batch_size: tuning.batch_size,
            max_wait: tuning.max_wait,
            statement_timeout: tuning.statement_timeout,
            outage_timeout: tuning.outage_timeout,
            on_error: tuning.on_error,
        },
    })
}

async fn report_progress(every: Duration, source: Arc<SourceStats>, lanes: Vec<Arc<LaneStats>>) {
    let mut last_applied = 0u64;
    let mut last = Instant::now();
    let mut ticker = tokio::time::interval(every);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let applied: u64 = lanes
            .iter()
            .map(|l| l.applied.load(Ordering::Relaxed))
            .sum();
        let retries: u64 = lanes
            .iter()
            .map(|l| l.retries.load(Ordering::Relaxed))
            .sum();
        let secs = last.elapsed().as_secs_f64().max(1e-3);
        let rate = (applied - last_applied) as f64 / secs;
        tracing::info!(
            changes_per_sec = rate.round() as u64,
            applied,
            received = source.received.load(Ordering::Relaxed),
            lag_ms = source.lag_micros.load(Ordering::Relaxed) / 1000,
            slot_retained_bytes = source.retained_bytes.load(Ordering::Relaxed),
            confirmed = %Lsn::from(source.confirmed.load(Ordering::Relaxed)),
            retries,
            "progress"
        );
        last_applied = applied;
        last = Instant::now();
    }
}

/// `kind name: message`, unless the message already starts by naming the connector.
fn named(kind: &str, connector: &str, message: &str) -> String {
    let prefix = format!("{kind} {connector}");
    if message.starts_with(&prefix) {
        message.to_owned()
    } else {
        format!("{prefix}: {message}")
    }
}
