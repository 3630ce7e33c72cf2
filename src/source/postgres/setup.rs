//! Preflight and ownership of the publication and slot, over an ordinary SQL connection.
//!
//! Order matters: everything that can fail on the user's setup (reachability, credentials,
//! `wal_level`, tables and their keys) is checked first, read-only; only then does Zipline
//! create the publication and the slot, so a bad config never leaves a slot behind holding WAL.
//! Catalog queries: <https://www.postgresql.org/docs/15/catalogs.html>.

use std::sync::Arc;

use crate::error::Cause;
use crate::retry::{Backoff, Budget};
use tokio_postgres::Client;

use super::conn::ConnectParams;
use super::{SourceError, quote_ident, quote_literal};
use crate::change::{Column, Table};

/// An open SQL connection whose driver task ends with the client.
pub(crate) async fn connect_sql(
    params: &ConnectParams,
    retries: u32,
) -> Result<Client, SourceError> {
    connect_sql_with(params, retries, None).await
}

/// [`connect_sql`] with session settings (`-c name=value …`, the `options` startup parameter).
pub(crate) async fn connect_sql_with(
    params: &ConnectParams,
    retries: u32,
    options: Option<&str>,
) -> Result<Client, SourceError> {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(&params.host)
        .port(params.port)
        .user(&params.user)
        .dbname(&params.database)
        .application_name("zipline")
        .connect_timeout(params.connect_timeout);
    if let Some(options) = options {
        cfg.options(options);
    }
    if let Some(pw) = &params.password {
        // The secret leaves its wrapper here, into the driver's connection settings.
        cfg.password(pw.expose());
    }
    let (mode, tls) = crate::tls::postgres::for_driver(&params.host, &params.tls)
        .map_err(|e| connect_error(params, &ConnectFailure::Tls(e), 1, false))?;
    cfg.ssl_mode(mode);
    let mut backoff = Backoff::new(
        format!(
            "cannot reach PostgreSQL at {}:{} yet; retrying",
            params.host, params.port
        ),
        Budget::Retries(retries),
    );
    loop {
        // tokio-postgres's connect_timeout covers the TCP connect only; a server that accepts
        // and then never answers the startup handshake must time out too.
        let connected =
            match tokio::time::timeout(params.connect_timeout, cfg.connect(tls.clone())).await {
                Ok(result) => result.map_err(ConnectFailure::Driver),
                Err(_) => Err(ConnectFailure::Silent),
            };
        match connected {
            Ok((client, connection)) => {
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!(error = %e, "source SQL connection closed");
                    }
                });
                return Ok(client);
            }
            Err(e) => {
                let db_error = matches!(&e, ConnectFailure::Driver(d) if d.as_db_error().is_some())
                    || e.is_tls();
                if db_error
                    || !backoff
                        .wait(&*Box::<dyn std::error::Error + Send + Sync>::from(
                            e.reason(params),
                        ))
                        .await
                {
                    return Err(connect_error(params, &e, backoff.attempts() + 1, db_error));
                }
            }
        }
    }
}

/// Why a connection attempt failed.
enum ConnectFailure {
    Driver(tokio_postgres::Error),
    /// No answer to the startup handshake within `connect_timeout`.
    Silent,
    /// The TLS settings cannot be used (a file, a name).
    Tls(crate::tls::TlsError),
}

impl ConnectFailure {
    /// The cause, with the driver's whole chain (each cause once).
    fn reason(&self, params: &ConnectParams) -> String {
        match self {
            ConnectFailure::Silent => format!(
                "the server accepted the connection but did not complete the startup \
                 handshake within {:?} (connect_timeout)",
                params.connect_timeout
            ),
            ConnectFailure::Tls(e) => e.to_string(),
            ConnectFailure::Driver(e) => {
                if let Some(db) = e.as_db_error() {
                    return db.message().to_owned();
                }
                let mode = crate::tls::mode_name(params.tls.mode, false);
                if let Some(problem) = crate::tls::tls_problem(e) {
                    return format!("TLS ({mode}): {problem}");
                }
                // tokio-postgres says so in an untyped cause.
                if std::error::Error::source(e)
                    .is_some_and(|c| c.to_string() == "server does not support TLS")
                {
                    return format!("the server does not support TLS, and {mode} requires it");
                }
                Cause::postgres(e).text
            }
        }
    }
}

