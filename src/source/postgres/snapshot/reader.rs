//! One snapshot reader: an SQL connection holding a REPEATABLE READ transaction that sees
//! the snapshot, and `COPY (SELECT …) TO STDOUT` of one chunk at a time.
//!
//! The session is fixed at connect time to print values the way the replication session does
//! (`DateStyle=ISO`, `TimeZone=UTC`, `IntervalStyle=postgres`, `extra_float_digits=3`,
//! `bytea_output=hex`), so the same parser reads both. `statement_timeout` and
//! `idle_in_transaction_session_timeout` are turned off for the session: a reader's
//! transaction stays open, idle between chunks, for as long as the snapshot runs.
//!
//! Importing an exported snapshot (`SET TRANSACTION SNAPSHOT`) must be the first thing the
//! transaction does: <https://www.postgresql.org/docs/15/sql-set-transaction.html>.

use std::pin::pin;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use tokio_postgres::Client;

use super::copy_text::RowDecoder;
use crate::change::{Table, Value};
use crate::checkpoint::SnapshotChunk;
use crate::source::SourceError;
use crate::source::postgres::conn::ConnectParams;
use crate::source::postgres::setup::{self, sql_error};
use crate::source::postgres::{quote_ident, quote_literal};

/// Session settings of a reader (see the module docs).
const SESSION_OPTIONS: &str = "-c DateStyle=ISO -c TimeZone=UTC -c IntervalStyle=postgres \
     -c extra_float_digits=3 -c bytea_output=hex -c statement_timeout=0 \
     -c idle_in_transaction_session_timeout=0 -c standard_conforming_strings=on";

/// A connection inside its snapshot transaction.
pub(crate) struct Reader {
    client: Client,
}

impl Reader {
    /// Connects and opens the transaction: importing `exported` when given, else a snapshot
    /// of its own (taken at its first query).
    pub(crate) async fn open(
        params: &ConnectParams,
        retries: u32,
        exported: Option<&str>,
    ) -> Result<Reader, SourceError> {
        let client = setup::connect_sql_with(params, retries, Some(SESSION_OPTIONS)).await?;
        let mut begin = String::from("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY");
        if let Some(name) = exported {
            begin.push_str("; SET TRANSACTION SNAPSHOT ");
            begin.push_str(&quote_literal(name));
        }
        client
            .batch_execute(&begin)
            .await
            .map_err(|e| sql_error("starting the snapshot transaction", &e))?;
        Ok(Reader { client })
    }

    /// The client, for planning queries inside the snapshot.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Every row of `chunk` of `table`, in column order.
    pub(crate) async fn copy_chunk(
        &self,
        table: &Table,
        chunk: &SnapshotChunk,
    ) -> Result<Vec<Vec<Value>>, SourceError> {
        let doing = format!("copying {chunk}");
        let mut decoder = RowDecoder::default();
        let mut rows = Vec::new();
        self.copy_out(table, chunk, &doing, |data| {
            decoder
                .push(data, &table.columns, &mut rows)
                .map_err(|e| SourceError::fatal(format!("{doing}: {e}")))
        })
        .await?;
        if decoder.has_partial() {
            return Err(partial(&doing));
        }
        Ok(rows)
    }

    /// Every row of `chunk` of `table` as the server printed it (COPY text format, one line
    /// per row), and the number of rows: for a sink that parses the text itself.
    pub(crate) async fn copy_chunk_text(
        &self,
        table: &Table,
        chunk: &SnapshotChunk,
    ) -> Result<(Bytes, u64), SourceError> {
        let doing = format!("copying {chunk}");
        let mut text = BytesMut::new();
        self.copy_out(table, chunk, &doing, |data| {
            text.extend_from_slice(data);
            Ok(())
        })
        .await?;
        // A newline inside a value is escaped (`\n`), so every raw newline ends a row.
        if text.last().is_some_and(|&b| b != b'\n') {
            return Err(partial(&doing));
        }
        let rows = text.iter().filter(|&&b| b == b'\n').count() as u64;
        Ok((text.freeze(), rows))
    }

    /// Runs the chunk's COPY, handing each piece of output to `each`.
    async fn copy_out(
        &self,
        table: &Table,
        chunk: &SnapshotChunk,
        doing: &str,
        mut each: impl FnMut(&[u8]) -> Result<(), SourceError>,
    ) -> Result<(), SourceError> {
        let sql = copy_sql(table, chunk);
        let stream = self
            .client
            .copy_out(sql.as_str())
            .await
            .map_err(|e| sql_error(doing, &e))?;
        let mut stream = pin!(stream);
        while let Some(data) = stream.next().await {
            each(&data.map_err(|e| sql_error(doing, &e))?)?;
        }
        Ok(())
    }
}

fn partial(doing: &str) -> SourceError {
    SourceError::transient(format!(
        "{doing}: the COPY output ended in the middle of a row"
    ))
}

/// `COPY (SELECT <columns> FROM <table> WHERE <range>) TO STDOUT`. The bounds are untyped
/// literals, which PostgreSQL reads as the key column's type.
pub(crate) fn copy_sql(table: &Table, chunk: &SnapshotChunk) -> String {
    let columns: Vec<String> = table.columns.iter().map(|c| quote_ident(&c.name)).collect();
    let mut sql = format!(
        "COPY (SELECT {} FROM {}.{}",
        columns.join(", "),
        quote_ident(&table.schema),
        quote_ident(&table.name)
    );
    let key = quote_ident(&chunk.column);
    let mut conditions = Vec::new();
    if let Some(lower) = &chunk.lower {
        conditions.push(format!("{key} >= {}", quote_literal(lower)));
    }
    if let Some(upper) = &chunk.upper {
        conditions.push(format!("{key} < {}", quote_literal(upper)));
    }
    if !conditions.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conditions.join(" AND "));
    }
    sql.push_str(") TO STDOUT");
    sql
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::Column;

    #[test]
    fn copy_statements_quote_names_and_bounds() {
        let col = |name: &str| Column {
            name: name.into(),
            type_oid: 25,
            type_modifier: -1,
            is_key: name == "k\"ey",
        };
        let table = Table::new("my schema".into(), "t".into(), vec![col("k\"ey"), col("v")]);
        let mut chunk = SnapshotChunk {
            table: table.qualified_name(),
            index: 1,
            column: "k\"ey".into(),
            lower: Some("it's".into()),
            upper: Some("z".into()),
        };
        assert_eq!(
            copy_sql(&table, &chunk),
            "COPY (SELECT \"k\"\"ey\", \"v\" FROM \"my schema\".\"t\" WHERE \"k\"\"ey\" >= 'it''s' \
             AND \"k\"\"ey\" < 'z') TO STDOUT"
        );
        chunk.lower = None;
        chunk.upper = None;
        assert_eq!(
            copy_sql(&table, &chunk),
            "COPY (SELECT \"k\"\"ey\", \"v\" FROM \"my schema\".\"t\") TO STDOUT"
        );
    }
}
