//! The snapshot state table in PostgreSQL; the bulk path that loads chunks is in `bulk.rs`.
//!
//! A chunk's rows go in with `COPY … FROM STDIN` (text format) straight into the target
//! table, inside a savepoint: on an empty table — the usual case, each chunk being a disjoint
//! key range — that is PostgreSQL's fastest load path, the one `pg_dump | psql` takes. When a
//! row with the same key is already there (the table was not emptied, or a resumed chunk
//! overlaps what the stream wrote), the `COPY` fails with a unique violation, the savepoint
//! is rolled back and that table's rows go through the lanes' upsert statements instead
//! (`INSERT … ON CONFLICT DO UPDATE`), which replace rows by key. The rows and the chunk's
//! "loaded" mark in [`TABLE`] commit in one transaction, on a connection of the sink's own
//! (kept in a small pool between chunks; chunks load concurrently).
//!
//! COPY text format (<https://www.postgresql.org/docs/15/sql-copy.html#id-1.9.3.55.9.2>):
//! columns separated by tabs, rows by newlines, `\N` for NULL, and backslash, tab, newline
//! and carriage return escaped with a backslash. Values are written in each type's input
//! syntax (`encode::push_text`), which the session's `DateStyle=ISO`/`TimeZone=UTC` parse back
//! exactly.
//!
//! The state table holds, per (pipeline, sink connector): a marker row (`source_table` = '',
//! `chunk` = -1; `done_at` NULL while pending, set when complete) and one row per planned chunk
//! (`done_at` set once loaded, with `loaded_rows`). The next snapshot replaces them.

use std::sync::Arc;

use super::Shared;
use super::errors::sink_error;
use super::sql::qualified;
use crate::change::Table;
use crate::sink::{SinkError, SnapshotChunk, SnapshotState};

/// Name of the snapshot state table, next to the checkpoint table.
pub(crate) const TABLE: &str = "_zipline_snapshot";

pub(super) fn state_table(shared: &Shared) -> String {
    qualified(shared.checkpoint_schema(), TABLE)
}

/// `CREATE TABLE IF NOT EXISTS` for the state table.
fn create_sql(shared: &Shared) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\
         pipeline varchar(128) COLLATE \"C\" NOT NULL, \
         connector varchar(128) COLLATE \"C\" NOT NULL, \
         source_table text COLLATE \"C\" NOT NULL, chunk integer NOT NULL, \
         key_column text, lower_bound text, upper_bound text, loaded_rows bigint, \
         done_at timestamptz, PRIMARY KEY (pipeline, connector, source_table, chunk))",
        state_table(shared)
    )
}

pub(super) fn state_error(shared: &Shared, doing: &str, e: &tokio_postgres::Error) -> SinkError {
    sink_error(
        shared.sink(),
        &format!("{doing} in {}", state_table(shared)),
        e,
    )
}

/// What the sink holds of the pipeline (see `CheckpointStore::history`).
pub(super) async fn history(shared: &Shared) -> Result<crate::sink::SinkHistory, SinkError> {
    let client = shared.connect().await?;
    let err = |e: tokio_postgres::Error| state_error(shared, "reading the snapshot state", &e);
    client
        .batch_execute(&create_sql(shared))
        .await
        .map_err(err)?;
    let o = &shared.options;
    let row = client
        .query_one(
            &format!(
                "SELECT coalesce(bool_or(chunk < 0), false), \
                 coalesce(bool_or(chunk >= 0 AND coalesce(loaded_rows, 0) > 0), false) \
                 FROM {} WHERE pipeline = $1::text AND connector = $2::text",
                state_table(shared)
            ),
            &[&shared.pipeline, &o.name],
        )
        .await
        .map_err(err)?;
    let checkpoints = super::checkpoint::any_rows(
        &client,
        shared.checkpoint_schema(),
        &shared.pipeline,
        &o.name,
    )
    .await
    .map_err(|e| sink_error(shared.sink(), "reading the lane checkpoints", &e))?;
    Ok(crate::sink::snapshot::history(
        row.get(0),
        row.get(1),
        checkpoints,
    ))
}

/// What the sink holds of the pipeline's snapshot.
pub(super) async fn state(shared: &Shared) -> Result<SnapshotState, SinkError> {
    let client = shared.connect().await?;
    client
        .batch_execute(&create_sql(shared))
        .await
        .map_err(|e| state_error(shared, "creating the snapshot state table", &e))?;
    let rows = client
        .query(
            &format!(
                "SELECT source_table, chunk, key_column, lower_bound, upper_bound, \
                 done_at IS NOT NULL FROM {} WHERE pipeline = $1::text AND connector = $2::text \
                 ORDER BY source_table, chunk",
                state_table(shared)
            ),
            &[&shared.pipeline, &shared.options.name],
        )
        .await
        .map_err(|e| state_error(shared, "reading the snapshot state", &e))?;
    let mut complete = None;
    let mut chunks = Vec::new();
    for r in &rows {
        let (table, chunk, done): (String, i32, bool) = (r.get(0), r.get(1), r.get(5));
        if table.is_empty() && chunk < 0 {
            complete = Some(done);
        } else if let Ok(index) = u32::try_from(chunk) {
            let planned = SnapshotChunk {
                table,
                index,
                column: r.get::<_, Option<String>>(2).unwrap_or_default(),
                lower: r.get(3),
                upper: r.get(4),
            };
            chunks.push((planned, done));
        }
    }
    Ok(match complete {
        None => SnapshotState::None,
        Some(true) => SnapshotState::Complete,
        Some(false) => SnapshotState::Pending(chunks),
    })
}

