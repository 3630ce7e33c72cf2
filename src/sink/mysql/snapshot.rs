//! The snapshot state table in MySQL/MariaDB; the bulk path that loads chunks is in
//! `infile.rs`.
//!
//! A chunk is written with `LOAD DATA LOCAL INFILE … REPLACE`, its rows streamed from memory
//! through mysql_async's per-connection infile handler — the fastest way into InnoDB, about
//! twice the rate of multi-row `INSERT … ON DUPLICATE KEY UPDATE` here. `REPLACE` makes a row
//! already in the sink with the same key give way to the snapshot's (deleted, then inserted:
//! its DELETE and INSERT triggers fire; columns the source lacks get their defaults). The
//! rows and the chunk's "loaded" mark in [`TABLE`] commit in one transaction.
//!
//! The data format is spelled out rather than left to defaults: under `NO_BACKSLASH_ESCAPES`
//! (the lane session's mode) `LOAD DATA` would have no escape character, and `'\t'` would be
//! two characters. So: fields end at `X'09'`, lines at `X'0a'`, the escape is `X'5c'`
//! (backslash), `\N` is NULL, and `CHARACTER SET binary` passes bytes through unconverted
//! (text is UTF-8 already; `bytea` goes in raw). Data is sent in pieces of at most
//! [`PIECE`] bytes, each one protocol packet, well under `max_allowed_packet`
//! (<https://mariadb.com/kb/en/load-data-infile/>).
//!
//! A server that refuses local infile (MySQL 8's default `local_infile=OFF`: error 3948;
//! MariaDB: 1148 or 4166) gets the lanes' multi-row upserts instead, from then on; so does a
//! sink table with a unique key besides its key, where `REPLACE` would delete the *other* row
//! that conflicts on it (the upserts' key guard fails the row instead, see `unique.rs`).
//!
//! The state table holds, per (pipeline, sink connector): a marker row (`source_table` = '',
//! `chunk` = -1; `done_at` NULL while pending, set when complete) and one row per planned
//! chunk (`done_at` set once loaded, with `loaded_rows`). Chunk rows stay after completion as
//! a record of what was copied; the next snapshot replaces them.

use std::sync::Arc;

use mysql_async::prelude::Queryable;

use super::errors::sink_error;
use super::literal::{push_ident, push_str};
use super::{Shared, close};
use crate::change::Table;
use crate::sink::{SinkError, SnapshotChunk, SnapshotState};

/// Name of the snapshot state table, next to the checkpoint table.
pub(crate) const TABLE: &str = "_zipline_snapshot";

