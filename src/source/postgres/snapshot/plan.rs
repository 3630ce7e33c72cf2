//! Splitting tables into chunks, and deciding what is left to copy into which sink.
//!
//! Chunks range over the leading column of the table's key index (the primary key, or the
//! replica identity index), so each chunk's `WHERE` is an index range scan. Where the chunk
//! boundaries come from:
//! - a table estimated (`pg_class.reltuples`, else `count(*)`) at no more than one chunk's
//!   rows is one unbounded chunk;
//! - an integer key is cut into equal-width ranges between its `min` and `max` (two index
//!   probes); gaps and skew make chunks uneven, never wrong;
//! - any other key type is walked once in key order and every `chunk_rows`-th value becomes a
//!   boundary (exact chunk sizes, one index-only pass).
//!
//! Boundaries are the values' text output and are compared as the key's type by PostgreSQL
//! itself, so any orderable key type works and every row falls in exactly one chunk — also
//! when the plan, made once, is reused by a resumed snapshot on a table that changed since.

use std::collections::HashSet;

use tokio_postgres::Client;

use crate::change::Table;
use crate::checkpoint::{SnapshotChunk, SnapshotState};
use crate::source::SourceError;
use crate::source::postgres::quote_ident;
use crate::source::postgres::setup::sql_error;

const INT2: u32 = 21;
const INT4: u32 = 23;
const INT8: u32 = 20;

/// The column chunks of `table` range over: the leading column of its key index.
pub(crate) async fn key_column(client: &Client, table: &Table) -> Result<String, SourceError> {
    let relation = relation(table);
    let row = client
        .query_opt(
            "SELECT a.attname::text FROM pg_index i \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
             WHERE i.indrelid = $1::text::regclass AND (i.indisreplident OR i.indisprimary) \
             ORDER BY i.indisreplident DESC LIMIT 1",
            &[&relation],
        )
        .await
        .map_err(|e| sql_error(&format!("finding the key index of {relation}"), &e))?;
    match row {
        Some(row) => Ok(row.get(0)),
        // Preflight found key columns, so an index exists; fall back to the first of them.
        None => table
            .key
            .first()
            .map(|&i| table.columns[i].name.clone())
            .ok_or_else(|| SourceError::fatal(format!("table {relation} has no key"))),
    }
}

/// The estimated row count of `table` (from the statistics, else counted).
pub(crate) async fn estimate_rows(client: &Client, table: &Table) -> Result<u64, SourceError> {
    let relation = relation(table);
    let doing = format!("estimating the size of {relation}");
    let reltuples: f32 = client
        .query_one(
            "SELECT reltuples FROM pg_class WHERE oid = $1::text::regclass",
            &[&relation],
        )
        .await
        .map_err(|e| sql_error(&doing, &e))?
        .get(0);
    if reltuples >= 0.0 {
        return Ok(reltuples as u64);
    }
    // Never analyzed (PostgreSQL 14+ says -1).
    let count: i64 = client
        .query_one(&format!("SELECT count(*) FROM {relation}"), &[])
        .await
        .map_err(|e| sql_error(&doing, &e))?
        .get(0);
    Ok(count.max(0) as u64)
}

/// The chunks of `table`, with the rows estimate they were planned on.
pub(crate) async fn plan_table(
    client: &Client,
    table: &Table,
    key_column: &str,
    chunk_rows: u64,
) -> Result<Vec<SnapshotChunk>, SourceError> {
    let relation = relation(table);
    let doing = format!("planning the snapshot chunks of {relation}");
    let estimate = estimate_rows(client, table).await?;
    let wanted = estimate.div_ceil(chunk_rows.max(1));
    let key = quote_ident(key_column);
    let bounds: Vec<String> = if wanted <= 1 {
        Vec::new()
    } else if table
        .columns
        .iter()
        .find(|c| c.name == key_column)
        .is_some_and(|c| matches!(c.type_oid, INT2 | INT4 | INT8))
    {
        let row = client
            .query_one(
                &format!("SELECT min({key})::int8, max({key})::int8 FROM {relation}"),
                &[],
            )
            .await
            .map_err(|e| sql_error(&doing, &e))?;
        match (row.get::<_, Option<i64>>(0), row.get::<_, Option<i64>>(1)) {
            (Some(min), Some(max)) => integer_bounds(min, max, wanted),
            _ => Vec::new(),
        }
    } else {
        let sql = format!(
            "SELECT {key}::text FROM (SELECT {key}, row_number() OVER (ORDER BY {key}) AS rn \
             FROM {relation}) s WHERE rn % {chunk_rows} = 1 AND rn > 1 ORDER BY rn"
        );
        let rows = client
            .query(&sql, &[])
            .await
            .map_err(|e| sql_error(&doing, &e))?;
        let mut bounds: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        // A composite key repeats leading values; a repeated boundary would make an empty
        // chunk.
        bounds.dedup();
        bounds
    };
    Ok(chunks_from_bounds(
        &table.qualified_name(),
        key_column,
        bounds,
    ))
}

