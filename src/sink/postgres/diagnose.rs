//! Finding the row behind a data error.
//!
//! PostgreSQL names the column for some errors (NOT NULL, foreign keys) and the constraint
//! for others, but never which row of a multi-row statement failed. After a Definite error the
//! batch has been rolled back; [`find_row`] then runs the failed statement on halves of its
//! rows, each inside a savepoint of a transaction that is rolled back at the end, and narrows
//! down to the one row that fails alone: about 2·log₂(rows) statements, only on this error
//! path. It gives up (returns `None`) when neither half fails alone (rows that conflict with
//! each other, or with an earlier statement of the batch) or on any other error.

use std::ops::Range;

use tokio_postgres::{Client, Statement};

use super::encode::Param;
use super::errors::classify;
use crate::error::ErrorClass;

/// The index (into `0..rows`) of the row that fails `statement` on its own, if there is one.
pub(super) async fn find_row(
    client: &Client,
    statement: &Statement,
    params: &[Param<'_>],
    rows: usize,
) -> Option<usize> {
    if rows == 0 {
        return None;
    }
    client.batch_execute("BEGIN").await.ok()?;
    let found = narrow(client, statement, params, rows).await;
    let _ = client.batch_execute("ROLLBACK").await;
    found
}

async fn narrow(
    client: &Client,
    statement: &Statement,
    params: &[Param<'_>],
    rows: usize,
) -> Option<usize> {
    let mut range = 0..rows;
    while range.len() > 1 {
        let mid = range.start + range.len() / 2;
        let (low, high) = (range.start..mid, mid..range.end);
        range = if fails(client, statement, params, low.clone()).await? {
            low
        } else if fails(client, statement, params, high.clone()).await? {
            high
        } else {
            return None;
        };
    }
    // A single row left: it fails alone only if it was narrowed to; a one-row statement
    // failed by itself already.
    Some(range.start)
}

/// Whether the rows `range` alone fail with a data error; `None` on any other error.
async fn fails(
    client: &Client,
    statement: &Statement,
    params: &[Param<'_>],
    range: Range<usize>,
) -> Option<bool> {
    client
        .batch_execute("SAVEPOINT zipline_diagnose")
        .await
        .ok()?;
    let sliced: Vec<Param<'_>> = params.iter().map(|p| p.slice(range.clone())).collect();
    let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = sliced
        .iter()
        .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    let result = client.execute(statement, &refs).await;
    client
        .batch_execute("ROLLBACK TO SAVEPOINT zipline_diagnose")
        .await
        .ok()?;
    match result {
        Ok(_) => Some(false),
        Err(e) if classify(&e) == ErrorClass::Definite => Some(true),
        Err(_) => None,
    }
}
