//! From a coalesced batch to statements with array parameters.
//!
//! Per table, in order of first appearance: `TRUNCATE` for a truncate, then deletes, then
//! upserts (deletes first, so a key deleted and re-inserted, or moved away and back, ends
//! right; coalescing leaves at most one effect per key). Each delete group and each upsert
//! group is one statement whose parameters are column arrays (see `encode.rs`):
//!
//! ```sql
//! DELETE FROM "s"."t" AS t USING unnest($1::int8[]) AS u(c1) WHERE t."id" = u.c1::"pg_catalog"."int8"
//! INSERT INTO "s"."t" ("id","note") OVERRIDING SYSTEM VALUE
//!   SELECT u.c1::"pg_catalog"."int8", u.c2::"pg_catalog"."text"
//!   FROM unnest($1::int8[], $2::text[]) AS u(c1, c2)
//!   ON CONFLICT ("id") DO UPDATE SET "note" = EXCLUDED."note"
//! ```
//!
//! Every value is cast to its sink column's type by the type's own quoted name
//! (`"pg_catalog"."bpchar"`), never by `format_type`'s spelling: `character` and `bit` mean
//! length 1 in a cast and would truncate. The cast carries no type modifier, so the insert's
//! assignment then checks `varchar(n)`, `numeric(p,s)` and friends exactly as a plain INSERT
//! would (an explicit cast to `varchar(5)` would silently truncate instead). Columns left out
//! of an upsert group (TOASTed values the update did not touch) keep their stored value.
//! `OVERRIDING SYSTEM VALUE` lets rows carry their own values for `GENERATED ALWAYS AS
//! IDENTITY` columns, as native logical replication does; it is a no-op elsewhere.
//!
//! Rows the batch inserted first (`fresh`) may instead go in a plain `INSERT` without the
//! `ON CONFLICT` clause (see [`batch`]).
//!
//! The text of a statement depends only on the target, the shape, the omitted columns and the
//! wire types, so each lane prepares it once and reuses it. A group larger than
//! [`MAX_ROWS`] rows or about [`MAX_BYTES`] bytes is cut into several statements.

use std::ops::Range;

use super::copy::CopyType;
use super::encode::{Param, Wire};
use super::schema::SinkTable;
use crate::change::{Change, Table, Value};
use crate::sink::coalesce::{Row, TablePlan};

/// Most rows in one statement.
pub(super) const MAX_ROWS: usize = 20_000;
/// Soft cap on the parameter bytes of one statement (a single row may exceed it).
pub(super) const MAX_BYTES: usize = 32 << 20;

/// Appends `"ident"` with embedded double quotes doubled.
pub(crate) fn push_ident(buf: &mut String, ident: &str) {
    buf.push('"');
    for c in ident.chars() {
        if c == '"' {
            buf.push('"');
        }
        buf.push(c);
    }
    buf.push('"');
}

/// `"schema"."name"`.
pub(crate) fn qualified(schema: &str, name: &str) -> String {
    let mut out = String::with_capacity(schema.len() + name.len() + 5);
    push_ident(&mut out, schema);
    out.push('.');
    push_ident(&mut out, name);
    out
}

/// What a statement does, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Truncate,
    Delete,
    Upsert,
    /// A plain `INSERT` of rows whose keys the sink should not have (see `fresh`).
    Insert,
    /// The same rows by `COPY … FROM STDIN (FORMAT binary)` (see `copy.rs`).
    Copy,
    /// The `UPDATE` that moves a row to its new key, keeping its TOASTed columns.
    Move,
}

/// One statement of a batch.
#[derive(Debug)]
pub(super) struct Stmt<'a> {
    pub(super) sql: String,
    pub(super) params: Vec<Param<'a>>,
    pub(super) kind: Kind,
    /// Index of the table in the batch's plan.
    pub(super) table: usize,
    /// Index of the group in its table's deletes or upserts.
    pub(super) group: usize,
    /// The group's rows (or keys) this statement carries.
    pub(super) rows: Range<usize>,
    /// For [`Kind::Copy`]: the format of each parameter's column; empty otherwise.
    pub(super) copy: Vec<CopyType>,
}

