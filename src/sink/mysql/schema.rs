//! Checking that the sink's tables can take the source's rows, from `information_schema`.
//!
//! For each source table the sink table `<database>.<name>` must exist, have every source
//! column (MySQL column names compare case-insensitively), and have a PRIMARY KEY or UNIQUE
//! index on exactly the source key columns: `ON DUPLICATE KEY UPDATE` only finds the row to
//! update through a unique index, so without one every update would add a row. Unique prefix
//! indexes do not count (they would merge rows that differ after the prefix). Sink columns the
//! source lacks must be nullable or have a default, and generated columns cannot be written.
//! Other unique indexes are allowed with a warning: a conflict on one makes the upsert update
//! the *other* row.
//!
//! With `create_tables: true` a missing table is first created from the source's columns
//! (see `ddl.rs`). The sink columns' data types are kept in [`SinkTypes`]: how a value MySQL
//! cannot represent is written depends on them (see `literal.rs`).
//!
//! Every problem found is reported at once, in one Fatal error.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use super::ddl;
use super::errors::sink_error;
use super::literal::{SinkClass, push_ident, push_str};
use crate::change::Table;
use crate::sink::SinkError;

/// The class of every sink column, by table name, then lower-cased column name; filled when
/// the tables are checked, read for every statement.
#[derive(Default)]
pub(super) struct SinkTypes(RwLock<HashMap<String, Arc<HashMap<String, SinkClass>>>>);

impl SinkTypes {
    fn set(&self, table: &str, columns: &[SinkColumn]) {
        let classes = columns
            .iter()
            .map(|c| (c.name.to_lowercase(), SinkClass::of(&c.data_type)))
            .collect();
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(table.to_owned(), Arc::new(classes));
    }

    /// Reads the column types of every sink table of `shapes` not known yet, or known without
    /// one of the shape's columns (added since): a transform may route changes to tables the
    /// check never saw, and the snapshot writes through connector instances of its own.
    pub(super) async fn ensure<'t>(
        &self,
        conn: &mut Conn,
        database: &str,
        shapes: impl IntoIterator<Item = &'t Table>,
    ) -> Result<(), mysql_async::Error> {
        let mut missing: Vec<String> = {
            let known = self
                .0
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            shapes
                .into_iter()
                .filter(|shape| match known.get(&shape.name) {
                    None => true,
                    Some(cols) => shape
                        .columns
                        .iter()
                        .any(|c| !cols.contains_key(&c.name.to_lowercase())),
                })
                .map(|shape| shape.name.clone())
                .collect()
        };
        missing.sort_unstable();
        missing.dedup();
        for table in missing {
            let cols = columns(conn, database, &table).await?;
            if !cols.is_empty() {
                self.set(&table, &cols);
            }
        }
        Ok(())
    }

    /// The class of each of `shape`'s columns in the sink ([`SinkClass::Strict`] where the
    /// sink column is not known).
    pub(super) fn classes(&self, shape: &Table) -> Vec<SinkClass> {
        let known = self
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&shape.name)
            .cloned();
        shape
            .columns
            .iter()
            .map(|c| {
                known
                    .as_ref()
                    .and_then(|k| k.get(&c.name.to_lowercase()).copied())
                    .unwrap_or_default()
            })
            .collect()
    }
}

/// A sink column, as `information_schema.COLUMNS` describes it.
struct SinkColumn {
    name: String,
    /// `DATA_TYPE`, e.g. `decimal`, `longtext`.
    data_type: String,
    /// NOT NULL, no default, not auto-increment, not generated: every insert must set it.
    required: bool,
    generated: bool,
}

