//! The PostgreSQL checkpoint table, in the sink connector's `schema` (default `public`); see
//! [`crate::checkpoint`] for what it means.

use tokio_postgres::Client;

use super::errors::sink_error;
use super::sql::qualified;
use super::{Shared, fence};
use crate::change::{Lsn, Position};
use crate::checkpoint::{LaneKey, Stored, TABLE, restart_position};
use crate::sink::SinkError;

/// `CREATE TABLE IF NOT EXISTS` for the checkpoint table in `schema`. Names compare
/// byte-wise (`COLLATE "C"`): pipeline `Orders` is not pipeline `orders`.
pub(super) fn create_table_sql(schema: &str) -> String {
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

/// The upsert that moves one lane's row, run inside the batch's transaction right after
/// [`fence::lock_sql`]. It is also the batch's fence check: the new `lsn` is NULL (a NOT NULL
/// violation, 23502, which aborts the transaction) unless the fence row still holds the
/// writer's epoch. Parameters: `$1` pipeline, `$2` connector, `$3` lane, `$4` lanes (int4),
/// `$5` LSN as decimal text, `$6` ordinal, `$7` sub, `$8` epoch (int8); see
/// [`upsert_params`].
pub(super) fn upsert_sql(schema: &str) -> String {
    format!(
        "INSERT INTO {} (pipeline, connector, lane, lanes, lsn, ordinal, sub, updated_at) \
         SELECT $1::text, $2::text, $3::int4, $4::int4, CASE WHEN ({}) = $8::int8 \
         THEN $5::text::numeric END, $6::int8, $7::int8, clock_timestamp() \
         ON CONFLICT (pipeline, connector, lane) DO UPDATE SET lanes = EXCLUDED.lanes, \
         lsn = EXCLUDED.lsn, ordinal = EXCLUDED.ordinal, sub = EXCLUDED.sub, \
         updated_at = EXCLUDED.updated_at",
        qualified(schema, TABLE),
        fence::epoch_query(schema, "$1::text", "$2::text"),
    )
}

/// Owned parameter values for [`upsert_sql`].
pub(super) struct UpsertParams {
    pipeline: String,
    connector: String,
    lane: i32,
    lanes: i32,
    lsn: String,
    ordinal: i64,
    sub: i64,
    epoch: i64,
}

impl UpsertParams {
    /// As `&dyn ToSql` for `execute`.
    pub(crate) fn as_params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 8] {
        [
            &self.pipeline,
            &self.connector,
            &self.lane,
            &self.lanes,
            &self.lsn,
            &self.ordinal,
            &self.sub,
            &self.epoch,
        ]
    }
}

/// Parameters that move `key`'s row (for `lane`) to `position`, fenced on `epoch`.
pub(super) fn upsert_params(
    key: &LaneKey<'_>,
    lane: u32,
    position: Position,
    epoch: u64,
) -> UpsertParams {
    UpsertParams {
        pipeline: key.pipeline.to_owned(),
        connector: key.connector.to_owned(),
        // Lane counts are at most 256 (config); positions' ordinals fit u32.
        lane: i32::try_from(lane).unwrap_or(i32::MAX),
        lanes: i32::try_from(key.lanes).unwrap_or(i32::MAX),
        lsn: position.lsn.0.to_string(),
        ordinal: i64::from(position.ordinal),
        sub: i64::from(position.sub),
        epoch: i64::try_from(epoch).unwrap_or(i64::MAX),
    }
}

/// Loads `key`'s checkpoint, first rewriting the (pipeline, connector) rows when they were
/// written under another lane count (see [`restart_position`]). One transaction holding an
/// advisory lock on (pipeline, connector), so lanes opening at the same time take turns: the
/// first rewrites, the others then read rows of the new count (each statement of a READ
/// COMMITTED transaction sees what committed before it started). The rewrite is fenced like
/// a batch.
pub(super) async fn load(
    client: &Client,
    shared: &Shared,
    key: &LaneKey<'_>,
) -> Result<Option<Position>, SinkError> {
    let table = qualified(shared.checkpoint_schema(), TABLE);
    let doing = format!("loading lane {}'s checkpoint from {table}", key.lane);
    let err = |e: tokio_postgres::Error| sink_error(shared.sink(), &doing, &e);
    client.batch_execute("BEGIN").await.map_err(err)?;
    let result = load_in_tx(client, shared, key, &table).await;
    match &result {
        Ok(_) => client.batch_execute("COMMIT").await.map_err(err)?,
        Err(_) => {
            let _ = client.batch_execute("ROLLBACK").await;
        }
    }
    result
}

