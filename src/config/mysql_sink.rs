//! `sink/mysql`: the connector's settings, defaults and checks (operator reference:
//! `docs/connectors/mysql-sink.md`). The sink takes this type as it is loaded.

use std::time::Duration;

use serde::Deserialize;
use serde::de::{Deserializer, Error as _};

use super::model::SinkTuning;
use super::secrets::{Secret, SecretRef};
use super::transform::OnError;
use super::{defaults, values};

/// `sink/mysql`: MySQL or MariaDB, written by parallel keyed lanes with idempotent batches.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename = "a connector")]
pub struct MysqlSink {
    /// The connector's name, for logs, errors and checkpoint keys.
    #[serde(deserialize_with = "values::identifier")]
    pub name: String,
    /// The connector type as written (`sink/mysql`).
    #[serde(rename = "type")]
    pub type_name: String,
    /// Where secret-capable fields come from instead (resolved into them at load).
    #[serde(default)]
    pub secret_refs: Vec<SecretRef>,
    /// Server host name or address. Default `127.0.0.1`.
    #[serde(default = "default_host", deserialize_with = "values::non_empty")]
    pub host: String,
    /// Server port. Default 3306.
    #[serde(default = "defaults::u16_::<3306>", deserialize_with = "values::port")]
    pub port: u16,
    /// Target database (and of the checkpoint table). Default: the pipeline name (filled in
    /// at load).
    #[serde(default, deserialize_with = "database")]
    pub database: String,
    /// User. Default `root`.
    #[serde(default = "default_user", deserialize_with = "values::non_empty")]
    pub user: String,
    /// From `password:` or `secret_refs`; `None` for no password.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Create missing target tables from the source's columns (see `docs/types.md`).
    /// Default false.
    #[serde(default, deserialize_with = "values::boolean")]
    pub create_tables: bool,
    /// Number of parallel lanes (one connection each). Default 4; 1–256.
    #[serde(default = "defaults::u32_::<4>", deserialize_with = "lanes")]
    pub lanes: u32,
    /// Most changes in one lane batch (one transaction). Default 1000.
    #[serde(
        default = "defaults::usize_::<1000>",
        deserialize_with = "values::count_usize"
    )]
    pub batch_size: usize,
    /// Longest a partial batch waits for more changes before it is written. Default 20ms.
    #[serde(
        default = "defaults::millis::<20>",
        deserialize_with = "values::duration"
    )]
    pub max_wait: Duration,
    /// Capacity of each lane's bounded queue, in changes. Default 4096.
    #[serde(
        default = "defaults::usize_::<4096>",
        deserialize_with = "values::count_usize"
    )]
    pub queue_capacity: usize,
    /// A group of at least this many rows of one table (same columns) is written by MariaDB's
    /// bulk execution of one prepared statement; smaller groups, and all on MySQL, as
    /// multi-row SQL text. 0 writes text only. Default 8.
    #[serde(default = "defaults::usize_::<8>", deserialize_with = "bulk_min_rows")]
    pub bulk_min_rows: usize,
    /// Time allowed for opening a connection and setting up its session. Default 10s.
    #[serde(
        default = "defaults::secs::<10>",
        deserialize_with = "values::duration"
    )]
    pub connect_timeout: Duration,
    /// See [`SinkTuning::statement_timeout`]. Default 60s.
    #[serde(
        default = "defaults::secs::<60>",
        deserialize_with = "values::duration"
    )]
    pub statement_timeout: Duration,
    /// See [`SinkTuning::outage_timeout`]. Default 5m.
    #[serde(
        rename = "sink_outage_timeout",
        default = "defaults::secs::<300>",
        deserialize_with = "values::duration"
    )]
    pub outage_timeout: Duration,
    /// What a row the sink rejects for good does. Default halt.
    #[serde(default)]
    pub on_error: OnError,
    /// The dead-letter table (`on_error: dead_letter`; read by `zipline dlq`). Default
    /// `_zipline_dead_letters`.
    #[serde(
        default = "dead_letter_table_default",
        deserialize_with = "dead_letter_table"
    )]
    pub dead_letter_table: String,
    /// `ssl_mode` (see `docs/connectors/`, "TLS"); read into `tls` at load.
    #[serde(default)]
    pub ssl_mode: Option<String>,
    /// `ssl_ca`: a CA file.
    #[serde(default)]
    pub ssl_ca: Option<String>,
    /// `ssl_cert`: client certificate file.
    #[serde(default)]
    pub ssl_cert: Option<String>,
    /// `ssl_key`: client key file.
    #[serde(default)]
    pub ssl_key: Option<String>,
    /// The TLS settings the four fields above make, checked at load.
    #[serde(skip)]
    pub tls: super::tls::Tls,
}

impl MysqlSink {
    /// How the sink's lanes batch, queue and retry.
    pub fn tuning(&self) -> SinkTuning {
        SinkTuning {
            lanes: self.lanes,
            batch_size: self.batch_size,
            max_wait: self.max_wait,
            queue_capacity: self.queue_capacity,
            statement_timeout: self.statement_timeout,
            outage_timeout: self.outage_timeout,
            on_error: self.on_error,
        }
    }
}

fn default_host() -> String {
    "127.0.0.1".to_owned()
}

fn default_user() -> String {
    "root".to_owned()
}

fn database<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = values::non_empty(d)?;
    if s.chars().count() > 64 {
        return Err(D::Error::custom(
            "MySQL database names are at most 64 characters",
        ));
    }
    Ok(s)
}

/// `lanes` of any sink type: 1–256.
pub(crate) fn lanes<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    values::ranged(d, 1, 256).map(|n| n as u32)
}

fn bulk_min_rows<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    values::ranged(d, 0, values::COUNT_MAX).map(|n| n as usize)
}

/// The default `dead_letter_table` of any sink type.
pub(crate) fn dead_letter_table_default() -> String {
    "_zipline_dead_letters".to_owned()
}

/// A table name both MySQL (64 characters) and PostgreSQL (63 bytes) take as written.
pub(crate) fn dead_letter_table<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = values::non_empty(d)?;
    let plain = s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !s.starts_with(|c: char| c.is_ascii_digit());
    if !plain || s.len() > values::PG_NAME_MAX {
        return Err(D::Error::custom(format_args!(
            "invalid table name `{s}`: use letters, digits and underscores (not first), at \
             most {} characters",
            values::PG_NAME_MAX
        )));
    }
    Ok(s)
}