/// Checks every table in `tables` (see the module docs), creating missing ones first when
/// `create` is set, and records the sink column types in `types`.
pub(super) async fn check(
    conn: &mut Conn,
    sink: &str,
    database: &str,
    tables: &[Arc<Table>],
    create: bool,
    types: &SinkTypes,
) -> Result<(), SinkError> {
    let mut problems = Vec::new();
    for table in tables {
        let doing = format!(
            "reading the definition of table {}",
            target(database, table)
        );
        let mut columns = columns(conn, database, &table.name)
            .await
            .map_err(|e| sink_error(sink, &doing, &e))?;
        if columns.is_empty() && create {
            let sql = match ddl::create_table_sql(database, table) {
                Ok(sql) => sql,
                Err(problem) => {
                    problems.push(format!(
                        "cannot create table {}: {problem}",
                        target(database, table)
                    ));
                    continue;
                }
            };
            let creating = format!("creating table {}", target(database, table));
            conn.query_drop(&sql)
                .await
                .map_err(|e| sink_error(sink, &creating, &e))?;
            tracing::info!(sink, table = %target(database, table), source = %table.qualified_name(), "created the sink table");
            columns = self::columns(conn, database, &table.name)
                .await
                .map_err(|e| sink_error(sink, &doing, &e))?;
        }
        if columns.is_empty() {
            problems.push(format!(
                "table {} does not exist (source table {}); create it with a primary key on ({}), \
                 or set create_tables: true",
                target(database, table),
                table.qualified_name(),
                key_names(table).join(", ")
            ));
            continue;
        }
        types.set(&table.name, &columns);
        let indexes = unique_indexes(conn, database, &table.name)
            .await
            .map_err(|e| sink_error(sink, &doing, &e))?;
        problems.extend(table_problems(database, table, &columns, &indexes, sink));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(SinkError::fatal(format!(
            "sink {sink}: {}",
            problems.join("; ")
        )))
    }
}

pub(super) fn target(database: &str, table: &Table) -> String {
    let mut out = String::new();
    push_ident(&mut out, database);
    out.push('.');
    push_ident(&mut out, &table.name);
    out
}

fn key_names(table: &Table) -> Vec<&str> {
    table
        .key
        .iter()
        .map(|&i| table.columns[i].name.as_str())
        .collect()
}

pub(super) fn same_name(a: &str, b: &str) -> bool {
    a.to_lowercase() == b.to_lowercase()
}

/// The problems of one existing table, as sentences.
fn table_problems(
    database: &str,
    table: &Table,
    columns: &[SinkColumn],
    indexes: &BTreeMap<String, Option<Vec<String>>>,
    sink: &str,
) -> Vec<String> {
    let name = target(database, table);
    let mut problems = Vec::new();
    for col in &table.columns {
        match columns.iter().find(|c| same_name(&c.name, &col.name)) {
            None => problems.push(format!(
                "table {name} has no column `{}` (source column {}.{}); add it",
                col.name,
                table.qualified_name(),
                col.name
            )),
            Some(c) if c.generated => problems.push(format!(
                "column {name}.`{}` is generated, so Zipline cannot write source column {}.{}",
                c.name,
                table.qualified_name(),
                col.name
            )),
            Some(_) => {}
        }
    }
    for c in columns {
        if c.required && !table.columns.iter().any(|s| same_name(&s.name, &c.name)) {
            problems.push(format!(
                "column {name}.`{}` is NOT NULL without a default and source table {} has no \
                 such column, so inserts would fail; give it a default or make it nullable",
                c.name,
                table.qualified_name()
            ));
        }
    }
    let key = key_names(table);
    if key.is_empty() {
        problems.push(format!(
            "source table {} has no key columns (replica identity); Zipline needs a key to \
             upsert and delete rows",
            table.qualified_name()
        ));
        return problems;
    }
    let matches_key = |cols: &Vec<String>| {
        cols.len() == key.len() && key.iter().all(|k| cols.iter().any(|c| same_name(c, k)))
    };
    let key_index = indexes
        .iter()
        .find(|(_, cols)| cols.as_ref().is_some_and(matches_key));
    match key_index {
        None => problems.push(format!(
            "table {name} has no PRIMARY KEY or UNIQUE index on exactly ({}), the key of source \
             table {}; without one, upserts would duplicate rows",
            key.join(", "),
            table.qualified_name()
        )),
        Some((key_index, _)) => {
            let others: Vec<&str> = indexes
                .keys()
                .filter(|n| *n != key_index)
                .map(String::as_str)
                .collect();
            if !others.is_empty() {
                tracing::info!(
                    sink,
                    table = %name,
                    indexes = ?others,
                    "sink table has unique keys besides its key: a change that conflicts on one \
                     fails (per on_error) instead of touching the other row, and the initial \
                     snapshot writes this table with upserts, not LOAD DATA … REPLACE"
                );
            }
        }
    }
    problems
}

