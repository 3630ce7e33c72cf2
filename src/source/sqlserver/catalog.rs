//! What the source knows of its tables: their capture instances, captured columns and keys,
//! and which instance serves which LSN range.
//!
//! A table has one or two capture instances (SQL Server allows two, so that a schema change
//! can be followed without a gap: the DBA creates a second instance with the new columns, then
//! drops the old one). Both capture every change committed at or after the newer one's start,
//! so for a read of `(lo, hi]` the older instance serves `(lo, start_new)` and the newer
//! `[start_new, hi]`; once `lo` has passed `start_new` only the newer one is read. See
//! <https://learn.microsoft.com/sql/relational-databases/track-changes/about-change-data-capture-sql-server#handling-changes-to-source-tables>.
//!
//! An instance can serve reads from `lo` only if its low endpoint (`cdc.change_tables.start_lsn`,
//! what `sys.fn_cdc_get_min_lsn` returns, raised by the cleanup job as the retention period
//! passes: <https://learn.microsoft.com/sql/relational-databases/system-functions/sys-fn-cdc-get-min-lsn-transact-sql>)
//! is at most `lo + 1`. Otherwise
//! changes after `lo` may already have been deleted, and the source stops with an error rather
//! than skip them: a silent gap is never acceptable.

use std::sync::Arc;

use super::conn::{self, Conn};
use super::lsn;
use super::sql;
use super::types::SqlType;
use crate::change::{Column, Lsn, Table};
use crate::config;
use crate::source::SourceError;

/// One captured column of a capture instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CapturedColumn {
    pub(crate) name: String,
    /// 1-based position in the change table (`column_ordinal`): its `__$update_mask` bit.
    pub(crate) ordinal: usize,
    pub(crate) ty: SqlType,
    pub(crate) is_key: bool,
}

/// A capture instance of a table.
#[derive(Debug, Clone)]
pub(crate) struct Instance {
    pub(crate) name: String,
    /// Low endpoint of its validity interval.
    pub(crate) start_lsn: Lsn,
    /// Object id of its change table.
    pub(crate) object_id: i64,
    pub(crate) columns: Vec<CapturedColumn>,
    /// The table's shape as this instance captures it.
    pub(crate) shape: Arc<Table>,
    /// Select-list expressions for `columns`, in order.
    pub(crate) select: Vec<String>,
}

/// A configured table and its capture instances, oldest first.
#[derive(Debug, Clone)]
pub(crate) struct Captured {
    pub(crate) schema: String,
    pub(crate) name: String,
    pub(crate) instances: Vec<Instance>,
}

impl Captured {
    pub(crate) fn qualified(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    /// The instance new work is read from: the newest.
    pub(crate) fn current(&self) -> &Instance {
        self.instances
            .last()
            .expect("a captured table has an instance")
    }
}

/// One read of a capture instance: rows with `__$start_lsn` in `[from, to]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Read {
    pub(crate) instance: usize,
    pub(crate) from: Lsn,
    pub(crate) to: Lsn,
}

/// The reads that cover `(lo, hi]` for `table`, or an error when its change data no longer
/// reaches back to `lo`.
pub(crate) fn plan_reads(table: &Captured, lo: Lsn, hi: Lsn) -> Result<Vec<Read>, String> {
    if hi <= lo {
        return Ok(Vec::new());
    }
    let from = lsn::next(lo);
    // The newest instance that already covers `from` serves everything.
    let Some(first) = table.instances.iter().rposition(|i| i.start_lsn <= from) else {
        let oldest = &table.instances[0];
        return Err(format!(
            "the change data of {} no longer reaches back to LSN {}: capture instance {} starts \
             at {} (the retention cleanup, or a disabled and re-enabled capture, removed what \
             lies between). Changes after {} may be lost, so Zipline stops. To start over, \
             clear this pipeline's checkpoints in the sink so that a new initial snapshot is \
             taken",
            table.qualified(),
            lsn::literal(lo),
            oldest.name,
            lsn::literal(oldest.start_lsn),
            lsn::literal(lo),
        ));
    };
    let mut reads = Vec::new();
    let mut start = from;
    for idx in first..table.instances.len() {
        let end = match table.instances.get(idx + 1) {
            Some(newer) if newer.start_lsn <= hi => lsn::prev(newer.start_lsn),
            _ => hi,
        };
        if start <= end {
            reads.push(Read {
                instance: idx,
                from: start,
                to: end,
            });
        }
        if end >= hi {
            break;
        }
        start = lsn::next(end);
    }
    Ok(reads)
}

