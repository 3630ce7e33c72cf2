//! One lane's writer: its connection, checkpoint, caches, and the transaction of a batch
//! (see the parent module's docs for the message flow).

mod cache;
pub(super) mod evolve;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::SinkExt;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use super::errors::{connection_lost, copy_line, sink_error};
use super::schema::{self, SinkTable};
use super::sql::{self, Kind, Stmt, qualified};
use super::{Shared, checkpoint, copy, dead_letter, diagnose, fence, pipeline};
use crate::change::{Change, Position, Table, Value};
use crate::error::ErrorClass;
use crate::sink::coalesce::{Row, TablePlan, coalesce};
use crate::sink::{Batch, BoxFuture, DeadLetter, LaneSink, ParkedKey, SinkError};

/// How long a ROLLBACK may take before the connection is just dropped.
const ROLLBACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Batches written with upserts only after a plain insert met an existing key (a stretch of
/// replayed changes), before plain inserts are tried again.
const SAFE_AFTER_CONFLICT: u32 = 16;

/// Prepared statements kept per connection before the cache is emptied (shapes are few; this
/// only bounds a pathological stream of ever-new shapes).
const STATEMENT_CACHE_LIMIT: usize = 512;

/// How a lane's transaction ends.
#[derive(Clone, Copy)]
enum Tail<'a> {
    /// Record `dead`, forget the dead letters a truncate of `forget` (source table name)
    /// supersedes, move the checkpoint to `position`, commit.
    Checkpoint {
        position: Position,
        dead: &'a [DeadLetter],
        forget: Option<&'a str>,
    },
    /// Remove the replayed records `ids` and commit; the checkpoint stays.
    Replay(&'a [u64]),
}

/// The statements of a [`Tail`], in order, for error messages.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    DeadLetters,
    Forget,
    Lock,
    Checkpoint,
    ReplayGuard,
    Remove,
}

/// What a batch does besides its coalesced tables.
enum Prelude<'a> {
    None,
    /// Empty this table first.
    Truncate(&'a Table),
    /// Move the row at the old key to the change's key first (a TOAST move).
    Move(&'a Change, &'a [Value]),
}

/// One lane's writer: its connection, checkpoint and caches.
pub(super) struct PostgresLane {
    shared: Arc<Shared>,
    /// `None` after a broken connection; the next call connects again.
    client: Option<Client>,
    lane: u32,
    lanes: u32,
    checkpoint: Option<Position>,
    /// Sink table definitions by (schema, name), read once per connection.
    tables: HashMap<(String, String), Arc<SinkTable>>,
    /// Prepared statements by SQL text, per connection.
    statements: HashMap<String, Statement>,
    checkpoint_sql: String,
    /// A call was cancelled midway and may have left a transaction open.
    dirty: bool,
    /// Batches still to write without plain inserts (after a conflict or a retry).
    safe_batches: u32,
    /// Table shapes the sink tables are known to fit (see `evolve.rs`).
    shapes: crate::sink::shapes::KnownShapes,
    /// This lane's keys with dead letters, as loaded when it opened.
    parked: Vec<ParkedKey>,
    /// The dead-letter table exists (a truncate then removes the dead letters it supersedes).
    dead_letter_table: bool,
}

impl fmt::Debug for PostgresLane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLane")
            .field("sink", &self.shared.sink())
            .field("lane", &self.lane)
            .field("lanes", &self.lanes)
            .field("checkpoint", &self.checkpoint)
            .finish_non_exhaustive()
    }
}

/// A failure, and whether the connection must be dropped.
struct Failure {
    error: SinkError,
    lost: bool,
    /// A plain insert met an existing key: write the batch again with upserts.
    conflict: bool,
}

impl Failure {
    /// `err`, met while `doing` something, from the server or the connection.
    fn pg(sink: &str, doing: &str, err: &tokio_postgres::Error) -> Self {
        Failure {
            error: sink_error(sink, doing, err),
            lost: connection_lost(err),
            conflict: false,
        }
    }
}

impl From<SinkError> for Failure {
    fn from(error: SinkError) -> Self {
        Failure {
            error,
            lost: false,
            conflict: false,
        }
    }
}

