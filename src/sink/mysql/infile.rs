//! The initial snapshot's bulk path into MySQL/MariaDB: `LOAD DATA LOCAL INFILE … REPLACE`,
//! or the lanes' multi-row upserts where the server refuses local infile or the table has
//! another unique key (see the module docs of `snapshot.rs`), the rows and the chunk's mark
//! in one transaction.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::StreamExt;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use super::array::{is_builtin_array, push_json_array};
use super::errors::{self, sink_error};
use super::literal::{SinkClass, Written, note_nulled, push_cell, push_ident};
use super::plan::{Plan, key_text};
use super::snapshot::{push_rows, state_error};
use super::{Shared, close};
use crate::change::{Change, Op, Position, Table, Value};
use crate::sink::{SinkError, SnapshotChunk};

/// Largest piece of infile data sent as one packet.
const PIECE: usize = 1 << 20;

/// Connections kept between chunk loads, whether the server refused local infile, and which
/// sink tables have unique keys besides their key (loaded with upserts: `REPLACE` would
/// delete the other row, see `unique.rs`).
#[derive(Default)]
pub(super) struct Loader {
    idle: Mutex<Vec<Conn>>,
    infile_refused: AtomicBool,
    other_unique: Mutex<std::collections::HashMap<String, bool>>,
}

impl Loader {
    async fn take(&self, shared: &Shared) -> Result<Conn, SinkError> {
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        match pooled {
            Some(conn) => Ok(conn),
            None => shared.connect().await,
        }
    }

    fn put(&self, conn: Conn) {
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(conn);
    }
}

/// A chunk's rows, as the source hands them over.
#[derive(Clone, Copy)]
pub(super) enum Input<'a> {
    /// Insert changes, possibly of several tables (what a transform made).
    Changes(&'a [Change]),
    /// Rows of one table.
    Rows(&'a Arc<Table>, &'a [Vec<Value>]),
}

impl<'a> Input<'a> {
    fn len(self) -> usize {
        match self {
            Input::Changes(changes) => changes.len(),
            Input::Rows(_, rows) => rows.len(),
        }
    }

    /// Rows by table shape, in order of first appearance.
    fn groups(self) -> Vec<(&'a Arc<Table>, Vec<&'a [Value]>)> {
        let changes = match self {
            Input::Rows(table, rows) => {
                return vec![(table, rows.iter().map(|r| &r[..]).collect())];
            }
            Input::Changes(changes) => changes,
        };
        let mut groups: Vec<(&Arc<Table>, Vec<&[Value]>)> = Vec::new();
        for change in changes {
            let table = &change.table;
            match groups
                .iter_mut()
                .find(|(t, _)| Arc::ptr_eq(t, table) || t == &table)
            {
                Some((_, rows)) => rows.push(&change.values),
                None => groups.push((table, vec![&change.values])),
            }
        }
        groups
    }
}

/// Writes a chunk's rows and marks it loaded, in one transaction.
pub(super) async fn load(
    shared: &Shared,
    loader: &Loader,
    chunk: &SnapshotChunk,
    changes: Input<'_>,
) -> Result<(), SinkError> {
    let mut conn = loader.take(shared).await?;
    let shapes: Vec<&Table> = match changes {
        Input::Changes(changes) => changes.iter().map(|c| &*c.table).collect(),
        Input::Rows(table, _) => vec![&**table],
    };
    if let Err(e) = shared
        .types
        .ensure(&mut conn, &shared.options.database, shapes)
        .await
    {
        close(conn).await;
        return Err(sink_error(
            shared.sink(),
            "reading the sink tables' column types",
            &e,
        ));
    }
    let mut infile = !loader.infile_refused.load(Ordering::Relaxed);
    for (shape, _) in changes.groups() {
        let known = loader
            .other_unique
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&shape.name)
            .copied();
        let others = match known {
            Some(others) => others,
            None => {
                match super::unique::has_others(&mut conn, &shared.options.database, shape).await {
                    Ok(others) => {
                        loader
                            .other_unique
                            .lock()
                            .unwrap_or_else(|poisoned| poisoned.into_inner())
                            .insert(shape.name.clone(), others);
                        others
                    }
                    Err(e) => {
                        close(conn).await;
                        return Err(sink_error(
                            shared.sink(),
                            "reading the sink tables' unique keys",
                            &e,
                        ));
                    }
                }
            }
        };
        infile &= !others;
    }
    let result = if infile {
        load_infile(shared, &mut conn, chunk, changes).await
    } else {
        load_upserts(shared, &mut conn, chunk, changes).await
    };
    match result {
        Ok(()) => {
            loader.put(conn);
            Ok(())
        }
        Err(Failure::InfileRefused(e)) => {
            close(conn).await;
            if !loader.infile_refused.swap(true, Ordering::Relaxed) {
                tracing::warn!(sink = shared.sink(), error = %e.report(), "the server refuses LOAD DATA LOCAL INFILE (local_infile=OFF?); the snapshot writes multi-row upserts instead, which is slower");
            }
            let mut conn = shared.connect().await?;
            match load_upserts(shared, &mut conn, chunk, changes).await {
                Ok(()) => {
                    loader.put(conn);
                    Ok(())
                }
                Err(Failure::InfileRefused(e) | Failure::Other(e)) => {
                    close(conn).await;
                    Err(e)
                }
            }
        }
        Err(Failure::Other(e)) => {
            // Closing rolls back whatever the transaction did.
            close(conn).await;
            Err(e)
        }
    }
}

