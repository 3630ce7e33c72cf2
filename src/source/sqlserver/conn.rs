//! One TDS connection (tiberius over tokio), its TLS settings, and what its errors mean.
//!
//! Flow: TCP connect → PRELOGIN (encryption negotiated) → TLS handshake inside TDS packets
//! (rustls) when encryption is on → LOGIN7 with SQL Server authentication → `SESSION_SETUP`.
//! With `encrypt: true` the connection is encrypted end to end and fails if the server cannot
//! (`EncryptionLevel::Required`); `trust_server_certificate` skips certificate validation
//! (self-signed server certificates), otherwise the system roots validate it. With
//! `encrypt: false` nothing is encrypted, the login included (`NotSupported`): only for a
//! local server or a test double. See
//! <https://learn.microsoft.com/openspecs/windows_protocols/ms-tds/b46a581a-39de-4745-b076-ec4dbb7d13ec>.
//!
//! The password lives only inside tiberius' `Config`; this module's types never print it.

use tiberius::{AuthMethod, Client, ColumnData, Config, EncryptionLevel, Row};
use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

use super::lsn;
use super::sql;
use crate::change::Lsn;
use crate::config;
use crate::error::{Cause, ErrorClass};
use crate::source::SourceError;

/// A logged-in connection.
pub(crate) type Conn = Client<Compat<TcpStream>>;

/// Opens a connection and sets up the session, within the connect timeout.
pub(crate) async fn connect(opts: &config::SqlServerSource) -> Result<Conn, SourceError> {
    let attempt = async {
        let tcp = TcpStream::connect((opts.host.as_str(), opts.port))
            .await
            .map_err(|e| SourceError::transient(format!("{}: connecting: {e}", where_(opts))))?;
        tcp.set_nodelay(true).map_err(|e| {
            SourceError::transient(format!("{}: setting TCP_NODELAY: {e}", where_(opts)))
        })?;
        let mut conn = Client::connect(config(opts), tcp.compat_write())
            .await
            .map_err(|e| match &e {
                // Prelogin found no encryption both sides accept: retrying cannot help.
                tiberius::error::Error::Protocol(m) if m.contains("encryption") => {
                    SourceError::fatal(format!(
                        "{}: logging in: {e} (with `encrypt: true` the server must offer TLS; \
                         `encrypt: false` turns encryption off entirely, login included)",
                        where_(opts)
                    ))
                }
                _ => classify(opts, "logging in", &e),
            })?;
        conn.simple_query(sql::SESSION_SETUP)
            .await
            .map_err(|e| classify(opts, "setting up the session", &e))?
            .into_results()
            .await
            .map_err(|e| classify(opts, "setting up the session", &e))?;
        Ok(conn)
    };
    match tokio::time::timeout(opts.connect_timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err(SourceError::transient(format!(
            "{}: no answer within {:?}",
            where_(opts),
            opts.connect_timeout
        ))),
    }
}

/// Connects, retrying transient failures up to `connect_retries` times with backoff.
pub(crate) async fn connect_with_retries(
    opts: &config::SqlServerSource,
) -> Result<Conn, SourceError> {
    let mut backoff = crate::retry::Backoff::new(
        format!("{}: cannot reach SQL Server yet; retrying", opts.name),
        crate::retry::Budget::Retries(opts.connect_retries),
    );
    loop {
        match connect(opts).await {
            Ok(conn) => return Ok(conn),
            Err(e) if e.class == crate::error::ErrorClass::Transient => {
                if !backoff.wait(&e).await {
                    let message = format!(
                        "{} (gave up after {} attempts)",
                        e.message,
                        backoff.attempts() + 1
                    );
                    return Err(e.reworded(crate::error::ErrorClass::Fatal, message));
                }
            }
            Err(e) => return Err(e),
        }
    }
}

fn config(opts: &config::SqlServerSource) -> Config {
    let mut config = Config::new();
    config.host(&opts.host);
    config.port(opts.port);
    config.database(&opts.database);
    config.application_name("zipline");
    config.authentication(AuthMethod::sql_server(
        &opts.user,
        // The secret leaves its wrapper only here, into the driver's login.
        opts.password
            .as_ref()
            .map_or("", crate::config::Secret::expose),
    ));
    if opts.encrypt {
        config.encryption(EncryptionLevel::Required);
        if opts.trust_server_certificate {
            config.trust_cert();
        }
    } else {
        config.encryption(EncryptionLevel::NotSupported);
    }
    config.handshake_timeout(Some(opts.connect_timeout));
    config
}

fn where_(opts: &config::SqlServerSource) -> String {
    format!(
        "{} (SQL Server {}:{}, database {}, user {})",
        opts.name, opts.host, opts.port, opts.database, opts.user
    )
}