impl ConnectFailure {
    /// A TLS failure: a refused certificate or a server without TLS is no reason to retry.
    fn is_tls(&self) -> bool {
        match self {
            ConnectFailure::Tls(_) => true,
            ConnectFailure::Driver(e) => {
                // tokio-postgres's kind for every TLS failure, including "server does not
                // support TLS" (which carries no typed cause).
                // A handshake cut by a reset or an early end is a broken connection: retried.
                crate::tls::tls_problem(e).is_some()
                    || e.to_string().contains("server does not support TLS")
            }
            ConnectFailure::Silent => false,
        }
    }
}

fn connect_error(
    params: &ConnectParams,
    e: &ConnectFailure,
    attempts: u32,
    db_error: bool,
) -> SourceError {
    let reason = e.reason(params);
    let where_ = format!(
        "PostgreSQL at {}:{} (database {}, user {})",
        params.host, params.port, params.database, params.user
    );
    if e.is_tls() {
        SourceError::fatal(format!("cannot connect securely to {where_}: {reason}"))
    } else if db_error {
        SourceError::fatal(format!("cannot log in to {where_}: {reason}"))
    } else {
        SourceError::fatal(format!(
            "cannot reach {where_} after {attempts} attempts: {reason}; check host, port and that the server is running"
        ))
    }
}

/// `server_version_num`, e.g. 150004.
pub(crate) async fn server_version(client: &Client) -> Result<i32, SourceError> {
    let text: String = client
        .query_one("SHOW server_version_num", &[])
        .await
        .map_err(|e| sql_error("reading server_version_num", &e))?
        .get(0);
    text.parse()
        .map_err(|_| SourceError::fatal(format!("unexpected server_version_num {text:?}")))
}

/// Stop unless the server decodes logical WAL.
pub(crate) async fn check_wal_level(client: &Client) -> Result<(), SourceError> {
    let level: String = client
        .query_one("SHOW wal_level", &[])
        .await
        .map_err(|e| sql_error("reading wal_level", &e))?
        .get(0);
    if level != "logical" {
        return Err(SourceError::fatal(format!(
            "PostgreSQL has wal_level={level}, but logical replication needs wal_level=logical; \
             run `ALTER SYSTEM SET wal_level = logical;` as a superuser and restart PostgreSQL \
             (or set wal_level = logical in postgresql.conf)"
        )));
    }
    Ok(())
}

/// The tables the pipeline replicates, with their shapes, checked for usable keys.
///
/// `configured`: `schema.table` or `table` (meaning `public.table`); `None` means the tables
/// the existing publication covers, or every user table when the publication does not exist.
pub(crate) async fn resolve_tables(
    client: &Client,
    publication: &str,
    configured: Option<&[String]>,
) -> Result<Vec<(Arc<Table>, u32)>, SourceError> {
    let names: Vec<(String, String)> = match configured {
        Some(list) => list.iter().map(|t| split_table_name(t)).collect(),
        None => {
            let exists = publication_exists(client, publication).await?;
            let sql = if exists {
                "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1, 2"
            } else {
                "SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
                 AND n.nspname NOT LIKE 'pg_toast%' AND n.nspname NOT LIKE 'pg_temp%' AND $1::text IS NOT NULL ORDER BY 1, 2"
            };
            client
                .query(sql, &[&publication])
                .await
                .map_err(|e| sql_error("listing published tables", &e))?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect()
        }
    };
    let mut tables = Vec::with_capacity(names.len());
    for (schema, name) in names {
        let (table, oid) = describe_table(client, &schema, &name).await?;
        tables.push((Arc::new(table), oid));
    }
    Ok(tables)
}

fn split_table_name(name: &str) -> (String, String) {
    match name.split_once('.') {
        Some((s, t)) => (s.to_owned(), t.to_owned()),
        None => ("public".to_owned(), name.to_owned()),
    }
}

