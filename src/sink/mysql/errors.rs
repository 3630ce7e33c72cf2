//! Classifying mysql_async errors into [`SinkError`]s: what the runtime does next.
//!
//! Server error codes are shared by MySQL and MariaDB up to 1900; MariaDB-only codes are noted.
//! References: <https://mariadb.com/kb/en/mariadb-error-code-reference/>,
//! <https://dev.mysql.com/doc/mysql-errors/8.0/en/server-error-reference.html>.
//!
//! - Transient: the connection or the transaction died for reasons outside the batch
//!   (deadlock, lock wait timeout, lost connection, server shutdown, read-only during a
//!   failover). The runtime reconnects and retries the same batch, which converges.
//! - Definite: the data cannot be stored (out of range, too long, bad value, NOT NULL, a
//!   duplicate on a secondary unique index, a foreign key). Retrying the same rows fails again.
//! - Fatal: the operator must act (credentials, missing database, table or column, missing
//!   privileges, a binlog format that refuses READ COMMITTED).
//!
//! An unknown server error is classified by its SQLSTATE class (22/23 data, 08 connection,
//! 40 rollback), and otherwise Fatal: stopping is safer than retrying blindly forever or
//! dead-lettering rows that might be fine.

use mysql_async::{DriverError, Error};

use crate::error::{Cause, ErrorClass};
use crate::sink::SinkError;

/// The class of a mysql_async error.
pub(crate) fn classify(err: &Error) -> ErrorClass {
    match err {
        Error::Server(e) => classify_server(e.code, &e.state),
        Error::Io(_) | Error::Other(_) => ErrorClass::Transient,
        Error::Driver(e) => match e {
            // A statement above max_allowed_packet: that batch's rows are too big.
            DriverError::PacketTooLarge => ErrorClass::Definite,
            DriverError::UnknownAuthPlugin { .. }
            | DriverError::MysqlOldPasswordDisabled
            | DriverError::CleartextPluginDisabled
            | DriverError::NoClientSslFlagFromServer
            | DriverError::CantParseServerVersion { .. } => ErrorClass::Fatal,
            _ => ErrorClass::Transient,
        },
        Error::Url(_) => ErrorClass::Fatal,
    }
}

fn classify_server(code: u16, state: &str) -> ErrorClass {
    match code {
        // Deadlock, lock wait timeout, connection killed (MariaDB 1927), server shutdown,
        // too many connections, query interrupted, net read/write errors, connection lost,
        // gone away, read-only (failover in progress), error during commit/rollback,
        // disconnected for inactivity (MySQL 4031), max execution time (MySQL 3024).
        1213
        | 1205
        | 1927
        | 1053
        | 1040
        | 1317
        | 1158..=1161
        | 2006
        | 2013
        | 1290
        | 1836
        | 1180
        | 1181
        | 4031
        | 3024 => ErrorClass::Transient,
        // Access denied (user, database, table, column, privilege), unknown database, table
        // or column, syntax (a bug in generated SQL), unknown engine, READ COMMITTED refused
        // by statement-based binlog, table is read only, host not allowed or blocked.
        1044 | 1045 | 1049 | 1146 | 1054 | 1142 | 1143 | 1227 | 1370 | 1064 | 1286 | 1665
        | 1036 | 1109 | 1129 | 1130 => ErrorClass::Fatal,
        // Out of range, data too long, incorrect value, NULL into NOT NULL, duplicate entry,
        // no default value, data truncated, division by zero, FK parent/child, packet too
        // large, invalid character string, check constraint (MariaDB 4025, MySQL 3819),
        // invalid JSON (MySQL 3140), value out of range in expression.
        1264 | 1406 | 1366 | 1367 | 1292 | 1048 | 1062 | 1364 | 1265 | 1365 | 1451 | 1452
        | 1153 | 1300 | 4025 | 3819 | 3140 | 1690 | 1411 | 1586 => ErrorClass::Definite,
        _ => match state.get(..2) {
            Some("22" | "23") => ErrorClass::Definite,
            Some("08" | "40") => ErrorClass::Transient,
            _ => ErrorClass::Fatal,
        },
    }
}

/// A [`SinkError`] for `err` met while `doing` something (e.g. "upserting 3 rows into …").
pub(crate) fn sink_error(sink: &str, doing: &str, err: &Error) -> SinkError {
    SinkError {
        class: classify(err),
        message: format!("sink {sink}: {doing}"),
        kind: crate::sink::SinkErrorKind::Other,
        cause: Some(Box::new(Cause::mysql(err).with_hint(hint(err)))),
    }
}

/// True when the connection is unusable after `err` (no point sending ROLLBACK on it).
pub(crate) fn connection_lost(err: &Error) -> bool {
    match err {
        // Killed (MariaDB), server shutdown, gone away, lost, idle disconnect (MySQL).
        Error::Server(e) => matches!(e.code, 1927 | 1053 | 2006 | 2013 | 4031),
        _ => err.is_fatal(),
    }
}

