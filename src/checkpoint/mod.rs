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
//! The MySQL SQL lives in [`mysql`], the PostgreSQL SQL in [`postgres`]; the decision logic
//! above is sink-generic.

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

/// Where a source without an upstream cursor resumes, from the stored rows of its sink run
/// on `lanes` lanes: the lowest committed position when every lane has a row (every change
/// at or below it is durable, whichever lane owns its key), `None` when some lane has none.
/// Rows of another lane count resolve as [`restart_position`] does, which is where the
/// lanes themselves will restart.
pub(crate) fn durable_frontier(rows: &[Stored], lanes: u32) -> Option<Position> {
    if let Some(start) = restart_position(rows, lanes) {
        return start;
    }
    let complete = (0..lanes).all(|lane| rows.iter().any(|r| r.lane == lane));
    if !complete {
        return None;
    }
    rows.iter().map(|r| r.position).min()
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

    /// The durable frontier of `key`'s (pipeline, connector) on `key.lanes` lanes (see
    /// [`super::durable_frontier`]). Reads only.
    pub(crate) async fn frontier(
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
        Ok(super::durable_frontier(&stored, key.lanes))
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
    pub(crate) fn push_advance(
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
}

/// The PostgreSQL checkpoint table, in the sink connector's `schema` (default `public`).
pub(crate) mod postgres {
    use tokio_postgres::Client;

    use super::{LaneKey, Stored, TABLE, restart_position};
    use crate::change::{Lsn, Position};
    use crate::sink::postgres::sql::qualified;

    /// `CREATE TABLE IF NOT EXISTS` for the checkpoint table in `schema`. Names compare
    /// byte-wise (`COLLATE "C"`): pipeline `Orders` is not pipeline `orders`.
    pub(crate) fn create_table_sql(schema: &str) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\
             pipeline varchar(128) COLLATE \"C\" NOT NULL, \
             connector varchar(128) COLLATE \"C\" NOT NULL, \
             lane integer NOT NULL, lanes integer NOT NULL, lsn numeric(39,0) NOT NULL, \
             ordinal bigint NOT NULL, sub bigint NOT NULL DEFAULT 0, \
             updated_at timestamptz NOT NULL DEFAULT now(), \
             PRIMARY KEY (pipeline, connector, lane))",
            qualified(schema, TABLE)
        )
    }

    /// The upsert that moves one lane's row, run inside the batch's transaction. Parameters:
    /// `$1` pipeline, `$2` connector, `$3` lane, `$4` lanes (int4), `$5` LSN as decimal text,
    /// `$6` ordinal, `$7` sub (int8); see [`upsert_params`].
    pub(crate) fn upsert_sql(schema: &str) -> String {
        format!(
            "INSERT INTO {} (pipeline, connector, lane, lanes, lsn, ordinal, sub, updated_at) \
             VALUES ($1::text, $2::text, $3::int4, $4::int4, $5::text::numeric, $6::int8, \
             $7::int8, clock_timestamp()) \
             ON CONFLICT (pipeline, connector, lane) DO UPDATE SET lanes = EXCLUDED.lanes, \
             lsn = EXCLUDED.lsn, ordinal = EXCLUDED.ordinal, sub = EXCLUDED.sub, \
             updated_at = EXCLUDED.updated_at",
            qualified(schema, TABLE)
        )
    }

    /// Owned parameter values for [`upsert_sql`].
    pub(crate) struct UpsertParams {
        pipeline: String,
        connector: String,
        lane: i32,
        lanes: i32,
        lsn: String,
        ordinal: i64,
        sub: i64,
    }

    impl UpsertParams {
        /// As `&dyn ToSql` for `execute`.
        pub(crate) fn as_params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 7] {
            [
                &self.pipeline,
                &self.connector,
                &self.lane,
                &self.lanes,
                &self.lsn,
                &self.ordinal,
                &self.sub,
            ]
        }
    }

    /// Parameters that move `key`'s row (for `lane`) to `position`.
    pub(crate) fn upsert_params(key: &LaneKey<'_>, lane: u32, position: Position) -> UpsertParams {
        UpsertParams {
            pipeline: key.pipeline.to_owned(),
            connector: key.connector.to_owned(),
            // Lane counts are at most 256 (config); positions' ordinals fit u32.
            lane: i32::try_from(lane).unwrap_or(i32::MAX),
            lanes: i32::try_from(key.lanes).unwrap_or(i32::MAX),
            lsn: position.lsn.0.to_string(),
            ordinal: i64::from(position.ordinal),
            sub: i64::from(position.sub),
        }
    }

    /// Loads `key`'s checkpoint, first rewriting the (pipeline, connector) rows when they were
    /// written under another lane count (see [`restart_position`]). One transaction holding an
    /// advisory lock on (pipeline, connector), so lanes opening at the same time take turns: the
    /// first rewrites, the others then read rows of the new count (each statement of a READ
    /// COMMITTED transaction sees what committed before it started).
    pub(crate) async fn load(
        client: &Client,
        schema: &str,
        key: &LaneKey<'_>,
    ) -> Result<Option<Position>, tokio_postgres::Error> {
        client.batch_execute("BEGIN").await?;
        let result = load_in_tx(client, schema, key).await;
        match &result {
            Ok(_) => client.batch_execute("COMMIT").await?,
            Err(_) => {
                let _ = client.batch_execute("ROLLBACK").await;
            }
        }
        result
    }

    async fn load_in_tx(
        client: &Client,
        schema: &str,
        key: &LaneKey<'_>,
    ) -> Result<Option<Position>, tokio_postgres::Error> {
        let table = qualified(schema, TABLE);
        let lock_name = format!("zipline checkpoint {}\u{1}{}", key.pipeline, key.connector);
        client
            .execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))",
                &[&lock_name],
            )
            .await?;
        let mut stored = read_rows(client, &table, key).await?;
        if let Some(start) = restart_position(&stored, key.lanes) {
            let mut old_counts: Vec<u32> = stored.iter().map(|r| r.lanes).collect();
            old_counts.sort_unstable();
            old_counts.dedup();
            client
                .execute(
                    &format!(
                        "DELETE FROM {table} WHERE pipeline = $1::text AND connector = $2::text"
                    ),
                    &[&key.pipeline, &key.connector],
                )
                .await?;
            stored.clear();
            if let Some(position) = start {
                let sql = upsert_sql(schema);
                for lane in 0..key.lanes {
                    let params = upsert_params(key, lane, position);
                    client.execute(&sql, &params.as_params()).await?;
                    stored.push(Stored {
                        lane,
                        lanes: key.lanes,
                        position,
                    });
                }
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
        Ok(stored
            .iter()
            .find(|r| r.lane == key.lane)
            .map(|r| r.position))
    }

    /// The (pipeline, connector) rows of `key`, skipping any that hold no valid position.
    async fn read_rows(
        client: &Client,
        table: &str,
        key: &LaneKey<'_>,
    ) -> Result<Vec<Stored>, tokio_postgres::Error> {
        let rows = client
            .query(
                &format!(
                    "SELECT lane, lanes, lsn::text, ordinal, sub FROM {table} \
                     WHERE pipeline = $1::text AND connector = $2::text"
                ),
                &[&key.pipeline, &key.connector],
            )
            .await?;
        let mut stored = Vec::with_capacity(rows.len());
        for r in &rows {
            let (lane, lanes, lsn, ordinal, sub): (i32, i32, String, i64, i64) =
                (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
            // A value that is not a position was not written by Zipline; replaying everything
            // from the source is the safe reading of it.
            let (Ok(lsn), Ok(lane), Ok(lanes), Ok(ordinal), Ok(sub)) = (
                lsn.parse::<u128>(),
                u32::try_from(lane),
                u32::try_from(lanes),
                u32::try_from(ordinal),
                u32::try_from(sub),
            ) else {
                tracing::warn!(
                    pipeline = key.pipeline,
                    connector = key.connector,
                    lane,
                    "ignoring a checkpoint row that holds no valid position"
                );
                continue;
            };
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
        Ok(stored)
    }

    /// The durable frontier of `key`'s (pipeline, connector) on `key.lanes` lanes (see
    /// [`super::durable_frontier`]). Reads only.
    pub(crate) async fn frontier(
        client: &Client,
        schema: &str,
        key: &LaneKey<'_>,
    ) -> Result<Option<Position>, tokio_postgres::Error> {
        let rows = read_rows(client, &qualified(schema, TABLE), key).await?;
        Ok(super::durable_frontier(&rows, key.lanes))
    }

    /// Raises every lane row of `key` (lanes `0..key.lanes`) that is below `frontier` to it,
    /// creating missing rows, in one statement. A lane committing concurrently only ever
    /// writes positions above a durable frontier; the row-wise comparison keeps the higher.
    pub(crate) async fn advance(
        client: &Client,
        schema: &str,
        key: &LaneKey<'_>,
        frontier: Position,
    ) -> Result<(), tokio_postgres::Error> {
        let sql = format!(
            "INSERT INTO {} AS c (pipeline, connector, lane, lanes, lsn, ordinal, sub, \
             updated_at) SELECT $1::text, $2::text, l, $3::int4, $4::text::numeric, $5::int8, \
             $6::int8, clock_timestamp() FROM generate_series(0, $3::int4 - 1) AS l \
             ON CONFLICT (pipeline, connector, lane) DO UPDATE SET lsn = EXCLUDED.lsn, \
             ordinal = EXCLUDED.ordinal, sub = EXCLUDED.sub, updated_at = EXCLUDED.updated_at \
             WHERE (c.lsn, c.ordinal, c.sub) < (EXCLUDED.lsn, EXCLUDED.ordinal, EXCLUDED.sub)",
            qualified(schema, TABLE)
        );
        let lanes = i32::try_from(key.lanes).unwrap_or(i32::MAX);
        let lsn = frontier.lsn.0.to_string();
        let (ordinal, sub) = (i64::from(frontier.ordinal), i64::from(frontier.sub));
        client
            .execute(
                &sql,
                &[&key.pipeline, &key.connector, &lanes, &lsn, &ordinal, &sub],
            )
            .await
            .map(drop)
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
    fn durable_frontier_needs_every_lane() {
        let rows = [row(0, 2, pos(5, 1)), row(1, 2, pos(3, 9))];
        assert_eq!(durable_frontier(&rows, 2), Some(pos(3, 9)));
        assert_eq!(
            durable_frontier(&rows[..1], 2),
            None,
            "lane 1 never committed"
        );
        assert_eq!(durable_frontier(&[], 1), None);
        // Another lane count: where the lanes will restart.
        assert_eq!(durable_frontier(&rows, 4), Some(pos(3, 9)));
        let partial = [row(0, 3, pos(5, 1))];
        assert_eq!(durable_frontier(&partial, 2), None);
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
        mysql::push_advance(&mut buf, "shop", &key, pos(7, u32::MAX));
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
