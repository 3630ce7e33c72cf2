//! The runtime's side of the table records (`crate::checkpoint::tables`): reading them from
//! the sinks at start, writing the shapes the source reports durable, and what a table change
//! the source stopped at leads to: the statement to run for a column type change (in each
//! sink's own SQL), the choices for a table dropped and created again, or, with
//! `on_table_recreate: resnapshot`, copying that table again.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::plan::Plan;
use super::{PipelineError, wiring};
use crate::change::Lsn;
use crate::checkpoint::TableRecord;
use crate::checkpoint::tables::merge;
use crate::config;
use crate::error::ErrorClass;
use crate::sink::SinkConnector;
use crate::source::{Source, SourceError, SourceErrorKind, TableChange};

fn sink_error(sink: &Arc<dyn SinkConnector>) -> impl Fn(crate::sink::SinkError) -> PipelineError {
    let connector = sink.name().to_owned();
    move |error| PipelineError::Sink {
        connector: connector.clone(),
        error,
    }
}

/// The records of every sink, merged (see [`merge`]).
pub(super) async fn known(
    sinks: &[Arc<dyn SinkConnector>],
) -> Result<Vec<TableRecord>, PipelineError> {
    let mut per_sink = Vec::with_capacity(sinks.len());
    for sink in sinks {
        per_sink.push(
            sink.checkpoints()
                .table_records()
                .await
                .map_err(sink_error(sink))?,
        );
    }
    Ok(merge(per_sink))
}

/// Writes each record the source sends into every sink, in order, until the source drops its
/// sender. A record that cannot be written is logged: it is written again when the source
/// reports the shape again (the next start compares with the older record, which at worst
/// stops at a change it need not have stopped at).
pub(super) fn recorder(
    sinks: Vec<Arc<dyn SinkConnector>>,
) -> (mpsc::UnboundedSender<TableRecord>, JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<TableRecord>();
    let task = tokio::spawn(async move {
        while let Some(record) = rx.recv().await {
            write(&sinks, &record).await;
        }
    });
    (tx, task)
}

async fn write(sinks: &[Arc<dyn SinkConnector>], record: &TableRecord) {
    for sink in sinks {
        let mut backoff = crate::retry::Backoff::new(
            format!(
                "sink {}: cannot record the shape of table {} yet; retrying",
                sink.name(),
                record.name()
            ),
            crate::retry::Budget::Retries(5),
        );
        loop {
            match sink.checkpoints().record_table(record).await {
                Ok(()) => break,
                Err(e) if e.class == ErrorClass::Transient && backoff.wait(&e).await => {}
                Err(e) => {
                    tracing::warn!(sink = sink.name(), table = %record.name(), error = %crate::error::Report(&e), "could not record the table's shape");
                    break;
                }
            }
        }
    }
    tracing::debug!(table = %record.name(), relation = record.relation, since = %record.since, "recorded the table's shape");
}

fn resnapshots(pipeline: &config::Pipeline, source: &str) -> bool {
    matches!(
        pipeline.connector(source).map(|c| &c.kind),
        Some(config::ConnectorKind::PostgresSource(pg))
            if pg.on_table_recreate == config::OnTableRecreate::Resnapshot
    )
}

/// Sink tables dropped and created again, empty, since the pipeline applied to them (checked
/// at start, for sinks of routes without a transform, whose sink tables are named after the
/// source's): the first such table to copy again with `on_table_recreate: resnapshot`, else a
/// stop naming them and the choices.
pub(super) async fn emptied(
    pipeline: &config::Pipeline,
    plan: &Plan,
    file: &str,
    sinks: &[Arc<dyn SinkConnector>],
    known: &[TableRecord],
) -> Result<Option<(String, Lsn)>, PipelineError> {
    for (s, sink) in sinks.iter().enumerate() {
        if plan.transformed(s) {
            continue;
        }
        let tables = sink.recreated_tables().await.map_err(sink_error(sink))?;
        let Some(first) = tables.first() else {
            continue;
        };
        if resnapshots(pipeline, &plan.source) {
            tracing::warn!(sink = sink.name(), table = %first, "the sink table was created again and is empty; copying the table again (on_table_recreate: resnapshot)");
            let at = known
                .iter()
                .find(|r| r.name() == *first)
                .map_or(Lsn(0), |r| r.since);
            return Ok(Some((first.clone(), at)));
        }
        let message = format!(
            "the sink table of {} was dropped and created again since Zipline last wrote to \
             it, and is empty: the rows applied before are gone, and those the source does not \
             change again would never arrive. To copy it again (and follow it), set \
             `on_table_recreate: resnapshot` on source {}; or start the whole pipeline over \
             with `zipline pipeline apply -f {file} --resnapshot`",
            tables.join(", "),
            plan.source
        );
        return Err(PipelineError::Sink {
            connector: sink.name().to_owned(),
            error: crate::sink::SinkError::fatal(message),
        });
    }
    Ok(None)
}

