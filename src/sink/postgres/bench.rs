//! Statement building for the micro-benchmarks (see `crate::bench`).

use bytes::BytesMut;
use tokio_postgres::types::{ToSql, Type};

use super::schema::SinkTable;
use super::sql::{self, Kind, qualified};
use super::{copy, encode::Param};
use crate::change::Change;
use crate::sink::coalesce::coalesce;

/// Builds every statement of a lane batch (coalesced first, as the lane does) into a sink
/// table of `columns` (name, cast type) and encodes it as it goes on the wire: the SQL text,
/// then each parameter in binary (arrays), or the `COPY` payload. Appends to `out`; returns the
/// number of statements.
pub fn statements(
    changes: &[Change],
    columns: &[(&str, &str)],
    out: &mut BytesMut,
) -> Result<usize, String> {
    let mut tables = coalesce(changes, "bench").map_err(|e| e.to_string())?;
    sql::partition_fresh(&mut tables);
    let sinks: Vec<SinkTable> = tables
        .iter()
        .map(|t| SinkTable::for_tests(&qualified(&t.source.schema, &t.source.name), columns))
        .collect();
    let refs: Vec<&SinkTable> = sinks.iter().collect();
    let mut stmts = Vec::new();
    sql::batch(&tables, &refs, true, &mut stmts)
        .map_err(|m| format!("no sink column {}", m.column))?;
    for stmt in &stmts {
        out.extend_from_slice(stmt.sql.as_bytes());
        if let Kind::Copy = stmt.kind {
            out.extend_from_slice(&copy::payload(&stmt.params, &stmt.copy)?);
            continue;
        }
        for param in &stmt.params {
            encode(param, out)?;
        }
    }
    Ok(stmts.len())
}

fn encode(param: &Param<'_>, out: &mut BytesMut) -> Result<(), String> {
    let oid = param.type_oid();
    let ty = Type::from_oid(oid).ok_or_else(|| format!("no built-in type {oid}"))?;
    param.to_sql(&ty, out).map_err(|e| e.to_string())?;
    Ok(())
}
