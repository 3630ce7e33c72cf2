//! Checkpoints committed inside the sink's own transaction.
//!
//! Each lane of each sink keeps one row in the sink database, keyed by (pipeline, connector,
//! lane): the position of the last change the lane committed, and the lane count it was
//! written under. The row is upserted by the same transaction that writes the batch, so "rows
//! written" and "checkpoint moved" are one atomic fact; after a crash a lane resumes right
//! after its row and replays nothing twice that it had committed (and anything replayed anyway
//! converges, because every write is an upsert or a delete by key).
//!
//! When the operator changes the lane count, keys move between lanes, so per-lane positions no
//! longer mean anything for the new lanes. [`restart_position`] decides where every new lane
//! starts: the minimum stored position (every change at or below it was committed by whichever
//! old lane owned its key), or no position at all when some old lane never committed. Replaying
//! from there converges because upserts carry whole rows.
//!
//! The MySQL SQL lives in [`mysql`]; the decision logic above is sink-generic.

use crate::change::Position;

/// Name of the checkpoint table, created in the sink database.
pub(crate) const TABLE: &str = "_zipline_checkpoints";

/// Longest pipeline or connector name the table holds (`VARCHAR(128)`).
pub(crate) const MAX_NAME_CHARS: usize = 128;

/// Identifies one lane's checkpoint row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneKey<'a> {
    pub(crate) pipeline: &'a str,
    pub(crate) connector: &'a str,
    pub(crate) lane: u32,
    pub(crate) lanes: u32,
}

/// One stored checkpoint row of a (pipeline, connector).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) lane: u32,
    pub(crate) lanes: u32,
    pub(crate) position: Position,
}

/// `None` when the stored rows already belong to `lanes` lanes (nothing to do). Otherwise the
/// lane count changed and `Some(start)` is where every new lane must start: the minimum stored
/// position, or `None` (replay everything the source still has) when some lane of an old lane
/// count has no row, i.e. never committed anything.
pub(crate) fn restart_position(rows: &[Stored], lanes: u32) -> Option<Option<Position>> {
    if rows.iter().all(|r| r.lanes == lanes && r.lane < lanes) {
        return None;
    }
    let complete = rows.iter().all(|r| {
        (0..r.lanes).all(|lane| rows.iter().any(|o| o.lanes == r.lanes && o.lane == lane))
    });
    if !complete {
        return Some(None);
    }
    Some(rows.iter().map(|r| r.position).min())
}

/// The MySQL/MariaDB checkpoint table.
pub(crate) mod mysql {
    use mysql_async::Conn;
    use mysql_async::prelude::Queryable;

    use super::{LaneKey, Stored, TABLE, restart_position};
    use crate::change::{Lsn, Position};
    use crate::sink::mysql::literal::{push_ident, push_str};

