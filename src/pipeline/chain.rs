//! One run of the stage chain: start the routes' transforms, preflight the source (resolving
//! each route's tables), check the sinks' tables, decide where to start, open the lanes, then
//! run source, dispatcher and lanes until a stop; on shutdown, drain within `drain_timeout`.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::plan::Plan;
use super::progress::report_progress;
use super::wiring::preflight_source;
use super::{Ended, PipelineError, RunOptions, cursor, instance, origin, tables};
use crate::change::Lsn;
use crate::config::{self, ConnectorKind};
use crate::lane::{self, LaneError, Router};
use crate::runtime::{Dispatcher, Transformer};
use crate::sink::SinkConnector;
use crate::source::{Ledger, SourceError, SourceIo, SourceState, StopMode, Upstream};

/// Parcels the source may hand over ahead of the dispatcher.
const PARCELS_AHEAD: usize = 4;

/// One run of the stage chain: preflight, start, lanes, stream, until a stop.
pub(super) struct Run<'r> {
    pub(super) pipeline: &'r config::Pipeline,
    pub(super) options: &'r RunOptions,
    pub(super) plan: &'r Plan,
    pub(super) connectors: &'r [Arc<dyn SinkConnector>],
    /// Counters that outlive each run.
    pub(super) metrics: &'r crate::metrics::PipelineMetrics,
}

fn sink_error(sink: &Arc<dyn SinkConnector>) -> impl Fn(crate::sink::SinkError) -> PipelineError {
    let connector = sink.name().to_owned();
    move |error| PipelineError::Sink {
        connector: connector.clone(),
        error,
    }
}