/// Replaces the pipeline's snapshot state with a pending snapshot planned as `chunks`.
pub(super) async fn begin(shared: &Shared, chunks: &[SnapshotChunk]) -> Result<(), SinkError> {
    let client = shared.connect().await?;
    let table = state_table(shared);
    let owner: [&(dyn tokio_postgres::types::ToSql + Sync); 2] =
        [&shared.pipeline, &shared.options.name];
    let names: Vec<&str> = chunks.iter().map(|c| c.table.as_str()).collect();
    let indexes: Vec<i32> = chunks
        .iter()
        .map(|c| i32::try_from(c.index).unwrap_or(i32::MAX))
        .collect();
    let columns: Vec<&str> = chunks.iter().map(|c| c.column.as_str()).collect();
    let lowers: Vec<Option<&str>> = chunks.iter().map(|c| c.lower.as_deref()).collect();
    let uppers: Vec<Option<&str>> = chunks.iter().map(|c| c.upper.as_deref()).collect();
    let doing = "recording a pending snapshot and its plan";
    let err = |e: tokio_postgres::Error| state_error(shared, doing, &e);
    client
        .batch_execute(&create_sql(shared))
        .await
        .map_err(err)?;
    client.batch_execute("BEGIN").await.map_err(err)?;
    let result = async {
        super::fence::check_in_tx(&client, shared).await?;
        client
            .execute(
                &format!("DELETE FROM {table} WHERE pipeline = $1::text AND connector = $2::text"),
                &owner,
            )
            .await
            .map_err(err)?;
        client
            .execute(
                &format!(
                    "INSERT INTO {table} (pipeline, connector, source_table, chunk) \
                     VALUES ($1::text, $2::text, '', -1)"
                ),
                &owner,
            )
            .await
            .map_err(err)?;
        client
            .execute(
                &format!(
                    "INSERT INTO {table} (pipeline, connector, source_table, chunk, key_column, \
                     lower_bound, upper_bound) SELECT $1::text, $2::text, u.* FROM \
                     unnest($3::text[], $4::int4[], $5::text[], $6::text[], $7::text[]) AS u"
                ),
                &[
                    owner[0], owner[1], &names, &indexes, &columns, &lowers, &uppers,
                ],
            )
            .await
            .map_err(err)?;
        client.batch_execute("COMMIT").await.map_err(err)
    }
    .await;
    if result.is_err() {
        let _ = client.batch_execute("ROLLBACK").await;
    }
    result
}

/// Empties the sink tables of `tables` (`TRUNCATE`, else `DELETE FROM` when truncating is
/// refused, e.g. a table other tables' foreign keys point at).
pub(super) async fn clear(shared: &Shared, tables: &[Arc<Table>]) -> Result<(), SinkError> {
    let client = shared.connect().await?;
    let err = |e: tokio_postgres::Error| sink_error(shared.sink(), "checking the claim", &e);
    // Each table is emptied in a fenced transaction of its own.
    for table in tables {
        client.batch_execute("BEGIN").await.map_err(err)?;
        if let Err(e) = super::fence::check_in_tx(&client, shared).await {
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(e);
        }
        let target = qualified(shared.target_schema(table), &table.name);
        client
            .batch_execute("SAVEPOINT zipline_truncate")
            .await
            .map_err(err)?;
        if let Err(e) = client.batch_execute(&format!("TRUNCATE {target}")).await {
            tracing::debug!(sink = shared.sink(), table = %target, error = %e, "TRUNCATE refused; deleting instead");
            let deleted = async {
                client
                    .batch_execute("ROLLBACK TO SAVEPOINT zipline_truncate")
                    .await?;
                client.batch_execute(&format!("DELETE FROM {target}")).await
            };
            if let Err(e) = deleted.await {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(sink_error(shared.sink(), &format!("emptying {target}"), &e));
            }
        }
        client.batch_execute("COMMIT").await.map_err(err)?;
        tracing::warn!(sink = shared.sink(), table = %target, "emptied for a new snapshot");
    }
    Ok(())
}

/// Marks the snapshot complete.
pub(super) async fn finish(shared: &Shared) -> Result<(), SinkError> {
    let client = shared.connect().await?;
    let err = |e: tokio_postgres::Error| state_error(shared, "marking the snapshot complete", &e);
    client.batch_execute("BEGIN").await.map_err(err)?;
    if let Err(e) = super::fence::check_in_tx(&client, shared).await {
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(e);
    }
    client
        .execute(
            &format!(
                "UPDATE {} SET done_at = clock_timestamp() WHERE pipeline = $1::text \
                 AND connector = $2::text AND source_table = '' AND chunk = -1",
                state_table(shared)
            ),
            &[&shared.pipeline, &shared.options.name],
        )
        .await
        .map_err(err)?;
    client.batch_execute("COMMIT").await.map_err(err)
}
