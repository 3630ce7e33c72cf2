//! The MySQL/MariaDB checkpoint table (see [`crate::checkpoint`] for what it means).

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use super::Shared;
use super::errors::sink_error;
use super::fence;
use super::literal::{push_ident, push_str};
use crate::change::{Lsn, Position};
use crate::checkpoint::{LaneKey, Stored, TABLE, restart_position};
use crate::sink::SinkError;

/// `CREATE TABLE IF NOT EXISTS` for the checkpoint table in `database`. Names compare
/// byte-wise (`utf8mb4_bin`): pipeline `Orders` is not pipeline `orders`.
pub(super) fn create_table_sql(database: &str) -> String {
    let mut sql = String::from("CREATE TABLE IF NOT EXISTS ");
    push_table(&mut sql, database);
    sql.push_str(
        " (pipeline VARCHAR(128) NOT NULL, connector VARCHAR(128) NOT NULL, \
         lane INT NOT NULL, lanes INT NOT NULL, lsn DECIMAL(39,0) NOT NULL, \
         ordinal INT UNSIGNED NOT NULL, sub INT UNSIGNED NOT NULL DEFAULT 0, \
         updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
         PRIMARY KEY (pipeline, connector, lane)) \
         ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    );
    sql
}

fn push_table(buf: &mut String, database: &str) {
    push_ident(buf, database);
    buf.push('.');
    push_ident(buf, TABLE);
}

fn push_owner_filter(buf: &mut String, key: &LaneKey<'_>) {
    buf.push_str(" WHERE pipeline=");
    push_str(buf, key.pipeline);
    buf.push_str(" AND connector=");
    push_str(buf, key.connector);
}

/// Appends the upsert that moves `key`'s row to `position`, run inside the batch's
/// transaction as its last statement. It is also the batch's fence check: the row's `lsn` is
/// taken from the fence row under a shared lock, and is NULL (an error, 1048, in a strict
/// session) unless the fence row still holds `epoch` (see [`fence::guarded_value`]).
/// `updated_at` is the server's clock (UTC in a lane session).
pub(super) fn push_upsert(
    buf: &mut String,
    database: &str,
    key: &LaneKey<'_>,
    position: Position,
    epoch: u64,
) {
    use std::fmt::Write as _;
    buf.push_str("INSERT INTO ");
    push_table(buf, database);
    buf.push_str(" (pipeline,connector,lane,lanes,lsn,ordinal,sub,updated_at) SELECT ");
    push_str(buf, key.pipeline);
    buf.push(',');
    push_str(buf, key.connector);
    let _ = write!(buf, ",{},{},", key.lane, key.lanes);
    fence::push_guarded_value(buf, epoch, &position.lsn.0.to_string());
    let _ = write!(
        buf,
        ",{},{},CURRENT_TIMESTAMP(6)",
        position.ordinal, position.sub
    );
    fence::push_guard_source(buf, database, key.pipeline, key.connector);
    buf.push_str(
        " ON DUPLICATE KEY UPDATE lanes=VALUES(lanes),lsn=VALUES(lsn),\
         ordinal=VALUES(ordinal),sub=VALUES(sub),updated_at=VALUES(updated_at)",
    );
}

fn push_upsert_rows(
    buf: &mut String,
    database: &str,
    key: &LaneKey<'_>,
    lanes: &[u32],
    position: Position,
) {
    use std::fmt::Write as _;
    buf.push_str("INSERT INTO ");
    push_table(buf, database);
    buf.push_str(" (pipeline,connector,lane,lanes,lsn,ordinal,sub,updated_at) VALUES ");
    for (n, lane) in lanes.iter().enumerate() {
        if n > 0 {
            buf.push(',');
        }
        buf.push('(');
        push_str(buf, key.pipeline);
        buf.push(',');
        push_str(buf, key.connector);
        let _ = write!(
            buf,
            ",{lane},{},{},{},{},CURRENT_TIMESTAMP(6))",
            key.lanes, position.lsn.0, position.ordinal, position.sub
        );
    }
    buf.push_str(
        " ON DUPLICATE KEY UPDATE lanes=VALUES(lanes),lsn=VALUES(lsn),\
         ordinal=VALUES(ordinal),sub=VALUES(sub),updated_at=VALUES(updated_at)",
    );
}