impl PostgresLane {
    /// Lane `lane` of `lanes` on `client`, resuming after `checkpoint`, with the keys it has
    /// dead letters of (`None`: no dead-letter table).
    pub(super) fn new(
        shared: Arc<Shared>,
        client: Client,
        lane: u32,
        lanes: u32,
        checkpoint: Option<Position>,
        parked: Option<Vec<ParkedKey>>,
    ) -> Self {
        let checkpoint_sql = checkpoint::upsert_sql(shared.checkpoint_schema());
        PostgresLane {
            shared,
            client: Some(client),
            lane,
            lanes,
            checkpoint,
            tables: HashMap::new(),
            statements: HashMap::new(),
            checkpoint_sql,
            dirty: false,
            safe_batches: 0,
            shapes: crate::sink::shapes::KnownShapes::default(),
            dead_letter_table: parked.is_some(),
            parked: parked.unwrap_or_default(),
        }
    }

    fn forget_connection(&mut self) {
        self.client = None;
        self.tables.clear();
        // The sink may have restarted with other tables: match shapes against them again.
        self.shapes.clear();
        self.statements.clear();
        self.dirty = false;
    }

    /// Writes the prelude and `tables`, ending as `tail` says, in one transaction.
    async fn write(
        &mut self,
        prelude: Prelude<'_>,
        tables: &[TablePlan<'_>],
        tail: Tail<'_>,
    ) -> Result<(), SinkError> {
        if self.dirty {
            // A cancelled call may have left a transaction open; a new session is clean.
            self.forget_connection();
        }
        if self.client.is_none() {
            self.client = Some(self.shared.connect().await?);
        }
        self.dirty = true;
        let mut fast = self.safe_batches == 0;
        let mut result = self.run(&prelude, tables, tail, fast).await;
        if fast && matches!(&result, Err(f) if f.conflict) {
            // A replay: the rows are there already. Same batch, upserts only.
            tracing::debug!(
                sink = self.shared.sink(),
                lane = self.lane,
                "plain insert met an existing key; writing the batch with upserts"
            );
            self.rollback().await;
            self.safe_batches = SAFE_AFTER_CONFLICT;
            fast = false;
            if self.client.is_none() {
                // The ROLLBACK failed and the connection went with it.
                self.client = Some(self.shared.connect().await?);
            }
            result = self.run(&prelude, tables, tail, fast).await;
        }
        self.dirty = false;
        match result {
            Ok(()) => {
                if !fast {
                    self.safe_batches = self.safe_batches.saturating_sub(1);
                }
                if let Tail::Checkpoint { position, .. } = tail {
                    self.checkpoint = Some(position);
                }
                Ok(())
            }
            Err(Failure { error, lost, .. }) => {
                if lost {
                    self.forget_connection();
                } else {
                    self.rollback().await;
                }
                tracing::debug!(sink = self.shared.sink(), lane = self.lane, error = %error.report(), "batch failed");
                Err(error)
            }
        }
    }

    /// The statements that end a transaction as `tail` says.
    fn steps(&self, tail: Tail<'_>) -> Vec<Step> {
        match tail {
            Tail::Checkpoint { dead, forget, .. } => {
                let mut steps = Vec::with_capacity(4);
                if !dead.is_empty() {
                    steps.push(Step::DeadLetters);
                }
                if forget.is_some() {
                    steps.push(Step::Forget);
                }
                steps.extend([Step::Lock, Step::Checkpoint]);
                steps
            }
            Tail::Replay(_) => vec![Step::Lock, Step::ReplayGuard, Step::Remove],
        }
    }

    /// The SQL of a step (prepared once per connection).
    fn step_sql(&self, step: Step) -> String {
        let (schema, table) = (
            self.shared.checkpoint_schema(),
            &self.shared.options.dead_letter_table,
        );
        match step {
            Step::DeadLetters => dead_letter::insert_sql(schema, table),
            Step::Forget => dead_letter::forget_sql(schema, table),
            Step::Lock => fence::LOCK_SQL.to_owned(),
            Step::Checkpoint => self.checkpoint_sql.clone(),
            // Division by zero unless the fence still holds this instance's epoch (the
            // division's operand is not a constant, so it is not folded at planning).
            Step::ReplayGuard => format!(
                "SELECT 1 / (CASE WHEN ({}) = $3::int8 THEN 1 ELSE 0 END)",
                fence::epoch_query(schema, "$1::text", "$2::text")
            ),
            Step::Remove => dead_letter::remove_sql(schema, table),
        }
    }

    /// Ends whatever transaction a failed call left open, or drops the connection.
    async fn rollback(&mut self) {
        let Some(client) = self.client.as_ref() else {
            return;
        };
        match tokio::time::timeout(ROLLBACK_TIMEOUT, client.batch_execute("ROLLBACK")).await {
            Ok(Ok(())) => {}
            _ => self.forget_connection(),
        }
    }

    async fn run(
        &mut self,
        prelude: &Prelude<'_>,
        tables: &[TablePlan<'_>],
        tail: Tail<'_>,
        fast: bool,
    ) -> Result<(), Failure> {
        let sink_tables = self.sink_tables(tables).await?;
        let refs: Vec<&SinkTable> = sink_tables.iter().map(Arc::as_ref).collect();
        let mut stmts: Vec<Stmt<'_>> = Vec::new();
        match *prelude {
            Prelude::None => {}
            Prelude::Truncate(table) => stmts.push(sql::truncate(
                &qualified(self.shared.target_schema(table), &table.name),
                0,
            )),
            Prelude::Move(change, old_key) => {
                let stmt = sql::move_row(refs[0], change, old_key)
                    .map_err(|m| self.missing_column(&change.table, refs[0], &m.column))?;
                stmts.push(stmt);
            }
        }
        if let Err(m) = sql::batch(tables, &refs, fast, &mut stmts) {
            return Err(self
                .missing_column(tables[m.table].source, refs[m.table], &m.column)
                .into());
        }
        let steps = self.steps(tail);
        self.prepare(&stmts, tables, &refs, &steps).await?;

        let client = self.client.as_ref().expect("connected in write()");
        let key = self.shared.lane_key(self.lane, self.lanes);
        let epoch = fence::epoch(&self.shared)?;
        let position = match tail {
            Tail::Checkpoint { position, .. } => position,
            Tail::Replay(_) => Position::default(),
        };
        let ck_params = checkpoint::upsert_params(&key, self.lane, position, epoch);
        let ck_refs = ck_params.as_params();
        let fence_key = self.shared.fence_keys.1;
        let o = &self.shared.options;
        let (dead, forget, ids): (&[DeadLetter], _, &[u64]) = match tail {
            Tail::Checkpoint { dead, forget, .. } => (dead, forget, &[]),
            Tail::Replay(ids) => (&[], None, ids),
        };
        let dead_params = dead_letter::InsertParams::new(&self.shared, dead);
        let dead_refs = dead_params.as_params();
        let forget_params =
            forget.map(|t| dead_letter::ForgetParams::new(&self.shared, t, position));
        let forget_refs = forget_params
            .as_ref()
            .map(dead_letter::ForgetParams::as_params);
        let ids: Vec<i64> = ids
            .iter()
            .map(|&i| i64::try_from(i).unwrap_or(i64::MAX))
            .collect();
        let epoch_param = i64::try_from(epoch).unwrap_or(i64::MAX);
        let guard_refs: [&(dyn ToSql + Sync); 3] = [&self.shared.pipeline, &o.name, &epoch_param];
        let remove_refs: [&(dyn ToSql + Sync); 3] = [&self.shared.pipeline, &o.name, &ids];
        let lock_refs: [&(dyn ToSql + Sync); 1] = [&fence_key];
        let param_refs: Vec<Vec<&(dyn ToSql + Sync)>> = stmts
            .iter()
            .map(|s| s.params.iter().map(|p| p as &(dyn ToSql + Sync)).collect())
            .collect();
        // Encoded before anything is sent, so a value COPY cannot write fails the batch
        // before its transaction starts.
        let mut payloads = Vec::with_capacity(stmts.len());
        for stmt in &stmts {
            payloads.push(match stmt.kind {
                Kind::Copy => Some(copy::payload(&stmt.params, &stmt.copy).map_err(|m| {
                    let source = stmt_source(tables, prelude, stmt);
                    let doing = sql::describe(stmt, &refs[stmt.table].target, source);
                    SinkError::definite(format!("sink {}: {doing}: {m}", self.shared.sink()))
                })?),
                _ => None,
            });
        }
        let mut futures: Vec<BoxFuture<'_, Result<(), tokio_postgres::Error>>> =
            Vec::with_capacity(stmts.len() + 3);
        futures.push(Box::pin(client.batch_execute("BEGIN")));
        for ((stmt, params), payload) in stmts.iter().zip(&param_refs).zip(payloads) {
            let prepared = &self.statements[&stmt.sql];
            futures.push(match payload {
                // tokio-postgres sends no later request until this COPY's data is done, so
                // the pipeline keeps its order.
                Some(data) => Box::pin(async move {
                    let sink = client.copy_in::<_, Bytes>(prepared).await?;
                    let mut sink = std::pin::pin!(sink);
                    sink.send(data).await?;
                    sink.as_mut().finish().await.map(drop)
                }),
                None => Box::pin(async move { client.execute(prepared, params).await.map(drop) }),
            });
        }
        for step in &steps {
            let prepared = &self.statements[&self.step_sql(*step)];
            let params: &[&(dyn ToSql + Sync)] = match step {
                Step::DeadLetters => &dead_refs,
                Step::Forget => forget_refs.as_ref().map_or(&[], |r| r.as_slice()),
                // The fence check: a shared lock first, so the guarded statement's snapshot
                // sees any claim that committed while this batch waited for it.
                Step::Lock => &lock_refs,
                Step::Checkpoint => &ck_refs,
                Step::ReplayGuard => &guard_refs,
                Step::Remove => &remove_refs,
            };
            futures.push(Box::pin(async move {
                client.execute(prepared, params).await.map(drop)
            }));
        }
        futures.push(Box::pin(client.batch_execute("COMMIT")));
        let outcomes = pipeline::run(futures).await;
        let Some((index, err)) = pipeline::first_error(outcomes) else {
            return Ok(());
        };
        let sink = self.shared.sink();
        let doing = match index {
            0 => "starting a transaction".to_owned(),
            i if i <= stmts.len() => {
                let stmt = &stmts[i - 1];
                let source = stmt_source(tables, prelude, stmt);
                let target = match refs.get(stmt.table) {
                    Some(t) if stmt.kind != Kind::Truncate || !tables.is_empty() => {
                        t.target.clone()
                    }
                    _ => qualified(self.shared.target_schema(source), &source.name),
                };
                sql::describe(stmt, &target, source)
            }
            i if i <= stmts.len() + steps.len() => match steps[i - stmts.len() - 1] {
                Step::DeadLetters => "recording dead letters".to_owned(),
                Step::Forget => "removing dead letters a truncate supersedes".to_owned(),
                Step::Lock => "taking the claim's shared lock".to_owned(),
                Step::Checkpoint | Step::ReplayGuard
                    if fence::is_guard_failure(&err)
                        || err.code()
                            == Some(&tokio_postgres::error::SqlState::DIVISION_BY_ZERO) =>
                {
                    return Err(fence::fenced(&self.shared).await.into());
                }
                Step::Checkpoint => format!(
                    "moving lane {}'s checkpoint in {} to {position}",
                    self.lane,
                    qualified(self.shared.checkpoint_schema(), crate::checkpoint::TABLE)
                ),
                Step::ReplayGuard => "checking the claim".to_owned(),
                Step::Remove => "removing replayed dead letters".to_owned(),
            },
            _ => "committing".to_owned(),
        };
        let mut error = sink_error(sink, &doing, &err);
        let lost = connection_lost(&err);
        let conflict = (1..=stmts.len()).contains(&index)
            && matches!(stmts[index - 1].kind, Kind::Insert | Kind::Copy)
            && err.code().is_some_and(|c| c.code() == "23505");
        if conflict {
            return Err(Failure {
                error,
                lost,
                conflict,
            });
        }
        if error.class == ErrorClass::Definite && !lost && (1..=stmts.len()).contains(&index) {
            let stmt = &stmts[index - 1];
            let key = match stmt.kind {
                // COPY names the row ("line") it failed at.
                Kind::Copy => copy_line(&err).and_then(|line| {
                    let group = tables.get(stmt.table)?.upserts.get(stmt.group)?;
                    let row = group.rows[stmt.rows.clone()].get(line.checked_sub(1)?)?;
                    let key = group.shape.key.iter().map(|&i| &row.values()[i]);
                    Some(sql::key_text(group.shape, key))
                }),
                _ => self.blame(stmt, tables).await,
            };
            if let Some(key) = key {
                error.message.push_str(&format!(" (row key {key})"));
            }
        }
        Err(Failure {
            error,
            lost,
            conflict: false,
        })
    }
}

/// The source table a statement writes: its plan table, or the prelude's for a truncate
/// prelude (which has no plan).
fn stmt_source<'t>(
    tables: &'t [TablePlan<'t>],
    prelude: &'t Prelude<'t>,
    stmt: &Stmt<'_>,
) -> &'t Table {
    match (tables.get(stmt.table), prelude) {
        (Some(plan), _) => plan.source,
        (None, Prelude::Truncate(table)) => table,
        (None, Prelude::Move(change, _)) => &change.table,
        (None, Prelude::None) => unreachable!("a statement always belongs to a table"),
    }
}