/// `schema.table`, quoted, as SQL and as a `regclass` literal's text.
fn relation(table: &Table) -> String {
    format!(
        "{}.{}",
        quote_ident(&table.schema),
        quote_ident(&table.name)
    )
}

/// Inner boundaries cutting `min..=max` into `parts` ranges of equal width.
fn integer_bounds(min: i64, max: i64, parts: u64) -> Vec<String> {
    let span = i128::from(max) - i128::from(min) + 1;
    let width = (span / i128::from(parts.max(1))).max(1);
    let mut bounds = Vec::new();
    let mut next = i128::from(min) + width;
    while next <= i128::from(max) {
        bounds.push(next.to_string());
        next += width;
    }
    bounds
}

/// Chunks `[-∞, b0), [b0, b1), …, [bn, +∞)` for the sorted inner boundaries `bounds`.
fn chunks_from_bounds(table: &str, column: &str, bounds: Vec<String>) -> Vec<SnapshotChunk> {
    let mut chunks = Vec::with_capacity(bounds.len() + 1);
    let mut lower = None;
    for (index, upper) in bounds.into_iter().map(Some).chain([None]).enumerate() {
        chunks.push(SnapshotChunk {
            table: table.to_owned(),
            index: index as u32,
            column: column.to_owned(),
            lower: lower.take(),
            upper: upper.clone(),
        });
        lower = upper;
    }
    chunks
}

/// The first plan a sink has saved (all sinks got the same one, unless a crash came between
/// saving it into one and into the next), or `None` when no sink has one.
pub(crate) fn saved_plan(states: &[SnapshotState]) -> Option<Vec<SnapshotChunk>> {
    states.iter().find_map(|s| match s {
        SnapshotState::Pending(chunks) if !chunks.is_empty() => {
            Some(chunks.iter().map(|(c, _)| c.clone()).collect())
        }
        _ => None,
    })
}

/// What a run copies where.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Work {
    /// Sinks whose saved plan is not `plan`: they must save it (forgetting what they loaded).
    pub(crate) save_plan: Vec<usize>,
    /// Each chunk of `plan` still to copy, with the sinks that need it.
    pub(crate) todo: Vec<(SnapshotChunk, Vec<usize>)>,
    /// Chunks of `plan` every pending sink already holds.
    pub(crate) done: usize,
}