/// A source column the sink table lacks (the sink table info may be stale: reload and retry).
#[derive(Debug)]
pub(super) struct MissingColumn {
    pub(super) table: usize,
    pub(super) column: String,
}

fn cast<'s>(sink: &'s SinkTable, table: usize, column: &str) -> Result<&'s str, MissingColumn> {
    sink.cast(column).ok_or_else(|| MissingColumn {
        table,
        column: column.to_owned(),
    })
}

/// Appends the statements of `tables` (a coalesced batch) to `out`; `sinks[i]` describes the
/// target of `tables[i]`. With `fast`, the leading fresh rows of each upsert group (see
/// [`partition_fresh`]) get a plain `INSERT`, which costs the server about half an upsert's
/// work; a unique violation on it means the batch is a replay, to be written again without
/// `fast`.
pub(super) fn batch<'a>(
    tables: &'a [TablePlan<'a>],
    sinks: &[&SinkTable],
    fast: bool,
    out: &mut Vec<Stmt<'a>>,
) -> Result<(), MissingColumn> {
    for (t, (plan, sink)) in tables.iter().zip(sinks).enumerate() {
        if plan.delete_all {
            out.push(truncate(&sink.target, t));
        }
        for (g, group) in plan.deletes.iter().enumerate() {
            let shape = group.shape;
            let key_cols: Vec<usize> = shape.key.clone();
            let wires: Vec<Wire> = key_cols
                .iter()
                .enumerate()
                .map(|(pos, &i)| {
                    Wire::choose(
                        shape.columns[i].type_oid,
                        group.keys.iter().map(|k| &k[pos]),
                    )
                })
                .collect();
            let mut sql = String::from("DELETE FROM ");
            sql.push_str(&sink.target);
            sql.push_str(" AS t USING ");
            push_unnest(&mut sql, &wires);
            sql.push_str(" WHERE ");
            for (pos, &i) in key_cols.iter().enumerate() {
                if pos > 0 {
                    sql.push_str(" AND ");
                }
                let name = &shape.columns[i].name;
                sql.push_str("t.");
                push_ident(&mut sql, name);
                sql.push_str(" = ");
                push_u_cast(&mut sql, pos, cast(sink, t, name)?);
            }
            for rows in chunks(group.keys.len(), |n| {
                group.keys[n].iter().map(Param::approx_bytes).sum()
            }) {
                let keys = &group.keys[rows.clone()];
                let params = wires
                    .iter()
                    .enumerate()
                    .map(|(pos, &w)| Param::keys(w, keys, pos))
                    .collect();
                out.push(Stmt {
                    sql: sql.clone(),
                    params,
                    kind: Kind::Delete,
                    table: t,
                    group: g,
                    rows,
                    copy: Vec::new(),
                });
            }
        }
        for (g, group) in plan.upserts.iter().enumerate() {
            let shape = group.shape;
            let kept: Vec<usize> = (0..shape.columns.len())
                .filter(|&i| !group.omit[i])
                .collect();
            let wires: Vec<Wire> = kept
                .iter()
                .map(|&i| {
                    Wire::choose(
                        shape.columns[i].type_oid,
                        group.rows.iter().map(|r| &r.values()[i]),
                    )
                })
                .collect();
            let upsert = upsert_sql(sink, t, shape, &kept, &wires)?;
            let fresh = if fast {
                group.fresh.iter().take_while(|&&f| f).count()
            } else {
                0
            };
            let copy = if fresh > 0 {
                copy_types(sink, shape, &kept, &group.rows[..fresh])
            } else {
                None
            };
            let copying = copy.is_some();
            if let Some(types) = copy {
                let rows = 0..fresh;
                let slice: &'a [Row<'a>] = &group.rows[rows.clone()];
                out.push(Stmt {
                    sql: copy_sql(sink, shape, &kept),
                    params: kept
                        .iter()
                        .map(|&i| Param::rows(Wire::Text, slice, i))
                        .collect(),
                    kind: Kind::Copy,
                    table: t,
                    group: g,
                    rows,
                    copy: types,
                });
            }
            let insert = match upsert.find(" ON CONFLICT ") {
                Some(end) if fresh > 0 && !copying => upsert[..end].to_owned(),
                _ => String::new(),
            };
            let inserted = if copying { 0..0 } else { 0..fresh };
            for (kind, sql, part) in [
                (Kind::Insert, &insert, inserted),
                (Kind::Upsert, &upsert, fresh..group.rows.len()),
            ] {
                let start = part.start;
                for rows in chunks(part.len(), |n| {
                    kept.iter()
                        .map(|&i| Param::approx_bytes(&group.rows[start + n].values()[i]))
                        .sum()
                }) {
                    let rows = start + rows.start..start + rows.end;
                    let slice: &'a [Row<'a>] = &group.rows[rows.clone()];
                    let params = kept
                        .iter()
                        .zip(&wires)
                        .map(|(&i, &w)| Param::rows(w, slice, i))
                        .collect();
                    out.push(Stmt {
                        sql: sql.clone(),
                        params,
                        kind,
                        table: t,
                        group: g,
                        rows,
                        copy: Vec::new(),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Reorders each upsert group so its fresh rows come first (order within a group does not
/// matter: its keys are distinct).
pub(super) fn partition_fresh(tables: &mut [TablePlan<'_>]) {
    for group in tables.iter_mut().flat_map(|t| t.upserts.iter_mut()) {
        if group.fresh.iter().all(|&f| f) || !group.fresh.iter().any(|&f| f) {
            continue;
        }
        let rows = std::mem::take(&mut group.rows);
        let (mut first, rest): (Vec<_>, Vec<_>) =
            rows.into_iter().zip(&group.fresh).partition(|(_, f)| **f);
        let n = first.len();
        first.extend(rest);
        group.rows = first.into_iter().map(|(row, _)| row).collect();
        for (i, f) in group.fresh.iter_mut().enumerate() {
            *f = i < n;
        }
    }
}

/// `TRUNCATE` of `target` (table `t` of the plan).
pub(super) fn truncate<'a>(target: &str, t: usize) -> Stmt<'a> {
    Stmt {
        sql: format!("TRUNCATE {target}"),
        params: Vec::new(),
        kind: Kind::Truncate,
        table: t,
        group: 0,
        rows: 0..0,
        copy: Vec::new(),
    }
}

/// The `UPDATE` that moves the row at `old_key` to the change's key, setting the columns the
/// change carries and leaving unchanged (TOASTed) ones as stored.
pub(super) fn move_row<'a>(
    sink: &SinkTable,
    change: &'a Change,
    old_key: &'a [Value],
) -> Result<Stmt<'a>, MissingColumn> {
    let table = &change.table;
    let mut sql = String::from("UPDATE ");
    sql.push_str(&sink.target);
    sql.push_str(" SET ");
    let mut params = Vec::new();
    for (column, value) in table.columns.iter().zip(&change.values) {
        if matches!(value, Value::Unchanged) {
            continue;
        }
        if !params.is_empty() {
            sql.push(',');
        }
        push_ident(&mut sql, &column.name);
        let wire = Wire::choose(column.type_oid, [value]);
        push_scalar(
            &mut sql,
            params.len() + 1,
            wire,
            cast(sink, 0, &column.name)?,
        );
        params.push(Param::one(wire, value));
    }
    sql.push_str(" WHERE ");
    for (n, (&i, value)) in table.key.iter().zip(old_key).enumerate() {
        if n > 0 {
            sql.push_str(" AND ");
        }
        let column = &table.columns[i];
        push_ident(&mut sql, &column.name);
        let wire = Wire::choose(column.type_oid, [value]);
        push_scalar(
            &mut sql,
            params.len() + 1,
            wire,
            cast(sink, 0, &column.name)?,
        );
        params.push(Param::one(wire, value));
    }
    Ok(Stmt {
        sql,
        params,
        kind: Kind::Move,
        table: 0,
        group: 0,
        rows: 0..1,
        copy: Vec::new(),
    })
}

/// The `COPY` formats of columns `kept` of `shape` in `sink`, if `COPY` can write every value
/// of `rows` in them.
fn copy_types(
    sink: &SinkTable,
    shape: &Table,
    kept: &[usize],
    rows: &[Row<'_>],
) -> Option<Vec<CopyType>> {
    let types: Vec<CopyType> = kept
        .iter()
        .map(|&i| sink.copy_type(&shape.columns[i].name))
        .collect::<Option<_>>()?;
    let fits = rows.iter().all(|row| {
        let values = row.values();
        kept.iter().zip(&types).all(|(&i, ty)| ty.takes(&values[i]))
    });
    fits.then_some(types)
}

/// `COPY <target> (<kept columns>) FROM STDIN (FORMAT binary)`.
fn copy_sql(sink: &SinkTable, shape: &Table, kept: &[usize]) -> String {
    let mut sql = String::from("COPY ");
    push_target_columns(&mut sql, sink, shape, kept);
    sql.push_str(" FROM STDIN (FORMAT binary)");
    sql
}

/// `<target> (<kept columns>)`.
fn push_target_columns(sql: &mut String, sink: &SinkTable, shape: &Table, kept: &[usize]) {
    sql.push_str(&sink.target);
    sql.push_str(" (");
    for (n, &i) in kept.iter().enumerate() {
        if n > 0 {
            sql.push(',');
        }
        push_ident(sql, &shape.columns[i].name);
    }
    sql.push(')');
}

/// The upsert statement text for columns `kept` of `shape`.
pub(super) fn upsert_sql(
    sink: &SinkTable,
    t: usize,
    shape: &Table,
    kept: &[usize],
    wires: &[Wire],
) -> Result<String, MissingColumn> {
    let mut sql = String::from("INSERT INTO ");
    push_target_columns(&mut sql, sink, shape, kept);
    sql.push_str(" OVERRIDING SYSTEM VALUE SELECT ");
    for (n, &i) in kept.iter().enumerate() {
        if n > 0 {
            sql.push(',');
        }
        push_u_cast(&mut sql, n, cast(sink, t, &shape.columns[i].name)?);
    }
    sql.push_str(" FROM ");
    push_unnest(&mut sql, wires);
    sql.push_str(" ON CONFLICT (");
    for (n, &i) in shape.key.iter().enumerate() {
        if n > 0 {
            sql.push(',');
        }
        push_ident(&mut sql, &shape.columns[i].name);
    }
    sql.push_str(") DO ");
    let mut any = false;
    for &i in kept {
        if shape.key.contains(&i) {
            continue;
        }
        sql.push_str(if any { "," } else { "UPDATE SET " });
        any = true;
        let name = &shape.columns[i].name;
        push_ident(&mut sql, name);
        sql.push_str("=EXCLUDED.");
        push_ident(&mut sql, name);
    }
    if !any {
        // Only key columns: the row exists, nothing to change.
        sql.push_str("NOTHING");
    }
    Ok(sql)
}

/// `unnest($1::int8[],$2::text[]) AS u(c1,c2)`.
fn push_unnest(sql: &mut String, wires: &[Wire]) {
    sql.push_str("unnest(");
    for (n, w) in wires.iter().enumerate() {
        if n > 0 {
            sql.push(',');
        }
        sql.push_str(&format!("${}::{}[]", n + 1, w.sql_name()));
    }
    sql.push_str(") AS u(");
    for n in 0..wires.len() {
        if n > 0 {
            sql.push(',');
        }
        sql.push_str(&format!("c{}", n + 1));
    }
    sql.push(')');
}

/// `u.c<n+1>::<cast>`.
fn push_u_cast(sql: &mut String, n: usize, cast: &str) {
    sql.push_str(&format!("u.c{}::", n + 1));
    sql.push_str(cast);
}

/// `=$n::<wire>::<cast>`.
fn push_scalar(sql: &mut String, n: usize, wire: Wire, cast: &str) {
    sql.push_str(&format!("=${n}::{}::", wire.sql_name()));
    sql.push_str(cast);
}

/// Splits `0..len` into runs of at most [`MAX_ROWS`] rows and about [`MAX_BYTES`] bytes.
fn chunks(len: usize, bytes_of: impl Fn(usize) -> usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for n in 0..len {
        let b = bytes_of(n);
        if n > start && (n - start >= MAX_ROWS || bytes + b > MAX_BYTES) {
            out.push(start..n);
            start = n;
            bytes = 0;
        }
        bytes += b;
    }
    if start < len {
        out.push(start..len);
    }
    out
}

/// "upserting 3 rows into "s"."t" (source table public.t)", for error messages.
pub(super) fn describe(stmt: &Stmt<'_>, target: &str, source: &Table) -> String {
    let n = stmt.rows.len();
    let plural = |word: &str| {
        if n == 1 {
            word.to_owned()
        } else {
            format!("{word}s")
        }
    };
    let action = match stmt.kind {
        Kind::Truncate => "truncating".to_owned(),
        Kind::Delete => format!("deleting {n} {} from", plural("key")),
        Kind::Upsert => format!("upserting {n} {} into", plural("row")),
        Kind::Insert => format!("inserting {n} {} into", plural("row")),
        Kind::Copy => format!("copying {n} {} into", plural("row")),
        Kind::Move => "moving a row to its new key in".to_owned(),
    };
    format!(
        "{action} {target} (source table {})",
        source.qualified_name()
    )
}

/// `(id, region)=(42, eu)`: the key of a row or delete, for error messages.
pub(super) fn key_text<'v>(shape: &Table, key: impl IntoIterator<Item = &'v Value>) -> String {
    let mut out = String::from("(");
    for (n, &i) in shape.key.iter().enumerate() {
        if n > 0 {
            out.push_str(", ");
        }
        out.push_str(&shape.columns[i].name);
    }
    out.push_str(")=(");
    for (n, v) in key.into_iter().enumerate() {
        if n > 0 {
            out.push_str(", ");
        }
        super::encode::push_text(&mut out, v);
    }
    out.push(')');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::Op;
    use crate::sink::coalesce::coalesce;
    use crate::sink::coalesce::fixtures::{Changes, orders, table};
    use crate::sink::postgres::schema::SinkTable;

    fn sink(target: &str, cols: &[(&str, &str)]) -> SinkTable {
        SinkTable::for_tests(target, cols)
    }

    fn orders_sink() -> SinkTable {
        sink(
            "\"public\".\"orders\"",
            &[
                ("id", "\"pg_catalog\".\"int4\""),
                ("note", "\"pg_catalog\".\"text\""),
                ("qty", "\"pg_catalog\".\"int8\""),
            ],
        )
    }

    fn sql(c: &Changes, sinks: &[&SinkTable]) -> Vec<(String, usize)> {
        let tables = coalesce(&c.list, "out").unwrap();
        let mut out = Vec::new();
        batch(&tables, sinks, false, &mut out).unwrap();
        out.iter().map(|s| (s.sql.clone(), s.rows.len())).collect()
    }

    #[test]
    fn deletes_then_upserts_with_casts_to_the_sink_types() {
        let t = orders();
        let mut c = Changes::new();
        c.upsert(&t, 1, "a", 5).upsert(&t, 2, "b", 6).delete(&t, 3);
        // The fixtures' columns are text in the source; the sink's types decide the casts.
        assert_eq!(
            sql(&c, &[&orders_sink()]),
            [
                (
                    "DELETE FROM \"public\".\"orders\" AS t USING unnest($1::text[]) AS u(c1) \
                     WHERE t.\"id\" = u.c1::\"pg_catalog\".\"int4\""
                        .to_owned(),
                    1
                ),
                (
                    "INSERT INTO \"public\".\"orders\" (\"id\",\"note\",\"qty\") OVERRIDING \
                     SYSTEM VALUE SELECT u.c1::\"pg_catalog\".\"int4\",u.c2::\"pg_catalog\".\"text\",\
                     u.c3::\"pg_catalog\".\"int8\" FROM unnest($1::text[],$2::text[],$3::text[]) \
                     AS u(c1,c2,c3) ON CONFLICT (\"id\") DO UPDATE SET \"note\"=EXCLUDED.\"note\",\
                     \"qty\"=EXCLUDED.\"qty\""
                        .to_owned(),
                    2
                ),
            ]
        );
    }

    #[test]
    fn unchanged_columns_are_left_out_and_key_only_rows_do_nothing() {
        let t = orders();
        let mut c = Changes::new();
        c.push(
            Op::Update,
            &t,
            vec![Value::Int4(1)],
            None,
            vec![Value::Int4(1), Value::Unchanged, Value::Int8(2)],
        );
        let keys = table("k", &[("a", true), ("b", true)]);
        c.push(
            Op::Insert,
            &keys,
            vec![Value::Int4(1), Value::Text("x".into())],
            None,
            vec![Value::Int4(1), Value::Text("x".into())],
        );
        let k_sink = sink(
            "\"s\".\"k\"",
            &[
                ("a", "\"pg_catalog\".\"int4\""),
                ("b", "\"pg_catalog\".\"text\""),
            ],
        );
        let out = sql(&c, &[&orders_sink(), &k_sink]);
        assert!(
            out[0]
                .0
                .starts_with("INSERT INTO \"public\".\"orders\" (\"id\",\"qty\")")
                && out[0].0.ends_with("DO UPDATE SET \"qty\"=EXCLUDED.\"qty\""),
            "{}",
            out[0].0
        );
        assert!(
            out[1].0.ends_with("ON CONFLICT (\"a\",\"b\") DO NOTHING"),
            "{}",
            out[1].0
        );
        // The fixtures' source columns are text, so even integers travel as text.
        assert!(
            out[1].0.contains("unnest($1::text[],$2::text[])"),
            "{}",
            out[1].0
        );
    }

    #[test]
    fn missing_sink_columns_are_reported() {
        let t = orders();
        let mut c = Changes::new();
        c.upsert(&t, 1, "a", 5);
        let tables = coalesce(&c.list, "out").unwrap();
        let narrow = sink(
            "\"public\".\"orders\"",
            &[("id", "\"pg_catalog\".\"int4\"")],
        );
        let err = batch(&tables, &[&narrow], false, &mut Vec::new()).unwrap_err();
        assert_eq!((err.table, err.column.as_str()), (0, "note"));
    }

    #[test]
    fn truncate_and_moves() {
        let t = orders();
        let mut c = Changes::new();
        c.push(Op::Truncate, &t, vec![], None, vec![]);
        assert_eq!(
            sql(&c, &[&orders_sink()]),
            [("TRUNCATE \"public\".\"orders\"".to_owned(), 0)]
        );
        let mut c = Changes::new();
        c.push(
            Op::Update,
            &t,
            vec![Value::Int4(2)],
            Some(vec![Value::Int4(1)]),
            vec![Value::Int4(2), Value::Unchanged, Value::Int8(7)],
        );
        let change = &c.list[0];
        let stmt = move_row(&orders_sink(), change, change.old_key.as_deref().unwrap()).unwrap();
        assert_eq!(
            stmt.sql,
            "UPDATE \"public\".\"orders\" SET \"id\"=$1::text::\"pg_catalog\".\"int4\",\
             \"qty\"=$2::text::\"pg_catalog\".\"int8\" WHERE \"id\"=$3::text::\"pg_catalog\".\"int4\""
        );
        assert_eq!(stmt.params.len(), 3);
    }

    #[test]
    fn fresh_rows_go_first_by_copy_or_a_plain_insert() {
        let t = orders();
        let mut c = Changes::new();
        c.upsert(&t, 1, "old", 1);
        c.push(
            Op::Insert,
            &t,
            vec![Value::Int4(2)],
            None,
            vec![Value::Int4(2), Value::Text("new".into()), Value::Int8(2)],
        );
        c.upsert(&t, 3, "old", 3);
        let mut tables = coalesce(&c.list, "out").unwrap();
        partition_fresh(&mut tables);
        assert_eq!(tables[0].upserts[0].fresh, [true, false, false]);
        // Every column has its sink type's binary form: the fresh row goes by COPY.
        let mut out = Vec::new();
        batch(&tables, &[&orders_sink()], true, &mut out).unwrap();
        let kinds: Vec<(Kind, usize)> = out.iter().map(|s| (s.kind, s.rows.len())).collect();
        assert_eq!(kinds, [(Kind::Copy, 1), (Kind::Upsert, 2)]);
        assert_eq!(
            out[0].sql,
            "COPY \"public\".\"orders\" (\"id\",\"note\",\"qty\") FROM STDIN (FORMAT binary)"
        );
        assert_eq!(out[0].copy.len(), 3);
        // A column COPY cannot write (text into an enum): a plain INSERT.
        let enum_note = sink(
            "\"public\".\"orders\"",
            &[
                ("id", "\"pg_catalog\".\"int4\""),
                ("note", "\"public\".\"mood\""),
                ("qty", "\"pg_catalog\".\"int8\""),
            ],
        );
        let mut out = Vec::new();
        batch(&tables, &[&enum_note], true, &mut out).unwrap();
        let kinds: Vec<(Kind, usize)> = out.iter().map(|s| (s.kind, s.rows.len())).collect();
        assert_eq!(kinds, [(Kind::Insert, 1), (Kind::Upsert, 2)]);
        assert!(!out[0].sql.contains("ON CONFLICT"), "{}", out[0].sql);
        assert!(out[1].sql.contains("ON CONFLICT"), "{}", out[1].sql);
        assert_eq!(out[0].rows, 0..1);
        assert_eq!(out[1].rows, 1..3);
        // Without `fast`, everything is upserted.
        let mut out = Vec::new();
        batch(&tables, &[&orders_sink()], false, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].kind, Kind::Upsert);
    }

    #[test]
    fn big_groups_are_cut() {
        assert_eq!(chunks(5, |_| 1), vec![0..5]);
        assert_eq!(
            chunks(MAX_ROWS + 1, |_| 1),
            [0..MAX_ROWS, MAX_ROWS..MAX_ROWS + 1]
        );
        assert_eq!(chunks(3, |_| MAX_BYTES), [0..1, 1..2, 2..3]);
        assert_eq!(chunks(0, |_| 1), Vec::<Range<usize>>::new());
    }

    #[test]
    fn identifiers_are_quoted_and_keys_described() {
        assert_eq!(qualified("we\"ird", "t"), "\"we\"\"ird\".\"t\"");
        let t = table("t", &[("id", true), ("region", true)]);
        assert_eq!(
            key_text(&t, &[Value::Int4(4), Value::Text("eu".into())]),
            "(id, region)=(4, eu)"
        );
    }
}
