//! A row that conflicts on a unique key other than its own key.
//!
//! `INSERT … ON DUPLICATE KEY UPDATE` finds the row to update through *any* unique index the
//! new row conflicts with, so on a sink table with a second unique key (say
//! `UNIQUE (customer_id)`) a change to row 12 would update row 1 instead, and the position
//! would be confirmed past the lost change. The upserts' key guard
//! ([`super::plan::push_key_guard`]) fails such a statement (1365) instead; a conflict that
//! InnoDB finds while updating the right row is a duplicate-key error (1062). Either way the
//! batch is rolled back, and this module finds which row of the statement conflicts with which
//! other row on which key, for an error that names both (inside the failed transaction, so the
//! batch's earlier statements are visible). The initial snapshot writes such tables with the
//! same guarded upserts instead of `LOAD DATA … REPLACE`, which would delete the other row.

use std::collections::HashMap;

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use super::coalesce::Row;
use super::literal::{push_ident, push_str, push_value};
use super::plan::key_text;
use super::schema::{same_name, target, unique_indexes};
use crate::change::{Table, Value};

/// Rows of a failed statement looked at, at most (the error path of a big batch).
const MAX_ROWS: usize = 1000;

/// True for the errors a unique conflict raises in an upsert: the key guard's division by
/// zero, and a duplicate entry.
pub(super) fn is_conflict(err: &mysql_async::Error) -> bool {
    matches!(err, mysql_async::Error::Server(e) if matches!(e.code, 1365 | 1062))
}

/// A unique index of the sink table other than the one on the key, with the position of each
/// of its columns in `shape` (indexes on columns the source does not send are skipped: every
/// row writes their defaults, and the server's message says enough).
struct Other {
    name: String,
    columns: Vec<usize>,
}

async fn other_indexes(
    conn: &mut Conn,
    database: &str,
    shape: &Table,
) -> Result<Vec<Other>, mysql_async::Error> {
    let indexes = unique_indexes(conn, database, &shape.name).await?;
    let key: Vec<&str> = shape
        .key
        .iter()
        .map(|&i| shape.columns[i].name.as_str())
        .collect();
    let mut out = Vec::new();
    for (name, columns) in indexes {
        let Some(columns) = columns else { continue };
        let is_key = columns.len() == key.len()
            && key.iter().all(|k| columns.iter().any(|c| same_name(c, k)));
        if is_key {
            continue;
        }
        let positions: Option<Vec<usize>> = columns
            .iter()
            .map(|c| shape.columns.iter().position(|s| same_name(&s.name, c)))
            .collect();
        if let Some(columns) = positions {
            out.push(Other { name, columns });
        }
    }
    Ok(out)
}

/// Whether the sink table of `shape` has a unique index besides its key.
pub(super) async fn has_others(
    conn: &mut Conn,
    database: &str,
    shape: &Table,
) -> Result<bool, mysql_async::Error> {
    let indexes = unique_indexes(conn, database, &shape.name).await?;
    let key: Vec<&str> = shape
        .key
        .iter()
        .map(|&i| shape.columns[i].name.as_str())
        .collect();
    Ok(indexes.values().any(|columns| match columns {
        Some(c) => !(c.len() == key.len() && key.iter().all(|k| c.iter().any(|x| same_name(x, k)))),
        None => true,
    }))
}

/// `name (a, b)=(1, 'x')` for index `other` of a row.
fn index_text(shape: &Table, other: &Other, values: &[Value]) -> String {
    let mut out = String::new();
    push_ident(&mut out, &other.name);
    out.push_str(" (");
    for (n, &i) in other.columns.iter().enumerate() {
        if n > 0 {
            out.push_str(", ");
        }
        out.push_str(&shape.columns[i].name);
    }
    out.push_str(")=(");
    for (n, &i) in other.columns.iter().enumerate() {
        if n > 0 {
            out.push_str(", ");
        }
        let mark = out.len();
        if push_value(&mut out, &values[i]).is_err() {
            out.truncate(mark);
            out.push_str(&format!("{:?}", values[i]));
        }
    }
    out.push(')');
    out
}