/// Checks that the configured tables exist and are tracked, and loads their capture
/// instances. Every failure names the table and says what to run.
pub(crate) async fn resolve(
    conn: &mut Conn,
    opts: &config::SqlServerSource,
    tables: &[(String, String)],
) -> Result<Vec<Captured>, SourceError> {
    let doing = "checking the configured tables";
    let rows = conn::query(conn, opts, doing, &sql::tables_state(tables)).await?;
    let mut state = Vec::with_capacity(rows.len());
    for row in &rows {
        let schema =
            conn::text(row, 0, "schema_name").map_err(|e| conn::bad_result(opts, doing, e))?;
        let name =
            conn::text(row, 1, "table_name").map_err(|e| conn::bad_result(opts, doing, e))?;
        let tracked = conn::int(row, 2, "tracked").map_err(|e| conn::bad_result(opts, doing, e))?;
        state.push((
            schema.unwrap_or_default(),
            name.unwrap_or_default(),
            tracked == Some(1),
        ));
    }
    for (schema, table) in tables {
        // Names compare as the database collation does; the usual collations ignore case.
        match state
            .iter()
            .find(|(s, t, _)| s.eq_ignore_ascii_case(schema) && t.eq_ignore_ascii_case(table))
        {
            None => {
                return Err(SourceError::fatal(format!(
                    "{}: table {schema}.{table} does not exist in database {} (or the user cannot see it)",
                    opts.name, opts.database
                )));
            }
            Some((_, _, false)) => {
                return Err(SourceError::fatal(format!(
                    "{}: change data capture is not enabled on table {schema}.{table}; enable it with: {}",
                    opts.name,
                    sql::enable_table_hint(schema, table)
                )));
            }
            Some(_) => {}
        }
    }
    let mut captured: Vec<Captured> = tables
        .iter()
        .map(|(schema, name)| Captured {
            schema: schema.clone(),
            name: name.clone(),
            instances: Vec::new(),
        })
        .collect();
    refresh(conn, opts, &mut captured).await?;
    Ok(captured)
}

/// Re-reads `cdc.change_tables`: new low endpoints, new instances (loading their columns),
/// dropped ones. A table left with no instance means CDC was disabled on it.
pub(crate) async fn refresh(
    conn: &mut Conn,
    opts: &config::SqlServerSource,
    tables: &mut [Captured],
) -> Result<(), SourceError> {
    let doing = "reading cdc.change_tables";
    let rows = conn::query(conn, opts, doing, sql::CAPTURE_INSTANCES).await?;
    let mut listed: Vec<(usize, String, Lsn, i64)> = Vec::new();
    for row in &rows {
        let bad = |e| conn::bad_result(opts, doing, e);
        let schema = conn::text(row, 0, "schema_name")
            .map_err(bad)?
            .unwrap_or_default();
        let table = conn::text(row, 1, "table_name")
            .map_err(bad)?
            .unwrap_or_default();
        let Some(t) = tables.iter().position(|c| {
            c.schema.eq_ignore_ascii_case(&schema) && c.name.eq_ignore_ascii_case(&table)
        }) else {
            continue;
        };
        let name = conn::text(row, 2, "capture_instance")
            .map_err(bad)?
            .unwrap_or_default();
        let start = conn::lsn_at(row, 3, "start_lsn")
            .map_err(bad)?
            .unwrap_or_default();
        let object_id = conn::int(row, 4, "object_id")
            .map_err(bad)?
            .unwrap_or_default();
        listed.push((t, name, start, object_id));
    }
    for (t, table) in tables.iter_mut().enumerate() {
        let mut instances = Vec::new();
        for (_, name, start, object_id) in listed.iter().filter(|(i, ..)| *i == t) {
            let known = table.instances.iter().find(|i| i.object_id == *object_id);
            let mut inst = match known {
                Some(known) => known.clone(),
                None => {
                    load_instance(conn, opts, &table.schema, &table.name, name, *object_id).await?
                }
            };
            if known.is_none() && !table.instances.is_empty() {
                tracing::info!(connector = %opts.name, table = %table.qualified(), capture_instance = %name, start_lsn = %lsn::literal(*start), "new capture instance (schema change); following it from its start");
            }
            inst.start_lsn = *start;
            instances.push(inst);
        }
        if instances.is_empty() {
            return Err(SourceError::fatal(format!(
                "{}: table {} has no capture instance (change data capture was disabled on it); \
                 enable it with: {}",
                opts.name,
                table.qualified(),
                sql::enable_table_hint(&table.schema, &table.name)
            )));
        }
        table.instances = instances;
    }
    Ok(())
}

async fn load_instance(
    conn: &mut Conn,
    opts: &config::SqlServerSource,
    schema: &str,
    table: &str,
    name: &str,
    object_id: i64,
) -> Result<Instance, SourceError> {
    let doing = format!("reading the captured columns of capture instance {name}");
    let rows = conn::query(conn, opts, &doing, &sql::captured_columns(object_id)).await?;
    let mut columns = Vec::with_capacity(rows.len());
    for row in &rows {
        let bad = |e| conn::bad_result(opts, &doing, e);
        let column = conn::text(row, 0, "column_name")
            .map_err(bad)?
            .unwrap_or_default();
        let ordinal = conn::int(row, 1, "column_ordinal")
            .map_err(bad)?
            .unwrap_or_default();
        let type_name = conn::text(row, 2, "type_name")
            .map_err(bad)?
            .unwrap_or_default();
        let max_length = conn::int(row, 3, "max_length")
            .map_err(bad)?
            .unwrap_or_default();
        let is_key = conn::int(row, 4, "is_key").map_err(bad)? == Some(1);
        let ty = SqlType::parse(&type_name, max_length).ok_or_else(|| {
            SourceError::fatal(format!(
                "{}: column {schema}.{table}.{column} has type {type_name}, which Zipline does not \
                 replicate (supported: integer types, bit, decimal/numeric, money, float/real, \
                 (n)char/(n)varchar/(n)text, date, time, datetime, smalldatetime, datetime2, \
                 datetimeoffset, uniqueidentifier, (var)binary, image, xml); leave it out of the \
                 capture instance's @captured_column_list",
                opts.name
            ))
        })?;
        columns.push(CapturedColumn {
            name: column,
            ordinal: usize::try_from(ordinal).unwrap_or_default(),
            ty,
            is_key,
        });
    }
    instance(opts, schema, table, name, object_id, columns)
}

