//! Classifying tokio-postgres errors into [`SinkError`]s by SQLSTATE: what the runtime does
//! next. Codes: <https://www.postgresql.org/docs/15/errcodes-appendix.html>.
//!
//! - Transient: the connection or the transaction died for reasons outside the batch
//!   (serialization failure, deadlock, administrator or crash shutdown, too many connections,
//!   a server starting up or read-only during a failover, lost or refused connections). The
//!   runtime reconnects and retries the same batch, which converges.
//! - Definite: the data cannot be stored (class 22 data exceptions, class 23 integrity
//!   violations, a key twice in one upsert, a value Zipline cannot encode). Retrying the same
//!   rows fails again.
//! - Fatal: the operator must act (credentials, missing database, schema, table or column,
//!   privileges, incompatible column types, no usable unique index).
//!
//! Other codes fall back to their class (08 connection, 40 rollback, 53 resources, 57 operator
//! intervention: transient), and otherwise Fatal: stopping is safer than retrying blindly or
//! dead-lettering rows that might be fine.

use std::error::Error as _;

use tokio_postgres::error::SqlState;

use super::encode::EncodeError;
use crate::error::{Cause, ErrorClass};
use crate::sink::SinkError;

/// The class of a tokio-postgres error.
pub(super) fn classify(err: &tokio_postgres::Error) -> ErrorClass {
    if let Some(db) = err.as_db_error() {
        return classify_code(db.code().code());
    }
    if err.is_closed() || io_cause(err).is_some() {
        return ErrorClass::Transient;
    }
    if err.source().is_some_and(|s| s.is::<EncodeError>()) {
        return ErrorClass::Definite;
    }
    let text = err.to_string();
    if text.starts_with("authentication error")
        || text.starts_with("invalid configuration")
        || text.starts_with("invalid connection string")
    {
        ErrorClass::Fatal
    } else {
        // Timeouts, unexpected or unparsable messages: the connection is suspect.
        ErrorClass::Transient
    }
}

fn classify_code(code: &str) -> ErrorClass {
    match code {
        // Serialization failure, deadlock, admin/crash shutdown, cannot connect now (starting
        // up), too many connections, lock not available, statement cancelled, read-only
        // transaction (a standby after a failover), idle-session timeout.
        "40001" | "40P01" | "57P01" | "57P02" | "57P03" | "53300" | "55P03" | "57014" | "25006"
        | "57P05" => ErrorClass::Transient,
        // Wrong password, bad authorization, missing database/schema/table/column/function,
        // no privilege, syntax (a bug in generated SQL), incompatible types, no unique index
        // for ON CONFLICT, unsupported feature (TRUNCATE of a referenced table), wrong object
        // type, a value of the wrong type for a column.
        "28P01" | "28000" | "3D000" | "3F000" | "42P01" | "42703" | "42883" | "42501" | "42601"
        | "42804" | "42846" | "42P10" | "0A000" | "42809" | "42P17" => ErrorClass::Fatal,
        // ON CONFLICT DO UPDATE affecting one row twice: two changes for one sink key.
        "21000" => ErrorClass::Definite,
        _ => match code.get(..2) {
            Some("22" | "23") => ErrorClass::Definite,
            Some("08" | "40" | "53" | "57") => ErrorClass::Transient,
            _ => ErrorClass::Fatal,
        },
    }
}

fn io_cause(err: &tokio_postgres::Error) -> Option<&std::io::Error> {
    err.source()?.downcast_ref::<std::io::Error>()
}

/// A [`SinkError`] for `err` met while `doing` something (e.g. "upserting 3 rows into …").
pub(super) fn sink_error(sink: &str, doing: &str, err: &tokio_postgres::Error) -> SinkError {
    SinkError {
        class: classify(err),
        message: format!("sink {sink}: {doing}"),
        kind: crate::sink::SinkErrorKind::Other,
        cause: Some(Box::new(Cause::postgres(err).with_hint(hint(err)))),
    }
}

/// True when the connection is unusable after `err` (reconnect rather than reuse it).
pub(super) fn connection_lost(err: &tokio_postgres::Error) -> bool {
    match err.as_db_error() {
        // The server ends the session after these.
        Some(db) => {
            matches!(
                db.code().code(),
                "57P01" | "57P02" | "57P03" | "57P05" | "53300"
            ) || db.code().code().starts_with("08")
        }
        None => classify(err) == ErrorClass::Transient,
    }
}

fn hint(err: &tokio_postgres::Error) -> Option<&'static str> {
    if let Some(db) = err.as_db_error() {
        let code = db.code();
        return if *code == SqlState::INVALID_PASSWORD {
            Some("check the sink's user and password")
        } else if *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION {
            Some("check the sink's user, and that pg_hba.conf lets it connect from this host")
        } else if *code == SqlState::INVALID_CATALOG_NAME {
            Some("create the database or fix the sink's database setting")
        } else if *code == SqlState::INVALID_SCHEMA_NAME {
            Some("create the schema or fix the sink's schema setting")
        } else if *code == SqlState::UNDEFINED_TABLE {
            Some("create the table, or set create_tables: true")
        } else if *code == SqlState::UNDEFINED_COLUMN {
            Some("the sink table lacks a column the source has (a schema change?); add it")
        } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
            Some(
                "grant the sink's user USAGE and CREATE on the schema and SELECT, INSERT, \
                 UPDATE, DELETE and TRUNCATE on the tables",
            )
        } else if *code == SqlState::DATATYPE_MISMATCH || *code == SqlState::CANNOT_COERCE {
            Some("the sink column's type cannot hold the source column's values")
        } else if *code == SqlState::INVALID_COLUMN_REFERENCE {
            Some("the sink table needs a PRIMARY KEY or UNIQUE index on the source key columns")
        } else if *code == SqlState::TOO_MANY_CONNECTIONS {
            Some("the server's max_connections is exhausted; retrying")
        } else if *code == SqlState::CANNOT_CONNECT_NOW {
            Some("the server is starting up or shutting down; retrying")
        } else if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
            Some("the server is read-only (a standby, or a failover in progress); retrying")
        } else {
            None
        };
    }
    match io_cause(err).map(std::io::Error::kind) {
        Some(std::io::ErrorKind::ConnectionRefused) => {
            Some("is the server running and listening there? retrying")
        }
        _ => None,
    }
}

/// The input line a COPY error happened at, from its context ("COPY t, line 3, column x").
pub(super) fn copy_line(e: &tokio_postgres::Error) -> Option<usize> {
    let context = e.as_db_error()?.where_()?;
    let at = context.find(", line ")?;
    let digits: String = context[at + 7..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_map_to_classes() {
        for code in [
            "40001", "40P01", "57P01", "53300", "08006", "08001", "57P03", "25006",
        ] {
            assert_eq!(classify_code(code), ErrorClass::Transient, "{code}");
        }
        for code in [
            "28P01", "3D000", "42P01", "42703", "42501", "42804", "42P10", "0A000",
        ] {
            assert_eq!(classify_code(code), ErrorClass::Fatal, "{code}");
        }
        for code in [
            "22001", "22003", "22P02", "23505", "23502", "23503", "23514", "21000",
        ] {
            assert_eq!(classify_code(code), ErrorClass::Definite, "{code}");
        }
        // Unknown codes fall back to their class; anything else stops the pipeline.
        assert_eq!(classify_code("08P99"), ErrorClass::Transient);
        assert_eq!(classify_code("53100"), ErrorClass::Transient);
        assert_eq!(classify_code("XX000"), ErrorClass::Fatal);
    }
}
