//! The initial snapshot's bulk path into PostgreSQL: `COPY` inside a savepoint, the lanes'
//! upserts where a row with the same key is already there, and the chunk's mark in the same
//! transaction (see the module docs of `snapshot.rs`).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::SinkExt;
use tokio_postgres::Client;

use super::encode::push_text;
use super::errors::{classify, copy_line, sink_error};
use super::snapshot::{state_error, state_table};
use super::sql::{self, qualified};
use super::{Shared, schema};
use crate::change::{Change, Op, Position, Table, Value};
use crate::error::ErrorClass;
use crate::sink::coalesce::coalesce;
use crate::sink::{SinkError, SnapshotChunk};

/// Connections kept between chunk loads.
#[derive(Default)]
pub(super) struct Pool {
    idle: Mutex<Vec<Client>>,
}

impl Pool {
    async fn take(&self, shared: &Shared) -> Result<Client, SinkError> {
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        match pooled {
            Some(client) if !client.is_closed() => Ok(client),
            _ => shared.connect().await,
        }
    }

    fn put(&self, client: Client) {
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(client);
    }
}

/// Writes a chunk's rows and marks it loaded, in one transaction.
/// Rows of one table shape, in load order.
struct Group<'a> {
    shape: &'a Arc<Table>,
    rows: Vec<&'a [Value]>,
}

/// Loads a chunk given as changes (what a transform made of the source's rows).
pub(super) async fn load(
    shared: &Shared,
    pool: &Pool,
    chunk: &SnapshotChunk,
    changes: &[Change],
) -> Result<(), SinkError> {
    load_groups(shared, pool, chunk, groups(changes), changes.len()).await
}

/// Loads a chunk given as the source's rows of one table: no change is built per row.
pub(super) async fn load_rows(
    shared: &Shared,
    pool: &Pool,
    chunk: &SnapshotChunk,
    table: &Arc<Table>,
    rows: &[Vec<Value>],
) -> Result<(), SinkError> {
    let group = Group {
        shape: table,
        rows: rows.iter().map(Vec::as_slice).collect(),
    };
    load_groups(shared, pool, chunk, vec![group], rows.len()).await
}

async fn load_groups(
    shared: &Shared,
    pool: &Pool,
    chunk: &SnapshotChunk,
    groups: Vec<Group<'_>>,
    rows: usize,
) -> Result<(), SinkError> {
    let rows = u64::try_from(rows).unwrap_or(u64::MAX);
    load_payload(shared, pool, chunk, Payload::Rows(groups), rows).await
}

/// Loads a chunk still in the source's COPY text format (see `CopyTextTarget`).
pub(super) async fn load_text(
    shared: &Shared,
    pool: &Pool,
    chunk: &SnapshotChunk,
    table: &Arc<Table>,
    text: &Bytes,
    rows: u64,
) -> Result<(), SinkError> {
    load_payload(shared, pool, chunk, Payload::Text { table, text }, rows).await
}

/// What a chunk's transaction writes before it marks the chunk loaded.
enum Payload<'a> {
    Rows(Vec<Group<'a>>),
    Text {
        table: &'a Arc<Table>,
        text: &'a Bytes,
    },
}

async fn load_payload(
    shared: &Shared,
    pool: &Pool,
    chunk: &SnapshotChunk,
    payload: Payload<'_>,
    rows: u64,
) -> Result<(), SinkError> {
    let client = pool.take(shared).await?;
    match load_on(shared, &client, chunk, payload, rows).await {
        Ok(()) => {
            pool.put(client);
            Ok(())
        }
        Err(e) => {
            // A ROLLBACK that fails leaves a connection not worth keeping.
            if client.batch_execute("ROLLBACK").await.is_ok() {
                pool.put(client);
            }
            Err(e)
        }
    }
}