/// The table's shape and relation id (OID).
async fn describe_table(
    client: &Client,
    schema: &str,
    name: &str,
) -> Result<(Table, u32), SourceError> {
    let qualified = format!("{schema}.{name}");
    let rel = client
        .query_opt(
            "SELECT c.oid, c.relreplident::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
            &[&schema, &name],
        )
        .await
        .map_err(|e| sql_error("reading pg_class", &e))?
        .ok_or_else(|| SourceError::fatal(format!("table {qualified} does not exist on the source")))?;
    let oid: u32 = rel.get(0);
    let identity: String = rel.get(1);
    // The key Zipline routes, upserts and deletes by: the primary key under REPLICA IDENTITY
    // DEFAULT, the chosen index under USING INDEX. Under FULL, pgoutput flags every column as
    // key, which a sink cannot upsert by; the table's own key is used instead (see
    // `identity_key_filter`). NOTHING sends no old values at all, so deletes could not be
    // applied.
    let key_index_filter = match identity.as_str() {
        "d" => "i.indisprimary".to_owned(),
        "i" => "i.indisreplident".to_owned(),
        "f" => identity_key_filter(client, oid, &qualified).await?,
        _ => {
            return Err(SourceError::fatal(format!(
                "table {qualified} has REPLICA IDENTITY NOTHING, so its updates and deletes carry \
                 no key: Zipline cannot apply them; give it a primary key and run ALTER TABLE \
                 {qualified} REPLICA IDENTITY DEFAULT (or USING INDEX <unique index on NOT NULL \
                 columns>)"
            )));
        }
    };
    let sql = format!(
        "SELECT a.attname::text, a.atttypid, a.atttypmod, \
                EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid AND {key_index_filter} AND a.attnum = ANY(i.indkey)) \
         FROM pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' \
         ORDER BY a.attnum"
    );
    let rows = client
        .query(&sql, &[&oid])
        .await
        .map_err(|e| sql_error("reading pg_attribute", &e))?;
    let columns: Vec<Column> = rows
        .iter()
        .map(|r| Column {
            name: r.get(0),
            type_oid: r.get(1),
            type_modifier: r.get(2),
            is_key: r.get(3),
        })
        .collect();
    refuse_unsupported_types(client, oid, &qualified).await?;
    if !columns.iter().any(|c| c.is_key) {
        return Err(SourceError::fatal(format!(
            "table {qualified} has no primary key: Zipline routes and applies rows by key; add one \
             (ALTER TABLE {qualified} ADD PRIMARY KEY (...)) or point REPLICA IDENTITY USING INDEX at a unique index \
             on NOT NULL columns"
        )));
    }
    Ok((Table::new(schema.to_owned(), name.to_owned(), columns), oid))
}

/// Fails naming every column whose type cannot round-trip through a sink: composite (row)
/// types and pseudo-types, also inside domains and arrays (resolved down to the element).
/// Everything else travels as a typed value or as PostgreSQL's text (see `docs/types.md`).
async fn refuse_unsupported_types(
    client: &Client,
    oid: u32,
    qualified: &str,
) -> Result<(), SourceError> {
    let rows = client
        .query(
            "WITH RECURSIVE t(col, typ, shown, depth) AS ( \
               SELECT a.attname::text, a.atttypid, format_type(a.atttypid, a.atttypmod), 0 \
               FROM pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
             UNION ALL \
               SELECT t.col, CASE WHEN ty.typtype = 'd' THEN ty.typbasetype ELSE ty.typelem END, \
                      t.shown, t.depth + 1 \
               FROM t JOIN pg_type ty ON ty.oid = t.typ \
               WHERE t.depth < 16 AND (ty.typtype = 'd' OR (ty.typcategory = 'A' AND ty.typelem <> 0))) \
             SELECT t.col, t.shown, format_type(ty.oid, NULL), ty.typtype::text \
             FROM t JOIN pg_type ty ON ty.oid = t.typ WHERE ty.typtype IN ('c', 'p') \
             ORDER BY t.col",
            &[&oid],
        )
        .await
        .map_err(|e| sql_error("reading the column types from pg_type", &e))?;
    if rows.is_empty() {
        return Ok(());
    }
    let problems: Vec<String> = rows
        .iter()
        .map(|r| {
            let (column, shown, inner, typtype): (String, String, String, String) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let kind = if typtype == "c" {
                "composite"
            } else {
                "pseudo"
            };
            if shown == inner {
                format!("{qualified}.{column} has {kind} type {shown}")
            } else {
                format!("{qualified}.{column} has type {shown}, built on {kind} type {inner}")
            }
        })
        .collect();
    Err(SourceError::fatal(format!(
        "unsupported column types: {}; Zipline cannot replicate composite or pseudo types. \
         Change the column to a supported type (e.g. ALTER TABLE ... ALTER COLUMN ... TYPE \
         jsonb USING to_jsonb(column)), or remove the table from the publication",
        problems.join("; ")
    )))
}