async fn load_in_tx(
    client: &Client,
    shared: &Shared,
    key: &LaneKey<'_>,
    table: &str,
) -> Result<Option<Position>, SinkError> {
    let doing = format!("loading lane {}'s checkpoint from {table}", key.lane);
    let err = |e: tokio_postgres::Error| sink_error(shared.sink(), &doing, &e);
    let lock_name = format!("zipline checkpoint {}\u{1}{}", key.pipeline, key.connector);
    client
        .execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))",
            &[&lock_name],
        )
        .await
        .map_err(err)?;
    let mut stored = read_rows(client, table, key).await.map_err(err)?;
    if let Some(start) = restart_position(&stored, key.lanes) {
        fence::check_in_tx(client, shared).await?;
        let epoch = fence::epoch(shared)?;
        let mut old_counts: Vec<u32> = stored.iter().map(|r| r.lanes).collect();
        old_counts.sort_unstable();
        old_counts.dedup();
        client
            .execute(
                &format!("DELETE FROM {table} WHERE pipeline = $1::text AND connector = $2::text"),
                &[&key.pipeline, &key.connector],
            )
            .await
            .map_err(err)?;
        stored.clear();
        if let Some(position) = start {
            let sql = upsert_sql(shared.checkpoint_schema());
            for lane in 0..key.lanes {
                let params = upsert_params(key, lane, position, epoch);
                client
                    .execute(&sql, &params.as_params())
                    .await
                    .map_err(err)?;
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

/// Whether (pipeline, connector) has any checkpoint row: a sink that ever committed a batch
/// of the pipeline has.
pub(super) async fn any_rows(
    client: &Client,
    schema: &str,
    pipeline: &str,
    connector: &str,
) -> Result<bool, tokio_postgres::Error> {
    let sql = format!(
        "SELECT 1 FROM {} WHERE pipeline = $1::text AND connector = $2::text LIMIT 1",
        qualified(schema, TABLE)
    );
    Ok(client
        .query_opt(&sql, &[&pipeline, &connector])
        .await?
        .is_some())
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

/// Deletes every checkpoint row of (pipeline, connector), fenced.
pub(super) async fn reset(client: &Client, shared: &Shared) -> Result<(), SinkError> {
    let table = qualified(shared.checkpoint_schema(), TABLE);
    let doing = format!("forgetting the lane checkpoints in {table}");
    let err = |e: tokio_postgres::Error| sink_error(shared.sink(), &doing, &e);
    let o = &shared.options;
    client.batch_execute("BEGIN").await.map_err(err)?;
    let result = async {
        fence::check_in_tx(client, shared).await?;
        client
            .execute(
                &format!("DELETE FROM {table} WHERE pipeline = $1::text AND connector = $2::text"),
                &[&shared.pipeline, &o.name],
            )
            .await
            .map_err(err)?;
        client.batch_execute("COMMIT").await.map_err(err)
    }
    .await;
    if result.is_err() {
        let _ = client.batch_execute("ROLLBACK").await;
    }
    result
}

/// The durable frontier of `key`'s (pipeline, connector) on `key.lanes` lanes (see
/// [`crate::checkpoint::durable_frontier`]). Reads only.
pub(super) async fn frontier(
    client: &Client,
    schema: &str,
    key: &LaneKey<'_>,
) -> Result<Option<Position>, tokio_postgres::Error> {
    let rows = read_rows(client, &qualified(schema, TABLE), key).await?;
    Ok(crate::checkpoint::durable_frontier(&rows, key.lanes))
}

/// Raises every lane row of `key` (lanes `0..key.lanes`) that is below `frontier` to it,
/// creating missing rows, in one fenced transaction. A lane committing concurrently only ever
/// writes positions above a durable frontier; the row-wise comparison keeps the higher.
pub(super) async fn advance(
    client: &Client,
    shared: &Shared,
    key: &LaneKey<'_>,
    frontier: Position,
) -> Result<(), SinkError> {
    let table = qualified(shared.checkpoint_schema(), TABLE);
    let sql = format!(
        "INSERT INTO {table} AS c (pipeline, connector, lane, lanes, lsn, ordinal, sub, \
         updated_at) SELECT $1::text, $2::text, l, $3::int4, $4::text::numeric, $5::int8, \
         $6::int8, clock_timestamp() FROM generate_series(0, $3::int4 - 1) AS l \
         ON CONFLICT (pipeline, connector, lane) DO UPDATE SET lsn = EXCLUDED.lsn, \
         ordinal = EXCLUDED.ordinal, sub = EXCLUDED.sub, updated_at = EXCLUDED.updated_at \
         WHERE (c.lsn, c.ordinal, c.sub) < (EXCLUDED.lsn, EXCLUDED.ordinal, EXCLUDED.sub)"
    );
    let lanes = i32::try_from(key.lanes).unwrap_or(i32::MAX);
    let lsn = frontier.lsn.0.to_string();
    let (ordinal, sub) = (i64::from(frontier.ordinal), i64::from(frontier.sub));
    let doing = format!("raising idle lanes' checkpoints in {table} to {frontier}");
    let err = |e: tokio_postgres::Error| sink_error(shared.sink(), &doing, &e);
    client.batch_execute("BEGIN").await.map_err(err)?;
    let result = async {
        fence::check_in_tx(client, shared).await?;
        client
            .execute(
                &sql,
                &[&key.pipeline, &key.connector, &lanes, &lsn, &ordinal, &sub],
            )
            .await
            .map_err(err)?;
        client.batch_execute("COMMIT").await.map_err(err)
    }
    .await;
    if result.is_err() {
        let _ = client.batch_execute("ROLLBACK").await;
    }
    result
}
