//! `source/postgres`: the connector's settings, defaults and checks (operator reference:
//! `docs/connectors/postgres-source.md`). The source takes this type as it is loaded.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{Deserializer, Error as _};
use serde::{Deserialize, de};

use super::defaults;
use super::secrets::{Secret, SecretRef};
use super::values::{self, PG_NAME_MAX};

/// `source/postgres`: PostgreSQL logical replication with the pgoutput plugin.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename = "a connector")]
pub struct PostgresSource {
    /// The connector's name, for logs and errors.
    #[serde(deserialize_with = "values::identifier")]
    pub name: String,
    /// The connector type as written (`source/postgres`).
    #[serde(rename = "type")]
    pub type_name: String,
    /// Where secret-capable fields come from instead (resolved into them at load).
    #[serde(default)]
    pub secret_refs: Vec<SecretRef>,
    /// Server host name or address (or a Unix-socket directory, starting with `/`). Required.
    #[serde(deserialize_with = "values::non_empty")]
    pub host: String,
    /// Server port. Default 5432.
    #[serde(default = "defaults::u16_::<5432>", deserialize_with = "values::port")]
    pub port: u16,
    /// Database to replicate. Required.
    #[serde(deserialize_with = "values::non_empty")]
    pub database: String,
    /// Role with the REPLICATION attribute. Required.
    #[serde(deserialize_with = "values::non_empty")]
    pub user: String,
    /// From `password:` or `secret_refs`; `None` for trust/peer authentication.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Publication to subscribe to (created when absent). Required; 1–63 bytes.
    #[serde(deserialize_with = "publication")]
    pub publication: String,
    /// Logical replication slot (created if absent). Required; `[a-z0-9_]{1,63}`.
    #[serde(deserialize_with = "slot_name")]
    pub slot_name: String,
    /// Tables to replicate, always schema-qualified (`table` is loaded as `public.table`);
    /// `None` replicates every table in the publication.
    #[serde(default, deserialize_with = "tables")]
    pub tables: Option<Vec<String>>,
    /// Time allowed for one connection attempt. Default 10s.
    #[serde(
        default = "defaults::secs::<10>",
        deserialize_with = "values::duration"
    )]
    pub connect_timeout: Duration,
    /// Further attempts after a failed connect before giving up. Default 5.
    #[serde(default = "defaults::u32_::<5>", deserialize_with = "values::retries")]
    pub connect_retries: u32,
    /// Period of standby status updates (feedback) to the server. Default 10s (at most half
    /// the server's `wal_sender_timeout`, enforced at preflight).
    #[serde(
        default = "defaults::secs::<10>",
        deserialize_with = "values::duration"
    )]
    pub status_interval: Duration,
    /// Silence from the server after which the replication connection counts as lost
    /// (a network partition sends no reset). Default 60s.
    #[serde(
        default = "defaults::secs::<60>",
        deserialize_with = "values::duration"
    )]
    pub receive_timeout: Duration,
    /// Receive large transactions while they run (pgoutput protocol 2, PostgreSQL 14+),
    /// spilled to `spill_dir` until they commit. Default true (turned off at preflight for
    /// older servers).
    #[serde(default = "defaults::yes", deserialize_with = "values::boolean")]
    pub stream_in_progress: bool,
    /// Receive values in binary format (pgoutput's `binary` option, PostgreSQL 14+) while
    /// every published column has a type Zipline reads in binary; text otherwise, and from
    /// the moment a column of another type appears. Default true.
    #[serde(default = "defaults::yes", deserialize_with = "values::boolean")]
    pub binary_values: bool,
    /// Directory for streamed transactions awaiting commit. Default: the system temporary
    /// directory, `zipline-spill/<pipeline>-<slot>` (filled in at load).
    #[serde(default, deserialize_with = "spill_dir")]
    pub spill_dir: PathBuf,
    /// Copy the tables' existing rows when Zipline creates the slot. Default
    /// [`PostgresSnapshot::Initial`].
    #[serde(default)]
    pub snapshot: PostgresSnapshot,
    /// Snapshot reader connections (and sink connections loading chunks). Default 2; 1–64.
    #[serde(
        default = "defaults::u32_::<2>",
        deserialize_with = "snapshot_parallelism"
    )]
    pub snapshot_parallelism: u32,
    /// Target rows per snapshot chunk (the unit of parallelism and of resuming). Default 50000.
    #[serde(
        default = "defaults::u64_::<50_000>",
        deserialize_with = "values::count"
    )]
    pub snapshot_chunk_rows: u64,
    /// Retained WAL above which the slot is reported with a WARN. Default 1GiB.
    #[serde(
        default = "defaults::u64_::<1_073_741_824>",
        deserialize_with = "values::size"
    )]
    pub slot_warn_bytes: u64,
    /// How often to write a transactional logical message (`pg_logical_emit_message`), so a
    /// slot on a database with no writes at all still advances. Default off.
    #[serde(default, deserialize_with = "values::some_duration")]
    pub heartbeat_interval: Option<Duration>,
    /// What a table dropped and created again (or gone from the publication) does. Default:
    /// stop.
    #[serde(default)]
    pub on_table_recreate: OnTableRecreate,
    /// `sslmode` (see `docs/connectors/`, "TLS"); read into `tls` at load.
    #[serde(default)]
    pub sslmode: Option<String>,
    /// `sslrootcert`: a CA file, or `system`.
    #[serde(default)]
    pub sslrootcert: Option<String>,
    /// `sslcert`: client certificate file.
    #[serde(default)]
    pub sslcert: Option<String>,
    /// `sslkey`: client key file.
    #[serde(default)]
    pub sslkey: Option<String>,
    /// The TLS settings the four fields above make, checked at load.
    #[serde(skip)]
    pub tls: super::tls::Tls,
}