async fn load_on(
    shared: &Shared,
    client: &Client,
    chunk: &SnapshotChunk,
    payload: Payload<'_>,
    rows: u64,
) -> Result<(), SinkError> {
    let sink = shared.sink();
    client
        .batch_execute("BEGIN")
        .await
        .map_err(|e| sink_error(sink, &format!("loading {chunk}"), &e))?;
    let groups = match payload {
        Payload::Rows(groups) => groups,
        Payload::Text { table, text } => {
            write_text(shared, client, chunk, table, text, rows).await?;
            Vec::new()
        }
    };
    for group in groups {
        let shape = group.shape;
        let target = qualified(shared.target_schema(shape), &shape.name);
        let doing = format!("loading {} rows of {chunk} into {target}", group.rows.len());
        client
            .batch_execute("SAVEPOINT zipline_copy")
            .await
            .map_err(|e| sink_error(sink, &doing, &e))?;
        match copy(client, &target, &group).await {
            Ok(()) => {}
            Err(e) if e.code().is_some_and(|c| c.code() == "23505") => {
                client
                    .batch_execute("ROLLBACK TO SAVEPOINT zipline_copy")
                    .await
                    .map_err(|e| sink_error(sink, &doing, &e))?;
                upsert(shared, client, &group).await?;
            }
            Err(e) => {
                let mut err = sink_error(sink, &doing, &e);
                if classify(&e) == ErrorClass::Definite
                    && let Some(row) = copy_line(&e).and_then(|n| group.rows.get(n.wrapping_sub(1)))
                {
                    let values = shape.key.iter().map(|&i| &row[i]);
                    err.message
                        .push_str(&format!(" (row key {})", sql::key_text(shape, values)));
                }
                return Err(err);
            }
        }
    }
    super::fence::check_in_tx(client, shared).await?;
    let rows = i64::try_from(rows).unwrap_or(i64::MAX);
    let index = i32::try_from(chunk.index).unwrap_or(i32::MAX);
    let marked = client
        .execute(
            &format!(
                "INSERT INTO {} (pipeline, connector, source_table, chunk, key_column, \
                 lower_bound, upper_bound, loaded_rows, done_at) VALUES ($1::text, $2::text, \
                 $3::text, $4::int4, $5::text, $6::text, $7::text, $8::int8, clock_timestamp()) \
                 ON CONFLICT (pipeline, connector, source_table, chunk) DO UPDATE SET \
                 loaded_rows = EXCLUDED.loaded_rows, done_at = EXCLUDED.done_at",
                state_table(shared)
            ),
            &[
                &shared.pipeline,
                &shared.options.name,
                &chunk.table,
                &index,
                &chunk.column,
                &chunk.lower,
                &chunk.upper,
                &rows,
            ],
        )
        .await;
    let committed = match marked {
        Ok(_) => client.batch_execute("COMMIT").await,
        Err(e) => Err(e),
    };
    committed.map_err(|e| state_error(shared, &format!("marking {chunk} loaded"), &e))
}

/// Writes a chunk in COPY text format: straight into the target table inside a savepoint, and
/// when a row with the same key is there already (a unique violation), through a temporary
/// table and `INSERT … ON CONFLICT DO UPDATE`, which replaces rows by key.
async fn write_text(
    shared: &Shared,
    client: &Client,
    chunk: &SnapshotChunk,
    table: &Table,
    text: &Bytes,
    rows: u64,
) -> Result<(), SinkError> {
    let sink = shared.sink();
    let target = qualified(shared.target_schema(table), &table.name);
    let doing = format!("loading {rows} rows of {chunk} into {target}");
    let columns = column_list(table);
    client
        .batch_execute("SAVEPOINT zipline_copy")
        .await
        .map_err(|e| sink_error(sink, &doing, &e))?;
    let copied = copy_text(
        client,
        &format!("COPY {target} ({columns}) FROM STDIN"),
        text,
    )
    .await;
    match copied {
        Ok(()) => return Ok(()),
        Err(e) if e.code().is_some_and(|c| c.code() == "23505") => {}
        Err(e) => return Err(text_copy_error(sink, &doing, table, text, &e)),
    }
    let mut keys = String::new();
    for (n, &i) in table.key.iter().enumerate() {
        if n > 0 {
            keys.push_str(", ");
        }
        sql::push_ident(&mut keys, &table.columns[i].name);
    }
    let mut updates = String::new();
    for column in table.columns.iter().filter(|c| !c.is_key) {
        if !updates.is_empty() {
            updates.push_str(", ");
        }
        sql::push_ident(&mut updates, &column.name);
        updates.push_str(" = EXCLUDED.");
        sql::push_ident(&mut updates, &column.name);
    }
    let action = if updates.is_empty() {
        "NOTHING".to_owned()
    } else {
        format!("UPDATE SET {updates}")
    };
    // The temporary table takes exactly the written columns with the target's types, so the
    // text parses there as it would have in the target.
    client
        .batch_execute(&format!(
            "ROLLBACK TO SAVEPOINT zipline_copy; \
             DROP TABLE IF EXISTS pg_temp._zipline_load; \
             CREATE TEMPORARY TABLE _zipline_load ON COMMIT DROP AS \
             SELECT {columns} FROM {target} WITH NO DATA"
        ))
        .await
        .map_err(|e| sink_error(sink, &doing, &e))?;
    copy_text(
        client,
        &format!("COPY pg_temp._zipline_load ({columns}) FROM STDIN"),
        text,
    )
    .await
    .map_err(|e| text_copy_error(sink, &doing, table, text, &e))?;
    client
        .batch_execute(&format!(
            "INSERT INTO {target} ({columns}) SELECT {columns} FROM pg_temp._zipline_load \
             ON CONFLICT ({keys}) DO {action}; DROP TABLE pg_temp._zipline_load"
        ))
        .await
        .map_err(|e| sink_error(sink, &doing, &e))
}

/// The table's columns, quoted, comma-separated.
fn column_list(table: &Table) -> String {
    let mut out = String::new();
    for (n, column) in table.columns.iter().enumerate() {
        if n > 0 {
            out.push_str(", ");
        }
        sql::push_ident(&mut out, &column.name);
    }
    out
}

async fn copy_text(
    client: &Client,
    statement: &str,
    text: &Bytes,
) -> Result<(), tokio_postgres::Error> {
    let sink = client.copy_in::<_, Bytes>(statement).await?;
    futures_util::pin_mut!(sink);
    sink.send(text.clone()).await?;
    sink.finish().await.map(drop)
}

