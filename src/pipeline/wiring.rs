//! From the configuration to connector instances: each sink once (shared by its lanes and
//! the snapshot writer), and the source after its read-only preflight, with each route's
//! tables resolved against what it streams.

use std::sync::Arc;

use super::PipelineError;
use super::plan::{Plan, SinkPlan};
use crate::config::{self, ConnectorKind};
use crate::lane::LaneConfig;
use crate::runtime::{SinkSnapshots, Tables, Target, Transformer};
use crate::sink::SinkConnector;
use crate::sink::mysql::MysqlConnector;
use crate::sink::postgres::PostgresConnector;
use crate::source::Source;
use crate::source::postgres::PostgresSource;

/// Builds the source and runs its read-only preflight; resolves each route's tables against
/// the tables it streams. A source that takes a snapshot gets a writer into the plan's sinks
/// (through each route's transform, `transforms` in route order).
pub(super) async fn preflight_source(
    pipeline: &config::Pipeline,
    plan: &Plan,
    transforms: &[Option<Arc<dyn Transformer>>],
) -> Result<(Box<dyn Source>, Vec<Tables>), PipelineError> {
    let name = plan.source.as_str();
    let source_err = |error| PipelineError::Source {
        connector: name.to_owned(),
        error: Box::new(error),
    };
    let (source, tables): (Box<dyn Source>, Vec<Tables>) =
        match pipeline.connector(name).map(|c| &c.kind) {
            Some(ConnectorKind::PostgresSource(pg)) => {
                let mut source = PostgresSource::preflight(pg.clone())
                    .await
                    .map_err(source_err)?;
                let tables = plan.tables(&pipeline.name, source.tables())?;
                if pg.snapshot != config::PostgresSnapshot::Never {
                    for sink in &plan.sinks {
                        super::snapshot_target(&sink.connector)?;
                    }
                    let targets = plan
                        .sinks
                        .iter()
                        .enumerate()
                        .map(|(s, sink)| Target {
                            sink: Arc::clone(&sink.connector),
                            tables: tables[plan.route_of[s]].clone(),
                            transform: transforms[plan.route_of[s]].clone(),
                        })
                        .collect();
                    source =
                        source.with_snapshot(crate::source::postgres::PostgresSnapshotOptions {
                            parallelism: pg.snapshot_parallelism,
                            chunk_rows: pg.snapshot_chunk_rows,
                            progress_interval: pipeline.settings.progress_interval,
                            writer: Arc::new(SinkSnapshots::new(name, targets)),
                        });
                }
                (Box::new(source), tables)
            }
            Some(ConnectorKind::SqlServerSource(ms)) => {
                let source = crate::source::sqlserver::SqlServerSource::preflight(ms.clone())
                    .await
                    .map_err(source_err)?;
                let tables = plan.tables(&pipeline.name, source.tables())?;
                (Box::new(source), tables)
            }
            _ => {
                return Err(PipelineError::Invalid {
                    pipeline: pipeline.name.clone(),
                    message: format!("route source {name} is not a source connector"),
                });
            }
        };
    check_whole_rows(pipeline, plan, &*source, &tables)?;
    Ok((source, tables))
}

/// A route whose transform is a row filter (`row_filter: true`) needs whole rows in updates:
/// an update entering the filter becomes an upsert of the new row, which the sink may never
/// have had, so an unchanged value left out of it would be lost. Checked before anything is
/// created upstream.
fn check_whole_rows(
    pipeline: &config::Pipeline,
    plan: &Plan,
    source: &dyn Source,
    tables: &[Tables],
) -> Result<(), PipelineError> {
    for (route, taken) in plan.routes.iter().zip(tables) {
        if !route.transform.as_ref().is_some_and(|t| t.row_filter) {
            continue;
        }
        for table in source.tables().iter().filter(|t| taken.takes_table(t)) {
            if let Err(why) = source.whole_rows(table) {
                return Err(PipelineError::Invalid {
                    pipeline: pipeline.name.clone(),
                    message: format!(
                        "{}: transform.row_filter: table {}.{}: a row filter needs whole rows in \
                         updates, and {why}",
                        route.at, table.schema, table.name
                    ),
                });
            }
        }
    }
    Ok(())
}

pub(super) fn sink_plan(
    pipeline: &config::Pipeline,
    name: &str,
) -> Result<SinkPlan, PipelineError> {
    let (connector, tuning): (Arc<dyn SinkConnector>, _) =
        match pipeline.connector(name).map(|c| &c.kind) {
            Some(ConnectorKind::MysqlSink(my)) => (
                Arc::new(MysqlConnector::new(&pipeline.name, my.clone())),
                my.tuning(),
            ),
            Some(ConnectorKind::PostgresSink(pg)) => (
                Arc::new(PostgresConnector::new(&pipeline.name, pg.clone())),
                pg.tuning(),
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
