//! Helpers for the initial snapshot tests (`tests/pipelines/snapshot.rs`): seeding the source with
//! rows that exercise every escape of the COPY and LOAD DATA formats, reading the sink's
//! snapshot state table, and waiting for log lines.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;

use super::{MY_DB, Zipline};

/// Inserts rows `from..=to` into the source's `orders`: NULLs in every nullable column, tabs,
/// newlines, backslashes, a literal `\N`, non-ASCII text, microsecond timestamps and values
/// large enough to be compressed or stored out of line.
pub async fn seed_orders(pg: &tokio_postgres::Client, from: i64, to: i64) {
    let sql = format!(
        "INSERT INTO orders SELECT g,
            CASE g % 7 WHEN 0 THEN NULL WHEN 1 THEN 'tab' || chr(9) || 'cust ' || g
                WHEN 2 THEN 'back\\slash ' || g WHEN 3 THEN 'Zoë ''quoted'' ' || g ELSE 'c' || g END,
            CASE WHEN g % 11 = 0 THEN NULL ELSE (g % 100000) / 100.0 END,
            (ARRAY['new', 'paid', 'shipped'])[g % 3 + 1],
            CASE WHEN g % 13 = 0 THEN NULL
                ELSE timestamptz '2020-01-01 00:00:00+00' + g * interval '1 second 7 microseconds' END,
            CASE WHEN g % 5 = 0 THEN NULL ELSE g % 2 = 0 END,
            CASE g % 9 WHEN 0 THEN NULL WHEN 1 THEN 'line1' || chr(10) || 'line2 \\N' || chr(13)
                WHEN 2 THEN repeat(md5(g::text), 60) ELSE 'note ' || g END
         FROM generate_series({from}, {to}) g"
    );
    pg.batch_execute(&sql).await.expect("seeding orders");
}

/// One row of the sink's `_zipline_snapshot` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRow {
    pub table: String,
    pub chunk: i64,
    pub loaded_rows: Option<i64>,
    /// `done_at` as text with microseconds; `None` while not loaded.
    pub done_at: Option<String>,
}

/// The sink's snapshot state rows (marker row included: table "" and chunk -1), or none when
/// the table does not exist.
pub async fn snapshot_rows(my: &mut mysql_async::Conn) -> Vec<ChunkRow> {
    let exists: Option<i64> = my
        .query_first(format!(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = '{MY_DB}' AND table_name = '_zipline_snapshot'"
        ))
        .await
        .expect("looking for the snapshot table");
    if exists != Some(1) {
        return Vec::new();
    }
    let rows: Vec<(String, i64, Option<i64>, Option<String>)> = my
        .query(format!(
            "SELECT source_table, chunk, loaded_rows, \
             DATE_FORMAT(done_at, '%Y-%m-%d %H:%i:%s.%f') \
             FROM {MY_DB}._zipline_snapshot ORDER BY source_table, chunk"
        ))
        .await
        .expect("reading the snapshot state");
    rows.into_iter()
        .map(|(table, chunk, loaded_rows, done_at)| ChunkRow {
            table,
            chunk,
            loaded_rows,
            done_at,
        })
        .collect()
}

/// The loaded chunk rows (not the marker).
pub fn loaded(rows: &[ChunkRow]) -> Vec<ChunkRow> {
    rows.iter()
        .filter(|r| r.chunk >= 0 && r.done_at.is_some())
        .cloned()
        .collect()
}

/// Waits until Zipline's log contains `needle` (panics, with the log, after `timeout` or if
/// the process exits).
pub async fn wait_log(z: &mut Zipline, needle: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !z.output().contains(needle) {
        z.assert_running();
        if Instant::now() >= deadline {
            panic!(
                "no {needle:?} in zipline's log after {timeout:?}; log:\n{}",
                z.tail(60)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first log line containing `needle`, if any.
pub fn log_line(z: &Zipline, needle: &str) -> Option<String> {
    z.output()
        .lines()
        .find(|l| l.contains(needle))
        .map(str::to_owned)
}

/// The integer value of `field=` in `line` (tracing's `key=value` output).
pub fn field(line: &str, field: &str) -> Option<u64> {
    let at = line.find(&format!(" {field}="))? + field.len() + 2;
    line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}
