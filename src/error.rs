//! Error classes shared by every component (what the runtime does next), and the driver
//! cause under a connector's error.
//!
//! Every error type here prints its own context only (`sink out: upserting 3 rows into
//! shop.orders (row key (12))`) and carries what went wrong underneath as its
//! [`std::error::Error::source`], so a chain printed link by link (`{:#}` at the CLI,
//! [`report`] in logs) says each cause exactly once.

use std::error::Error;
use std::fmt;

/// What the runtime does next with an error.
///
/// `Definite` and `Fatal` differ at run time: a definite error is about one piece of data
/// (a row a sink refuses, a change a transform fails on), and the owner's `on_error` policy
/// decides (`halt`, `skip`, `dead_letter`); a fatal one stops the pipeline whatever the
/// policy says. Sources have no per-row policy, so they only report `Transient` or `Fatal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Retry the same work with backoff (connection loss, deadlock, lock wait timeout,
    /// a replication slot still held by a dying walsender).
    Transient,
    /// The work itself is bad (a row, a table): the `on_error` policy applies; retrying
    /// cannot help.
    Definite,
    /// Stop the pipeline and tell the operator what to change (bad credentials,
    /// `wal_level` not logical, a missing table).
    Fatal,
}

/// Implemented by every error type that can reach the run loop.
pub trait Classify {
    /// How the runtime must react to this error.
    fn class(&self) -> ErrorClass;
}

/// The system a [`Cause`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    /// A PostgreSQL server or its client library.
    Postgres,
    /// A MySQL or MariaDB server or its client library.
    MySql,
    /// A SQL Server or its client library.
    SqlServer,
    /// The operating system (files, sockets).
    Io,
}

/// What a driver or the operating system reported under a connector's error, captured as
/// data (the server's code, its message, a hint) rather than as the driver's own error
/// value, so errors can cross a process boundary (a later transport carries lanes between
/// machines) and print the server's words once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text}{}", hint.map(|h| format!("; {h}")).unwrap_or_default())]
pub struct Cause {
    /// Where it came from.
    pub system: System,
    /// The server's error code: a SQLSTATE, a MySQL or SQL Server error number.
    pub code: Option<String>,
    /// What was reported, with the code and detail (`PostgreSQL error 23505: duplicate key
    /// value violates unique constraint "t_pkey" (Key (id)=(1) already exists.)`).
    pub text: String,
    /// What the operator can do about it, where something specific helps.
    pub hint: Option<&'static str>,
}

impl Cause {
    /// A tokio-postgres error: the server's SQLSTATE, message, column and detail, or the
    /// client's error with its own cause (an I/O error, a TLS failure).
    pub fn postgres(err: &tokio_postgres::Error) -> Self {
        let text = match err.as_db_error() {
            Some(db) => {
                let mut out = format!("PostgreSQL error {}: {}", db.code().code(), db.message());
                if let Some(column) = db.column() {
                    out.push_str(&format!(" (column \"{column}\")"));
                }
                if let Some(detail) = db.detail() {
                    out.push_str(&format!(" ({detail})"));
                }
                out
            }
            None => with_sources(err),
        };
        Cause {
            system: System::Postgres,
            code: err.code().map(|c| c.code().to_owned()),
            text,
            hint: None,
        }
    }

    /// A mysql_async error: the server's error number, SQLSTATE and message, or the
    /// client's connection, driver or option error.
    pub fn mysql(err: &mysql_async::Error) -> Self {
        use mysql_async::Error;
        let (code, text) = match err {
            Error::Server(e) => (
                Some(e.code.to_string()),
                format!("MySQL error {} ({}): {}", e.code, e.state, e.message),
            ),
            Error::Io(e) => (None, format!("connection error: {e}")),
            Error::Driver(e) => (None, format!("driver error: {e}")),
            Error::Other(e) => (None, format!("error: {e}")),
            Error::Url(e) => (None, format!("connection options: {e}")),
        };
        Cause {
            system: System::MySql,
            code,
            text,
            hint: None,
        }
    }

    /// A tiberius (SQL Server) error: the server's error number and message, or the
    /// client's.
    pub fn sql_server(err: &tiberius::error::Error) -> Self {
        let code = match err {
            tiberius::error::Error::Server(token) => Some(token.code().to_string()),
            _ => None,
        };
        Cause {
            system: System::SqlServer,
            code,
            text: err.to_string(),
            hint: None,
        }
    }

    /// An operating-system error (a file, a socket).
    pub fn io(err: &std::io::Error) -> Self {
        Cause {
            system: System::Io,
            code: err.raw_os_error().map(|c| c.to_string()),
            text: err.to_string(),
            hint: None,
        }
    }

    /// The same cause with `hint` said after it.
    pub fn with_hint(mut self, hint: Option<&'static str>) -> Self {
        self.hint = hint;
        self
    }
}

/// `err` followed by its own sources, for a driver error whose sources say what failed
/// underneath (`error connecting to server: Connection refused (os error 111)`).
fn with_sources(err: &dyn Error) -> String {
    let mut out = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        let text = e.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = e.source();
    }
    out
}

/// The whole chain of `err` on one line, each link once: what a log line or a dead-letter
/// reason says.
pub fn report(err: &dyn Error) -> String {
    Report(err).to_string()
}

/// Displays an error chain on one line, `context: cause: cause …`.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a>(pub &'a dyn Error);

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("sink out: upserting 1 row into t")]
    struct Outer {
        #[source]
        cause: Cause,
    }

    #[test]
    fn a_chain_prints_each_link_once_with_the_hint_last() {
        let err = Outer {
            cause: Cause {
                system: System::MySql,
                code: Some("1045".into()),
                text: "MySQL error 1045 (28000): Access denied".into(),
                hint: None,
            }
            .with_hint(Some("check the sink's user and password")),
        };
        assert_eq!(
            report(&err),
            "sink out: upserting 1 row into t: MySQL error 1045 (28000): Access denied; \
             check the sink's user and password"
        );
        assert_eq!(err.cause.code.as_deref(), Some("1045"));
    }

    #[test]
    fn io_causes_keep_the_os_code() {
        let e = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        let c = Cause::io(&e);
        assert_eq!(c.system, System::Io);
        assert_eq!(
            c.code.as_deref(),
            Some(libc::ECONNREFUSED.to_string().as_str())
        );
        assert!(c.to_string().contains("refused"), "{c}");
    }
}