    /// `CREATE TABLE IF NOT EXISTS` for the checkpoint table in `database`. Names compare
    /// byte-wise (`utf8mb4_bin`): pipeline `Orders` is not pipeline `orders`.
    pub(crate) fn create_table_sql(database: &str) -> String {
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

    /// Appends the upsert that moves `key`'s row to `position`; run inside the batch's
    /// transaction. `updated_at` is the server's clock (UTC in a lane session).
    pub(crate) fn push_upsert(
        buf: &mut String,
        database: &str,
        key: &LaneKey<'_>,
        position: Position,
    ) {
        push_upsert_rows(buf, database, key, &[key.lane], position);
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
    /// others then see rows of the new count. `conn` must be a fresh lane session.
    pub(crate) async fn load(
        conn: &mut Conn,
        database: &str,
        key: &LaneKey<'_>,
    ) -> Result<Option<Position>, mysql_async::Error> {
        let mut sql = String::from("SELECT lane, lanes, CAST(lsn AS CHAR), ordinal, sub FROM ");
        push_table(&mut sql, database);
        push_owner_filter(&mut sql, key);
        sql.push_str(" FOR UPDATE");
        conn.query_drop("START TRANSACTION").await?;
        let rows: Vec<(u32, u32, String, u32, u32)> = conn.query(sql).await?;
        let mut rows: Vec<Stored> = rows
            .into_iter()
            .map(|(lane, lanes, lsn, ordinal, sub)| {
                // DECIMAL(39,0) holds any 128-bit position; a value that is not one was not
                // written by Zipline.
                let lsn = lsn.parse::<u128>().map_err(|_| {
                    mysql_async::Error::Other(
                        format!(
                            "{TABLE} holds a position that is not an unsigned integer: {lsn:?}"
                        )
                        .into(),
                    )
                })?;
                Ok(Stored {
                    lane,
                    lanes,
                    position: Position {
                        sub,
                        ..Position::new(Lsn(lsn), ordinal)
                    },
                })
            })
            .collect::<Result<_, mysql_async::Error>>()?;
        if let Some(start) = restart_position(&rows, key.lanes) {
            let mut old_counts: Vec<u32> = rows.iter().map(|r| r.lanes).collect();
            old_counts.sort_unstable();
            old_counts.dedup();
            let mut sql = String::from("DELETE FROM ");
            push_table(&mut sql, database);
            push_owner_filter(&mut sql, key);
            conn.query_drop(sql).await?;
            rows.clear();
            if let Some(position) = start {
                let lanes: Vec<u32> = (0..key.lanes).collect();
                let mut sql = String::new();
                push_upsert_rows(&mut sql, database, key, &lanes, position);
                conn.query_drop(sql).await?;
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
        conn.query_drop("COMMIT").await?;
        Ok(rows.iter().find(|r| r.lane == key.lane).map(|r| r.position))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::Lsn;

    fn pos(lsn: u64, ordinal: u32) -> Position {
        Position::new(Lsn::from(lsn), ordinal)
    }

    fn row(lane: u32, lanes: u32, p: Position) -> Stored {
        Stored {
            lane,
            lanes,
            position: p,
        }
    }

    #[test]
    fn same_lane_count_needs_nothing() {
        assert_eq!(restart_position(&[], 4), None);
        let rows = [row(0, 2, pos(5, 1)), row(1, 2, pos(3, 9))];
        assert_eq!(restart_position(&rows, 2), None);
        // A lane that never committed has no row; with the same count that is fine.
        assert_eq!(restart_position(&rows[..1], 2), None);
    }

    #[test]
    fn changed_lane_count_restarts_at_the_minimum() {
        let rows = [row(0, 2, pos(5, 1)), row(1, 2, pos(3, 9))];
        assert_eq!(restart_position(&rows, 3), Some(Some(pos(3, 9))));
        assert_eq!(restart_position(&rows, 1), Some(Some(pos(3, 9))));
        // Ordinal breaks ties on the commit LSN.
        let rows = [row(0, 2, pos(3, 2)), row(1, 2, pos(3, 1))];
        assert_eq!(restart_position(&rows, 4), Some(Some(pos(3, 1))));
    }

    #[test]
    fn an_old_lane_without_a_row_means_replay_everything() {
        let rows = [row(0, 3, pos(5, 1)), row(2, 3, pos(7, 1))];
        assert_eq!(restart_position(&rows, 2), Some(None));
    }

    #[test]
    fn sql_quotes_names() {
        let key = LaneKey {
            pipeline: "p'1",
            connector: "out",
            lane: 2,
            lanes: 4,
        };
        let mut buf = String::new();
        mysql::push_upsert(&mut buf, "shop", &key, pos(0x16_B374_D848, 7));
        assert_eq!(
            buf,
            "INSERT INTO `shop`.`_zipline_checkpoints` \
             (pipeline,connector,lane,lanes,lsn,ordinal,sub,updated_at) VALUES \
             ('p''1','out',2,4,97500059720,7,0,CURRENT_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE \
             lanes=VALUES(lanes),lsn=VALUES(lsn),ordinal=VALUES(ordinal),sub=VALUES(sub),\
             updated_at=VALUES(updated_at)"
        );
        assert!(mysql::create_table_sql("we`ird").starts_with(
            "CREATE TABLE IF NOT EXISTS `we``ird`.`_zipline_checkpoints` (pipeline VARCHAR(128)"
        ));
    }
}
