//! The runtime's [`SnapshotWriter`]: a source's snapshot chunks into each sink's snapshot
//! target, through the route's transform where the route has one.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::route::{Tables, Transformer};
use crate::change::{Change, Op, Position, Table, Value};
use crate::checkpoint::{SnapshotChunk, SnapshotState};
use crate::error::ErrorClass;
use crate::retry::{Backoff, Budget};
use crate::sink::{SinkConnector, SinkError, SnapshotTarget};
use crate::source::SourceError;
use crate::source::snapshot::{Rows, SnapshotWriter};

/// Attempts per chunk and sink before a transient error is given up on.
const MAX_ATTEMPTS: u32 = 10;

/// One sink fed by the source.
pub struct Target {
    /// The sink.
    pub sink: Arc<dyn SinkConnector>,
    /// The tables its route takes.
    pub tables: Tables,
    /// Its route's transform.
    pub transform: Option<Arc<dyn Transformer>>,
}

/// A source's snapshot targets.
pub struct SinkSnapshots {
    connector: String,
    targets: Vec<Target>,
}

impl std::fmt::Debug for SinkSnapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkSnapshots")
            .field("connector", &self.connector)
            .field(
                "targets",
                &self
                    .targets
                    .iter()
                    .map(|t| t.sink.name())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl SinkSnapshots {
    /// The targets of source `connector` (each sink should have a snapshot target; one that
    /// has none fails every call naming it).
    pub fn new(connector: &str, targets: Vec<Target>) -> Self {
        SinkSnapshots {
            connector: connector.to_owned(),
            targets,
        }
    }

    /// `target`'s snapshot target.
    fn of(&self, target: usize) -> Result<&dyn SnapshotTarget, SourceError> {
        let sink = &self.targets[target].sink;
        sink.snapshot()
            .ok_or_else(|| source_error(crate::sink::snapshot_unsupported(sink.name())))
    }
}

fn source_error(e: SinkError) -> SourceError {
    // A row the sink refuses stops the snapshot: a source has no per-row policy.
    let class = match e.class {
        ErrorClass::Transient => ErrorClass::Transient,
        ErrorClass::Definite | ErrorClass::Fatal => ErrorClass::Fatal,
    };
    SourceError {
        class,
        message: e.message,
        kind: crate::source::SourceErrorKind::Other,
        cause: e.cause,
    }
}

impl SnapshotWriter for SinkSnapshots {
    fn targets(&self) -> usize {
        self.targets.len()
    }

    fn name(&self, target: usize) -> &str {
        self.targets[target].sink.name()
    }

    fn wants(&self, target: usize, table: &str) -> bool {
        let (schema, name) = table.split_once('.').unwrap_or(("public", table));
        self.targets[target].tables.takes(schema, name)
    }

    fn takes_text(&self, target: usize) -> bool {
        let t = &self.targets[target];
        t.transform.is_none() && t.sink.snapshot().is_some_and(|s| s.copy_text().is_some())
    }

    fn state(&self, target: usize) -> BoxFuture<'_, Result<SnapshotState, SourceError>> {
        Box::pin(async move { self.of(target)?.state().await.map_err(source_error) })
    }

    fn clear<'a>(
        &'a self,
        target: usize,
        tables: &'a [Arc<Table>],
    ) -> BoxFuture<'a, Result<bool, SourceError>> {
        Box::pin(async move {
            let t = &self.targets[target];
            if t.transform.is_some() {
                return Ok(false);
            }
            let mine: Vec<Arc<Table>> = tables
                .iter()
                .filter(|table| t.tables.takes_table(table))
                .cloned()
                .collect();
            self.of(target)?.clear(&mine).await.map_err(source_error)?;
            Ok(true)
        })
    }

    fn begin<'a>(
        &'a self,
        target: usize,
        plan: &'a [SnapshotChunk],
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move { self.of(target)?.begin(plan).await.map_err(source_error) })
    }

    fn finish(&self, target: usize) -> BoxFuture<'_, Result<(), SourceError>> {
        Box::pin(async move { self.of(target)?.finish().await.map_err(source_error) })
    }

    fn load<'a>(
        &'a self,
        target: usize,
        chunk: &'a SnapshotChunk,
        table: &'a Arc<Table>,
        rows: Rows<'a>,
        position: Position,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let t = &self.targets[target];
            let transformed = match (&t.transform, rows) {
                (Some(transform), Rows::Decoded(rows)) => Some(
                    transform_rows(&self.connector, &**transform, table, rows, chunk, position)
                        .await?,
                ),
                _ => None,
            };
            let name = t.sink.name();
            let sink = self.of(target)?;
            let mut backoff = Backoff::new(
                format!("sink {name}: loading snapshot {chunk} failed; retrying"),
                Budget::Retries(MAX_ATTEMPTS),
            );
            loop {
                let result = match (&transformed, rows) {
                    (Some(changes), _) => sink.load(chunk, changes).await,
                    (None, Rows::Decoded(rows)) => sink.load_rows(chunk, table, rows).await,
                    (None, Rows::Text(text, n)) => match sink.copy_text() {
                        Some(text_target) => text_target.load_text(chunk, table, text, n).await,
                        None => Err(SinkError::fatal(format!(
                            "sink {name} was handed COPY text it cannot parse"
                        ))),
                    },
                };
                match result {
                    Ok(()) => return Ok(()),
                    Err(e) if e.class == ErrorClass::Transient && backoff.wait(&e).await => {}
                    Err(e) => return Err(source_error(e)),
                }
            }
        })
    }
}

/// Rows as insert changes through the route's transform; what comes out must be whole rows.
async fn transform_rows(
    connector: &str,
    transform: &dyn Transformer,
    table: &Arc<Table>,
    rows: &[Vec<Value>],
    chunk: &SnapshotChunk,
    position: Position,
) -> Result<Vec<Change>, SourceError> {
    let mut out = Vec::new();
    for batch in rows.chunks(transform.batch_size().max(1)) {
        let changes = batch
            .iter()
            .map(|values| Change {
                position,
                op: Op::Insert,
                table: table.clone(),
                key: table.key.iter().map(|&i| values[i].clone()).collect(),
                old_key: None,
                values: values.clone(),
            })
            .collect();
        let transformed = transform
            .transform(changes)
            .await
            .map_err(|e| SourceError::fatal(format!("{connector}: {e}")))?;
        for (_, change) in transformed {
            let whole = matches!(change.op, Op::Insert | Op::Update)
                && !change.values.contains(&Value::Unchanged);
            if !whole {
                return Err(SourceError::fatal(format!(
                    "{connector}: the transform made a {} of {} out of a snapshot row of \
                     {chunk}; the snapshot writes whole rows only",
                    change.op.as_str(),
                    change.table.qualified_name()
                )));
            }
            out.push(Change {
                op: Op::Insert,
                ..change
            });
        }
    }
    Ok(out)
}
