//! The table records in MySQL/MariaDB (see [`crate::checkpoint::tables`]).

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use super::errors::sink_error;
use super::literal::{push_ident, push_str};
use super::{Shared, fence};
use crate::checkpoint::tables::{TABLES_TABLE, TableRecord};
use crate::sink::SinkError;

/// `CREATE TABLE IF NOT EXISTS` for the records in `database`.
pub(super) fn create_table_sql(database: &str) -> String {
    let mut sql = String::from("CREATE TABLE IF NOT EXISTS ");
    push_table(&mut sql, database);
    sql.push_str(
        " (pipeline VARCHAR(128) NOT NULL, connector VARCHAR(128) NOT NULL, \
         source_table VARCHAR(255) NOT NULL, relation INT UNSIGNED NOT NULL, \
         since_lsn DECIMAL(39,0) NOT NULL, columns_json LONGTEXT NOT NULL, \
         sink_table_id VARCHAR(64) NULL, updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
         PRIMARY KEY (pipeline, connector, source_table)) \
         ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    );
    sql
}

fn push_table(buf: &mut String, database: &str) {
    push_ident(buf, database);
    buf.push('.');
    push_ident(buf, TABLES_TABLE);
}

fn push_owner(buf: &mut String, shared: &Shared) {
    buf.push_str(" WHERE pipeline=");
    push_str(buf, &shared.pipeline);
    buf.push_str(" AND connector=");
    push_str(buf, &shared.options.name);
}

/// The identity of sink table `name` (in the sink's database) as a subquery: its creation
/// time, which dropping and creating it again changes (as does a rebuilding `ALTER`, which
/// keeps the rows; `NULL` when the table does not exist, as under a renaming transform).
fn push_identity(buf: &mut String, shared: &Shared, name: &str) {
    buf.push_str(
        "(SELECT CAST(CREATE_TIME AS CHAR) FROM information_schema.TABLES WHERE TABLE_SCHEMA=",
    );
    push_str(buf, &shared.options.database);
    buf.push_str(" AND TABLE_NAME=");
    push_str(buf, name);
    buf.push(')');
}

fn error(shared: &Shared, doing: &str, e: &mysql_async::Error) -> SinkError {
    sink_error(shared.sink(), &format!("{doing} in {TABLES_TABLE}"), e)
}

/// Every record of the pipeline in this sink.
pub(super) async fn load(conn: &mut Conn, shared: &Shared) -> Result<Vec<TableRecord>, SinkError> {
    let mut sql =
        String::from("SELECT source_table, relation, CAST(since_lsn AS CHAR), columns_json FROM ");
    push_table(&mut sql, &shared.options.database);
    push_owner(&mut sql, shared);
    let rows: Vec<(String, u32, String, String)> = conn
        .query(sql)
        .await
        .map_err(|e| error(shared, "reading the table records", &e))?;
    Ok(rows
        .into_iter()
        .filter_map(|(table, relation, since, columns)| {
            TableRecord::from_stored(&table, relation, since.parse().ok()?, &columns)
        })
        .collect())
}

/// Writes `record`, unless the sink has a later one of that table (fenced).
pub(super) async fn record(
    conn: &mut Conn,
    shared: &Shared,
    record: &TableRecord,
) -> Result<(), SinkError> {
    let err = |e: mysql_async::Error| error(shared, "recording a table's shape", &e);
    conn.query_drop("START TRANSACTION").await.map_err(err)?;
    fence::check_locked(conn, shared).await?;
    let mut sql = String::from("INSERT INTO ");
    push_table(&mut sql, &shared.options.database);
    sql.push_str(
        " (pipeline,connector,source_table,relation,since_lsn,columns_json,sink_table_id) VALUES (",
    );
    push_str(&mut sql, &shared.pipeline);
    sql.push(',');
    push_str(&mut sql, &shared.options.name);
    sql.push(',');
    push_str(&mut sql, &record.name());
    sql.push_str(&format!(",{},{},", record.relation, record.since.0));
    push_str(&mut sql, &record.columns_json());
    sql.push(',');
    push_identity(&mut sql, shared, &record.table.name);
    // Each assignment sees the columns assigned before it: `since_lsn` goes last.
    let newer = "VALUES(since_lsn)>=since_lsn";
    sql.push_str(&format!(
        ") ON DUPLICATE KEY UPDATE relation=IF({newer},VALUES(relation),relation),\
         columns_json=IF({newer},VALUES(columns_json),columns_json),\
         sink_table_id=VALUES(sink_table_id),\
         updated_at=IF({newer},CURRENT_TIMESTAMP(6),updated_at),\
         since_lsn=GREATEST(since_lsn,VALUES(since_lsn));COMMIT"
    ));
    conn.query_drop(sql).await.map_err(err)
}