/// The work left for the sinks with a pending snapshot, given the plan in force. Sinks with
/// no snapshot or a complete one take no part, nor a sink in chunks of tables it does not
/// take (`wants(sink, table)`: its route's tables).
pub(crate) fn work(
    states: &[SnapshotState],
    plan: &[SnapshotChunk],
    wants: impl Fn(usize, &str) -> bool,
) -> Work {
    let mut work = Work::default();
    let planned: HashSet<&SnapshotChunk> = plan.iter().collect();
    let mut loaded: Vec<Option<HashSet<&SnapshotChunk>>> = Vec::with_capacity(states.len());
    for (sink, state) in states.iter().enumerate() {
        loaded.push(match state {
            SnapshotState::Pending(chunks) => {
                // Sinks list chunks in an order of their own.
                let same_plan = chunks.len() == planned.len()
                    && chunks.iter().all(|(c, _)| planned.contains(c));
                if same_plan {
                    Some(
                        chunks
                            .iter()
                            .filter(|(_, done)| *done)
                            .map(|(c, _)| c)
                            .collect(),
                    )
                } else {
                    work.save_plan.push(sink);
                    Some(HashSet::new())
                }
            }
            SnapshotState::None | SnapshotState::Complete => None,
        });
    }
    for chunk in plan {
        let sinks: Vec<usize> = loaded
            .iter()
            .enumerate()
            .filter_map(|(sink, l)| match l {
                Some(done) if !done.contains(chunk) && wants(sink, &chunk.table) => Some(sink),
                _ => None,
            })
            .collect();
        if sinks.is_empty() {
            work.done += 1;
        } else {
            work.todo.push((chunk.clone(), sinks));
        }
    }
    work
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(index: u32, lower: Option<&str>, upper: Option<&str>) -> SnapshotChunk {
        SnapshotChunk {
            table: "public.t".into(),
            index,
            column: "id".into(),
            lower: lower.map(str::to_owned),
            upper: upper.map(str::to_owned),
        }
    }

    #[test]
    fn integer_ranges_cover_min_to_max() {
        assert_eq!(integer_bounds(1, 100, 4), ["26", "51", "76"]);
        assert_eq!(integer_bounds(1, 3, 10), ["2", "3"]);
        assert!(integer_bounds(5, 5, 3).is_empty());
        // The whole i64 range does not overflow.
        assert_eq!(integer_bounds(i64::MIN, i64::MAX, 2), ["0"]);
        assert_eq!(integer_bounds(-10, 9, 2), ["0"]);
    }

    #[test]
    fn chunks_are_contiguous_and_unbounded_at_the_ends() {
        assert_eq!(
            chunks_from_bounds("public.t", "id", vec![]),
            [chunk(0, None, None)]
        );
        assert_eq!(
            chunks_from_bounds("public.t", "id", vec!["10".into(), "20".into()]),
            [
                chunk(0, None, Some("10")),
                chunk(1, Some("10"), Some("20")),
                chunk(2, Some("20"), None)
            ]
        );
    }

    #[test]
    fn resuming_copies_only_what_each_sink_misses() {
        let plan = chunks_from_bounds("public.t", "id", vec!["10".into(), "20".into()]);
        let pending = |done: [bool; 3]| {
            SnapshotState::Pending(plan.iter().cloned().zip(done).collect::<Vec<_>>())
        };
        let states = [
            pending([true, false, true]),
            pending([true, true, false]),
            SnapshotState::Complete,
            SnapshotState::None,
        ];
        assert_eq!(saved_plan(&states), Some(plan.clone()));
        let w = work(&states, &plan, |_, _| true);
        assert!(w.save_plan.is_empty());
        assert_eq!(w.done, 1);
        assert_eq!(
            w.todo,
            vec![(plan[1].clone(), vec![0]), (plan[2].clone(), vec![1])]
        );
        // A sink whose route does not take the table needs none of it.
        let w = work(&states, &plan, |sink, _| sink != 1);
        assert_eq!(w.done, 2);
        assert_eq!(w.todo, vec![(plan[1].clone(), vec![0])]);
    }

    #[test]
    fn a_sink_with_another_or_no_plan_starts_over() {
        let plan = chunks_from_bounds("public.t", "id", vec!["10".into()]);
        let other = chunks_from_bounds("public.t", "id", vec!["15".into()]);
        let states = [
            SnapshotState::Pending(plan.iter().cloned().map(|c| (c, true)).collect()),
            SnapshotState::Pending(other.iter().cloned().map(|c| (c, true)).collect()),
            SnapshotState::Pending(Vec::new()),
        ];
        let w = work(&states, &plan, |_, _| true);
        assert_eq!(w.save_plan, vec![1, 2]);
        assert_eq!(w.done, 0);
        assert_eq!(
            w.todo,
            vec![(plan[0].clone(), vec![1, 2]), (plan[1].clone(), vec![1, 2])]
        );
        // Nobody planned yet: no saved plan.
        assert_eq!(saved_plan(&[SnapshotState::Pending(Vec::new())]), None);
    }
}
