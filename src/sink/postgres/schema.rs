//! What the sink's tables look like, whether they can take the source's rows, and creating
//! them when asked.
//!
//! A sink table is `<schema>.<source table name>`, `<schema>` being the connector's `schema`
//! or else the source table's own schema. It must exist (a table or a partitioned table), have
//! every source column (names compare exactly, as quoted identifiers do), and have a PRIMARY
//! KEY or UNIQUE index on exactly the source key columns that `ON CONFLICT` can use as its
//! arbiter: valid, not partial, no expressions, not deferrable
//! (<https://www.postgresql.org/docs/15/sql-insert.html#SQL-ON-CONFLICT>). Sink columns the
//! source lacks must be nullable, have a default or be identity columns; generated columns
//! cannot be written. Other unique indexes are allowed with a warning (a conflict on one is an
//! error the pipeline stops on). Every problem is reported at once, in one Fatal error.
//!
//! Source columns an existing table lacks are added first (nullable; see `lane/evolve.rs`),
//! as they are when the source gains them mid-stream.
//!
//! With `create_tables`, a missing table is created with the source's exact types:
//! `format_type(type OID, typmod)` evaluated on the sink, which is right for every built-in
//! type (their OIDs are fixed across clusters, `FirstNormalObjectId` = 16384). Types the
//! source cluster defined itself (enums, domains, composites, extension types) have OIDs that
//! mean nothing on the sink, so such tables must be created by hand. Columns are nullable
//! except the key, which becomes the PRIMARY KEY; defaults, constraints, collations and
//! indexes other than the key are not copied.

use std::collections::HashMap;
use std::sync::Arc;

use tokio_postgres::Client;

use super::copy::CopyType;
use super::errors::sink_error;
use super::sql::{push_ident, qualified};
use crate::change::Table;
use crate::error::ErrorClass;
use crate::sink::SinkError;

/// OIDs below this belong to objects created by `initdb`, the same in every cluster.
pub(super) const FIRST_NORMAL_OID: u32 = 16_384;

/// A sink column as the catalog describes it.
#[derive(Debug, Clone)]
struct SinkColumn {
    /// `"schema"."typname"`: the type itself, without modifier (see `sql.rs`).
    cast: String,
    /// NOT NULL without a default, not identity, not generated: every insert must set it.
    required: bool,
    generated: bool,
}

/// What a lane needs to know about one sink table.
#[derive(Debug, Clone)]
pub(super) struct SinkTable {
    /// `"schema"."name"`.
    pub(super) target: String,
    columns: HashMap<String, SinkColumn>,
    /// A plain table without rules or row-level security, which `COPY` writes exactly as
    /// `INSERT` would (see `copy.rs`).
    copy_ok: bool,
}

impl SinkTable {
    /// Columns every insert must set (NOT NULL without a default, not identity or generated).
    pub(super) fn required_columns(&self) -> impl Iterator<Item = &str> {
        self.columns
            .iter()
            .filter(|(_, c)| c.required)
            .map(|(n, _)| n.as_str())
    }

    /// The cast target for values of sink column `column`.
    pub(super) fn cast(&self, column: &str) -> Option<&str> {
        self.columns.get(column).map(|c| c.cast.as_str())
    }

    /// The format `COPY` writes sink column `column` in; `None` if `COPY` must not be used.
    pub(super) fn copy_type(&self, column: &str) -> Option<CopyType> {
        if !self.copy_ok {
            return None;
        }
        let c = self.columns.get(column).filter(|c| !c.generated)?;
        CopyType::for_cast(&c.cast)
    }

    #[cfg(any(test, feature = "bench"))]
    pub(super) fn for_tests(target: &str, cols: &[(&str, &str)]) -> SinkTable {
        SinkTable {
            target: target.to_owned(),
            columns: cols
                .iter()
                .map(|&(name, cast)| {
                    let col = SinkColumn {
                        cast: cast.to_owned(),
                        required: false,
                        generated: false,
                    };
                    (name.to_owned(), col)
                })
                .collect(),
            copy_ok: true,
        }
    }
}

/// The catalog's view of one relation.
struct Relation {
    oid: u32,
    kind: i8,
    table: SinkTable,
}

