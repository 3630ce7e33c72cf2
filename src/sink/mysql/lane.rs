//! One lane's writer: its connection, checkpoint and SQL buffer, and the transaction of a
//! batch (see the parent module's docs).

use std::fmt;
use std::sync::Arc;

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use super::errors::{self, sink_error};
use super::literal::{push_ident, push_value};
use super::plan::{Bulk, Plan, StmtInfo};
use super::{ROLLBACK_TIMEOUT, Shared, checkpoint, close, dead_letter, fence, unique};
use crate::change::{Change, Position, Table, Value};
use crate::error::ErrorClass;
use crate::sink::{Batch, BoxFuture, DeadLetter, LaneSink, ParkedKey, SinkError, SinkErrorKind};

/// One lane's writer: its connection, checkpoint and SQL buffer.
pub(super) struct MysqlLane {
    pub(super) shared: Arc<Shared>,
    /// `None` after a broken connection; `apply` connects again.
    pub(super) conn: Option<Conn>,
    pub(super) lane: u32,
    pub(super) lanes: u32,
    pub(super) checkpoint: Option<Position>,
    /// Reused for every statement.
    pub(super) buf: String,
    /// Reused for every bulk statement (MariaDB only, see `plan/bulk.rs`).
    pub(super) bulk: Bulk,
    /// A transaction was started and not yet ended: a previous call was cancelled midway.
    pub(super) in_tx: bool,
    /// Table shapes the sink tables are known to fit (see `evolve.rs`).
    pub(super) shapes: crate::sink::shapes::KnownShapes,
    /// This lane's keys with dead letters, as loaded when it opened.
    pub(super) parked: Vec<ParkedKey>,
    /// The dead-letter table exists (a truncate then removes the dead letters it supersedes).
    pub(super) dead_letter_table: bool,
}

/// How a lane's transaction ends.
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

impl fmt::Debug for MysqlLane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlLane")
            .field("sink", &self.shared.sink())
            .field("lane", &self.lane)
            .field("lanes", &self.lanes)
            .field("checkpoint", &self.checkpoint)
            .finish_non_exhaustive()
    }
}

impl MysqlLane {
    /// Writes `plan` and ends the transaction as `tail` says, all in one transaction.
    async fn write(
        &mut self,
        mut plan: Plan<'_>,
        prelude: Option<&str>,
        tail: Tail<'_>,
    ) -> Result<(), SinkError> {
        if self.in_tx {
            // A cancelled call left a transaction open; closing the connection rolls it back.
            self.drop_conn().await;
        }
        if self.conn.is_none() {
            self.conn = Some(self.shared.connect().await?);
        }
        let conn = self.conn.as_mut().expect("connected above");
        let shared = &self.shared;
        if let Err(e) = shared
            .types
            .ensure(conn, &shared.options.database, plan.shapes())
            .await
        {
            let err = sink_error(shared.sink(), "reading the sink tables' column types", &e);
            if errors::connection_lost(&e) {
                self.drop_conn().await;
            }
            return Err(err);
        }
        let moved = match &tail {
            Tail::Checkpoint { position, .. } => Some(*position),
            Tail::Replay(_) => None,
        };
        let result = self.run(&mut plan, prelude, tail).await;
        if let Err((err, broken)) = &result {
            if *broken {
                self.drop_conn().await;
            } else if self.in_tx {
                self.rollback().await;
            }
            tracing::debug!(sink = self.shared.sink(), lane = self.lane, error = %err.report(), "batch failed");
        }
        result.map_err(|(err, _)| err)?;
        if moved.is_some() {
            self.checkpoint = moved;
        }
        Ok(())
    }