/// Runs one statement and collects its first result set.
pub(crate) async fn query(
    conn: &mut Conn,
    opts: &config::SqlServerSource,
    doing: &str,
    sql: &str,
) -> Result<Vec<Row>, SourceError> {
    let stream = conn
        .simple_query(sql)
        .await
        .map_err(|e| classify(opts, doing, &e))?;
    stream
        .into_first_result()
        .await
        .map_err(|e| classify(opts, doing, &e))
}

/// Runs statements that return nothing of interest.
pub(crate) async fn execute(
    conn: &mut Conn,
    opts: &config::SqlServerSource,
    doing: &str,
    sql: &str,
) -> Result<(), SourceError> {
    conn.simple_query(sql)
        .await
        .map_err(|e| classify(opts, doing, &e))?
        .into_results()
        .await
        .map_err(|e| classify(opts, doing, &e))?;
    Ok(())
}

/// What a driver error means for the source.
pub(crate) fn classify(
    opts: &config::SqlServerSource,
    doing: &str,
    e: &tiberius::error::Error,
) -> SourceError {
    let message = format!("{}: {doing}", where_(opts));
    let (class, hint) = match e {
        tiberius::error::Error::Io { .. } | tiberius::error::Error::Protocol(_) => {
            (ErrorClass::Transient, None)
        }
        tiberius::error::Error::Server(token) => match token.code() {
            // Deadlock victim, lock timeout, and Azure SQL's "try again" family.
            1205 | 1222 | 10928 | 10929 | 40197 | 40501 | 40613 | 49918 | 49919 | 49920 => {
                (ErrorClass::Transient, None)
            }
            18456 => (
                ErrorClass::Fatal,
                Some(
                    "check user and password; the password comes from `password` or \
                     `secret_refs`",
                ),
            ),
            229 | 230 | 262 | 297 | 300 | 916 => (
                ErrorClass::Fatal,
                Some(
                    "the user needs SELECT on the captured tables and on the cdc schema, e.g. \
                     membership in db_owner or in the capture instance's gating role",
                ),
            ),
            _ => (ErrorClass::Fatal, None),
        },
        _ => (ErrorClass::Fatal, None),
    };
    let error = match class {
        ErrorClass::Transient => SourceError::transient(message),
        _ => SourceError::fatal(message),
    };
    error.caused_by(Cause::sql_server(e).with_hint(hint))
}

/// Reads column `idx` as an integer (any integer width, or a bit).
pub(crate) fn int(row: &Row, idx: usize, what: &str) -> Result<Option<i64>, String> {
    match row
        .get_column_data(idx)
        .map_err(|e| format!("{what}: {e}"))?
    {
        ColumnData::U8(v) => Ok(v.map(i64::from)),
        ColumnData::I16(v) => Ok(v.map(i64::from)),
        ColumnData::I32(v) => Ok(v.map(i64::from)),
        ColumnData::I64(v) => Ok(*v),
        ColumnData::Bit(v) => Ok(v.map(i64::from)),
        other => Err(format!("{what}: expected an integer, found {other:?}")),
    }
}

/// Reads column `idx` as a string.
pub(crate) fn text(row: &Row, idx: usize, what: &str) -> Result<Option<String>, String> {
    match row
        .get_column_data(idx)
        .map_err(|e| format!("{what}: {e}"))?
    {
        ColumnData::String(v) => Ok(v.as_ref().map(|s| s.to_string())),
        other => Err(format!("{what}: expected a string, found {other:?}")),
    }
}

/// Reads column `idx` as bytes.
pub(crate) fn bytes<'r>(row: &'r Row, idx: usize, what: &str) -> Result<Option<&'r [u8]>, String> {
    match row
        .get_column_data(idx)
        .map_err(|e| format!("{what}: {e}"))?
    {
        ColumnData::Binary(v) => Ok(v.as_deref()),
        other => Err(format!("{what}: expected binary, found {other:?}")),
    }
}

/// Reads column `idx` as an LSN (`binary(10)`); NULL is `None`.
pub(crate) fn lsn_at(row: &Row, idx: usize, what: &str) -> Result<Option<Lsn>, String> {
    bytes(row, idx, what)?
        .map(|b| lsn::from_bytes(b).map_err(|e| format!("{what}: {e}")))
        .transpose()
}

/// A source error for a result that does not have the expected shape.
pub(crate) fn bad_result(opts: &config::SqlServerSource, doing: &str, e: String) -> SourceError {
    SourceError::fatal(format!("{}: {doing}: unexpected result: {e}", where_(opts)))
}