/// Reads table `schema.name` from the catalog; `None` if it does not exist.
async fn relation(
    client: &Client,
    schema: &str,
    name: &str,
) -> Result<Option<Relation>, tokio_postgres::Error> {
    let target = qualified(schema, name);
    let Some(row) = client
        .query_opt(
            "SELECT c.oid, c.relkind, c.relkind IN ('r', 'p') AND NOT c.relhasrules \
                    AND NOT c.relrowsecurity \
             FROM pg_catalog.pg_class c WHERE c.oid = to_regclass($1)",
            &[&target],
        )
        .await?
    else {
        return Ok(None);
    };
    let oid: u32 = row.get(0);
    let kind: i8 = row.get(1);
    let copy_ok: bool = row.get(2);
    let rows = client
        .query(
            "SELECT a.attname::text, tn.nspname::text, t.typname::text, \
                    a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' \
                        AND a.attgenerated = '', \
                    a.attgenerated <> '' \
             FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
             JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace \
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
            &[&oid],
        )
        .await?;
    let columns = rows
        .iter()
        .map(|r| {
            let column = SinkColumn {
                cast: qualified(r.get(1), r.get(2)),
                required: r.get(3),
                generated: r.get(4),
            };
            (r.get::<_, String>(0), column)
        })
        .collect();
    Ok(Some(Relation {
        oid,
        kind,
        table: SinkTable {
            target,
            columns,
            copy_ok,
        },
    }))
}

/// Loads the sink table for a lane; `None` if it does not exist.
pub(super) async fn load(
    client: &Client,
    schema: &str,
    name: &str,
) -> Result<Option<SinkTable>, tokio_postgres::Error> {
    Ok(relation(client, schema, name).await?.map(|r| r.table))
}

/// Unique indexes usable as `ON CONFLICT` arbiters, by name, with their key columns; plus the
/// names of unique indexes that are not (partial, expression, deferrable).
async fn unique_indexes(
    client: &Client,
    oid: u32,
) -> Result<Vec<(String, Option<Vec<String>>)>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT i.indexrelid::regclass::text, \
                    i.indisvalid AND i.indimmediate AND i.indpred IS NULL \
                        AND i.indexprs IS NULL, \
                    array_agg(a.attname::text ORDER BY k.n) \
             FROM pg_catalog.pg_index i \
             CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n) \
             LEFT JOIN pg_catalog.pg_attribute a \
                    ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = $1 AND i.indisunique AND k.n <= i.indnkeyatts \
             GROUP BY i.indexrelid, 2 ORDER BY 1",
            &[&oid],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let usable: bool = r.get(1);
            let cols: Vec<Option<String>> = r.get(2);
            let cols = cols.into_iter().collect::<Option<Vec<String>>>();
            (r.get(0), cols.filter(|_| usable))
        })
        .collect())
}