/// What the run loop does after the source stopped at a table change.
pub(super) enum Next {
    /// Stop with this error.
    Stop(PipelineError),
    /// Copy `table` again, then run again.
    Recopy { table: String, at: Lsn },
}

/// Turns a source error that is a table change into what comes next; other errors pass.
pub(super) async fn on_source_error(
    pipeline: &config::Pipeline,
    plan: &Plan,
    file: &str,
    sinks: &[Arc<dyn SinkConnector>],
    error: SourceError,
) -> Next {
    let connector = plan.source.clone();
    let stop = |error| {
        Next::Stop(PipelineError::Source {
            connector: connector.clone(),
            error: Box::new(error),
        })
    };
    match error.kind.clone() {
        SourceErrorKind::Other => stop(error),
        SourceErrorKind::TypeChanged { record, column } => {
            // The operator alters the sink column next; the next start goes on from here.
            write(sinks, &record).await;
            let mut hints = Vec::new();
            let route = plan.route_for(&record.name());
            for (s, sink) in sinks.iter().enumerate() {
                if Some(plan.route_of[s]) != route {
                    continue;
                }
                if plan.transformed(s) {
                    hints.push(format!(
                        "in sink {}: the route's transform decides the sink tables: alter the \
                         column that holds {}.{column} there",
                        sink.name(),
                        record.name()
                    ));
                } else if let Some(sql) = sink.alter_column_sql(&record.table, &column).await {
                    hints.push(format!("in sink {}: {sql}", sink.name()));
                }
            }
            let message = format!(
                "{}. Alter the sink column to the new type, then start Zipline again: it \
                 resumes right at the change. {}",
                error.message,
                hints.join("; ")
            );
            stop(SourceError { message, ..error })
        }
        SourceErrorKind::TableChanged { table, change, at } => {
            let resnapshot = resnapshots(pipeline, &plan.source);
            let transformed = plan
                .route_for(&table)
                .is_some_and(|r| plan.routes[r].transform.is_some());
            if resnapshot && !transformed {
                tracing::warn!(source = %plan.source, table = %table, ?change, "copying the table again (on_table_recreate: resnapshot)");
                return Next::Recopy { table, at };
            }
            let choices = if transformed && resnapshot {
                "on_table_recreate: resnapshot cannot empty its sink tables, which the route's \
                 transform decides: empty them yourself, then run `zipline pipeline apply -f \
                 FILE --resnapshot`"
                    .replace("FILE", file)
            } else {
                let copy = match change {
                    TableChange::Recreated { .. } => "To copy it again",
                    TableChange::Unpublished => {
                        "If it should still be replicated, add it back \
                                                 to the publication; to copy it again"
                    }
                };
                format!(
                    "{copy} (its sink table is emptied first) and follow it, set \
                     `on_table_recreate: resnapshot` on source {}. To stop replicating it, \
                     take it out of the publication (or `tables:`) and run `zipline pipeline \
                     apply -f {file} --forget-table {table}` once (its sink table is left as \
                     it is)",
                    plan.source
                )
            };
            let message = format!("{}. {choices}", error.message);
            stop(SourceError { message, ..error })
        }
    }
}

/// Copies `table` again (see the module docs): a source of its own (its preflight sees the
/// table as it is now; preparing it adds the table back to a publication Zipline manages),
/// the table's sink tables emptied, the copy, then its record, so the next run follows it.
pub(super) async fn recopy(
    pipeline: &config::Pipeline,
    plan: &Plan,
    table: &str,
    at: Lsn,
) -> Result<(), PipelineError> {
    let source_err = |error| PipelineError::Source {
        connector: plan.source.clone(),
        error: Box::new(error),
    };
    let sinks = plan.connectors();
    // Only routes without a transform copy a table again: the copy needs none.
    let transforms = vec![None; plan.routes.len()];
    let (mut source, _): (Box<dyn Source>, _) =
        wiring::preflight_source(pipeline, plan, &transforms).await?;
    source.prepare().await.map_err(source_err)?;
    let Some(shape) = source
        .tables()
        .iter()
        .find(|t| t.qualified_name() == table)
        .cloned()
    else {
        return Err(source_err(SourceError::fatal(format!(
            "cannot copy table {table} again: it is not in the source's publication any more; \
             add it back (or list it in `tables:`), or stop replicating it with \
             `--forget-table {table}`"
        ))));
    };
    let route = plan.route_for(table);
    for (s, sink) in sinks.iter().enumerate() {
        if Some(plan.route_of[s]) == route {
            super::snapshot_target(sink)?
                .clear(std::slice::from_ref(&shape))
                .await
                .map_err(sink_error(sink))?;
        }
    }
    let records = source
        .recopy(&[table.to_owned()])
        .await
        .map_err(source_err)?;
    for mut record in records {
        record.since = at;
        write(&sinks, &record).await;
    }
    tracing::info!(
        table,
        "table copied again; following it from where it changed"
    );
    Ok(())
}