/// `CREATE TABLE IF NOT EXISTS` for the state table in `database`.
pub(crate) fn create_table_sql(database: &str) -> String {
    let mut sql = String::from("CREATE TABLE IF NOT EXISTS ");
    push_table(&mut sql, database);
    sql.push_str(
        " (pipeline VARCHAR(128) NOT NULL, connector VARCHAR(128) NOT NULL, \
         source_table VARCHAR(255) NOT NULL, chunk INT NOT NULL, \
         key_column VARCHAR(255) NULL, lower_bound LONGTEXT NULL, upper_bound LONGTEXT NULL, \
         loaded_rows BIGINT NULL, done_at TIMESTAMP(6) NULL, \
         PRIMARY KEY (pipeline, connector, source_table, chunk)) \
         ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    );
    sql
}

fn push_table(buf: &mut String, database: &str) {
    push_ident(buf, database);
    buf.push('.');
    push_ident(buf, TABLE);
}

fn push_owner(buf: &mut String, shared: &Shared) {
    buf.push_str(" WHERE pipeline=");
    push_str(buf, &shared.pipeline);
    buf.push_str(" AND connector=");
    push_str(buf, &shared.options.name);
}

fn push_opt_str(buf: &mut String, value: Option<&str>) {
    match value {
        Some(v) => push_str(buf, v),
        None => buf.push_str("NULL"),
    }
}

/// `INSERT` of state rows for `chunks` (`None`: the marker), with `done` as `done_at` and
/// `loaded` as `loaded_rows`; on a duplicate only those two change.
pub(super) fn push_rows(
    buf: &mut String,
    shared: &Shared,
    chunks: &[Option<&SnapshotChunk>],
    done: &str,
    loaded: Option<u64>,
) {
    buf.push_str("INSERT INTO ");
    push_table(buf, &shared.options.database);
    buf.push_str(
        " (pipeline,connector,source_table,chunk,key_column,lower_bound,upper_bound,\
         loaded_rows,done_at) VALUES ",
    );
    for (n, chunk) in chunks.iter().enumerate() {
        if n > 0 {
            buf.push(',');
        }
        buf.push('(');
        push_str(buf, &shared.pipeline);
        buf.push(',');
        push_str(buf, &shared.options.name);
        buf.push(',');
        match chunk {
            Some(c) => {
                push_str(buf, &c.table);
                buf.push_str(&format!(",{},", c.index));
                push_str(buf, &c.column);
                buf.push(',');
                push_opt_str(buf, c.lower.as_deref());
                buf.push(',');
                push_opt_str(buf, c.upper.as_deref());
            }
            None => buf.push_str("'',-1,NULL,NULL,NULL"),
        }
        match loaded {
            Some(rows) => buf.push_str(&format!(",{rows},")),
            None => buf.push_str(",NULL,"),
        }
        buf.push_str(done);
        buf.push(')');
    }
    buf.push_str(
        " ON DUPLICATE KEY UPDATE loaded_rows=VALUES(loaded_rows),done_at=VALUES(done_at)",
    );
}

pub(super) fn state_error(shared: &Shared, doing: &str, e: &mysql_async::Error) -> SinkError {
    sink_error(shared.sink(), &format!("{doing} in {TABLE}"), e)
}

/// What the sink holds of the pipeline (see `CheckpointStore::history`).
pub(super) async fn history(shared: &Shared) -> Result<crate::sink::SinkHistory, SinkError> {
    let mut conn = shared.connect().await?;
    let result = async {
        let err = |e: mysql_async::Error| state_error(shared, "reading the snapshot state", &e);
        conn.query_drop(create_table_sql(&shared.options.database))
            .await
            .map_err(err)?;
        let mut sql = String::from(
            "SELECT IFNULL(MAX(chunk < 0), 0), \
             IFNULL(MAX(chunk >= 0 AND IFNULL(loaded_rows, 0) > 0), 0) FROM ",
        );
        push_table(&mut sql, &shared.options.database);
        push_owner(&mut sql, shared);
        let (marker, loaded): (bool, bool) = conn
            .query_first(sql)
            .await
            .map_err(err)?
            .unwrap_or_default();
        let o = &shared.options;
        let checkpoints =
            super::checkpoint::any_rows(&mut conn, &o.database, &shared.pipeline, &o.name)
                .await
                .map_err(|e| sink_error(shared.sink(), "reading the lane checkpoints", &e))?;
        Ok(crate::sink::snapshot::history(marker, loaded, checkpoints))
    }
    .await;
    close(conn).await;
    result
}

/// What the sink holds of the pipeline's snapshot.
pub(super) async fn state(shared: &Shared) -> Result<SnapshotState, SinkError> {
    let mut conn = shared.connect().await?;
    let result = async {
        conn.query_drop(create_table_sql(&shared.options.database))
            .await
            .map_err(|e| state_error(shared, "creating the snapshot state table", &e))?;
        let mut sql = String::from(
            "SELECT source_table, chunk, key_column, lower_bound, upper_bound, \
             done_at IS NOT NULL FROM ",
        );
        push_table(&mut sql, &shared.options.database);
        push_owner(&mut sql, shared);
        sql.push_str(" ORDER BY source_table, chunk");
        let rows: Vec<StateRow> = conn
            .query(sql)
            .await
            .map_err(|e| state_error(shared, "reading the snapshot state", &e))?;
        Ok(state_from_rows(rows))
    }
    .await;
    close(conn).await;
    result
}

/// (source_table, chunk, key_column, lower_bound, upper_bound, loaded) of a state row.
type StateRow = (
    String,
    i64,
    Option<String>,
    Option<String>,
    Option<String>,
    bool,
);

fn state_from_rows(rows: Vec<StateRow>) -> SnapshotState {
    let mut marker = None;
    let mut chunks = Vec::new();
    for (table, chunk, column, lower, upper, done) in rows {
        match u32::try_from(chunk) {
            Err(_) if table.is_empty() => marker = Some(done),
            Ok(index) => chunks.push((
                SnapshotChunk {
                    table,
                    index,
                    column: column.unwrap_or_default(),
                    lower,
                    upper,
                },
                done,
            )),
            Err(_) => {}
        }
    }
    match marker {
        None => SnapshotState::None,
        Some(true) => SnapshotState::Complete,
        Some(false) => SnapshotState::Pending(chunks),
    }
}

/// Replaces the pipeline's snapshot state with a pending snapshot planned as `chunks`.
pub(super) async fn begin(shared: &Shared, chunks: &[SnapshotChunk]) -> Result<(), SinkError> {
    let mut conn = shared.connect().await?;
    let result = async {
        conn.query_drop(create_table_sql(&shared.options.database))
            .await
            .map_err(|e| state_error(shared, "creating the snapshot state table", &e))?;
        conn.query_drop("START TRANSACTION")
            .await
            .map_err(|e| state_error(shared, "recording a pending snapshot", &e))?;
        super::fence::check_locked(&mut conn, shared).await?;
        let mut sql = String::from("DELETE FROM ");
        push_table(&mut sql, &shared.options.database);
        push_owner(&mut sql, shared);
        sql.push(';');
        push_rows(&mut sql, shared, &[None], "NULL", None);
        conn.query_drop(sql)
            .await
            .map_err(|e| state_error(shared, "recording a pending snapshot", &e))?;
        for part in chunks.chunks(500) {
            let mut sql = String::new();
            let part: Vec<Option<&SnapshotChunk>> = part.iter().map(Some).collect();
            push_rows(&mut sql, shared, &part, "NULL", None);
            conn.query_drop(sql)
                .await
                .map_err(|e| state_error(shared, "recording the snapshot plan", &e))?;
        }
        conn.query_drop("COMMIT")
            .await
            .map_err(|e| state_error(shared, "recording the snapshot plan", &e))
    }
    .await;
    close(conn).await;
    result
}

/// Empties the sink tables of `tables`: `TRUNCATE TABLE` (fast, but it needs the DROP
/// privilege and no foreign key pointing at the table), else `DELETE FROM`.
pub(super) async fn clear(shared: &Shared, tables: &[Arc<Table>]) -> Result<(), SinkError> {
    let mut conn = shared.connect().await?;
    let result = async {
        // TRUNCATE commits by itself, so the claim is checked right before, not with it.
        conn.query_drop("START TRANSACTION")
            .await
            .map_err(|e| state_error(shared, "checking the claim", &e))?;
        super::fence::check_locked(&mut conn, shared).await?;
        conn.query_drop("COMMIT")
            .await
            .map_err(|e| state_error(shared, "checking the claim", &e))?;
        for table in tables {
            let mut target = String::new();
            push_ident(&mut target, &shared.options.database);
            target.push('.');
            push_ident(&mut target, &table.name);
            if let Err(e) = conn.query_drop(format!("TRUNCATE TABLE {target}")).await {
                tracing::debug!(sink = shared.sink(), table = %target, error = %e, "TRUNCATE refused; deleting instead");
                conn.query_drop(format!("DELETE FROM {target}"))
                    .await
                    .map_err(|e| sink_error(shared.sink(), &format!("emptying {target}"), &e))?;
            }
            tracing::warn!(sink = shared.sink(), table = %target, "emptied for a new snapshot");
        }
        Ok(())
    }
    .await;
    close(conn).await;
    result
}

/// Marks the snapshot complete.
pub(super) async fn finish(shared: &Shared) -> Result<(), SinkError> {
    let mut conn = shared.connect().await?;
    let result = async {
        let err = |e: mysql_async::Error| state_error(shared, "marking the snapshot complete", &e);
        conn.query_drop("START TRANSACTION").await.map_err(err)?;
        super::fence::check_locked(&mut conn, shared).await?;
        let mut sql = String::new();
        push_rows(&mut sql, shared, &[None], "CURRENT_TIMESTAMP(6)", None);
        sql.push_str(";COMMIT");
        conn.query_drop(sql).await.map_err(err)
    }
    .await;
    close(conn).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_rows_become_a_state() {
        assert_eq!(state_from_rows(vec![]), SnapshotState::None);
        let marker = |done| (String::new(), -1, None, None, None, done);
        assert_eq!(state_from_rows(vec![marker(true)]), SnapshotState::Complete);
        let chunk = (
            "public.t".to_owned(),
            0,
            Some("id".to_owned()),
            None,
            Some("10".to_owned()),
            true,
        );
        assert_eq!(
            state_from_rows(vec![marker(false), chunk]),
            SnapshotState::Pending(vec![(
                SnapshotChunk {
                    table: "public.t".into(),
                    index: 0,
                    column: "id".into(),
                    lower: None,
                    upper: Some("10".into()),
                },
                true
            )])
        );
    }
}
