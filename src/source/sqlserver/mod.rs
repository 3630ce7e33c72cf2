//! SQL Server change data capture source (`source/sqlserver`).
//!
//! SQL Server's capture job (a SQL Server Agent job) reads the transaction log and copies
//! every change of a CDC-enabled table into that table's change table; Zipline polls the
//! change tables, it never reads the log itself. See
//! <https://learn.microsoft.com/sql/relational-databases/track-changes/about-change-data-capture-sql-server>.
//!
//! Flow:
//! 1. Preflight (read-only): log in (TLS through rustls, password from `password` or
//!    `secret_refs`), check that CDC is enabled on the database and on every configured
//!    table (else the error says which statement enables it), that snapshot isolation is
//!    allowed when a snapshot may be needed, that a capture job exists, and load each table's
//!    capture instances with their captured columns, key and types ([`catalog`]).
//! 2. `run`: start from the durable frontier the runtime read from the sinks. SQL Server
//!    keeps no cursor for a reader (unlike a PostgreSQL slot), so the sinks' checkpoint rows
//!    are the only durable record of how far the pipeline got: the runtime hands the source
//!    the lowest position every lane has committed, and records the frontier back into the
//!    sinks' idle lanes, so one quiet lane does not hold the restart point back until the
//!    change tables' retention has passed it.
//! 3. With no frontier: an initial snapshot ([`snapshot`]) or, with `snapshot: never`, start
//!    at the current maximum LSN. With one: stream from it ([`stream`], [`reader`]).
//!
//! Positions are `(commit LSN, ordinal)`; the mapping from `(__$start_lsn, __$seqval,
//! __$operation)` is described in [`lsn`].

mod catalog;
mod conn;
mod lsn;
mod reader;
mod snapshot;
mod sql;
mod stream;
mod types;

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::change::Table;
use crate::config::{self, SqlServerSnapshot};
use crate::source::{Source, SourceError, SourceIo, SourceStats, StopMode};

/// A SQL Server source, between preflight and streaming.
#[derive(Debug)]
pub struct SqlServerSource {
    opts: config::SqlServerSource,
    captured: Vec<catalog::Captured>,
    tables: Vec<Arc<Table>>,
}

impl SqlServerSource {
    /// Read-only preflight: reach the server (bounded retries), check CDC on the database and
    /// the tables, load the capture instances.
    pub async fn preflight(opts: config::SqlServerSource) -> Result<Self, SourceError> {
        let mut conn = conn::connect_with_retries(&opts).await?;
        check_database(&mut conn, &opts).await?;
        let captured = catalog::resolve(&mut conn, &opts, &opts.tables).await?;
        let tables = captured.iter().map(|c| c.current().shape.clone()).collect();
        for c in &captured {
            tracing::info!(connector = %opts.name, table = %c.qualified(), capture_instance = %c.current().name, columns = c.current().columns.len(), "table captured");
        }
        let _ = conn.close().await;
        Ok(SqlServerSource {
            opts,
            captured,
            tables,
        })
    }
}

