//! `pipeline status` and `pipeline drop` for a PostgreSQL source, over an ordinary SQL
//! connection (no preflight: they work while the pipeline runs, and after its tables are
//! gone).

use std::time::Duration;

use tokio_postgres::Client;

use super::setup::{self, OWNED_MARK};
use super::{PostgresSource, SourceError, quote_ident};
use crate::config;
use crate::source::lifecycle::{SourceDropped, SourceStatus};

/// How long `drop` waits for a walsender that is ending to let go of the slot.
const SLOT_PATIENCE: Duration = Duration::from_secs(5);

async fn connect(opts: &config::PostgresSource) -> Result<Client, SourceError> {
    // One try: an operator's command reports an unreachable server at once.
    setup::connect_sql(&PostgresSource::connect_params(opts), 0).await
}

/// Whether the publication exists, and whether its comment says Zipline created it.
async fn publication(client: &Client, name: &str) -> Result<(bool, bool), SourceError> {
    let row = client
        .query_opt(
            "SELECT coalesce(obj_description(oid, 'pg_publication'), '') FROM pg_publication \
             WHERE pubname = $1",
            &[&name],
        )
        .await
        .map_err(|e| setup::sql_error("reading pg_publication", &e))?;
    Ok(match row {
        Some(r) => (true, r.get::<_, String>(0).starts_with(OWNED_MARK)),
        None => (false, false),
    })
}

/// The slot and publication of `opts`, as the server reports them now.
pub async fn status(opts: &config::PostgresSource) -> Result<SourceStatus, SourceError> {
    let client = connect(opts).await?;
    let server = setup::current_wal_lsn(&client).await?;
    let slot = setup::find_slot(&client, &opts.slot_name, &opts.database).await?;
    let (publication_exists, publication_owned) = publication(&client, &opts.publication).await?;
    let mut status = SourceStatus {
        name: opts.name.clone(),
        kind: "postgres",
        slot: Some(opts.slot_name.clone()),
        server_lsn: Some(server.to_string()),
        publication: Some(opts.publication.clone()),
        publication_exists,
        publication_owned,
        ..SourceStatus::default()
    };
    if let Some(slot) = slot {
        let confirmed = slot
            .confirmed_flush
            .as_deref()
            .and_then(|l| l.parse::<crate::change::Lsn>().ok());
        status.slot_exists = true;
        status.active = slot.active_pid.is_some();
        status.active_pid = slot.active_pid;
        status.wal_status = slot.wal_status;
        status.retained_bytes = slot.retained_bytes;
        status.lag_bytes =
            confirmed.map(|c| i64::try_from(server.0.saturating_sub(c.0)).unwrap_or(i64::MAX));
        status.confirmed_lsn = slot.confirmed_flush;
    }
    Ok(status)
}

/// Drops the slot and, when Zipline created it, the publication. Refuses while a walsender
/// streams from the slot (the pipeline runs).
pub async fn drop_owned(opts: &config::PostgresSource) -> Result<SourceDropped, SourceError> {
    let client = connect(opts).await?;
    let mut dropped = SourceDropped::default();
    if let Some(slot) = setup::find_slot(&client, &opts.slot_name, &opts.database).await? {
        if let Some(pid) = slot.active_pid {
            return Err(SourceError::fatal(format!(
                "replication slot {} is active (walsender process {pid}): the pipeline is \
                 running; stop it (SIGTERM or Ctrl-C) and drop again",
                opts.slot_name
            )));
        }
        setup::drop_slot(&client, &opts.slot_name, SLOT_PATIENCE).await?;
        dropped.slot = Some(opts.slot_name.clone());
    }
    match publication(&client, &opts.publication).await? {
        (true, true) => {
            client
                .batch_execute(&format!(
                    "DROP PUBLICATION IF EXISTS {}",
                    quote_ident(&opts.publication)
                ))
                .await
                .map_err(|e| {
                    setup::sql_error(&format!("dropping publication {}", opts.publication), &e)
                })?;
            dropped.publication = Some(opts.publication.clone());
        }
        (true, false) => {
            dropped.kept = Some(format!(
                "publication {} was kept: Zipline did not create it (its comment does not say \
                 `{OWNED_MARK}`); drop it with DROP PUBLICATION if it is no longer needed",
                opts.publication
            ));
        }
        (false, _) => {}
    }
    Ok(dropped)
}