enum Failure {
    InfileRefused(SinkError),
    Other(SinkError),
}

fn infile_refused(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(s) if matches!(s.code, 1148 | 3948 | 4166))
}

async fn load_infile(
    shared: &Shared,
    conn: &mut Conn,
    chunk: &SnapshotChunk,
    changes: Input<'_>,
) -> Result<(), Failure> {
    let sink = shared.sink();
    let database = &shared.options.database;
    conn.query_drop("START TRANSACTION")
        .await
        .map_err(|e| Failure::Other(sink_error(sink, &format!("loading {chunk}"), &e)))?;
    let mut data = Vec::new();
    let mut scratch = String::new();
    for (shape, group) in changes.groups() {
        data.clear();
        // Most rows take well under this; one reallocation at most instead of a dozen.
        data.reserve(group.len() * 128);
        let classes = shared.types.classes(shape);
        let nulled = |column: usize, value: &Value| {
            note_nulled(sink, &shape.name, &shape.columns[column].name, value);
        };
        render_rows(&mut data, &mut scratch, &group, &classes, nulled).map_err(
            |(row, column, problem)| {
                Failure::Other(SinkError::definite(format!(
                    "sink {sink}: {}.{}: {problem} (row key {})",
                    shape.qualified_name(),
                    shape.columns[column].name,
                    key_text(shape, shape.key.iter().map(|&i| &group[row][i]))
                )))
            },
        )?;
        let pieces = pieces(Bytes::from(std::mem::take(&mut data)), PIECE);
        conn.set_infile_handler(async move {
            Ok(futures_util::stream::iter(pieces.into_iter().map(Ok)).boxed())
        });
        if let Err(e) = conn.query_drop(load_sql(database, shape)).await {
            let doing = format!(
                "loading {} rows of {chunk} into `{database}`.`{}`",
                group.len(),
                shape.name
            );
            let mut err = sink_error(sink, &doing, &e);
            if infile_refused(&e) {
                return Err(Failure::InfileRefused(err));
            }
            if let Some(row) = errors::row_number(&e).and_then(|n| group.get(n.wrapping_sub(1))) {
                let key = key_text(shape, shape.key.iter().map(|&i| &row[i]));
                err.message.push_str(&format!(" (row key {key})"));
            }
            return Err(Failure::Other(err));
        }
    }
    commit(shared, conn, chunk, changes.len()).await
}

async fn load_upserts(
    shared: &Shared,
    conn: &mut Conn,
    chunk: &SnapshotChunk,
    input: Input<'_>,
) -> Result<(), Failure> {
    let sink = shared.sink();
    // The lanes' statement builder works on changes: made here for rows, on this slower
    // path only.
    let made: Vec<Change>;
    let changes = match input {
        Input::Changes(changes) => changes,
        Input::Rows(table, rows) => {
            made = rows
                .iter()
                .map(|values| Change {
                    position: Position::default(),
                    op: Op::Insert,
                    table: table.clone(),
                    key: table.key.iter().map(|&i| values[i].clone()).collect(),
                    old_key: None,
                    values: values.clone(),
                })
                .collect();
            &made
        }
    };
    let mut plan = Plan::build(changes, &shared.options.database, sink)
        .map_err(Failure::Other)?
        .with_types(&shared.types);
    let mut buf = String::from("START TRANSACTION");
    conn.query_drop(&buf)
        .await
        .map_err(|e| Failure::Other(sink_error(sink, &format!("loading {chunk}"), &e)))?;
    loop {
        buf.clear();
        let info = match plan.next_statement(&mut buf) {
            Ok(Some(info)) => info,
            Ok(None) => break,
            Err(e) => return Err(Failure::Other(e)),
        };
        if let Err(e) = conn.query_drop(&buf).await {
            let mut err = sink_error(sink, &plan.describe(info), &e);
            if super::unique::is_conflict(&e)
                && let Some((shape, rows)) = plan.upsert_rows(info)
            {
                err.kind = crate::sink::SinkErrorKind::UniqueConflict;
                let database = &shared.options.database;
                if let Some(what) = super::unique::explain(conn, database, shape, rows).await {
                    err.message = format!(
                        "sink {sink}: {}: {what}. {}",
                        plan.describe(info),
                        super::unique::HINT
                    );
                }
            } else if let Some(key) = errors::row_number(&e).and_then(|n| plan.row_key(info, n)) {
                err.message.push_str(&format!(" (row key {key})"));
            }
            return Err(Failure::Other(err));
        }
    }
    commit(shared, conn, chunk, changes.len()).await
}