/// What conflicts with what, as a sentence, or `None` when it cannot be found (the server's
/// own message then stands).
pub(super) async fn explain(
    conn: &mut Conn,
    database: &str,
    shape: &Table,
    rows: &[Row<'_>],
) -> Option<String> {
    let others = other_indexes(conn, database, shape).await.ok()?;
    let rows = &rows[..rows.len().min(MAX_ROWS)];
    let row_key = |values: &[Value]| key_text(shape, shape.key.iter().map(|&i| &values[i]));
    for other in &others {
        // Two rows of the statement itself sharing the other key.
        let mut seen: HashMap<String, &[Value]> = HashMap::new();
        for row in rows {
            let values = row.values();
            let unique = index_text(shape, other, values);
            if other.columns.iter().any(|&i| values[i].is_null()) {
                continue;
            }
            if let Some(first) = seen.insert(unique.clone(), values) {
                return Some(format!(
                    "rows {} and {} both have unique key {unique}",
                    row_key(first),
                    row_key(values)
                ));
            }
        }
        for row in rows {
            let values = row.values();
            if other.columns.iter().any(|&i| values[i].is_null()) {
                continue;
            }
            if let Some(holder) = holder(conn, database, shape, other, values).await {
                return Some(format!(
                    "row {} has unique key {} of the sink's row {holder}",
                    row_key(values),
                    index_text(shape, other, values)
                ));
            }
        }
    }
    None
}

/// The key of the stored row, other than `values`' own, that has `values`' entry of index
/// `other`, as `(id)=(1)`.
async fn holder(
    conn: &mut Conn,
    database: &str,
    shape: &Table,
    other: &Other,
    values: &[Value],
) -> Option<String> {
    let mut sql = String::from("SELECT ");
    for (n, &i) in shape.key.iter().enumerate() {
        if n > 0 {
            sql.push(',');
        }
        sql.push_str("CAST(");
        push_ident(&mut sql, &shape.columns[i].name);
        sql.push_str(" AS CHAR)");
    }
    sql.push_str(" FROM ");
    sql.push_str(&target(database, shape));
    sql.push_str(" WHERE ");
    for (n, &i) in other.columns.iter().enumerate() {
        if n > 0 {
            sql.push_str(" AND ");
        }
        push_ident(&mut sql, &shape.columns[i].name);
        sql.push_str("<=>");
        push_value(&mut sql, &values[i]).ok()?;
    }
    sql.push_str(" AND NOT (");
    for (n, &i) in shape.key.iter().enumerate() {
        if n > 0 {
            sql.push_str(" AND ");
        }
        push_ident(&mut sql, &shape.columns[i].name);
        sql.push_str("<=>");
        push_value(&mut sql, &values[i]).ok()?;
    }
    sql.push_str(") LIMIT 1");
    let row: mysql_async::Row = conn.query_first(sql).await.ok()??;
    let mut out = String::from("(");
    for (n, &i) in shape.key.iter().enumerate() {
        if n > 0 {
            out.push_str(", ");
        }
        out.push_str(&shape.columns[i].name);
    }
    out.push_str(")=(");
    for n in 0..shape.key.len() {
        if n > 0 {
            out.push_str(", ");
        }
        let text: Option<String> = row.get(n).flatten();
        // Written like the new row's key: numbers bare, everything else quoted.
        let numeric = matches!(
            values[shape.key[n]],
            Value::Int2(_) | Value::Int4(_) | Value::Int8(_) | Value::Numeric(_)
        );
        match text {
            Some(t) if numeric => out.push_str(&t),
            Some(t) => push_str(&mut out, &t),
            None => out.push_str("NULL"),
        }
    }
    out.push(')');
    Some(out)
}

/// What the operator can do, appended to a conflict's error.
pub(super) const HINT: &str = "Zipline writes a change only into the row with the change's key, \
    never over another row. The sink table has a unique key the source does not enforce, or \
    its rows are not the source's: drop or change that unique key in the sink, or remove the \
    other row (on_error decides what happens to this change meanwhile)";