fn hint(err: &Error) -> Option<&'static str> {
    match err {
        Error::Server(e) => match e.code {
            1045 => Some("check the sink's user and password"),
            1044 | 1142 | 1143 | 1227 => Some(
                "grant the sink's user SELECT, INSERT, UPDATE, DELETE and CREATE on the database",
            ),
            1049 => Some("create the database or fix the sink's database setting"),
            1130 => Some("allow the sink's user to connect from this host"),
            1129 => Some("the host is blocked after connection errors; run FLUSH HOSTS"),
            1665 => {
                Some("Zipline writes with READ COMMITTED, which needs binlog_format=ROW or MIXED")
            }
            1040 => Some("the server's max_connections is exhausted; retrying"),
            1290 | 1836 => Some("the server is read-only (a failover?); retrying"),
            _ => None,
        },
        Error::Io(mysql_async::IoError::Io(e)) => match e.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                Some("is the server running and listening there? retrying")
            }
            _ => None,
        },
        Error::Driver(DriverError::PacketTooLarge) => Some(
            "a single row is larger than the server's max_allowed_packet; raise it on the server",
        ),
        _ => None,
    }
}

/// The row number in a MySQL message such as "Out of range value for column 'x' at row 3".
pub(crate) fn row_number(err: &Error) -> Option<usize> {
    let Error::Server(e) = err else { return None };
    let at = e.message.rfind(" at row ")?;
    let digits: String = e.message[at + 8..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mysql_async::ServerError;

    fn server(code: u16, state: &str, message: &str) -> Error {
        Error::Server(ServerError {
            code,
            state: state.to_owned(),
            message: message.to_owned(),
        })
    }

    #[test]
    fn server_codes_map_to_classes() {
        for code in [1213, 1205, 2006, 2013, 1927, 1053, 1040, 1317] {
            assert_eq!(
                classify(&server(code, "HY000", "x")),
                ErrorClass::Transient,
                "{code}"
            );
        }
        for code in [1045, 1049, 1146, 1054, 1142] {
            assert_eq!(
                classify(&server(code, "42000", "x")),
                ErrorClass::Fatal,
                "{code}"
            );
        }
        for code in [1264, 1406, 1366, 1292, 1048, 1062] {
            assert_eq!(
                classify(&server(code, "22003", "x")),
                ErrorClass::Definite,
                "{code}"
            );
        }
        // Unknown codes fall back to the SQLSTATE class.
        assert_eq!(classify(&server(9999, "22012", "x")), ErrorClass::Definite);
        assert_eq!(classify(&server(9999, "40001", "x")), ErrorClass::Transient);
        assert_eq!(classify(&server(9999, "HY000", "x")), ErrorClass::Fatal);
    }

    #[test]
    fn connection_and_driver_errors() {
        let refused = Error::Io(mysql_async::IoError::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(classify(&refused), ErrorClass::Transient);
        let e = sink_error("out", "connecting to MySQL at db:3306", &refused);
        assert!(
            e.report()
                .starts_with("sink out: connecting to MySQL at db:3306: connection error")
        );
        assert!(
            e.report().contains("is the server running"),
            "{}",
            e.report()
        );
        let closed = Error::Driver(DriverError::ConnectionClosed);
        assert_eq!(classify(&closed), ErrorClass::Transient);
        assert_eq!(
            classify(&Error::Driver(DriverError::PacketTooLarge)),
            ErrorClass::Definite
        );
    }

    #[test]
    fn messages_name_the_sink_and_carry_hints() {
        let e = sink_error(
            "mysql-out",
            "connecting",
            &server(
                1045,
                "28000",
                "Access denied for user 'z'@'h' (using password: YES)",
            ),
        );
        assert_eq!(e.class, ErrorClass::Fatal);
        assert_eq!(e.code(), Some("1045"));
        assert_eq!(
            e.report(),
            "sink mysql-out: connecting: MySQL error 1045 (28000): Access denied for user \
             'z'@'h' (using password: YES); check the sink's user and password"
        );
    }

    #[test]
    fn lost_connections_are_told_apart_from_failed_statements() {
        assert!(connection_lost(&server(
            1927,
            "70100",
            "Connection was killed"
        )));
        assert!(!connection_lost(&server(1213, "40001", "Deadlock found")));
        assert!(connection_lost(&Error::Driver(
            DriverError::ConnectionClosed
        )));
    }

    #[test]
    fn row_numbers_are_read_from_messages() {
        let e = server(
            1264,
            "22003",
            "Out of range value for column 'qty' at row 17",
        );
        assert_eq!(row_number(&e), Some(17));
        assert_eq!(
            row_number(&server(1062, "23000", "Duplicate entry 'x' for key 'u'")),
            None
        );
    }
}
