//! The pipeline's records in a MySQL/MariaDB sink, for `pipeline status` and `pipeline drop`
//! (see [`crate::sink::Lifecycle`]). Sessions are UTC (see the module docs), so stored
//! times print as UTC.

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use super::errors::sink_error;
use super::literal::{push_ident, push_str};
use super::{MysqlConnector, Shared, close};
use crate::change::{Lsn, Position};
use crate::checkpoint::fence::FENCE_TABLE;
use crate::checkpoint::{TABLE, tables::TABLES_TABLE};
use crate::sink::lifecycle::{ClaimStatus, Forgotten, LaneCheckpoint, Lifecycle, SinkStatus};
use crate::sink::{BoxFuture, SinkError};

/// Zipline's tables that hold rows per (pipeline, connector), in the order `drop` empties
/// them (the claim last: a failed drop is still refused while an instance runs).
const OWN_TABLES: [&str; 4] = [TABLE, TABLES_TABLE, super::snapshot::TABLE, FENCE_TABLE];

impl Lifecycle for MysqlConnector {
    fn status(&self) -> BoxFuture<'_, Result<SinkStatus, SinkError>> {
        Box::pin(async move {
            let shared = &self.shared;
            let mut conn = shared.connect().await?;
            let result = status(&mut conn, shared).await.map_err(|e| {
                sink_error(
                    shared.sink(),
                    "reading the pipeline's records for status",
                    &e,
                )
            });
            close(conn).await;
            result
        })
    }

    fn forget_pipeline(&self) -> BoxFuture<'_, Result<Forgotten, SinkError>> {
        Box::pin(async move {
            let shared = &self.shared;
            let mut conn = shared.connect().await?;
            let result = forget(&mut conn, shared)
                .await
                .map_err(|e| sink_error(shared.sink(), "removing the pipeline's records", &e));
            close(conn).await;
            result
        })
    }
}

fn push_owned(buf: &mut String, shared: &Shared, table: &str) {
    push_ident(buf, &shared.options.database);
    buf.push('.');
    push_ident(buf, table);
    buf.push_str(" WHERE pipeline=");
    push_str(buf, &shared.pipeline);
    buf.push_str(" AND connector=");
    push_str(buf, &shared.options.name);
}

/// Which of `tables` exist in the sink database.
async fn existing(
    conn: &mut Conn,
    shared: &Shared,
    tables: &[&str],
) -> Result<Vec<String>, mysql_async::Error> {
    let mut sql =
        String::from("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA=");
    push_str(&mut sql, &shared.options.database);
    sql.push_str(" AND TABLE_NAME IN (");
    for (n, t) in tables.iter().enumerate() {
        if n > 0 {
            sql.push(',');
        }
        push_str(&mut sql, t);
    }
    sql.push(')');
    conn.query(sql).await
}

async fn status(conn: &mut Conn, shared: &Shared) -> Result<SinkStatus, mysql_async::Error> {
    let dead = shared.options.dead_letter_table.as_str();
    let present = existing(conn, shared, &[TABLE, FENCE_TABLE, dead]).await?;
    let has = |t: &str| present.iter().any(|p| p == t);
    let mut status = SinkStatus {
        lanes: Vec::new(),
        claim: None,
        dead_letters: 0,
    };
    if has(TABLE) {
        let mut sql = String::from(
            "SELECT lane, lanes, CAST(lsn AS CHAR), ordinal, sub, \
             DATE_FORMAT(updated_at, '%Y-%m-%dT%H:%i:%s.%fZ') FROM ",
        );
        push_owned(&mut sql, shared, TABLE);
        sql.push_str(" ORDER BY lane");
        let rows: Vec<(u32, u32, String, u32, u32, String)> = conn.query(sql).await?;
        status.lanes = rows
            .into_iter()
            .map(
                |(lane, lanes, lsn, ordinal, sub, updated_at)| LaneCheckpoint {
                    lane,
                    lanes,
                    position: lsn.parse::<u128>().map_or(lsn, |lsn| {
                        Position {
                            sub,
                            ..Position::new(Lsn(lsn), ordinal)
                        }
                        .to_string()
                    }),
                    updated_at,
                },
            )
            .collect();
    }
    if has(FENCE_TABLE) {
        let mut sql = String::from(
            "SELECT pid, host, DATE_FORMAT(started_at, '%Y-%m-%dT%H:%i:%sZ'), \
             GREATEST(TIMESTAMPDIFF(MICROSECOND, heartbeat_at, NOW(6)), 0), \
             DATE_FORMAT(stopped_at, '%Y-%m-%dT%H:%i:%sZ'), last_error FROM ",
        );
        push_owned(&mut sql, shared, FENCE_TABLE);
        let row: Option<mysql_async::Row> = conn.query_first(sql).await?;
        status.claim = row.map(|r| ClaimStatus {
            pid: r.get(0).unwrap_or_default(),
            host: r.get(1).unwrap_or_default(),
            started_at: r.get(2).unwrap_or_default(),
            heartbeat_age_seconds: r.get::<u64, _>(3).unwrap_or_default() as f64 / 1e6,
            stopped_at: r.get::<Option<String>, _>(4).flatten(),
            last_error: r.get::<Option<String>, _>(5).flatten(),
        });
    }
    if has(dead) {
        let mut sql = String::from("SELECT COUNT(*) FROM ");
        push_owned(&mut sql, shared, dead);
        status.dead_letters = conn.query_first(sql).await?.unwrap_or(0);
    }
    Ok(status)
}

async fn forget(conn: &mut Conn, shared: &Shared) -> Result<Forgotten, mysql_async::Error> {
    let present = existing(conn, shared, &OWN_TABLES).await?;
    let mut forgotten = Forgotten::default();
    for table in OWN_TABLES {
        if !present.iter().any(|p| p == table) {
            continue;
        }
        let mut sql = String::from("DELETE FROM ");
        push_owned(&mut sql, shared, table);
        conn.query_drop(sql).await?;
        forgotten.rows += conn.affected_rows();
        let mut any = String::from("SELECT 1 FROM ");
        push_ident(&mut any, &shared.options.database);
        any.push('.');
        push_ident(&mut any, table);
        any.push_str(" LIMIT 1");
        if conn.query_first::<u8, _>(any).await?.is_some() {
            forgotten.kept_tables.push(table.to_owned());
            continue;
        }
        let mut drop = String::from("DROP TABLE IF EXISTS ");
        push_ident(&mut drop, &shared.options.database);
        drop.push('.');
        push_ident(&mut drop, table);
        conn.query_drop(drop).await?;
        forgotten.dropped_tables.push(table.to_owned());
    }
    Ok(forgotten)
}
