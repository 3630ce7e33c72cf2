//! Every SQL text the SQL Server source sends, generated here so tests can pin it.
//!
//! All statements go as plain batches (`SQL:BatchRequest`) with values inlined as literals:
//! LSNs as `0x…` `binary(10)` constants, names as bracketed identifiers and `N'…'` strings.
//! None of them come from change data, only from the catalog and the pipeline file, and each
//! is quoted. Plain batches also keep the text of each statement exact, which is what the
//! mock TDS server in the protocol tests matches on.
//!
//! Catalog views and functions used:
//! - `sys.databases.is_cdc_enabled`, `snapshot_isolation_state`;
//!   `sys.tables.is_tracked_by_cdc`
//!   (<https://learn.microsoft.com/sql/relational-databases/system-catalog-views/sys-databases-transact-sql>);
//! - `cdc.change_tables`: one row per capture instance, `start_lsn` its low endpoint, moved up
//!   by the cleanup job (<https://learn.microsoft.com/sql/relational-databases/system-tables/cdc-change-tables-transact-sql>);
//! - `cdc.captured_columns`, `cdc.index_columns`: the instance's columns, in `column_ordinal`
//!   order (the bit order of `__$update_mask`), and the unique index CDC identifies rows by;
//! - `sys.fn_cdc_get_max_lsn()`: the highest LSN the capture job has finished; a window never
//!   ends above it (<https://learn.microsoft.com/sql/relational-databases/system-functions/sys-fn-cdc-get-max-lsn-transact-sql>);
//! - `cdc.lsn_time_mapping`: one row per committed transaction the capture job processed
//!   (plus idle markers), keyed by commit LSN; its `tran_end_time` gives commit times, as
//!   `sys.fn_cdc_map_lsn_to_time` does (<https://learn.microsoft.com/sql/relational-databases/system-functions/sys-fn-cdc-map-lsn-to-time-transact-sql>);
//! - `cdc.fn_cdc_get_all_changes_<capture_instance>(from, to, N'all update old')`: an
//!   index range read of the change table's clustered index on `__$start_lsn`
//!   (<https://learn.microsoft.com/sql/relational-databases/system-functions/cdc-fn-cdc-get-all-changes-capture-instance-transact-sql>).
//!   Quirk: a range outside the instance's validity interval fails with error 313 ("An
//!   insufficient number of arguments were supplied…"), so the source checks
//!   `cdc.change_tables.start_lsn` (what `sys.fn_cdc_get_min_lsn` returns) first.

use std::fmt::Write as _;

use super::lsn;
use crate::change::Lsn;

/// Most transactions one poll reads; bounds the memory a backlog can take.
pub(crate) const WINDOW_TRANSACTIONS: u32 = 1000;

/// Run once on every new connection. XACT_ABORT makes any error end the snapshot
/// transaction instead of leaving it open.
pub(crate) const SESSION_SETUP: &str = "SET NOCOUNT ON; SET XACT_ABORT ON";

/// CDC and snapshot isolation state of the connection's database.
pub(crate) const DATABASE_STATE: &str = "SELECT DB_NAME() AS database_name, \
     CAST(is_cdc_enabled AS int) AS cdc_enabled, \
     CAST(snapshot_isolation_state AS int) AS snapshot_isolation \
     FROM sys.databases WHERE database_id = DB_ID()";

/// Whether a capture job exists for this database (readable with `msdb` access only).
pub(crate) const CAPTURE_JOB: &str = "SELECT COUNT(*) AS jobs FROM msdb.dbo.cdc_jobs \
     WHERE database_id = DB_ID() AND job_type = N'capture'";

/// Every capture instance of the database, oldest first; the caller keeps its tables'.
pub(crate) const CAPTURE_INSTANCES: &str = "SELECT s.name AS schema_name, t.name AS table_name, \
     ct.capture_instance, ct.start_lsn, ct.object_id \
     FROM cdc.change_tables ct \
     JOIN sys.tables t ON t.object_id = ct.source_object_id \
     JOIN sys.schemas s ON s.schema_id = t.schema_id \
     ORDER BY ct.create_date, ct.object_id";

/// The highest LSN the capture job has processed.
pub(crate) const MAX_LSN: &str = "SELECT sys.fn_cdc_get_max_lsn() AS max_lsn";