/// Deletes the record of `table` (`schema.name`), or every record (`None`), fenced.
pub(super) async fn forget(
    conn: &mut Conn,
    shared: &Shared,
    table: Option<&str>,
) -> Result<(), SinkError> {
    let err = |e: mysql_async::Error| error(shared, "forgetting table records", &e);
    conn.query_drop("START TRANSACTION").await.map_err(err)?;
    fence::check_locked(conn, shared).await?;
    let mut sql = String::from("DELETE FROM ");
    push_table(&mut sql, &shared.options.database);
    push_owner(&mut sql, shared);
    if let Some(table) = table {
        sql.push_str(" AND source_table=");
        push_str(&mut sql, table);
    }
    sql.push_str(";COMMIT");
    conn.query_drop(sql).await.map_err(err)
}

/// The source tables whose sink table was dropped and created again since its record was
/// written and is empty now: the rows applied to it are gone, and rows the source does not
/// change again would never arrive. A sink table rebuilt by an `ALTER` (it kept its rows)
/// gets its new identity recorded.
pub(super) async fn recreated_empty(
    conn: &mut Conn,
    shared: &Shared,
) -> Result<Vec<String>, SinkError> {
    let err = |e: mysql_async::Error| error(shared, "comparing sink tables with their records", &e);
    let mut db = String::new();
    push_str(&mut db, &shared.options.database);
    let mut sql = String::from("SELECT r.source_table, CAST(t.CREATE_TIME AS CHAR) FROM ");
    push_table(&mut sql, &shared.options.database);
    sql.push_str(&format!(
        " r LEFT JOIN information_schema.TABLES t ON t.TABLE_SCHEMA={db} \
         AND t.TABLE_NAME=SUBSTRING(r.source_table, LOCATE('.', r.source_table) + 1) \
         WHERE r.pipeline="
    ));
    push_str(&mut sql, &shared.pipeline);
    sql.push_str(" AND r.connector=");
    push_str(&mut sql, &shared.options.name);
    sql.push_str(
        " AND r.sink_table_id IS NOT NULL \
         AND NOT (r.sink_table_id <=> CAST(t.CREATE_TIME AS CHAR))",
    );
    let changed: Vec<(String, Option<String>)> = conn.query(sql).await.map_err(err)?;
    let mut emptied = Vec::new();
    for (source_table, now) in changed {
        let name = source_table
            .split_once('.')
            .map_or(source_table.as_str(), |(_, n)| n);
        let mut probe = String::from("SELECT 1 FROM ");
        push_ident(&mut probe, &shared.options.database);
        probe.push('.');
        push_ident(&mut probe, name);
        probe.push_str(" LIMIT 1");
        let has_rows = match now {
            None => false,
            Some(_) => conn
                .query_first::<u8, _>(probe)
                .await
                .map_err(err)?
                .is_some(),
        };
        if has_rows {
            conn.query_drop("START TRANSACTION").await.map_err(err)?;
            fence::check_locked(conn, shared).await?;
            let mut update = String::from("UPDATE ");
            push_table(&mut update, &shared.options.database);
            update.push_str(" SET sink_table_id=");
            push_identity(&mut update, shared, name);
            push_owner(&mut update, shared);
            update.push_str(" AND source_table=");
            push_str(&mut update, &source_table);
            update.push_str(";COMMIT");
            conn.query_drop(update).await.map_err(err)?;
            tracing::info!(sink = shared.sink(), table = %source_table, "the sink table was rebuilt since Zipline last recorded it and kept its rows; going on");
        } else {
            emptied.push(source_table);
        }
    }
    Ok(emptied)
}