/// Loads `key`'s checkpoint, first rewriting the (pipeline, connector) rows when they were
/// written under another lane count (see [`restart_position`]). One transaction whose
/// locking read serializes lanes opening at the same time: the first one rewrites, the
/// others then see rows of the new count. The rewrite is fenced like a batch. `conn` must be
/// a fresh lane session.
pub(super) async fn load(
    conn: &mut Conn,
    shared: &Shared,
    key: &LaneKey<'_>,
) -> Result<Option<Position>, SinkError> {
    let lane = key.lane;
    let doing = format!("loading lane {lane}'s checkpoint from {TABLE}");
    let err = |e: mysql_async::Error| sink_error(shared.sink(), &doing, &e);
    let database = &shared.options.database;
    let mut sql = String::from("SELECT lane, lanes, CAST(lsn AS CHAR), ordinal, sub FROM ");
    push_table(&mut sql, database);
    push_owner_filter(&mut sql, key);
    sql.push_str(" FOR UPDATE");
    conn.query_drop("START TRANSACTION").await.map_err(err)?;
    let rows: Vec<(u32, u32, String, u32, u32)> = conn.query(sql).await.map_err(err)?;
    let mut rows: Vec<Stored> = rows
        .into_iter()
        .map(|(lane, lanes, lsn, ordinal, sub)| {
            // DECIMAL(39,0) holds any 128-bit position; a value that is not one was not
            // written by Zipline.
            let lsn = lsn.parse::<u128>().map_err(|_| not_a_position(&lsn))?;
            Ok(Stored {
                lane,
                lanes,
                position: Position {
                    sub,
                    ..Position::new(Lsn(lsn), ordinal)
                },
            })
        })
        .collect::<Result<_, mysql_async::Error>>()
        .map_err(err)?;
    if let Some(start) = restart_position(&rows, key.lanes) {
        fence::check_locked(conn, shared).await?;
        let mut old_counts: Vec<u32> = rows.iter().map(|r| r.lanes).collect();
        old_counts.sort_unstable();
        old_counts.dedup();
        let mut sql = String::from("DELETE FROM ");
        push_table(&mut sql, database);
        push_owner_filter(&mut sql, key);
        conn.query_drop(sql).await.map_err(err)?;
        rows.clear();
        if let Some(position) = start {
            let lanes: Vec<u32> = (0..key.lanes).collect();
            let mut sql = String::new();
            push_upsert_rows(&mut sql, database, key, &lanes, position);
            conn.query_drop(sql).await.map_err(err)?;
            rows.extend(lanes.iter().map(|&lane| Stored {
                lane,
                lanes: key.lanes,
                position,
            }));
        }
        tracing::warn!(
            pipeline = key.pipeline,
            connector = key.connector,
            old_lanes = ?old_counts,
            new_lanes = key.lanes,
            restart = %start.map_or_else(|| "the source's start".to_owned(), |p| p.to_string()),
            "lane count changed: every lane restarts from the lowest committed checkpoint \
             (rows written since then are rewritten with the same values)"
        );
    }
    conn.query_drop("COMMIT").await.map_err(err)?;
    Ok(rows.iter().find(|r| r.lane == key.lane).map(|r| r.position))
}

/// Whether (pipeline, connector) has any checkpoint row: a sink that ever committed a batch
/// of the pipeline has.
pub(super) async fn any_rows(
    conn: &mut Conn,
    database: &str,
    pipeline: &str,
    connector: &str,
) -> Result<bool, mysql_async::Error> {
    let key = LaneKey {
        pipeline,
        connector,
        lane: 0,
        lanes: 0,
    };
    let mut sql = String::from("SELECT 1 FROM ");
    push_table(&mut sql, database);
    push_owner_filter(&mut sql, &key);
    sql.push_str(" LIMIT 1");
    Ok(conn.query_first::<u8, _>(sql).await?.is_some())
}

/// Deletes every checkpoint row of (pipeline, connector), fenced.
pub(super) async fn reset(conn: &mut Conn, shared: &Shared) -> Result<(), SinkError> {
    let err = |e: mysql_async::Error| {
        sink_error(
            shared.sink(),
            &format!("forgetting the lane checkpoints in {TABLE}"),
            &e,
        )
    };
    let o = &shared.options;
    let key = LaneKey {
        pipeline: &shared.pipeline,
        connector: &o.name,
        lane: 0,
        lanes: 0,
    };
    conn.query_drop("START TRANSACTION").await.map_err(err)?;
    fence::check_locked(conn, shared).await?;
    let mut sql = String::from("DELETE FROM ");
    push_table(&mut sql, &o.database);
    push_owner_filter(&mut sql, &key);
    sql.push_str(";COMMIT");
    conn.query_drop(sql).await.map_err(err)
}

/// The durable frontier of `key`'s (pipeline, connector) on `key.lanes` lanes (see
/// [`crate::checkpoint::durable_frontier`]). Reads only.
pub(super) async fn frontier(
    conn: &mut Conn,
    database: &str,
    key: &LaneKey<'_>,
) -> Result<Option<Position>, mysql_async::Error> {
    let mut sql = String::from("SELECT lane, lanes, CAST(lsn AS CHAR), ordinal, sub FROM ");
    push_table(&mut sql, database);
    push_owner_filter(&mut sql, key);
    let rows: Vec<(u32, u32, String, u32, u32)> = conn.query(sql).await?;
    let mut stored = Vec::with_capacity(rows.len());
    for (lane, lanes, lsn, ordinal, sub) in rows {
        let lsn = lsn.parse::<u128>().map_err(|_| not_a_position(&lsn))?;
        stored.push(Stored {
            lane,
            lanes,
            position: Position {
                lsn: Lsn(lsn),
                ordinal,
                sub,
            },
        });
    }
    Ok(crate::checkpoint::durable_frontier(&stored, key.lanes))
}

