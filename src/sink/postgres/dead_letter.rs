//! The dead-letter table in PostgreSQL (`on_error: dead_letter`; see `crate::lane::settle`
//! and, for the layout, the MySQL sink's `dead_letter.rs`): one row per dead-lettered change,
//! unique by position, written in the batch's own transaction.

use tokio_postgres::Client;
use tokio_postgres::types::ToSql;

use super::Shared;
use super::sql::qualified;
use crate::change::Position;
use crate::lane::key_hash;
use crate::sink::{DeadLetter, DeadLetterRecord, ParkedKey};
use crate::transform::json::{change_to_json, key_to_json};

/// `CREATE TABLE IF NOT EXISTS` for the dead-letter table `table` in `schema`.
pub(super) fn create_table_sql(schema: &str, table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, \
         pipeline varchar(128) COLLATE \"C\" NOT NULL, \
         connector varchar(128) COLLATE \"C\" NOT NULL, lsn numeric(39,0) NOT NULL, \
         ordinal bigint NOT NULL, sub bigint NOT NULL, position text NOT NULL, \
         source_table text NOT NULL, op text NOT NULL, key_json text NOT NULL, \
         key_hash numeric(20,0) NOT NULL, code text, reason text NOT NULL, \
         change_json text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), \
         UNIQUE (pipeline, connector, lsn, ordinal, sub))",
        qualified(schema, table)
    )
}

/// The insert of dead letters, idempotent by position; parameters from [`InsertParams`].
pub(super) fn insert_sql(schema: &str, table: &str) -> String {
    format!(
        "INSERT INTO {} (pipeline, connector, lsn, ordinal, sub, position, source_table, op, \
         key_json, key_hash, code, reason, change_json) SELECT $1::text, $2::text, \
         u.l::numeric, u.o, u.s, u.p, u.t, u.op, u.k, u.h::numeric, u.c, u.r, u.j FROM \
         unnest($3::text[], $4::int8[], $5::int8[], $6::text[], $7::text[], $8::text[], \
         $9::text[], $10::text[], $11::text[], $12::text[], $13::text[]) \
         AS u(l, o, s, p, t, op, k, h, c, r, j) \
         ON CONFLICT (pipeline, connector, lsn, ordinal, sub) DO UPDATE SET \
         code = EXCLUDED.code, reason = EXCLUDED.reason",
        qualified(schema, table)
    )
}

/// Owned parameters of [`insert_sql`].
pub(super) struct InsertParams {
    pipeline: String,
    connector: String,
    lsn: Vec<String>,
    ordinal: Vec<i64>,
    sub: Vec<i64>,
    position: Vec<String>,
    table: Vec<String>,
    op: Vec<&'static str>,
    key: Vec<String>,
    hash: Vec<String>,
    code: Vec<Option<String>>,
    reason: Vec<String>,
    change: Vec<String>,
}

impl InsertParams {
    pub(super) fn new(shared: &Shared, dead: &[DeadLetter]) -> Self {
        let o = &shared.options;
        let mut p = InsertParams {
            pipeline: shared.pipeline.clone(),
            connector: o.name.clone(),
            lsn: Vec::new(),
            ordinal: Vec::new(),
            sub: Vec::new(),
            position: Vec::new(),
            table: Vec::new(),
            op: Vec::new(),
            key: Vec::new(),
            hash: Vec::new(),
            code: Vec::new(),
            reason: Vec::new(),
            change: Vec::new(),
        };
        for d in dead {
            let c = &d.change;
            p.lsn.push(c.position.lsn.0.to_string());
            p.ordinal.push(i64::from(c.position.ordinal));
            p.sub.push(i64::from(c.position.sub));
            p.position.push(c.position.to_string());
            p.table.push(c.table.qualified_name());
            p.op.push(c.op.as_str());
            p.key.push(key_to_json(&c.key));
            p.hash
                .push(key_hash(&c.table.schema, &c.table.name, &c.key).to_string());
            p.code.push(d.code.clone());
            p.reason.push(d.reason.clone());
            p.change.push(change_to_json(c).to_string());
        }
        p
    }