/// For a REPLICA IDENTITY FULL table: the filter on `pg_index i` that picks its key, the
/// primary key or else the first unique index (by OID) that can identify a row: on plain NOT
/// NULL columns, not partial, not deferrable, valid (what USING INDEX itself requires).
async fn identity_key_filter(
    client: &Client,
    oid: u32,
    qualified: &str,
) -> Result<String, SourceError> {
    let index: Option<u32> = client
        .query_opt(
            "SELECT i.indexrelid FROM pg_index i \
             WHERE i.indrelid = $1 AND i.indisunique AND i.indimmediate AND i.indisvalid \
               AND i.indpred IS NULL AND i.indexprs IS NULL \
               AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = i.indrelid \
                               AND a.attnum = ANY(i.indkey) AND NOT a.attnotnull) \
             ORDER BY i.indisprimary DESC, i.indexrelid LIMIT 1",
            &[&oid],
        )
        .await
        .map_err(|e| sql_error("reading pg_index", &e))?
        .map(|r| r.get(0));
    match index {
        Some(index) => Ok(format!("i.indexrelid = {index}")),
        None => Err(SourceError::fatal(format!(
            "table {qualified} has REPLICA IDENTITY FULL but no primary key and no unique index on \
             NOT NULL columns: Zipline routes, upserts and deletes rows by key, and every column \
             together is no key a sink can upsert by; add a primary key (ALTER TABLE {qualified} \
             ADD PRIMARY KEY (...)), or a unique index on NOT NULL columns"
        ))),
    }
}

