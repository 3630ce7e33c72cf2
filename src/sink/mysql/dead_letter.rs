//! The dead-letter table in MySQL/MariaDB (`on_error: dead_letter`; see `crate::lane::settle`).
//!
//! One row per dead-lettered change: its position (unique per pipeline and connector, so a
//! batch retried after a lost `COMMIT` reply records it once), table, operation, key (JSON, and
//! the key's routing hash, by which each lane finds its parked keys at start), the sink's error
//! code and reason, and the whole change in the `zipline transform test` JSON format. Rows are
//! written by the batch's own transaction, removed by `zipline dlq replay` in the transaction
//! that applies them again, and by a truncate of their table, which supersedes them.

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use super::Shared;
use super::literal::{push_ident, push_str};
use crate::change::{Change, Position};
use crate::lane::key_hash;
use crate::sink::{DeadLetter, DeadLetterRecord, ParkedKey};
use crate::transform::json::{change_to_json, key_to_json};

/// `CREATE TABLE IF NOT EXISTS` for the dead-letter table `table` in `database`.
pub(super) fn create_table_sql(database: &str, table: &str) -> String {
    let mut sql = String::from("CREATE TABLE IF NOT EXISTS ");
    push_target(&mut sql, database, table);
    sql.push_str(
        " (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, pipeline VARCHAR(128) NOT NULL, \
         connector VARCHAR(128) NOT NULL, lsn DECIMAL(39,0) NOT NULL, \
         ordinal INT UNSIGNED NOT NULL, sub INT UNSIGNED NOT NULL, \
         position VARCHAR(80) NOT NULL, source_table VARCHAR(255) NOT NULL, \
         op VARCHAR(16) NOT NULL, key_json LONGTEXT NOT NULL, \
         key_hash BIGINT UNSIGNED NOT NULL, code VARCHAR(32) NULL, reason LONGTEXT NOT NULL, \
         change_json LONGTEXT NOT NULL, \
         created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), PRIMARY KEY (id), \
         UNIQUE KEY zipline_position (pipeline, connector, lsn, ordinal, sub)) \
         ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    );
    sql
}

fn push_target(buf: &mut String, database: &str, table: &str) {
    push_ident(buf, database);
    buf.push('.');
    push_ident(buf, table);
}

fn push_owner(buf: &mut String, shared: &Shared) {
    buf.push_str(" WHERE pipeline=");
    push_str(buf, &shared.pipeline);
    buf.push_str(" AND connector=");
    push_str(buf, &shared.options.name);
}

/// The routing hash of a change's key.
fn hash_of(change: &Change) -> u64 {
    key_hash(&change.table.schema, &change.table.name, &change.key)
}

/// Appends the insert of `dead` into `table` (idempotent by position).
pub(super) fn push_insert(buf: &mut String, shared: &Shared, table: &str, dead: &[DeadLetter]) {
    use std::fmt::Write as _;
    buf.push_str("INSERT INTO ");
    push_target(buf, &shared.options.database, table);
    buf.push_str(
        " (pipeline,connector,lsn,ordinal,sub,position,source_table,op,key_json,key_hash,code,\
         reason,change_json) VALUES ",
    );
    for (n, d) in dead.iter().enumerate() {
        let c = &d.change;
        if n > 0 {
            buf.push(',');
        }
        buf.push('(');
        push_str(buf, &shared.pipeline);
        buf.push(',');
        push_str(buf, &shared.options.name);
        let p = c.position;
        let _ = write!(buf, ",{},{},{},", p.lsn.0, p.ordinal, p.sub);
        push_str(buf, &p.to_string());
        buf.push(',');
        push_str(buf, &c.table.qualified_name());
        buf.push(',');
        push_str(buf, c.op.as_str());
        buf.push(',');
        push_str(buf, &key_to_json(&c.key));
        let _ = write!(buf, ",{},", hash_of(c));
        match &d.code {
            Some(code) => push_str(buf, code),
            None => buf.push_str("NULL"),
        }
        buf.push(',');
        push_str(buf, &d.reason);
        buf.push(',');
        push_str(buf, &change_to_json(c).to_string());
        buf.push(')');
    }
    buf.push_str(" ON DUPLICATE KEY UPDATE code=VALUES(code),reason=VALUES(reason)");
}

/// Appends the delete of the dead letters of `source_table` below `position` (a truncate of
/// the table supersedes them).
pub(super) fn push_forget(
    buf: &mut String,
    shared: &Shared,
    table: &str,
    source_table: &str,
    position: Position,
) {
    use std::fmt::Write as _;
    buf.push_str("DELETE FROM ");
    push_target(buf, &shared.options.database, table);
    push_owner(buf, shared);
    buf.push_str(" AND source_table=");
    push_str(buf, source_table);
    let (l, o, s) = (position.lsn.0, position.ordinal, position.sub);
    let _ = write!(
        buf,
        " AND (lsn<{l} OR (lsn={l} AND (ordinal<{o} OR (ordinal={o} AND sub<{s}))))"
    );
}

/// Appends the delete of records `ids` (replayed).
pub(super) fn push_remove(buf: &mut String, shared: &Shared, table: &str, ids: &[u64]) {
    buf.push_str("DELETE FROM ");
    push_target(buf, &shared.options.database, table);
    push_owner(buf, shared);
    buf.push_str(" AND id IN (");
    for (n, id) in ids.iter().enumerate() {
        if n > 0 {
            buf.push(',');
        }
        buf.push_str(&id.to_string());
    }
    buf.push(')');
}

/// Whether `table` exists in the sink database.
async fn exists(conn: &mut Conn, shared: &Shared, table: &str) -> Result<bool, mysql_async::Error> {
    let mut sql = String::from("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA=");
    push_str(&mut sql, &shared.options.database);
    sql.push_str(" AND TABLE_NAME=");
    push_str(&mut sql, table);
    Ok(conn.query_first::<u8, _>(sql).await?.is_some())
}

/// The parked keys of lane `lane` of `lanes`: those of its dead letters.
pub(super) async fn parked(
    conn: &mut Conn,
    shared: &Shared,
    table: &str,
    lane: u32,
    lanes: u32,
) -> Result<Vec<ParkedKey>, mysql_async::Error> {
    if !exists(conn, shared, table).await? {
        return Ok(Vec::new());
    }
    let mut sql = String::from("SELECT DISTINCT source_table, key_json FROM ");
    push_target(&mut sql, &shared.options.database, table);
    push_owner(&mut sql, shared);
    sql.push_str(&format!(" AND key_hash % {} = {lane}", lanes.max(1)));
    let rows: Vec<(String, String)> = conn.query(sql).await?;
    Ok(rows
        .into_iter()
        .map(|(table, key)| ParkedKey { table, key })
        .collect())
}

/// Every dead letter of the pipeline in this sink, oldest position first.
pub(super) async fn list(
    conn: &mut Conn,
    shared: &Shared,
    table: &str,
) -> Result<Vec<DeadLetterRecord>, mysql_async::Error> {
    if !exists(conn, shared, table).await? {
        return Ok(Vec::new());
    }
    let mut sql = String::from(
        "SELECT id, position, source_table, op, key_json, code, reason, \
         DATE_FORMAT(created_at, '%Y-%m-%d %H:%i:%s'), change_json FROM ",
    );
    push_target(&mut sql, &shared.options.database, table);
    push_owner(&mut sql, shared);
    sql.push_str(" ORDER BY lsn, ordinal, sub");
    let rows: Vec<mysql_async::Row> = conn.query(sql).await?;
    Ok(rows
        .into_iter()
        .map(|r| DeadLetterRecord {
            id: r.get(0).unwrap_or_default(),
            position: r.get(1).unwrap_or_default(),
            table: r.get(2).unwrap_or_default(),
            op: r.get(3).unwrap_or_default(),
            key: r.get(4).unwrap_or_default(),
            code: r.get::<Option<String>, _>(5).flatten(),
            reason: r.get(6).unwrap_or_default(),
            created_at: r.get(7).unwrap_or_default(),
            change: r.get(8).unwrap_or_default(),
        })
        .collect())
}