    pub(super) fn as_params(&self) -> [&(dyn ToSql + Sync); 13] {
        [
            &self.pipeline,
            &self.connector,
            &self.lsn,
            &self.ordinal,
            &self.sub,
            &self.position,
            &self.table,
            &self.op,
            &self.key,
            &self.hash,
            &self.code,
            &self.reason,
            &self.change,
        ]
    }
}

/// The delete of the dead letters of table `$3` below position (`$4` LSN text, `$5` ordinal,
/// `$6` sub): a truncate of the table supersedes them.
pub(super) fn forget_sql(schema: &str, table: &str) -> String {
    format!(
        "DELETE FROM {} WHERE pipeline = $1::text AND connector = $2::text AND \
         source_table = $3::text AND (lsn, ordinal, sub) < ($4::text::numeric, $5::int8, $6::int8)",
        qualified(schema, table)
    )
}

/// Owned parameters of [`forget_sql`].
pub(super) struct ForgetParams(String, String, String, String, i64, i64);

impl ForgetParams {
    pub(super) fn new(shared: &Shared, source_table: &str, position: Position) -> Self {
        let o = &shared.options;
        ForgetParams(
            shared.pipeline.clone(),
            o.name.clone(),
            source_table.to_owned(),
            position.lsn.0.to_string(),
            i64::from(position.ordinal),
            i64::from(position.sub),
        )
    }

    pub(super) fn as_params(&self) -> [&(dyn ToSql + Sync); 6] {
        [&self.0, &self.1, &self.2, &self.3, &self.4, &self.5]
    }
}

/// The delete of replayed records `$3` (int8[]).
pub(super) fn remove_sql(schema: &str, table: &str) -> String {
    format!(
        "DELETE FROM {} WHERE pipeline = $1::text AND connector = $2::text AND id = ANY($3::int8[])",
        qualified(schema, table)
    )
}

async fn exists(client: &Client, schema: &str, table: &str) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT to_regclass($1::text) IS NOT NULL",
            &[&qualified(schema, table)],
        )
        .await?
        .get(0))
}

/// The parked keys of lane `lane` of `lanes`: those of its dead letters. `None` when the
/// table does not exist.
pub(super) async fn parked(
    client: &Client,
    shared: &Shared,
    lane: u32,
    lanes: u32,
) -> Result<Option<Vec<ParkedKey>>, tokio_postgres::Error> {
    let (schema, table) = (
        shared.checkpoint_schema(),
        &shared.options.dead_letter_table,
    );
    if !exists(client, schema, table).await? {
        return Ok(None);
    }
    let o = &shared.options;
    let rows = client
        .query(
            &format!(
                "SELECT DISTINCT source_table, key_json FROM {} WHERE pipeline = $1::text AND \
                 connector = $2::text AND key_hash % $3::int8 = $4::int8",
                qualified(schema, table)
            ),
            &[
                &shared.pipeline,
                &o.name,
                &i64::from(lanes.max(1)),
                &i64::from(lane),
            ],
        )
        .await?;
    Ok(Some(
        rows.iter()
            .map(|r| ParkedKey {
                table: r.get(0),
                key: r.get(1),
            })
            .collect(),
    ))
}

/// Every dead letter of the pipeline in this sink, oldest position first.
pub(super) async fn list(
    client: &Client,
    shared: &Shared,
) -> Result<Vec<DeadLetterRecord>, tokio_postgres::Error> {
    let (schema, table) = (
        shared.checkpoint_schema(),
        &shared.options.dead_letter_table,
    );
    if !exists(client, schema, table).await? {
        return Ok(Vec::new());
    }
    let o = &shared.options;
    let rows = client
        .query(
            &format!(
                "SELECT id, position, source_table, op, key_json, code, reason, \
                 to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'), change_json \
                 FROM {} WHERE pipeline = $1::text AND connector = $2::text \
                 ORDER BY lsn, ordinal, sub",
                qualified(schema, table)
            ),
            &[&shared.pipeline, &o.name],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| DeadLetterRecord {
            id: u64::try_from(r.get::<_, i64>(0)).unwrap_or_default(),
            position: r.get(1),
            table: r.get(2),
            op: r.get(3),
            key: r.get(4),
            code: r.get(5),
            reason: r.get(6),
            created_at: r.get(7),
            change: r.get(8),
        })
        .collect())
}