async fn commit(
    shared: &Shared,
    conn: &mut Conn,
    chunk: &SnapshotChunk,
    rows: usize,
) -> Result<(), Failure> {
    super::fence::check_locked(conn, shared)
        .await
        .map_err(Failure::Other)?;
    let mut sql = String::new();
    push_rows(
        &mut sql,
        shared,
        &[Some(chunk)],
        "CURRENT_TIMESTAMP(6)",
        Some(rows as u64),
    );
    sql.push_str(";COMMIT");
    conn.query_drop(sql).await.map_err(|e| {
        Failure::Other(state_error(
            shared,
            &format!("marking {chunk} loaded and committing"),
            &e,
        ))
    })
}

/// `LOAD DATA LOCAL INFILE … REPLACE INTO TABLE` for `shape`'s columns (see the module docs).
fn load_sql(database: &str, shape: &Table) -> String {
    let mut sql = String::from("LOAD DATA LOCAL INFILE 'zipline-snapshot' REPLACE INTO TABLE ");
    push_ident(&mut sql, database);
    sql.push('.');
    push_ident(&mut sql, &shape.name);
    sql.push_str(
        " CHARACTER SET binary FIELDS TERMINATED BY X'09' ESCAPED BY X'5c' \
         LINES TERMINATED BY X'0a' (",
    );
    for (n, column) in shape.columns.iter().enumerate() {
        if n > 0 {
            sql.push(',');
        }
        push_ident(&mut sql, &column.name);
    }
    sql.push(')');
    sql
}

/// Appends `rows` as infile lines. On error: (row index, column index, what is wrong).
/// `classes` are the sink columns' classes; `nulled` is told of each value written as NULL
/// because its column cannot hold it.
fn render_rows(
    out: &mut Vec<u8>,
    scratch: &mut String,
    rows: &[&[Value]],
    classes: &[SinkClass],
    mut nulled: impl FnMut(usize, &Value),
) -> Result<(), (usize, usize, String)> {
    for (r, row) in rows.iter().enumerate() {
        for (c, value) in row.iter().enumerate() {
            if c > 0 {
                out.push(b'\t');
            }
            let class = classes.get(c).copied().unwrap_or_default();
            if render_value(out, scratch, value, class).map_err(|problem| (r, c, problem))?
                == Written::Nulled
            {
                nulled(c, value);
            }
        }
        out.push(b'\n');
    }
    Ok(())
}

fn render_value(
    out: &mut Vec<u8>,
    scratch: &mut String,
    value: &Value,
    class: SinkClass,
) -> Result<Written, String> {
    match value {
        Value::Null => out.extend_from_slice(b"\\N"),
        Value::Other { type_oid, text } if is_builtin_array(*type_oid) => {
            scratch.clear();
            push_json_array(scratch, *type_oid, text)?;
            push_escaped(out, scratch.as_bytes());
        }
        Value::Text(text) | Value::Json(text) | Value::Other { text, .. } => {
            push_escaped(out, text.as_bytes())
        }
        Value::Bytes(bytes) => push_escaped(out, bytes),
        Value::Bool(b) => out.push(if *b { b'1' } else { b'0' }),
        Value::Int2(i) => push_int(out, i64::from(*i)),
        Value::Int4(i) => push_int(out, i64::from(*i)),
        Value::Int8(i) => push_int(out, *i),
        other => {
            // Numbers, booleans, temporal values and UUIDs: the SQL literal without its
            // quotes; none of them holds a tab, newline or backslash.
            // PostgreSQL's text for a value MySQL cannot hold (`'NaN'`, `'0044-03-15 BC'`)
            // has no quote, tab, newline or backslash either.
            scratch.clear();
            if push_cell(scratch, other, class)? == Written::Nulled {
                out.extend_from_slice(b"\\N");
                return Ok(Written::Nulled);
            }
            let text = scratch.as_str();
            let text = text
                .strip_prefix('\'')
                .and_then(|t| t.strip_suffix('\''))
                .unwrap_or(text);
            out.extend_from_slice(text.as_bytes());
        }
    }
    Ok(Written::Value)
}

