//! The table records in PostgreSQL (see [`crate::checkpoint::tables`]), in the checkpoint
//! schema.

use tokio_postgres::Client;

use super::errors::sink_error;
use super::sql::qualified;
use super::{Shared, fence};
use crate::checkpoint::tables::{TABLES_TABLE, TableRecord};
use crate::sink::SinkError;

/// `CREATE TABLE IF NOT EXISTS` for the records in `schema`.
pub(super) fn create_table_sql(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\
         pipeline varchar(128) COLLATE \"C\" NOT NULL, \
         connector varchar(128) COLLATE \"C\" NOT NULL, \
         source_table text COLLATE \"C\" NOT NULL, relation bigint NOT NULL, \
         since_lsn numeric(39,0) NOT NULL, columns_json text NOT NULL, \
         sink_table_id text, updated_at timestamptz NOT NULL DEFAULT now(), \
         PRIMARY KEY (pipeline, connector, source_table))",
        qualified(schema, TABLES_TABLE)
    )
}

fn table(shared: &Shared) -> String {
    qualified(shared.checkpoint_schema(), TABLES_TABLE)
}

/// The sink table of source table `schema.name`, quoted.
fn sink_table(shared: &Shared, source_table: &str) -> String {
    let (schema, name) = source_table
        .split_once('.')
        .unwrap_or(("public", source_table));
    qualified(shared.options.schema.as_deref().unwrap_or(schema), name)
}

fn error(shared: &Shared, doing: &str, e: &tokio_postgres::Error) -> SinkError {
    sink_error(shared.sink(), &format!("{doing} in {}", table(shared)), e)
}

/// Every record of the pipeline in this sink.
pub(super) async fn load(client: &Client, shared: &Shared) -> Result<Vec<TableRecord>, SinkError> {
    let o = &shared.options;
    let rows = client
        .query(
            &format!(
                "SELECT source_table, relation, since_lsn::text, columns_json FROM {} \
                 WHERE pipeline = $1::text AND connector = $2::text",
                table(shared)
            ),
            &[&shared.pipeline, &o.name],
        )
        .await
        .map_err(|e| error(shared, "reading the table records", &e))?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            let relation = u32::try_from(r.get::<_, i64>(1)).ok()?;
            let since: u128 = r.get::<_, String>(2).parse().ok()?;
            TableRecord::from_stored(r.get(0), relation, since, r.get(3))
        })
        .collect())
}

/// Runs `sql` with `params` in a fenced transaction.
async fn fenced(
    client: &Client,
    shared: &Shared,
    doing: &str,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<(), SinkError> {
    let err = |e: tokio_postgres::Error| error(shared, doing, &e);
    client.batch_execute("BEGIN").await.map_err(err)?;
    let result = async {
        fence::check_in_tx(client, shared).await?;
        client.execute(sql, params).await.map_err(err)?;
        client.batch_execute("COMMIT").await.map_err(err)
    }
    .await;
    if result.is_err() {
        let _ = client.batch_execute("ROLLBACK").await;
    }
    result
}

/// Writes `record`, unless the sink has a later one of that table (fenced).
pub(super) async fn record(
    client: &Client,
    shared: &Shared,
    record: &TableRecord,
) -> Result<(), SinkError> {
    let o = &shared.options;
    let sql = format!(
        "INSERT INTO {} AS t (pipeline, connector, source_table, relation, since_lsn, \
         columns_json, sink_table_id, updated_at) VALUES ($1::text, $2::text, $3::text, \
         $4::int8, $5::text::numeric, $6::text, to_regclass($7::text)::oid::text, \
         clock_timestamp()) \
         ON CONFLICT (pipeline, connector, source_table) DO UPDATE SET \
         relation = EXCLUDED.relation, since_lsn = EXCLUDED.since_lsn, \
         columns_json = EXCLUDED.columns_json, sink_table_id = EXCLUDED.sink_table_id, \
         updated_at = EXCLUDED.updated_at \
         WHERE t.since_lsn <= EXCLUDED.since_lsn",
        table(shared)
    );
    let (name, relation, since, columns) = (
        record.name(),
        i64::from(record.relation),
        record.since.0.to_string(),
        record.columns_json(),
    );
    let target = sink_table(shared, &name);
    fenced(
        client,
        shared,
        "recording a table's shape",
        &sql,
        &[
            &shared.pipeline,
            &o.name,
            &name,
            &relation,
            &since,
            &columns,
            &target,
        ],
    )
    .await
}

/// Deletes the record of `table` (`schema.name`), or every record (`None`), fenced.
pub(super) async fn forget(
    client: &Client,
    shared: &Shared,
    table_name: Option<&str>,
) -> Result<(), SinkError> {
    let o = &shared.options;
    let sql = format!(
        "DELETE FROM {} WHERE pipeline = $1::text AND connector = $2::text \
         AND ($3::text IS NULL OR source_table = $3::text)",
        table(shared)
    );
    fenced(
        client,
        shared,
        "forgetting table records",
        &sql,
        &[&shared.pipeline, &o.name, &table_name],
    )
    .await
}

/// The source tables whose sink table was dropped and created again (another OID) since its
/// record was written and is empty now (see `SinkConnector::recreated_tables`); one that kept
/// rows gets its new identity recorded.
pub(super) async fn recreated_empty(
    client: &Client,
    shared: &Shared,
) -> Result<Vec<String>, SinkError> {
    let o = &shared.options;
    let err =
        |e: tokio_postgres::Error| error(shared, "comparing sink tables with their records", &e);
    let rows = client
        .query(
            &format!(
                "SELECT source_table, sink_table_id FROM {} WHERE pipeline = $1::text \
                 AND connector = $2::text AND sink_table_id IS NOT NULL",
                table(shared)
            ),
            &[&shared.pipeline, &o.name],
        )
        .await
        .map_err(err)?;
    let mut emptied = Vec::new();
    for row in rows {
        let (source_table, recorded): (String, String) = (row.get(0), row.get(1));
        let target = sink_table(shared, &source_table);
        let now: Option<String> = client
            .query_one("SELECT to_regclass($1::text)::oid::text", &[&target])
            .await
            .map_err(err)?
            .get(0);
        if now.as_deref() == Some(recorded.as_str()) {
            continue;
        }
        let has_rows = now.is_some()
            && client
                .query_opt(&format!("SELECT 1 FROM {target} LIMIT 1"), &[])
                .await
                .map_err(err)?
                .is_some();
        if has_rows {
            fenced(
                client,
                shared,
                "recording a sink table's identity",
                &format!(
                    "UPDATE {} SET sink_table_id = to_regclass($4::text)::oid::text \
                     WHERE pipeline = $1::text AND connector = $2::text \
                     AND source_table = $3::text",
                    table(shared)
                ),
                &[&shared.pipeline, &o.name, &source_table, &target],
            )
            .await?;
            tracing::info!(sink = shared.sink(), table = %source_table, "the sink table was created again since Zipline last recorded it and holds rows; going on");
        } else {
            emptied.push(source_table);
        }
    }
    Ok(emptied)
}