pub(crate) async fn publication_exists(
    client: &Client,
    publication: &str,
) -> Result<bool, SourceError> {
    Ok(client
        .query_opt(
            "SELECT 1 FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(|e| sql_error("reading pg_publication", &e))?
        .is_some())
}

/// Create the publication when absent; when Zipline was told which tables to publish, make
/// an existing publication cover exactly those.
pub(crate) async fn ensure_publication(
    client: &Client,
    publication: &str,
    slot: &str,
    configured: Option<&[String]>,
    tables: &[Arc<Table>],
) -> Result<(), SourceError> {
    let list = || {
        tables
            .iter()
            .map(|t| format!("{}.{}", quote_ident(&t.schema), quote_ident(&t.name)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let exists = publication_exists(client, publication).await?;
    let sql = match (exists, configured) {
        (false, Some(_)) => format!(
            "CREATE PUBLICATION {} FOR TABLE {}",
            quote_ident(publication),
            list()
        ),
        (false, None) => format!(
            "CREATE PUBLICATION {} FOR ALL TABLES",
            quote_ident(publication)
        ),
        (true, Some(_)) => format!(
            "ALTER PUBLICATION {} SET TABLE {}",
            quote_ident(publication),
            list()
        ),
        (true, None) => return Ok(()),
    };
    tracing::info!(publication, statement = %sql, "configuring publication");
    // Marked when created, so `pipeline drop` removes only a publication Zipline made.
    let sql = if exists {
        sql
    } else {
        format!(
            "{sql}; COMMENT ON PUBLICATION {} IS {}",
            quote_ident(publication),
            quote_literal(&format!("{OWNED_MARK} for replication slot {slot}"))
        )
    };
    client
        .batch_execute(&sql)
        .await
        .map_err(|e| sql_error(&format!("configuring publication {publication}"), &e))
}

/// How the comment of a publication Zipline created begins.
pub(crate) const OWNED_MARK: &str = "created by zipline";

/// What we know of an existing slot.
#[derive(Debug, Clone)]
pub(crate) struct SlotInfo {
    pub confirmed_flush: Option<String>,
    /// `reserved`, `extended`, `unreserved` or `lost` (PostgreSQL 13+).
    pub wal_status: Option<String>,
    /// The walsender streaming from it, if any.
    pub active_pid: Option<i32>,
    /// WAL the slot keeps the server from recycling, in bytes.
    pub retained_bytes: Option<i64>,
}

impl SlotInfo {
    /// Why the slot cannot be streamed from, if it cannot.
    pub(crate) fn unusable(&self, slot: &str) -> Option<String> {
        match self.wal_status.as_deref() {
            Some("lost") => Some(format!(
                "replication slot {slot} was invalidated by PostgreSQL (wal_status = 'lost': the \
                 WAL it still needed was removed, e.g. because it retained more than \
                 max_slot_wal_keep_size); the changes made since its confirmed position {} are \
                 gone from the source",
                self.confirmed_flush.as_deref().unwrap_or("(none)")
            )),
            _ => None,
        }
    }
}

/// The slot's state, or `None` when absent; an incompatible slot of that name is an error.
pub(crate) async fn find_slot(
    client: &Client,
    slot: &str,
    database: &str,
) -> Result<Option<SlotInfo>, SourceError> {
    let row = client
        .query_opt(
            "SELECT slot_type, plugin::text, database::text, confirmed_flush_lsn::text, \
                    wal_status, active_pid, \
                    (pg_current_wal_lsn() - restart_lsn)::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| sql_error("reading pg_replication_slots", &e))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let slot_type: String = row.get(0);
    let plugin: Option<String> = row.get(1);
    let db: Option<String> = row.get(2);
    if slot_type != "logical"
        || plugin.as_deref() != Some("pgoutput")
        || db.as_deref() != Some(database)
    {
        return Err(SourceError::fatal(format!(
            "replication slot {slot} exists but is not a pgoutput logical slot of database {database} \
             (type {slot_type}, plugin {}, database {}); choose another slot_name or drop it with \
             SELECT pg_drop_replication_slot({})",
            plugin.as_deref().unwrap_or("none"),
            db.as_deref().unwrap_or("none"),
            quote_literal(slot)
        )));
    }
    Ok(Some(SlotInfo {
        confirmed_flush: row.get(3),
        wal_status: row.get(4),
        active_pid: row.get(5),
        retained_bytes: row.get(6),
    }))
}

/// Drops the slot, waiting (up to `patience`) for a walsender of an earlier instance that
/// still streams from it to end.
pub(crate) async fn drop_slot(
    client: &Client,
    slot: &str,
    patience: std::time::Duration,
) -> Result<(), SourceError> {
    let mut backoff = Backoff::new(
        format!(
            "replication slot {slot} is still in use by a walsender of an earlier \
             connection; waiting for it to end (wal_sender_timeout)"
        ),
        Budget::For(patience),
    );
    loop {
        match client
            .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
            .await
        {
            Ok(_) => return Ok(()),
            Err(e)
                if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_IN_USE)
                    && backoff.wait(&e).await => {}
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_OBJECT) => {
                return Ok(());
            }
            Err(e) => return Err(sql_error(&format!("dropping replication slot {slot}"), &e)),
        }
    }
}

/// The server's current WAL write position.
pub(crate) async fn current_wal_lsn(client: &Client) -> Result<crate::change::Lsn, SourceError> {
    let text: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .map_err(|e| sql_error("reading pg_current_wal_lsn()", &e))?
        .get(0);
    text.parse()
        .map_err(|e| SourceError::fatal(format!("pg_current_wal_lsn(): {e}")))
}

/// The tables in `publication` now, by `schema.name`, with their relation ids.
pub(crate) async fn published(
    client: &Client,
    publication: &str,
) -> Result<Vec<(String, u32)>, tokio_postgres::Error> {
    Ok(client
        .query(
            "SELECT schemaname || '.' || tablename,                     (quote_ident(schemaname) || '.' || quote_ident(tablename))::regclass::oid              FROM pg_publication_tables WHERE pubname = $1",
            &[&publication],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// `wal_sender_timeout` (`None`: 0, disabled).
pub(crate) async fn wal_sender_timeout(
    client: &Client,
) -> Result<Option<std::time::Duration>, SourceError> {
    let ms: i64 = client
        .query_one(
            "SELECT setting::int8 FROM pg_settings WHERE name = 'wal_sender_timeout'",
            &[],
        )
        .await
        .map_err(|e| sql_error("reading wal_sender_timeout", &e))?
        .get(0);
    Ok((ms > 0).then(|| std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
}

/// Render a tokio-postgres error with the server's message, for a source error.
pub(crate) fn sql_error(doing: &str, e: &tokio_postgres::Error) -> SourceError {
    let error = match e.as_db_error() {
        Some(_) => SourceError::fatal(doing),
        None => SourceError::transient(doing),
    };
    error.caused_by(Cause::postgres(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_default_to_public() {
        assert_eq!(
            split_table_name("orders"),
            ("public".into(), "orders".into())
        );
        assert_eq!(
            split_table_name("shop.orders"),
            ("shop".into(), "orders".into())
        );
    }
}