/// A decimal integer, without going through `fmt` (the hot path of most keys).
fn push_int(out: &mut Vec<u8>, value: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

/// Bytes with the field separator, line end, escape character and NUL escaped.
fn push_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'\\' => b"\\\\",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0 => b"\\0",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(escaped);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// `data` in zero-copy slices of at most `size` bytes.
fn pieces(data: Bytes, size: usize) -> Vec<Bytes> {
    let mut pieces = Vec::with_capacity(data.len() / size + 1);
    let mut start = 0;
    while start < data.len() {
        let end = (start + size).min(data.len());
        pieces.push(data.slice(start..end));
        start = end;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::{Column, DATE_MAX, PG_EPOCH_MICROS, TIMESTAMP_END};

    fn table() -> Arc<Table> {
        let col = |name: &str, type_oid, is_key| Column {
            name: name.into(),
            type_oid,
            type_modifier: -1,
            is_key,
        };
        Arc::new(Table::new(
            "public".into(),
            "orders".into(),
            vec![
                col("id", 20, true),
                col("note", 25, false),
                col("at", 1184, false),
                col("raw", 17, false),
            ],
        ))
    }

    #[test]
    fn rows_render_as_escaped_infile_lines() {
        let a = vec![
            Value::Int8(-7),
            Value::Text("tab\there\nline \\N back\\slash".into()),
            Value::TimestampTz(1_700_000_000_123_456 - PG_EPOCH_MICROS),
            Value::Bytes(vec![0, b'\t', 0xff]),
        ];
        let b = vec![Value::Int8(i64::MIN), Value::Null, Value::Null, Value::Null];
        let mut out = Vec::new();
        render_rows(&mut out, &mut String::new(), &[&a, &b], &[], |_, _| {}).unwrap();
        assert_eq!(
            out,
            b"-7\ttab\\there\\nline \\\\N back\\\\slash\t2023-11-14 22:13:20.123456\t\\0\\t\xff\n\
              -9223372036854775808\t\\N\t\\N\t\\N\n"
                .to_vec()
        );
        let bad = vec![
            Value::Int8(9),
            Value::Null,
            Value::TimestampTz(i64::MAX),
            Value::Null,
        ];
        let err = render_rows(&mut out, &mut String::new(), &[&bad], &[], |_, _| {}).unwrap_err();
        assert_eq!((err.0, err.1), (0, 2));
        assert!(err.2.contains("infinity"), "{}", err.2);
    }

    #[test]
    fn unrepresentable_values_follow_the_sink_column_and_arrays_become_json() {
        let row = vec![
            Value::Numeric("NaN".into()),
            Value::Float8(f64::INFINITY),
            Value::Date(i32::MIN),
            Value::Other {
                type_oid: 1009,
                text: "{\"a\tb\",NULL}".into(),
            },
            // The last timestamp and date PostgreSQL holds: past MySQL's year 9999.
            Value::Timestamp(TIMESTAMP_END - 1),
            Value::Date(DATE_MAX),
        ];
        let classes = [
            SinkClass::Text,
            SinkClass::Typed,
            SinkClass::Text,
            SinkClass::Typed,
            SinkClass::Text,
            SinkClass::Typed,
        ];
        let mut nulled = Vec::new();
        let mut out = Vec::new();
        render_rows(&mut out, &mut String::new(), &[&row], &classes, |c, _| {
            nulled.push(c)
        })
        .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "NaN\t\\N\t-infinity\t[\"a\\\\tb\",null]\t294276-12-31 23:59:59.999999\t\\N\n"
        );
        assert_eq!(nulled, [1, 5]);
    }

    #[test]
    fn load_statement_names_every_column() {
        assert_eq!(
            load_sql("sh`op", &table()),
            "LOAD DATA LOCAL INFILE 'zipline-snapshot' REPLACE INTO TABLE `sh``op`.`orders` \
             CHARACTER SET binary FIELDS TERMINATED BY X'09' ESCAPED BY X'5c' \
             LINES TERMINATED BY X'0a' (`id`,`note`,`at`,`raw`)"
        );
    }

    #[test]
    fn pieces_cover_the_buffer() {
        let cut = pieces(Bytes::from(vec![1u8; 10]), 4);
        assert_eq!(cut.iter().map(Bytes::len).collect::<Vec<_>>(), [4, 4, 2]);
        assert!(pieces(Bytes::new(), 4).is_empty());
    }
}