/// Starts the snapshot transaction. The snapshot is fixed by its first read, which is the
/// `MAX_LSN` query that follows.
pub(crate) const SNAPSHOT_BEGIN: &str =
    "SET TRANSACTION ISOLATION LEVEL SNAPSHOT; BEGIN TRANSACTION";

/// Ends the snapshot transaction (it only read) and restores the default isolation.
pub(crate) const SNAPSHOT_END: &str =
    "COMMIT TRANSACTION; SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// A bracketed identifier: `[name]`, with `]` doubled.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("[{}]", name.replace(']', "]]"))
}

/// A Unicode string literal: `N'text'`, with `'` doubled.
pub(crate) fn quote_str(text: &str) -> String {
    format!("N'{}'", text.replace('\'', "''"))
}

/// Existence and CDC tracking of the configured tables (`(schema, table)` pairs).
pub(crate) fn tables_state(tables: &[(String, String)]) -> String {
    let mut sql = String::from(
        "SELECT s.name AS schema_name, t.name AS table_name, \
         CAST(t.is_tracked_by_cdc AS int) AS tracked \
         FROM sys.tables t JOIN sys.schemas s ON s.schema_id = t.schema_id WHERE ",
    );
    for (i, (schema, table)) in tables.iter().enumerate() {
        if i > 0 {
            sql.push_str(" OR ");
        }
        let _ = write!(
            sql,
            "(s.name = {} AND t.name = {})",
            quote_str(schema),
            quote_str(table)
        );
    }
    sql
}

/// The captured columns of the change table `change_table_id`, in `__$update_mask` order, with
/// their base type, `max_length` (-1 for `(max)`) and whether they belong to the row key.
pub(crate) fn captured_columns(change_table_id: i64) -> String {
    format!(
        "SELECT cc.column_name, cc.column_ordinal, TYPE_NAME(c.system_type_id) AS type_name, \
         CAST(c.max_length AS int) AS max_length, \
         CAST(CASE WHEN ic.column_name IS NULL THEN 0 ELSE 1 END AS int) AS is_key \
         FROM cdc.captured_columns cc \
         JOIN sys.columns c ON c.object_id = cc.object_id AND c.name = cc.column_name \
         LEFT JOIN cdc.index_columns ic ON ic.object_id = cc.object_id AND ic.column_name = cc.column_name \
         WHERE cc.object_id = {change_table_id} AND cc.is_computed = 0 ORDER BY cc.column_ordinal"
    )
}

/// The commit LSNs (and their age in microseconds) of up to [`WINDOW_TRANSACTIONS`]
/// transactions in `(after, upto]`, in commit order.
pub(crate) fn window(after: Lsn, upto: Lsn) -> String {
    format!(
        "SELECT TOP ({WINDOW_TRANSACTIONS}) start_lsn, \
         ISNULL(DATEDIFF_BIG(MICROSECOND, tran_end_time, SYSDATETIME()), 0) AS age_us \
         FROM cdc.lsn_time_mapping WHERE start_lsn > {} AND start_lsn <= {} ORDER BY start_lsn",
        lsn::literal(after),
        lsn::literal(upto)
    )
}

/// The change rows of `capture_instance` committed in `[from, to]`, both images of updates,
/// in commit order. `select` is the captured columns' select list.
pub(crate) fn changes(capture_instance: &str, from: Lsn, to: Lsn, select: &[String]) -> String {
    let mut sql = String::from("SELECT __$start_lsn, __$seqval, __$operation, __$update_mask");
    for expr in select {
        sql.push_str(", ");
        sql.push_str(expr);
    }
    let _ = write!(
        sql,
        " FROM cdc.{}({}, {}, N'all update old') ORDER BY __$start_lsn, __$seqval, __$operation",
        quote_ident(&format!("fn_cdc_get_all_changes_{capture_instance}")),
        lsn::literal(from),
        lsn::literal(to)
    );
    sql
}

/// How many changes (operations 1, 2, 4: the `all` filter) `capture_instance` holds for the
/// transaction committed at `at`.
pub(crate) fn changes_at(capture_instance: &str, at: Lsn) -> String {
    format!(
        "SELECT COUNT_BIG(*) AS changes FROM cdc.{}({}, {}, N'all')",
        quote_ident(&format!("fn_cdc_get_all_changes_{capture_instance}")),
        lsn::literal(at),
        lsn::literal(at)
    )
}

