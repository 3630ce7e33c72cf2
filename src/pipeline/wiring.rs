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
use crate::sink::mysql::{MysqlConnector, MysqlSinkOptions};
use crate::source::Source;
use crate::source::postgres::{PostgresSource, PostgresSourceOptions};

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
                source = source.with_snapshot(crate::source::postgres::PostgresSnapshotOptions {
                    parallelism: pg.snapshot_parallelism,
                    chunk_rows: pg.snapshot_chunk_rows,
                    progress_interval: pipeline.settings.progress_interval,
                    writer: Arc::new(SinkSnapshots::new(name, targets)),
                });
            }
            Ok((Box::new(source), tables))
        }
        Some(ConnectorKind::SqlServerSource(ms)) => {
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
            let source = crate::source::sqlserver::SqlServerSource::preflight(opts)
                .await
                .map_err(source_err)?;
            let tables = plan.tables(&pipeline.name, source.tables())?;
            Ok((Box::new(source), tables))
        }
        _ => Err(PipelineError::Invalid {
            pipeline: pipeline.name.clone(),
            message: format!("route source {name} is not a source connector"),
        }),
    }
}

pub(super) fn sink_plan(
    pipeline: &config::Pipeline,
    name: &str,
) -> Result<SinkPlan, PipelineError> {
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