impl Run<'_> {
    pub(super) async fn once(
        &self,
        claims: &mut instance::Claims,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<Ended, PipelineError> {
        let Run {
            pipeline,
            options,
            plan,
            connectors,
            metrics,
        } = *self;
        let source_stats = Arc::clone(metrics.source());
        source_stats.set_state(SourceState::Starting);
        let source_name = plan.source.as_str();
        let source_err = |error| PipelineError::Source {
            connector: source_name.to_owned(),
            error: Box::new(error),
        };
        let mut transforms: Vec<Option<Arc<dyn Transformer>>> = Vec::new();
        for (r, route) in plan.routes.iter().enumerate() {
            transforms.push(match &route.transform {
                None => None,
                Some(spec) => Some(Arc::new(
                    crate::transform::RouteTransform::start(
                        &route.from,
                        spec,
                        metrics.transform(r),
                    )
                    .await?,
                )),
            });
        }
        // Preflight: nothing is created until every check has passed.
        let (mut source, route_tables) = preflight_source(pipeline, plan, &transforms).await?;
        let streamed = source.tables().to_vec();
        // Per sink, the source tables it takes; `None` where a transform decides its tables
        // (what reaches them is known only change by change, and checked then).
        let scopes: Vec<Option<Vec<_>>> = (0..plan.sinks.len())
            .map(|s| (!plan.transformed(s)).then(|| plan.sink_tables(s, &route_tables, &streamed)))
            .collect();
        for (sink, scope) in connectors.iter().zip(&scopes) {
            sink.check_tables(scope.as_deref().unwrap_or(&[]))
                .await
                .map_err(sink_error(sink))?;
        }
        let (cursor_name, when_needed) = match pipeline.connector(source_name).map(|c| &c.kind) {
            Some(ConnectorKind::PostgresSource(pg)) => (
                pg.slot_name.as_str(),
                pg.snapshot == config::PostgresSnapshot::WhenNeeded,
            ),
            _ => ("", false),
        };
        let cx = origin::Context {
            file: &options.file,
            source: source_name,
            cursor: cursor_name,
            forced: options.resnapshot,
            when_needed,
        };
        origin::establish(&cx, &mut *source, connectors, &scopes).await?;
        let known = tables::known(connectors).await?;
        if let Some((table, at)) =
            tables::emptied(pipeline, plan, &options.file, connectors, &known).await?
        {
            return Ok(Ended::Recopy { table, at });
        }
        source.prepare().await.map_err(&source_err)?;
        let no_cursor = matches!(source.upstream(), Upstream::NoCursor);
        let resume = if no_cursor {
            cursor::resume(plan).await?
        } else {
            None
        };

        // Lanes.
        let (ack_tx, ack_rx) = mpsc::unbounded_channel();
        let mut lanes_set: JoinSet<Result<(), LaneError>> = JoinSet::new();
        let mut routers = Vec::new();
        for (s, sink) in plan.sinks.iter().enumerate() {
            let mut senders = Vec::new();
            for lane in 0..sink.lanes {
                let writer = sink
                    .connector
                    .open_lane(lane, sink.lanes)
                    .await
                    .map_err(sink_error(&sink.connector))?;
                tracing::info!(sink = %sink.connector.name(), lane, checkpoint = ?writer.checkpoint().map(|p| p.to_string()), "lane open");
                let (tx, rx) = lane::queue(sink.queue_capacity);
                let stats = metrics.lane(s, lane);
                stats.watch_queue(tx.depth());
                senders.push(tx);
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
        // Only lanes may hold ack senders: the dispatcher's drain ends when the last lane ends.
        drop(ack_tx);

        let (record, recorder) = tables::recorder(connectors.to_vec());
        let (stop_tx, stop_rx) = watch::channel(StopMode::Run);
        let (emitter, events, frontier) =
            crate::source::emitter::channel(PARCELS_AHEAD, resume.map_or(Lsn(0), |p| p.lsn));
        let keeper = no_cursor.then(|| cursor::keep(plan, frontier.subscribe()));
        let dispatcher = Dispatcher::new(
            plan.stages(&route_tables, &transforms),
            routers,
            events,
            ack_rx,
            frontier,
            stop_rx.clone(),
            source_stats.clone(),
        );
        let mut dispatcher_task = tokio::spawn(dispatcher.run());
        let mut source_task = tokio::spawn(source.run(
            SourceIo {
                emitter,
                ledger: Ledger { known, record },
                resume,
            },
            stop_rx,
            source_stats.clone(),
        ));
        let reporter = tokio::spawn(report_progress(
            pipeline.settings.progress_interval,
            source_stats,
            metrics.lanes(),
        ));

        let mut first_error: Option<PipelineError> = None;
        let mut stopping = *shutdown.borrow();
        if stopping {
            let _ = stop_tx.send(StopMode::Drain);
        }
        let mut drain_deadline =
            stopping.then(|| tokio::time::Instant::now() + pipeline.settings.drain_timeout);
        let mut claim_lost = false;
        let mut dispatcher_done = false;
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
                        tracing::error!(pipeline = %pipeline.name, error = %crate::error::Report(&err), "lane failed; halting the pipeline");
                        first_error.get_or_insert(err);
                        let _ = stop_tx.send(StopMode::Abort);
                    }
                }
                done = &mut dispatcher_task, if !dispatcher_done => {
                    dispatcher_done = true;
                    if let Some(err) = dispatcher_failure(done) {
                        tracing::error!(pipeline = %pipeline.name, error = %crate::error::Report(&err), "halting the pipeline");
                        first_error.get_or_insert(err);
                        let _ = stop_tx.send(StopMode::Abort);
                    }
                }
                lost = &mut claims.lost, if !claim_lost => {
                    claim_lost = true;
                    // Err: the renewing task ended, which happens only once the run is over.
                    let Ok((connector, error)) = lost else { continue };
                    tracing::error!(pipeline = %pipeline.name, sink = %connector, error = %crate::error::Report(&error), "another instance took over; stopping without writing");
                    first_error.get_or_insert(PipelineError::Sink { connector, error });
                    let _ = stop_tx.send(StopMode::Abort);
                }
                res = &mut source_task => break res,
            }
        };
        // The source has returned and dropped its emitter, so the dispatcher and the lanes end
        // by themselves (or were told to abort).
        if !dispatcher_done && let Some(err) = dispatcher_failure(dispatcher_task.await) {
            first_error.get_or_insert(err);
        }
        while let Some(done) = lanes_set.join_next().await {
            if let Some(err) = lane_failure(done) {
                first_error.get_or_insert(err);
            }
        }
        reporter.abort();
        if let Some(keeper) = keeper {
            let _ = keeper.await;
        }
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
                match tables::on_source_error(pipeline, plan, &options.file, connectors, e).await {
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

fn dispatcher_failure(
    done: Result<Result<(), crate::runtime::DispatchError>, tokio::task::JoinError>,
) -> Option<PipelineError> {
    match done {
        Ok(Ok(())) => None,
        // The lanes say why they stopped.
        Ok(Err(crate::runtime::DispatchError::LanesGone { .. })) => None,
        Ok(Err(e)) => Some(PipelineError::Dispatch(e)),
        Err(join) => Some(PipelineError::Invalid {
            pipeline: String::new(),
            message: format!("the dispatcher task failed: {join}"),
        }),
    }
}