/// Checks every table (see the module docs), creating missing ones first when `create` is
/// set. `schema` is the connector's `schema` option.
pub(super) async fn check(
    client: &Client,
    sink: &str,
    schema: Option<&str>,
    create: bool,
    tables: &[Arc<Table>],
) -> Result<(), SinkError> {
    let mut problems = Vec::new();
    for table in tables {
        let target_schema = schema.unwrap_or(&table.schema);
        let target = qualified(target_schema, &table.name);
        let reading = |e: tokio_postgres::Error| {
            sink_error(
                sink,
                &format!("reading the definition of table {target}"),
                &e,
            )
        };
        let mut rel = relation(client, target_schema, &table.name)
            .await
            .map_err(reading)?;
        if rel.is_none() && create {
            match create_table(client, sink, target_schema, table).await? {
                Some(problem) => {
                    problems.push(problem);
                    continue;
                }
                None => {
                    rel = relation(client, target_schema, &table.name)
                        .await
                        .map_err(reading)?
                }
            }
        }
        let Some(rel) = rel else {
            problems.push(format!(
                "table {target} does not exist (source table {}); create it with a primary key \
                 on ({}), or set create_tables: true",
                table.qualified_name(),
                key_names(table).join(", ")
            ));
            continue;
        };
        // 'r' ordinary table, 'p' partitioned table.
        if rel.kind != b'r' as i8 && rel.kind != b'p' as i8 {
            problems.push(format!(
                "{target} is not a table (relkind '{}'); Zipline writes tables only",
                rel.kind as u8 as char
            ));
            continue;
        }
        // Columns the source gained while Zipline was stopped are added as they would be
        // mid-stream (see `lane/evolve.rs`).
        let fitted = super::lane::evolve::fit(client, sink, table, &rel.table, false);
        let rel = match fitted.await {
            Ok(false) => rel,
            Ok(true) => relation(client, target_schema, &table.name)
                .await
                .map_err(reading)?
                .unwrap_or(rel),
            Err(e) if e.class == ErrorClass::Transient => return Err(e),
            Err(e) => {
                let prefix = format!("sink {sink}: ");
                let text = e.report();
                problems.push(text.strip_prefix(&prefix).unwrap_or(&text).to_owned());
                continue;
            }
        };
        let indexes = unique_indexes(client, rel.oid).await.map_err(reading)?;
        problems.extend(table_problems(table, &rel.table, &indexes, sink));
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

fn key_names(table: &Table) -> Vec<&str> {
    table
        .key
        .iter()
        .map(|&i| table.columns[i].name.as_str())
        .collect()
}

/// The problems of one existing table, as sentences.
fn table_problems(
    table: &Table,
    sink_table: &SinkTable,
    indexes: &[(String, Option<Vec<String>>)],
    sink: &str,
) -> Vec<String> {
    let name = &sink_table.target;
    let mut problems = Vec::new();
    for col in &table.columns {
        match sink_table.columns.get(&col.name) {
            None => problems.push(format!(
                "table {name} has no column \"{}\" (source column {}.{}); add it",
                col.name,
                table.qualified_name(),
                col.name
            )),
            Some(c) if c.generated => problems.push(format!(
                "column {name}.\"{}\" is generated, so Zipline cannot write source column {}.{}",
                col.name,
                table.qualified_name(),
                col.name
            )),
            Some(_) => {}
        }
    }
    let mut required: Vec<&String> = sink_table
        .columns
        .iter()
        .filter(|(n, c)| c.required && !table.columns.iter().any(|s| &s.name == *n))
        .map(|(n, _)| n)
        .collect();
    required.sort();
    for n in required {
        problems.push(format!(
            "column {name}.\"{n}\" is NOT NULL without a default and source table {} has no \
             such column, so inserts would fail; give it a default or make it nullable",
            table.qualified_name()
        ));
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
        cols.len() == key.len() && key.iter().all(|k| cols.iter().any(|c| c == k))
    };
    let arbiter = indexes
        .iter()
        .find(|(_, cols)| cols.as_ref().is_some_and(matches_key));
    match arbiter {
        None => problems.push(format!(
            "table {name} has no PRIMARY KEY or UNIQUE index on exactly ({}), the key of source \
             table {} (partial, expression and deferrable indexes do not count: ON CONFLICT \
             cannot use them); without one, upserts cannot find existing rows",
            key.join(", "),
            table.qualified_name()
        )),
        Some((arbiter, _)) => {
            let others: Vec<&str> = indexes
                .iter()
                .map(|(n, _)| n.as_str())
                .filter(|n| n != arbiter)
                .collect();
            if !others.is_empty() {
                tracing::warn!(
                    sink,
                    table = %name,
                    indexes = ?others,
                    "sink table has unique indexes besides its key; a row that conflicts on one \
                     of them stops the pipeline with a unique-violation error"
                );
            }
        }
    }
    problems
}

/// Creates `schema.table` with the source's types and a primary key on its key. Returns a
/// problem sentence when the table cannot be created from what the source tells.
async fn create_table(
    client: &Client,
    sink: &str,
    schema: &str,
    table: &Table,
) -> Result<Option<String>, SinkError> {
    let target = qualified(schema, &table.name);
    let user_types: Vec<String> = table
        .columns
        .iter()
        .filter(|c| c.type_oid >= FIRST_NORMAL_OID)
        .map(|c| format!("\"{}\" (type OID {})", c.name, c.type_oid))
        .collect();
    if !user_types.is_empty() {
        return Ok(Some(format!(
            "table {target} does not exist and create_tables cannot create it: columns {} of \
             source table {} have types defined in the source database, which the sink may \
             not have or may number differently; create the table yourself",
            user_types.join(", "),
            table.qualified_name()
        )));
    }
    if table.key.is_empty() {
        return Ok(Some(format!(
            "table {target} does not exist and create_tables cannot create it: source table {} \
             has no key columns (replica identity)",
            table.qualified_name()
        )));
    }
    let oids: Vec<u32> = table.columns.iter().map(|c| c.type_oid).collect();
    let mods: Vec<i32> = table.columns.iter().map(|c| c.type_modifier).collect();
    let types: Vec<Option<String>> = client
        .query(
            "SELECT format_type(t.o, t.m) FROM unnest($1::oid[], $2::int4[]) \
             WITH ORDINALITY AS t(o, m, n) ORDER BY t.n",
            &[&oids, &mods],
        )
        .await
        .map_err(|e| sink_error(sink, &format!("naming the column types of {target}"), &e))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    // CREATE SCHEMA needs CREATE on the database even when the schema exists: ask first.
    let schema_exists: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)",
            &[&schema],
        )
        .await
        .map_err(|e| sink_error(sink, &format!("looking up schema {schema}"), &e))?
        .get(0);
    let mut ddl = String::new();
    if !schema_exists {
        ddl.push_str("CREATE SCHEMA IF NOT EXISTS ");
        push_ident(&mut ddl, schema);
        ddl.push_str("; ");
    }
    ddl.push_str("CREATE TABLE IF NOT EXISTS ");
    ddl.push_str(&target);
    ddl.push_str(" (");
    for (col, ty) in table.columns.iter().zip(&types) {
        let Some(ty) = ty.as_deref().filter(|t| !t.contains("???")) else {
            return Ok(Some(format!(
                "table {target} does not exist and create_tables cannot create it: the sink \
                 does not know type OID {} of source column {}.{}",
                col.type_oid,
                table.qualified_name(),
                col.name
            )));
        };
        push_ident(&mut ddl, &col.name);
        ddl.push(' ');
        ddl.push_str(ty);
        ddl.push_str(", ");
    }
    ddl.push_str("PRIMARY KEY (");
    for (n, name) in key_names(table).iter().enumerate() {
        if n > 0 {
            ddl.push_str(", ");
        }
        push_ident(&mut ddl, name);
    }
    ddl.push_str("))");
    client
        .batch_execute(&ddl)
        .await
        .map_err(|e| sink_error(sink, &format!("creating table {target}"), &e))?;
    tracing::info!(sink, table = %target, source = %table.qualified_name(), "created sink table");
    Ok(None)
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

    fn sink_table(cols: &[(&str, bool, bool)]) -> SinkTable {
        SinkTable {
            target: "\"public\".\"orders\"".into(),
            columns: cols
                .iter()
                .map(|&(name, required, generated)| {
                    let col = SinkColumn {
                        cast: "\"pg_catalog\".\"int4\"".into(),
                        required,
                        generated,
                    };
                    (name.to_owned(), col)
                })
                .collect(),
            copy_ok: true,
        }
    }

    fn index(name: &str, cols: Option<&[&str]>) -> (String, Option<Vec<String>>) {
        (
            name.to_owned(),
            cols.map(|c| c.iter().map(|s| (*s).to_owned()).collect()),
        )
    }

    #[test]
    fn a_matching_table_has_no_problems() {
        let t = table(&[("id", true), ("note", false)]);
        let s = sink_table(&[
            ("id", true, false),
            ("note", false, false),
            ("extra", false, false),
        ]);
        let idx = [index("orders_pkey", Some(&["id"]))];
        assert!(table_problems(&t, &s, &idx, "out").is_empty());
    }

    #[test]
    fn missing_columns_keys_and_required_columns_are_named() {
        let t = table(&[("id", true), ("region", true), ("Note", false)]);
        let s = sink_table(&[
            ("id", true, false),
            ("region", true, false),
            ("note", false, false),
            ("tenant", true, false),
            ("total", false, true),
        ]);
        let idx = [
            index("orders_pkey", Some(&["id"])),
            index("by_region_partial", None),
        ];
        let problems = table_problems(&t, &s, &idx, "out");
        assert_eq!(problems.len(), 3, "{problems:?}");
        // Quoted identifiers are case-sensitive: "Note" is not "note".
        assert_eq!(
            problems[0],
            "table \"public\".\"orders\" has no column \"Note\" (source column \
             public.orders.Note); add it"
        );
        assert!(problems[1].contains("\"orders\".\"tenant\" is NOT NULL without a default"));
        assert!(
            problems[2].contains("no PRIMARY KEY or UNIQUE index on exactly (id, region)"),
            "{}",
            problems[2]
        );
    }

    #[test]
    fn generated_columns_cannot_be_written() {
        let t = table(&[("id", true), ("total", false)]);
        let s = sink_table(&[("id", true, false), ("total", false, true)]);
        let idx = [index("u", Some(&["id"]))];
        let problems = table_problems(&t, &s, &idx, "out");
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].contains("\"total\" is generated"),
            "{}",
            problems[0]
        );
    }
}