impl PostgresSource {
    /// The default spill directory of `pipeline` (when `spill_dir` is not set).
    pub(crate) fn default_spill_dir(pipeline: &str, slot_name: &str) -> PathBuf {
        std::env::temp_dir()
            .join("zipline-spill")
            .join(format!("{pipeline}-{slot_name}"))
    }
}

/// `on_table_recreate:` of `source/postgres`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnTableRecreate {
    /// `stop`: stop, naming the table and the choices.
    #[default]
    Stop,
    /// `resnapshot`: empty the table's sink tables, copy it again from a new snapshot, then
    /// follow it.
    Resnapshot,
}

impl<'de> Deserialize<'de> for OnTableRecreate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        values::keyword(
            d,
            &[
                ("stop", OnTableRecreate::Stop),
                ("resnapshot", OnTableRecreate::Resnapshot),
            ],
            "policy",
            "`stop` or `resnapshot`",
        )
    }
}

/// `snapshot:` of `source/postgres`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PostgresSnapshot {
    /// `initial`: when Zipline creates the slot, copy the tables' rows, then stream.
    #[default]
    Initial,
    /// `never`: stream only changes committed after the slot was created.
    Never,
    /// `when_needed`: as `initial`, and when the slot is gone or unusable, or a sink lost its
    /// state, start over by itself: a new slot and a whole new snapshot (the sinks' tables are
    /// emptied first). Without it those cases stop the pipeline with the remedy.
    WhenNeeded,
}

impl<'de> Deserialize<'de> for PostgresSnapshot {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        values::keyword(
            d,
            &[
                ("initial", PostgresSnapshot::Initial),
                ("never", PostgresSnapshot::Never),
                ("when_needed", PostgresSnapshot::WhenNeeded),
            ],
            "snapshot mode",
            "`initial`, `never` or `when_needed`",
        )
    }
}

fn publication<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = values::non_empty(d)?;
    if s.len() > PG_NAME_MAX {
        return Err(D::Error::custom(format_args!(
            "publication name is {} bytes; PostgreSQL names are at most {PG_NAME_MAX} bytes",
            s.len()
        )));
    }
    Ok(s)
}

fn slot_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = values::non_empty(d)?;
    let valid_chars = s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !valid_chars || s.len() > PG_NAME_MAX {
        return Err(D::Error::custom(format_args!(
            "invalid replication slot name `{s}`: PostgreSQL allows only lower-case letters, \
             digits and underscores, at most {PG_NAME_MAX} characters"
        )));
    }
    Ok(s)
}

fn spill_dir<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
    values::non_empty(d).map(PathBuf::from)
}

fn snapshot_parallelism<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    values::ranged(d, 1, 64).map(|n| n as u32)
}

/// `tables: [orders, sales.items]` → `["public.orders", "sales.items"]`; each item is checked
/// where it is written.
fn tables<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    let items = Vec::<QualifiedTable>::deserialize(d)?;
    if items.is_empty() {
        return Err(D::Error::custom(
            "empty table list; omit `tables` to replicate every table in the publication",
        ));
    }
    Ok(Some(items.into_iter().map(|t| t.0).collect()))
}

/// One `tables` item, schema-qualified.
struct QualifiedTable(String);

impl<'de> Deserialize<'de> for QualifiedTable {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = values::non_empty(d)?;
        let parts: Vec<&str> = name.split('.').collect();
        match parts.as_slice() {
            [table] if !table.trim().is_empty() => Ok(QualifiedTable(format!("public.{table}"))),
            [schema, table] if !schema.trim().is_empty() && !table.trim().is_empty() => {
                Ok(QualifiedTable(name))
            }
            _ => Err(de::Error::custom(format_args!(
                "invalid table `{name}`: expected `schema.table` or `table`"
            ))),
        }
    }
}

/// The first table listed twice, as `(index, message)`.
pub(crate) fn repeated_table(tables: &[String]) -> Option<(usize, String)> {
    let mut seen = HashSet::new();
    tables
        .iter()
        .position(|t| !seen.insert(t))
        .map(|i| (i, format!("table `{}` is listed twice", tables[i])))
}