fn not_a_position(lsn: &str) -> mysql_async::Error {
    mysql_async::Error::Other(
        format!("{TABLE} holds a position that is not an unsigned integer: {lsn:?}").into(),
    )
}

/// Appends the upsert that raises every lane row of `key` (lanes `0..key.lanes`) to
/// `frontier` where it is lower, creating missing rows. A lane committing concurrently
/// only ever writes positions above a durable frontier, so the row-level compare keeps
/// whichever is higher. MySQL evaluates the assignments left to right (each sees the
/// columns assigned before it), so `lsn` is replaced last.
pub(super) fn push_advance(
    buf: &mut String,
    database: &str,
    key: &LaneKey<'_>,
    frontier: Position,
) {
    let lanes: Vec<u32> = (0..key.lanes).collect();
    push_upsert_rows(buf, database, key, &lanes, frontier);
    let cut = buf.rfind(" ON DUPLICATE KEY UPDATE").unwrap_or(buf.len());
    buf.truncate(cut);
    let lower = "(lsn < VALUES(lsn) OR (lsn = VALUES(lsn) AND (ordinal < VALUES(ordinal) \
                 OR (ordinal = VALUES(ordinal) AND sub < VALUES(sub)))))";
    // Once `sub` is replaced the test can only turn false where `ordinal` is already
    // equal, so each assignment still sees the old position where it matters.
    buf.push_str(&format!(
        " ON DUPLICATE KEY UPDATE updated_at=IF({lower},VALUES(updated_at),updated_at),\
         sub=IF({lower},VALUES(sub),sub),ordinal=IF({lower},VALUES(ordinal),ordinal),\
         lsn=GREATEST(lsn,VALUES(lsn))"
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(lsn: u64, ordinal: u32) -> Position {
        Position::new(Lsn::from(lsn), ordinal)
    }

    #[test]
    fn advance_only_raises() {
        let key = LaneKey {
            pipeline: "p",
            connector: "out",
            lane: 0,
            lanes: 2,
        };
        let mut buf = String::new();
        push_advance(&mut buf, "shop", &key, pos(7, u32::MAX));
        let lower = "(lsn < VALUES(lsn) OR (lsn = VALUES(lsn) AND (ordinal < VALUES(ordinal) \
                     OR (ordinal = VALUES(ordinal) AND sub < VALUES(sub)))))";
        assert_eq!(
            buf,
            format!(
                "INSERT INTO `shop`.`_zipline_checkpoints` \
                 (pipeline,connector,lane,lanes,lsn,ordinal,sub,updated_at) VALUES \
                 ('p','out',0,2,7,4294967295,0,CURRENT_TIMESTAMP(6)),\
                 ('p','out',1,2,7,4294967295,0,CURRENT_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE \
                 updated_at=IF({lower},VALUES(updated_at),updated_at),\
                 sub=IF({lower},VALUES(sub),sub),ordinal=IF({lower},VALUES(ordinal),ordinal),\
                 lsn=GREATEST(lsn,VALUES(lsn))"
            )
        );
    }

    #[test]
    fn the_upsert_is_fenced_and_quotes_names() {
        let key = LaneKey {
            pipeline: "p'1",
            connector: "out",
            lane: 2,
            lanes: 4,
        };
        let mut buf = String::new();
        push_upsert(&mut buf, "shop", &key, pos(0x16_B374_D848, 7), 9);
        assert_eq!(
            buf,
            "INSERT INTO `shop`.`_zipline_checkpoints` \
             (pipeline,connector,lane,lanes,lsn,ordinal,sub,updated_at) SELECT \
             'p''1','out',2,4,IF(f.epoch<=>9,97500059720,NULL),7,0,CURRENT_TIMESTAMP(6) \
             FROM (SELECT 1) AS z LEFT JOIN `shop`.`_zipline_fence` AS f \
             ON f.pipeline='p''1' AND f.connector='out' LOCK IN SHARE MODE \
             ON DUPLICATE KEY UPDATE \
             lanes=VALUES(lanes),lsn=VALUES(lsn),ordinal=VALUES(ordinal),sub=VALUES(sub),\
             updated_at=VALUES(updated_at)"
        );
        assert!(create_table_sql("we`ird").starts_with(
            "CREATE TABLE IF NOT EXISTS `we``ird`.`_zipline_checkpoints` (pipeline VARCHAR(128)"
        ));
    }
}