/// A failed COPY of text rows, naming the row's key when the server says which line failed.
fn text_copy_error(
    sink: &str,
    doing: &str,
    table: &Table,
    text: &Bytes,
    e: &tokio_postgres::Error,
) -> SinkError {
    let mut err = sink_error(sink, doing, e);
    if classify(e) == ErrorClass::Definite
        && let Some(line) =
            copy_line(e).and_then(|n| text.split(|&b| b == b'\n').nth(n.wrapping_sub(1)))
    {
        let fields: Vec<&[u8]> = line.split(|&b| b == b'\t').collect();
        let key: Vec<String> = table
            .key
            .iter()
            .map(|&i| {
                let value = fields
                    .get(i)
                    .map_or_else(String::new, |f| String::from_utf8_lossy(f).into_owned());
                format!("{}={value}", table.columns[i].name)
            })
            .collect();
        err.message
            .push_str(&format!(" (row key {})", key.join(", ")));
    }
    err
}

/// `COPY target (columns) FROM STDIN` of `rows`, all of one shape.
async fn copy(
    client: &Client,
    target: &str,
    group: &Group<'_>,
) -> Result<(), tokio_postgres::Error> {
    let statement = format!("COPY {target} ({}) FROM STDIN", column_list(group.shape));
    let mut data = String::new();
    let mut text = String::new();
    for row in &group.rows {
        for (n, value) in row.iter().enumerate() {
            if n > 0 {
                data.push('\t');
            }
            push_copy_text(&mut data, &mut text, value);
        }
        data.push('\n');
    }
    copy_text(client, &statement, &Bytes::from(data)).await
}

/// One value in COPY text format (see the module docs).
fn push_copy_text(out: &mut String, scratch: &mut String, value: &Value) {
    if matches!(value, Value::Null | Value::Unchanged) {
        out.push_str("\\N");
        return;
    }
    scratch.clear();
    push_text(scratch, value);
    // Most values hold no byte COPY escapes; those go in whole.
    if !scratch
        .bytes()
        .any(|b| matches!(b, b'\\' | b'\t' | b'\n' | b'\r'))
    {
        out.push_str(scratch);
        return;
    }
    for c in scratch.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
}

/// The rows of one table through the lanes' upsert statements (rows already there are
/// replaced by key).
async fn upsert(shared: &Shared, client: &Client, group: &Group<'_>) -> Result<(), SinkError> {
    let shape = group.shape;
    let rows = &group.rows;
    let sink = shared.sink();
    let target_schema = shared.target_schema(shape);
    let target = qualified(target_schema, &shape.name);
    let doing = format!("upserting {} rows into {target}", rows.len());
    let sink_table = schema::load(client, target_schema, &shape.name)
        .await
        .map_err(|e| sink_error(sink, &doing, &e))?
        .ok_or_else(|| SinkError::fatal(format!("sink {sink}: table {target} does not exist")))?;
    let owned: Vec<Change> = rows
        .iter()
        .map(|values| Change {
            position: Position::default(),
            op: Op::Insert,
            table: Arc::clone(shape),
            key: shape.key.iter().map(|&i| values[i].clone()).collect(),
            old_key: None,
            values: values.to_vec(),
        })
        .collect();
    let tables = coalesce(&owned, sink)?;
    let mut stmts = Vec::new();
    sql::batch(&tables, &[&sink_table], false, &mut stmts).map_err(|m| {
        SinkError::fatal(format!(
            "sink {sink}: table {target} has no column \"{}\" (source column {}.{})",
            m.column,
            shape.qualified_name(),
            m.column
        ))
    })?;
    for stmt in &stmts {
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = stmt
            .params
            .iter()
            .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        client
            .execute(stmt.sql.as_str(), &params)
            .await
            .map_err(|e| sink_error(sink, &doing, &e))?;
    }
    Ok(())
}

/// Rows of `changes` grouped by table shape, in order of first appearance.
fn groups(changes: &[Change]) -> Vec<Group<'_>> {
    let mut out: Vec<Group<'_>> = Vec::new();
    for change in changes {
        let same =
            |g: &&mut Group<'_>| Arc::ptr_eq(g.shape, &change.table) || **g.shape == *change.table;
        match out.iter_mut().find(same) {
            Some(group) => group.rows.push(&change.values),
            None => out.push(Group {
                shape: &change.table,
                rows: vec![&change.values],
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_text_escapes_separators_and_spells_null() {
        let mut out = String::new();
        let mut scratch = String::new();
        for v in [
            Value::Text("a\tb\nc\\d\re".into()),
            Value::Null,
            Value::Bytes(vec![0, 0xab]),
            Value::TimestampTz(0),
        ] {
            push_copy_text(&mut out, &mut scratch, &v);
            out.push('|');
        }
        assert_eq!(
            out,
            "a\\tb\\nc\\\\d\\re|\\N|\\\\x00ab|2000-01-01 00:00:00+00|"
        );
    }
}