    /// The transaction itself. On error, also says whether the connection is unusable.
    async fn run(
        &mut self,
        plan: &mut Plan<'_>,
        prelude: Option<&str>,
        tail: Tail<'_>,
    ) -> Result<(), (SinkError, bool)> {
        let Self {
            shared,
            conn,
            buf,
            bulk,
            in_tx,
            lane,
            lanes,
            ..
        } = self;
        let conn = conn.as_mut().expect("connected above");
        let sink = shared.sink();
        let mut bulk = (shared.mariadb.get() == Some(&true)).then_some(bulk);
        buf.clear();
        buf.push_str("START TRANSACTION;");
        if let Some(prelude) = prelude {
            buf.push_str(prelude);
            *in_tx = true;
            if let Err(e) = conn.query_drop(buf.as_str()).await {
                let err = sink_error(sink, "moving a row to its new key", &e);
                return Err((err, errors::connection_lost(&e)));
            }
            buf.clear();
        }
        loop {
            let info: StmtInfo = match plan.next_step(buf, bulk.as_deref_mut()) {
                Ok(Some(info)) => info,
                Ok(None) => break,
                Err(e) => return Err((e, false)),
            };
            let sent = match bulk.as_deref_mut().filter(|_| info.bulk) {
                Some(bulk) => {
                    if !*in_tx {
                        // A prepared statement cannot carry `START TRANSACTION` along.
                        *in_tx = true;
                        if let Err(e) = conn.query_drop("START TRANSACTION").await {
                            let err = sink_error(sink, "starting a transaction", &e);
                            return Err((err, errors::connection_lost(&e)));
                        }
                        buf.clear();
                    }
                    conn.exec_batch(bulk.sql.as_str(), bulk.params.drain(..))
                        .await
                }
                None => {
                    *in_tx = true;
                    conn.query_drop(buf.as_str()).await
                }
            };
            if let Err(e) = sent {
                let mut err = sink_error(sink, &plan.describe(info), &e);
                if unique::is_conflict(&e)
                    && let Some((shape, rows)) = plan.upsert_rows(info)
                {
                    err.kind = SinkErrorKind::UniqueConflict;
                    let database = &shared.options.database;
                    if let Some(what) = unique::explain(conn, database, shape, rows).await {
                        err.message = format!(
                            "sink {sink}: {}: {what}. {}",
                            plan.describe(info),
                            unique::HINT
                        );
                    }
                } else if err.class == ErrorClass::Definite
                    && let Some(key) = errors::row_number(&e).and_then(|n| plan.row_key(info, n))
                {
                    err.message.push_str(&format!(" (row key {key})"));
                }
                return Err((err, errors::connection_lost(&e)));
            }
            buf.clear();
        }
        if !*in_tx {
            buf.clear();
            buf.push_str("START TRANSACTION;");
        }
        *in_tx = true;
        let dead_table = &shared.options.dead_letter_table;
        let (position, dead, forget) = match tail {
            Tail::Checkpoint {
                position,
                dead,
                forget,
            } => (position, dead, forget),
            Tail::Replay(ids) => {
                let doing = "removing replayed dead letters and committing";
                let fail = |e: &mysql_async::Error| {
                    (sink_error(sink, doing, e), errors::connection_lost(e))
                };
                if !buf.is_empty() {
                    conn.query_drop(buf.as_str()).await.map_err(|e| fail(&e))?;
                    buf.clear();
                }
                fence::check_locked(conn, shared)
                    .await
                    .map_err(|e| (e, false))?;
                dead_letter::push_remove(buf, shared, dead_table, ids);
                buf.push_str(";COMMIT");
                conn.query_drop(buf.as_str()).await.map_err(|e| fail(&e))?;
                *in_tx = false;
                return Ok(());
            }
        };
        if !dead.is_empty() {
            dead_letter::push_insert(buf, shared, dead_table, dead);
            buf.push(';');
        }
        if let Some(source_table) = forget {
            dead_letter::push_forget(buf, shared, dead_table, source_table, position);
            buf.push(';');
        }
        let key = shared.lane_key(*lane, *lanes);
        let epoch = fence::epoch(shared).map_err(|e| (e, false))?;
        checkpoint::push_upsert(buf, &shared.options.database, &key, position, epoch);
        buf.push_str(";COMMIT");
        if let Err(e) = conn.query_drop(buf.as_str()).await {
            if fence::is_guard_failure(&e) {
                return Err((fence::fenced(shared).await, false));
            }
            let doing = format!(
                "{}moving lane {lane}'s checkpoint in {} to {position} and committing",
                if dead.is_empty() {
                    ""
                } else {
                    "recording dead letters, "
                },
                crate::checkpoint::TABLE
            );
            return Err((sink_error(sink, &doing, &e), errors::connection_lost(&e)));
        }
        *in_tx = false;
        Ok(())
    }

    async fn rollback(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        match tokio::time::timeout(ROLLBACK_TIMEOUT, conn.query_drop("ROLLBACK")).await {
            Ok(Ok(())) => self.in_tx = false,
            _ => self.drop_conn().await,
        }
    }

