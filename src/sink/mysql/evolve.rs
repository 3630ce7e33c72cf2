//! Following the source's schema changes on the sink tables, before a batch is written.
//!
//! A batch may carry a table shape the lane has not matched against the sink yet (the source
//! table gained or lost columns mid-stream, or the lane just started). For such a shape the
//! lane reads the sink table's columns and:
//! - adds every source column the sink table lacks, nullable (rows written before it stay
//!   valid), typed by [`super::ddl::column_type`], one `ALTER TABLE … ADD COLUMN` each. An
//!   error 1060 (duplicate column) means another lane added it first: that is success, which
//!   makes lanes racing on one table harmless (MySQL has no `ADD COLUMN IF NOT EXISTS`);
//! - refuses a sink column that is NOT NULL without a default when the source no longer has
//!   it (dropped on the source): every later insert would fail.
//!
//! This runs outside the batch transaction: DDL commits implicitly in MySQL and MariaDB, and
//! a lane must not hold row locks of an open transaction while it waits for the metadata lock
//! the ALTER needs (other lanes' transactions finish and release theirs; MySQL's metadata-lock
//! deadlock detector breaks any cycle, which then surfaces as a retried deadlock).
//!
//! Sink tables that do not exist are left to the batch (which reports them) and to
//! `create_tables`.

use std::sync::Arc;

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use super::ddl::column_type;
use super::errors::{classify, sink_error};
use super::literal::{push_ident, push_str};
use super::schema::{same_name, target};
use crate::change::{Column, Table};
use crate::error::ErrorClass;
use crate::sink::SinkError;

/// ER_DUP_FIELDNAME: the column exists already.
const DUPLICATE_COLUMN: u16 = 1060;

/// A sink column's name, and whether every insert must set it.
struct SinkColumn {
    name: String,
    /// NOT NULL, no default, not auto-increment, not generated.
    required: bool,
}

/// Makes sink table `database.<table.name>` able to take rows of shape `table` (see the
/// module docs). `Ok(false)` when the sink table does not exist. `refuse_required: false`
/// leaves required columns the source lacks to the caller (the startup check, which reports
/// every problem at once).
pub(super) async fn fit(
    conn: &mut Conn,
    sink: &str,
    database: &str,
    table: &Arc<Table>,
    refuse_required: bool,
) -> Result<bool, SinkError> {
    let target = target(database, table);
    let columns = sink_columns(conn, database, &table.name)
        .await
        .map_err(|e| sink_error(sink, &format!("reading the columns of table {target}"), &e))?;
    if columns.is_empty() {
        return Ok(false);
    }
    let has = |name: &str| columns.iter().any(|c| same_name(&c.name, name));
    if let Some(kept) = columns.iter().find(|c| {
        refuse_required && c.required && !table.columns.iter().any(|s| same_name(&s.name, &c.name))
    }) {
        let column = &kept.name;
        return Err(SinkError::fatal(format!(
            "sink {sink}: column {target}.`{column}` is NOT NULL without a default, and source \
             table {} has no column {column} (dropped or renamed on the source?), so inserts \
             would fail; make it nullable or give it a default (ALTER TABLE {target} MODIFY \
             `{column}` <type> NULL), then restart Zipline",
            table.qualified_name()
        )));
    }
    for column in table.columns.iter().filter(|c| !has(&c.name)) {
        add_column(conn, sink, &target, table, column).await?;
    }
    Ok(true)
}

async fn add_column(
    conn: &mut Conn,
    sink: &str,
    target: &str,
    table: &Table,
    column: &Column,
) -> Result<(), SinkError> {
    let source = format!("{}.{}", table.qualified_name(), column.name);
    let ty = column_type(column, false).map_err(|reason| {
        SinkError::fatal(format!(
            "sink {sink}: source column {source} was added, but cannot be added to table \
             {target}: {reason}; add the column to {target} yourself, then restart Zipline"
        ))
    })?;
    let mut sql = format!("ALTER TABLE {target} ADD COLUMN ");
    push_ident(&mut sql, &column.name);
    sql.push(' ');
    sql.push_str(&ty);
    sql.push_str(" NULL");
    match conn.query_drop(sql.as_str()).await {
        Ok(()) => {
            tracing::info!(sink, table = %target, column = %column.name, column_type = %ty, "added a column the source table gained");
            Ok(())
        }
        Err(mysql_async::Error::Server(e)) if e.code == DUPLICATE_COLUMN => Ok(()),
        Err(e) if classify(&e) == ErrorClass::Transient => Err(sink_error(
            sink,
            &format!("adding column `{}` to table {target}", column.name),
            &e,
        )),
        Err(e) => {
            let err = sink_error(sink, &format!("adding column `{}`", column.name), &e);
            let message = format!(
                "{}; source column {source} is new and table {target} lacks it: run `{sql}` \
                 on the sink (or grant ALTER on it to Zipline's user), then restart Zipline",
                err.message
            );
            Err(SinkError {
                class: crate::error::ErrorClass::Fatal,
                ..err.reworded(message)
            })
        }
    }
}

async fn sink_columns(
    conn: &mut Conn,
    database: &str,
    table: &str,
) -> Result<Vec<SinkColumn>, mysql_async::Error> {
    let mut sql = String::from(
        "SELECT COLUMN_NAME, IS_NULLABLE = 'NO' AND COLUMN_DEFAULT IS NULL \
                AND EXTRA NOT LIKE '%auto_increment%' AND EXTRA NOT LIKE '%generated%' \
         FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=",
    );
    push_str(&mut sql, database);
    sql.push_str(" AND TABLE_NAME=");
    push_str(&mut sql, table);
    let rows: Vec<(String, bool)> = conn.query(sql).await?;
    Ok(rows
        .into_iter()
        .map(|(name, required)| SinkColumn { name, required })
        .collect())
}

impl super::MysqlLane {
    /// Fits the sink tables to every shape of `changes` this lane has not matched yet; a
    /// no-op lookup for known shapes. Never inside a transaction (see the module docs).
    pub(super) async fn fit_shapes(
        &mut self,
        changes: &[crate::change::Change],
    ) -> Result<(), SinkError> {
        let unknown = self.shapes.unknown(changes);
        if unknown.is_empty() {
            return Ok(());
        }
        if self.in_tx {
            // A cancelled call left a transaction open; closing the connection rolls it back.
            self.drop_conn().await;
        }
        if self.conn.is_none() {
            self.conn = Some(self.shared.connect().await?);
        }
        let shared = Arc::clone(&self.shared);
        for table in unknown {
            let conn = self.conn.as_mut().expect("connected above");
            match fit(conn, shared.sink(), &shared.options.database, &table, true).await {
                Ok(true) => self.shapes.insert(table),
                Ok(false) => {}
                Err(e) => {
                    if e.class == ErrorClass::Transient {
                        self.drop_conn().await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}
