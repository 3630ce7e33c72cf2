//! The pipeline's records in a PostgreSQL sink, for `pipeline status` and `pipeline drop`
//! (see [`crate::sink::Lifecycle`]). Times print as UTC.

use tokio_postgres::Client;

use super::errors::sink_error;
use super::sql::qualified;
use super::{PostgresConnector, Shared};
use crate::change::{Lsn, Position};
use crate::checkpoint::fence::FENCE_TABLE;
use crate::checkpoint::{TABLE, tables::TABLES_TABLE};
use crate::sink::lifecycle::{ClaimStatus, Forgotten, LaneCheckpoint, Lifecycle, SinkStatus};
use crate::sink::{BoxFuture, SinkError};

/// Zipline's tables that hold rows per (pipeline, connector), in the order `drop` empties
/// them (the claim last: a failed drop is still refused while an instance runs).
const OWN_TABLES: [&str; 4] = [TABLE, TABLES_TABLE, super::snapshot::TABLE, FENCE_TABLE];

const UTC: &str = "AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS";

impl Lifecycle for PostgresConnector {
    fn status(&self) -> BoxFuture<'_, Result<SinkStatus, SinkError>> {
        Box::pin(async move {
            let shared = &self.shared;
            let client = shared.connect().await?;
            status(&client, shared).await.map_err(|e| {
                sink_error(
                    shared.sink(),
                    "reading the pipeline's records for status",
                    &e,
                )
            })
        })
    }

    fn forget_pipeline(&self) -> BoxFuture<'_, Result<Forgotten, SinkError>> {
        Box::pin(async move {
            let shared = &self.shared;
            let client = shared.connect().await?;
            forget(&client, shared)
                .await
                .map_err(|e| sink_error(shared.sink(), "removing the pipeline's records", &e))
        })
    }
}

async fn exists(client: &Client, table: &str) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&table])
        .await?
        .get(0))
}

const OWNER: &str = "WHERE pipeline = $1::text AND connector = $2::text";

async fn status(client: &Client, shared: &Shared) -> Result<SinkStatus, tokio_postgres::Error> {
    let schema = shared.checkpoint_schema();
    let owner: [&(dyn tokio_postgres::types::ToSql + Sync); 2] =
        [&shared.pipeline, &shared.options.name];
    let mut status = SinkStatus {
        lanes: Vec::new(),
        claim: None,
        dead_letters: 0,
    };
    let checkpoints = qualified(schema, TABLE);
    if exists(client, &checkpoints).await? {
        let sql = format!(
            "SELECT lane, lanes, lsn::text, ordinal, sub, \
             to_char(updated_at {UTC}.US\"Z\"') FROM {checkpoints} {OWNER} ORDER BY lane"
        );
        for r in client.query(&sql, &owner).await? {
            let lsn: String = r.get(2);
            let ordinal = u32::try_from(r.get::<_, i64>(3)).unwrap_or_default();
            let sub = u32::try_from(r.get::<_, i64>(4)).unwrap_or_default();
            status.lanes.push(LaneCheckpoint {
                lane: u32::try_from(r.get::<_, i32>(0)).unwrap_or_default(),
                lanes: u32::try_from(r.get::<_, i32>(1)).unwrap_or_default(),
                position: lsn.parse::<u128>().map_or(lsn, |lsn| {
                    Position {
                        sub,
                        ..Position::new(Lsn(lsn), ordinal)
                    }
                    .to_string()
                }),
                updated_at: r.get(5),
            });
        }
    }
    let fence = qualified(schema, FENCE_TABLE);
    if exists(client, &fence).await? {
        let sql = format!(
            "SELECT pid, host, to_char(started_at {UTC}\"Z\"'), \
             greatest(extract(epoch FROM clock_timestamp() - heartbeat_at), 0)::float8, \
             to_char(stopped_at {UTC}\"Z\"'), last_error FROM {fence} {OWNER}"
        );
        status.claim = client.query_opt(&sql, &owner).await?.map(|r| ClaimStatus {
            pid: u32::try_from(r.get::<_, i64>(0)).unwrap_or_default(),
            host: r.get(1),
            started_at: r.get(2),
            heartbeat_age_seconds: r.get(3),
            stopped_at: r.get(4),
            last_error: r.get(5),
        });
    }
    let dead = qualified(schema, &shared.options.dead_letter_table);
    if exists(client, &dead).await? {
        let sql = format!("SELECT count(*) FROM {dead} {OWNER}");
        let n: i64 = client.query_one(&sql, &owner).await?.get(0);
        status.dead_letters = u64::try_from(n).unwrap_or_default();
    }
    Ok(status)
}

async fn forget(client: &Client, shared: &Shared) -> Result<Forgotten, tokio_postgres::Error> {
    let schema = shared.checkpoint_schema();
    let mut forgotten = Forgotten::default();
    for table in OWN_TABLES {
        let name = qualified(schema, table);
        if !exists(client, &name).await? {
            continue;
        }
        forgotten.rows += client
            .execute(
                &format!("DELETE FROM {name} {OWNER}"),
                &[&shared.pipeline, &shared.options.name],
            )
            .await?;
        let others = client
            .query_opt(&format!("SELECT 1 FROM {name} LIMIT 1"), &[])
            .await?
            .is_some();
        if others {
            forgotten.kept_tables.push(table.to_owned());
        } else {
            client
                .batch_execute(&format!("DROP TABLE IF EXISTS {name}"))
                .await?;
            forgotten.dropped_tables.push(table.to_owned());
        }
    }
    Ok(forgotten)
}