    /// Drops the connection without waiting long for a graceful close (the socket may be
    /// dead); the server rolls back whatever transaction it had open.
    pub(super) async fn drop_conn(&mut self) {
        if let Some(conn) = self.conn.take() {
            close(conn).await;
        }
        self.in_tx = false;
    }
}

impl LaneSink for MysqlLane {
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
                // the update did not send stay with it.
                let prelude = move_sql(&shared.options.database, change, old_key)
                    .map_err(|m| SinkError::definite(format!("sink {}: {m}", shared.sink())))?;
                let upsert = [Change {
                    old_key: None,
                    ..Change::clone(change)
                }];
                let plan = Plan::build(&upsert, &shared.options.database, shared.sink())?
                    .with_types(&shared.types);
                let tail = Tail::Checkpoint {
                    position: batch.last_position(),
                    dead: &batch.dead_letters,
                    forget: None,
                };
                return self.write(plan, Some(&prelude), tail).await;
            }
            let plan = Plan::build(&batch.changes, &shared.options.database, shared.sink())?
                .with_types(&shared.types);
            let tail = Tail::Checkpoint {
                position: batch.last_position(),
                dead: &batch.dead_letters,
                forget: None,
            };
            self.write(plan, None, tail).await
        })
    }

    fn truncate<'a>(
        &'a mut self,
        table: &'a Table,
        position: Position,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let shared = Arc::clone(&self.shared);
            let plan = Plan::delete_all(table, &shared.options.database, shared.sink());
            let source_table = table.qualified_name();
            let tail = Tail::Checkpoint {
                position,
                dead: &[],
                forget: self.dead_letter_table.then_some(source_table.as_str()),
            };
            self.write(plan, None, tail).await
        })
    }

    fn reconnect(&mut self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            self.drop_conn().await;
            // The sink may have restarted with other tables: match shapes against them again.
            self.shapes.clear();
            self.conn = Some(self.shared.connect().await?);
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
            let plan = Plan::build(changes, &shared.options.database, shared.sink())?
                .with_types(&shared.types);
            self.write(plan, None, Tail::Replay(ids)).await
        })
    }
}

/// `UPDATE` that moves the row at `old_key` to the change's key and sets the columns the
/// change carries, leaving unchanged (TOASTed) columns as stored. A following upsert of the
/// known columns covers a sink that never had the old row.
fn move_sql(database: &str, change: &Change, old_key: &[Value]) -> Result<String, String> {
    let table = &change.table;
    let mut sql = String::from("UPDATE ");
    push_ident(&mut sql, database);
    sql.push('.');
    push_ident(&mut sql, &table.name);
    sql.push_str(" SET ");
    let mut first = true;
    for (column, value) in table.columns.iter().zip(&change.values) {
        if matches!(value, Value::Unchanged) {
            continue;
        }
        if !first {
            sql.push(',');
        }
        first = false;
        push_ident(&mut sql, &column.name);
        sql.push('=');
        push_value(&mut sql, value).map_err(|e| {
            format!(
                "table {}, column {}: {e}",
                table.qualified_name(),
                column.name
            )
        })?;
    }
    sql.push_str(" WHERE ");
    for (n, (&index, value)) in table.key.iter().zip(old_key).enumerate() {
        if n > 0 {
            sql.push_str(" AND ");
        }
        push_ident(&mut sql, &table.columns[index].name);
        sql.push('=');
        push_value(&mut sql, value)
            .map_err(|e| format!("table {}, key column: {e}", table.qualified_name()))?;
    }
    Ok(sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_toast_move_updates_the_key_in_place() {
        use crate::change::{Column, Op};
        let col = |name: &str, is_key| Column {
            name: name.into(),
            type_oid: 25,
            type_modifier: -1,
            is_key,
        };
        let table = Arc::new(Table::new(
            "public".into(),
            "orders".into(),
            vec![col("id", true), col("status", false), col("note", false)],
        ));
        let change = Change {
            position: Position::default(),
            op: Op::Update,
            table,
            key: vec![Value::Int8(2)].into(),
            old_key: Some(Box::new(vec![Value::Int8(1)].into())),
            values: vec![Value::Int8(2), Value::Text("it's".into()), Value::Unchanged],
        };
        let sql = move_sql("shop", &change, &[Value::Int8(1)]).unwrap();
        assert_eq!(
            sql,
            "UPDATE `shop`.`orders` SET `id`=2,`status`='it''s' WHERE `id`=1"
        );
    }
}
