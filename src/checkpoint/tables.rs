//! The source tables a pipeline has applied, as each sink keeps them next to its checkpoints
//! (`_zipline_tables`): per table its source relation id and the shape of its last applied
//! rows, recorded once the first change of that shape is durable.
//!
//! A new connection's Relation messages are compared with these records, not only with what
//! the same connection saw before, so a column type changed, or a table dropped and created
//! again, while Zipline was stopped, lagging or reconnecting is noticed before the first row
//! that carries it, exactly as a live one is.

use serde::{Deserialize, Serialize};

use crate::change::{Column, Lsn, Table};

/// The name of the table of records, next to the checkpoint table.
pub(crate) const TABLES_TABLE: &str = "_zipline_tables";

/// One source table as the pipeline last applied it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRecord {
    /// The table's shape (schema, name, columns with types and key flags).
    pub table: Table,
    /// The source's relation id (PostgreSQL: the table's OID). A table dropped and created
    /// again gets another.
    pub relation: u32,
    /// The commit position of the first change applied with this shape.
    pub since: Lsn,
}

#[derive(Serialize, Deserialize)]
struct ColumnJson {
    name: String,
    type_oid: u32,
    type_modifier: i32,
    key: bool,
}

impl TableRecord {
    /// `schema.name`.
    pub fn name(&self) -> String {
        self.table.qualified_name()
    }

    /// The columns as JSON, as stored.
    pub(crate) fn columns_json(&self) -> String {
        let columns: Vec<ColumnJson> = self
            .table
            .columns
            .iter()
            .map(|c| ColumnJson {
                name: c.name.clone(),
                type_oid: c.type_oid,
                type_modifier: c.type_modifier,
                key: c.is_key,
            })
            .collect();
        serde_json::to_string(&columns).unwrap_or_default()
    }

    /// A record read back: `table` is `schema.name`; `None` when the stored columns are not
    /// readable (written by something else than Zipline), so the record is ignored.
    pub(crate) fn from_stored(
        table: &str,
        relation: u32,
        since: u128,
        columns: &str,
    ) -> Option<Self> {
        let (schema, name) = table.split_once('.')?;
        let columns: Vec<ColumnJson> = serde_json::from_str(columns).ok()?;
        let columns = columns
            .into_iter()
            .map(|c| Column {
                name: c.name,
                type_oid: c.type_oid,
                type_modifier: c.type_modifier,
                is_key: c.key,
            })
            .collect();
        Some(TableRecord {
            table: Table::new(schema.to_owned(), name.to_owned(), columns),
            relation,
            since: Lsn(since),
        })
    }
}

/// Merges the records of several sinks: per table the one applied last (a record that one
/// sink failed to write is older there).
pub fn merge(per_sink: Vec<Vec<TableRecord>>) -> Vec<TableRecord> {
    let mut out: Vec<TableRecord> = Vec::new();
    for record in per_sink.into_iter().flatten() {
        match out.iter_mut().find(|r| r.name() == record.name()) {
            Some(known) if known.since < record.since => *known = record,
            Some(_) => {}
            None => out.push(record),
        }
    }
    out.sort_by_key(TableRecord::name);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, relation: u32, since: u128) -> TableRecord {
        TableRecord {
            table: Table::new(
                "public".into(),
                name.into(),
                vec![Column {
                    name: "id".into(),
                    type_oid: 20,
                    type_modifier: -1,
                    is_key: true,
                }],
            ),
            relation,
            since: Lsn(since),
        }
    }

    #[test]
    fn records_round_trip_and_merge_to_the_latest() {
        let r = record("orders", 16384, 7);
        let back = TableRecord::from_stored("public.orders", 16384, 7, &r.columns_json());
        assert_eq!(back.as_ref(), Some(&r));
        assert_eq!(TableRecord::from_stored("orders", 1, 1, "[]"), None);
        assert_eq!(TableRecord::from_stored("public.x", 1, 1, "not json"), None);
        let merged = merge(vec![
            vec![record("orders", 1, 5), record("items", 2, 3)],
            vec![record("orders", 9, 8)],
        ]);
        assert_eq!(merged, [record("items", 2, 3), record("orders", 9, 8)]);
    }
}
