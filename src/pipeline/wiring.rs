//! From the configuration to connector instances: each sink once (shared by its lanes, the
//! snapshot and a source that asks the sinks where to resume), and the route's source after
//! its read-only preflight.

use std::sync::Arc;

use super::{PipelineError, SinkPlan};
use crate::config::{self, ConnectorKind};
use crate::lane::LaneConfig;
use crate::sink::SinkConnector;
use crate::sink::mysql::{MysqlConnector, MysqlSinkOptions};
use crate::source::Source;
use crate::source::postgres::{PostgresSource, PostgresSourceOptions};

/// Build the route's source and run its read-only preflight.
pub(super) async fn preflight_source(
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