async fn check_database(
    conn: &mut conn::Conn,
    opts: &config::SqlServerSource,
) -> Result<(), SourceError> {
    let doing = "checking the database's CDC settings";
    let rows = conn::query(conn, opts, doing, sql::DATABASE_STATE).await?;
    let row = rows.first().ok_or_else(|| {
        SourceError::fatal(format!(
            "{}: database {} is not visible to user {}",
            opts.name, opts.database, opts.user
        ))
    })?;
    let bad = |e| conn::bad_result(opts, doing, e);
    let cdc = conn::int(row, 1, "cdc_enabled").map_err(bad)?;
    let snapshot_isolation = conn::int(row, 2, "snapshot_isolation").map_err(bad)?;
    if cdc != Some(1) {
        return Err(SourceError::fatal(format!(
            "{}: change data capture is not enabled on database {}; a member of sysadmin can \
             enable it with: {} (then enable each table with sys.sp_cdc_enable_table)",
            opts.name,
            opts.database,
            sql::enable_database_hint(&opts.database)
        )));
    }
    if opts.snapshot == SqlServerSnapshot::Initial && snapshot_isolation != Some(1) {
        return Err(SourceError::fatal(format!(
            "{}: the initial snapshot reads under snapshot isolation, which database {} does \
             not allow; enable it with: {} (or set `snapshot: never`)",
            opts.name,
            opts.database,
            sql::snapshot_isolation_hint(&opts.database)
        )));
    }
    // The capture job is what fills the change tables. Reading msdb needs rights the source's
    // user may lack, so only a definite "no job" stops the source.
    match conn::query(
        conn,
        opts,
        "looking for the CDC capture job",
        sql::CAPTURE_JOB,
    )
    .await
    {
        Ok(rows) => {
            let jobs = rows
                .first()
                .map(|r| conn::int(r, 0, "jobs"))
                .transpose()
                .map_err(|e| conn::bad_result(opts, "looking for the CDC capture job", e))?
                .flatten();
            if jobs == Some(0) {
                return Err(SourceError::fatal(format!(
                    "{}: database {} has no CDC capture job, so its change tables never fill; \
                     create it with: EXEC sys.sp_cdc_add_job @job_type = N'capture'; and make \
                     sure SQL Server Agent runs",
                    opts.name, opts.database
                )));
            }
        }
        Err(e) => {
            tracing::warn!(connector = %opts.name, error = %crate::error::Report(&e), "cannot check for the CDC capture job; make sure SQL Server Agent runs the capture job of this database");
        }
    }
    Ok(())
}

impl Source for SqlServerSource {
    fn name(&self) -> &str {
        &self.opts.name
    }

    fn tables(&self) -> &[Arc<Table>] {
        &self.tables
    }

    fn upstream(&self) -> crate::source::Upstream {
        crate::source::Upstream::NoCursor
    }

    fn takes_snapshot(&self) -> bool {
        self.opts.snapshot == SqlServerSnapshot::Initial
    }

    fn whole_rows(&self, _table: &Table) -> Result<(), String> {
        // CDC's change tables capture every column of the row after an update.
        Ok(())
    }

    fn reset(&mut self) -> BoxFuture<'_, Result<(), SourceError>> {
        Box::pin(async { Ok(()) })
    }

    fn recopy<'a>(
        &'a mut self,
        _: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<crate::checkpoint::TableRecord>, SourceError>> {
        let message = format!(
            "{}: copying single tables again is not supported for source/sqlserver",
            self.opts.name
        );
        Box::pin(async move { Err(SourceError::fatal(message)) })
    }

    fn prepare(&mut self) -> BoxFuture<'_, Result<(), SourceError>> {
        // Nothing to create upstream: CDC is enabled by the DBA, and the position is kept
        // by the sinks.
        Box::pin(async { Ok(()) })
    }

    fn run(
        self: Box<Self>,
        io: SourceIo,
        stop: tokio::sync::watch::Receiver<StopMode>,
        stats: Arc<SourceStats>,
    ) -> BoxFuture<'static, Result<(), SourceError>> {
        Box::pin(async move {
            let SqlServerSource { opts, captured, .. } = *self;
            stream::run(&opts, captured, io, stop, stats).await
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn options() -> config::SqlServerSource {
        let entry = "name: mssql\ntype: source/sqlserver\nhost: 127.0.0.1\ndatabase: shop\n\
                     user: zipline\npassword: hunter2-secret\ntables: [orders]\n";
        match config::connector_for_tests(entry) {
            config::ConnectorKind::SqlServerSource(source) => source,
            other => panic!("the entry is {}", other.type_name()),
        }
    }

    #[test]
    fn debug_output_hides_the_password() {
        let debug = format!("{:?}", options());
        assert!(!debug.contains("hunter2-secret") && debug.contains("<redacted>"));
    }
}