/// Builds an instance from its columns; it must have a key.
pub(crate) fn instance(
    opts: &config::SqlServerSource,
    schema: &str,
    table: &str,
    name: &str,
    object_id: i64,
    columns: Vec<CapturedColumn>,
) -> Result<Instance, SourceError> {
    if columns.is_empty() {
        return Err(SourceError::fatal(format!(
            "{}: capture instance {name} of {schema}.{table} has no captured columns visible to user {}",
            opts.name, opts.user
        )));
    }
    if !columns.iter().any(|c| c.is_key) {
        return Err(SourceError::fatal(format!(
            "{}: table {schema}.{table} (capture instance {name}) has no primary key or unique \
             index that CDC identifies rows by; Zipline needs one to route and apply changes. \
             Add a primary key, then recreate the capture instance (or pass @index_name to \
             sys.sp_cdc_enable_table)",
            opts.name
        )));
    }
    let shape = Table::new(
        schema.to_owned(),
        table.to_owned(),
        columns
            .iter()
            .map(|c| Column {
                name: c.name.clone(),
                type_oid: c.ty.pg_type_oid(),
                type_modifier: -1,
                is_key: c.is_key,
            })
            .collect(),
    );
    let select = columns.iter().map(|c| c.ty.select_expr(&c.name)).collect();
    Ok(Instance {
        name: name.to_owned(),
        start_lsn: Lsn(0),
        object_id,
        columns,
        shape: Arc::new(shape),
        select,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(name: &str, start: u128) -> Instance {
        let col = CapturedColumn {
            name: "id".into(),
            ordinal: 1,
            ty: SqlType::Int,
            is_key: true,
        };
        Instance {
            name: name.into(),
            start_lsn: Lsn(start),
            object_id: 1,
            columns: vec![col],
            shape: Arc::new(Table::new("dbo".into(), "t".into(), vec![])),
            select: vec!["[id]".into()],
        }
    }

    fn table(instances: Vec<Instance>) -> Captured {
        Captured {
            schema: "dbo".into(),
            name: "t".into(),
            instances,
        }
    }

    fn read(instance: usize, from: u128, to: u128) -> Read {
        Read {
            instance,
            from: Lsn(from),
            to: Lsn(to),
        }
    }

    #[test]
    fn one_instance_serves_the_window() {
        let t = table(vec![inst("a", 5)]);
        assert_eq!(
            plan_reads(&t, Lsn(10), Lsn(20)).unwrap(),
            vec![read(0, 11, 20)]
        );
        // Starting right at the low endpoint is fine.
        assert_eq!(plan_reads(&t, Lsn(4), Lsn(9)).unwrap(), vec![read(0, 5, 9)]);
        assert!(plan_reads(&t, Lsn(20), Lsn(20)).unwrap().is_empty());
    }

    #[test]
    fn retention_past_the_checkpoint_is_an_error() {
        let t = table(vec![inst("dbo_t", 50)]);
        let err = plan_reads(&t, Lsn(10), Lsn(60)).unwrap_err();
        assert!(
            err.contains("no longer reaches back to LSN 0x0000000000000000000A"),
            "{err}"
        );
        assert!(
            err.contains("dbo_t starts at 0x00000000000000000032"),
            "{err}"
        );
    }

    #[test]
    fn a_replacing_instance_takes_over_at_its_start() {
        let t = table(vec![inst("old", 5), inst("new", 30)]);
        // Window spans the switch: old up to 29, new from 30.
        assert_eq!(
            plan_reads(&t, Lsn(10), Lsn(40)).unwrap(),
            vec![read(0, 11, 29), read(1, 30, 40)]
        );
        // Window before the switch: old only.
        assert_eq!(
            plan_reads(&t, Lsn(10), Lsn(25)).unwrap(),
            vec![read(0, 11, 25)]
        );
        // Past the switch: new only.
        assert_eq!(
            plan_reads(&t, Lsn(35), Lsn(40)).unwrap(),
            vec![read(1, 36, 40)]
        );
        // The old instance already dropped while we were behind its successor's start.
        let t = table(vec![inst("new", 30)]);
        assert!(plan_reads(&t, Lsn(10), Lsn(40)).is_err());
        // The old one's data cleaned up past us, though the new one starts later still.
        let t = table(vec![inst("old", 20), inst("new", 30)]);
        assert!(plan_reads(&t, Lsn(10), Lsn(40)).is_err());
    }
}