/// Every row of `schema.table` (read inside the snapshot transaction).
pub(crate) fn snapshot_rows(schema: &str, table: &str, select: &[String]) -> String {
    format!(
        "SELECT {} FROM {}.{}",
        select.join(", "),
        quote_ident(schema),
        quote_ident(table)
    )
}

/// What to run to enable CDC on the database.
pub(crate) fn enable_database_hint(database: &str) -> String {
    format!("USE {}; EXEC sys.sp_cdc_enable_db;", quote_ident(database))
}

/// What to run to enable CDC on a table
/// (<https://learn.microsoft.com/sql/relational-databases/system-stored-procedures/sys-sp-cdc-enable-table-transact-sql>).
pub(crate) fn enable_table_hint(schema: &str, table: &str) -> String {
    format!(
        "EXEC sys.sp_cdc_enable_table @source_schema = {}, @source_name = {}, @role_name = NULL;",
        quote_str(schema),
        quote_str(table)
    )
}

/// What to run to allow the snapshot transaction.
pub(crate) fn snapshot_isolation_hint(database: &str) -> String {
    format!(
        "ALTER DATABASE {} SET ALLOW_SNAPSHOT_ISOLATION ON;",
        quote_ident(database)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote_ident("a]b"), "[a]]b]");
        assert_eq!(quote_str("O'Brien"), "N'O''Brien'");
    }

    #[test]
    fn change_query_reads_one_capture_instance_by_lsn_range() {
        let sql = changes(
            "dbo_orders",
            Lsn(0x2A_0000_01F8_0003),
            Lsn(0x2A_0000_0200_0001),
            &[
                "[id]".into(),
                "CAST([price] AS decimal(19,4)) AS [price]".into(),
            ],
        );
        assert_eq!(
            sql,
            "SELECT __$start_lsn, __$seqval, __$operation, __$update_mask, [id], \
             CAST([price] AS decimal(19,4)) AS [price] \
             FROM cdc.[fn_cdc_get_all_changes_dbo_orders](0x0000002A000001F80003, \
             0x0000002A000002000001, N'all update old') \
             ORDER BY __$start_lsn, __$seqval, __$operation"
        );
        assert_eq!(
            changes_at("x]y", Lsn(1)),
            "SELECT COUNT_BIG(*) AS changes FROM cdc.[fn_cdc_get_all_changes_x]]y]\
             (0x00000000000000000001, 0x00000000000000000001, N'all')"
        );
    }

    #[test]
    fn window_query_is_bounded_and_ordered() {
        assert_eq!(
            window(Lsn(0x10), Lsn(0x20)),
            "SELECT TOP (1000) start_lsn, \
             ISNULL(DATEDIFF_BIG(MICROSECOND, tran_end_time, SYSDATETIME()), 0) AS age_us \
             FROM cdc.lsn_time_mapping WHERE start_lsn > 0x00000000000000000010 \
             AND start_lsn <= 0x00000000000000000020 ORDER BY start_lsn"
        );
    }

    #[test]
    fn catalog_queries_quote_names() {
        assert_eq!(
            tables_state(&[("dbo".into(), "orders".into()), ("s'x".into(), "t".into())]),
            "SELECT s.name AS schema_name, t.name AS table_name, \
             CAST(t.is_tracked_by_cdc AS int) AS tracked FROM sys.tables t \
             JOIN sys.schemas s ON s.schema_id = t.schema_id \
             WHERE (s.name = N'dbo' AND t.name = N'orders') OR (s.name = N's''x' AND t.name = N't')"
        );
        assert!(
            captured_columns(42).contains(
                "WHERE cc.object_id = 42 AND cc.is_computed = 0 ORDER BY cc.column_ordinal"
            )
        );
        assert_eq!(
            snapshot_rows("dbo", "or]ders", &["[id]".into(), "[name]".into()]),
            "SELECT [id], [name] FROM [dbo].[or]]ders]"
        );
    }

    #[test]
    fn hints_are_runnable_statements() {
        assert_eq!(
            enable_database_hint("shop"),
            "USE [shop]; EXEC sys.sp_cdc_enable_db;"
        );
        assert_eq!(
            enable_table_hint("dbo", "orders"),
            "EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'orders', \
             @role_name = NULL;"
        );
        assert_eq!(
            snapshot_isolation_hint("shop"),
            "ALTER DATABASE [shop] SET ALLOW_SNAPSHOT_ISOLATION ON;"
        );
    }
}