async fn columns(
    conn: &mut Conn,
    database: &str,
    table: &str,
) -> Result<Vec<SinkColumn>, mysql_async::Error> {
    let mut sql = String::from(
        "SELECT COLUMN_NAME, DATA_TYPE, IS_NULLABLE, COLUMN_DEFAULT IS NULL, EXTRA \
         FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=",
    );
    push_str(&mut sql, database);
    sql.push_str(" AND TABLE_NAME=");
    push_str(&mut sql, table);
    let rows: Vec<(String, String, String, bool, Option<String>)> = conn.query(sql).await?;
    Ok(rows
        .into_iter()
        .map(|(name, data_type, nullable, no_default, extra)| {
            let extra = extra.unwrap_or_default().to_ascii_lowercase();
            // MySQL also says DEFAULT_GENERATED for expression defaults, which are writable.
            let generated = [
                "virtual generated",
                "stored generated",
                "persistent generated",
            ]
            .iter()
            .any(|g| extra.contains(g));
            let required =
                nullable == "NO" && no_default && !extra.contains("auto_increment") && !generated;
            SinkColumn {
                name,
                data_type,
                required,
                generated,
            }
        })
        .collect())
}

/// Unique indexes by name: their columns, or `None` when one is a prefix or an expression.
pub(super) async fn unique_indexes(
    conn: &mut Conn,
    database: &str,
    table: &str,
) -> Result<BTreeMap<String, Option<Vec<String>>>, mysql_async::Error> {
    let mut sql = String::from(
        "SELECT INDEX_NAME, COLUMN_NAME, SUB_PART IS NULL \
         FROM information_schema.STATISTICS WHERE NON_UNIQUE=0 AND TABLE_SCHEMA=",
    );
    push_str(&mut sql, database);
    sql.push_str(" AND TABLE_NAME=");
    push_str(&mut sql, table);
    sql.push_str(" ORDER BY INDEX_NAME, SEQ_IN_INDEX");
    let rows: Vec<(String, Option<String>, bool)> = conn.query(sql).await?;
    let mut indexes: BTreeMap<String, Option<Vec<String>>> = BTreeMap::new();
    for (index, column, whole) in rows {
        let entry = indexes.entry(index).or_insert_with(|| Some(Vec::new()));
        match (column, whole) {
            (Some(column), true) => {
                if let Some(cols) = entry {
                    cols.push(column);
                }
            }
            _ => *entry = None,
        }
    }
    Ok(indexes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::Column;

    fn table(cols: &[(&str, bool)]) -> Table {
        Table::new(
            "public".into(),
            "orders".into(),
            cols.iter()
                .map(|&(name, is_key)| Column {
                    name: name.into(),
                    type_oid: 23,
                    type_modifier: -1,
                    is_key,
                })
                .collect(),
        )
    }

    fn col(name: &str, required: bool, generated: bool) -> SinkColumn {
        SinkColumn {
            name: name.into(),
            data_type: "int".into(),
            required,
            generated,
        }
    }

    fn index(cols: &[&str]) -> Option<Vec<String>> {
        Some(cols.iter().map(|c| (*c).to_owned()).collect())
    }

    #[test]
    fn a_matching_table_has_no_problems() {
        let t = table(&[("id", true), ("Note", false)]);
        let cols = [
            col("ID", true, false),
            col("note", false, false),
            col("extra", false, false),
        ];
        let idx = BTreeMap::from([("PRIMARY".to_owned(), index(&["Id"]))]);
        assert!(table_problems("shop", &t, &cols, &idx, "out").is_empty());
    }

    #[test]
    fn missing_columns_keys_and_required_columns_are_named() {
        let t = table(&[("id", true), ("region", true), ("note", false)]);
        let cols = [
            col("id", true, false),
            col("region", true, false),
            col("tenant", true, false),
        ];
        let idx = BTreeMap::from([
            ("PRIMARY".to_owned(), index(&["id"])),
            ("by_prefix".to_owned(), None),
        ]);
        let problems = table_problems("shop", &t, &cols, &idx, "out");
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert_eq!(
            problems[0],
            "table `shop`.`orders` has no column `note` (source column public.orders.note); add it"
        );
        assert!(problems[1].contains("`shop`.`orders`.`tenant` is NOT NULL without a default"));
        assert!(
            problems[2].contains("no PRIMARY KEY or UNIQUE index on exactly (id, region)"),
            "{}",
            problems[2]
        );
    }

    #[test]
    fn generated_columns_cannot_be_written() {
        let t = table(&[("id", true), ("total", false)]);
        let cols = [col("id", true, false), col("total", false, true)];
        let idx = BTreeMap::from([("u".to_owned(), index(&["id"]))]);
        let problems = table_problems("shop", &t, &cols, &idx, "out");
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].contains("`total` is generated"),
            "{}",
            problems[0]
        );
    }
}