impl LaneSink for PostgresLane {
    fn checkpoint(&self) -> Option<Position> {
        self.checkpoint
    }

    fn apply<'a>(&'a mut self, batch: &'a Batch) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let shared = Arc::clone(&self.shared);
            // Columns the source gained are added first, outside the batch's transaction.
            self.fit_shapes(&batch.changes).await?;
            if let [change] = batch.changes.as_slice()
                && let Some(old_key) = &change.old_key
                && change.values.contains(&Value::Unchanged)
            {
                // The lane worker isolates such a change in its own batch (see
                // `crate::lane::is_toast_move`); the row moves in place so the TOASTed values
                // the update did not send stay with it, then the upsert writes the rest.
                let upsert = [Change {
                    old_key: None,
                    ..Change::clone(change)
                }];
                let tables = coalesce(&upsert, shared.sink())?;
                let tail = Tail::Checkpoint {
                    position: batch.last_position(),
                    dead: &batch.dead_letters,
                    forget: None,
                };
                return self
                    .write(Prelude::Move(change, old_key), &tables, tail)
                    .await;
            }
            let mut tables = coalesce(&batch.changes, shared.sink())?;
            sql::partition_fresh(&mut tables);
            let tail = Tail::Checkpoint {
                position: batch.last_position(),
                dead: &batch.dead_letters,
                forget: None,
            };
            self.write(Prelude::None, &tables, tail).await
        })
    }

    fn truncate<'a>(
        &'a mut self,
        table: &'a Table,
        position: Position,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let source_table = table.qualified_name();
            let tail = Tail::Checkpoint {
                position,
                dead: &[],
                forget: self.dead_letter_table.then_some(source_table.as_str()),
            };
            self.write(Prelude::Truncate(table), &[], tail).await
        })
    }

    fn reconnect(&mut self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            self.forget_connection();
            // The batch about to be retried may have committed after all (a lost reply).
            self.safe_batches = self.safe_batches.max(1);
            self.client = Some(self.shared.connect().await?);
            Ok(())
        })
    }

    fn parked(&self) -> Vec<ParkedKey> {
        self.parked.clone()
    }

    fn replay<'a>(
        &'a mut self,
        changes: &'a [Change],
        ids: &'a [u64],
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let shared = Arc::clone(&self.shared);
            self.fit_shapes(changes).await?;
            // Replayed rows may meet any state of the sink: upserts only.
            self.safe_batches = self.safe_batches.max(1);
            let tables = coalesce(changes, shared.sink())?;
            self.write(Prelude::None, &tables, Tail::Replay(ids)).await
        })
    }
}
