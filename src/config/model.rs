//! The loaded, validated pipeline configuration the runtime consumes.
//!
//! Everything here has passed validation: names are unique and well formed, routes point at
//! existing connectors of the right direction, numbers are in range, secrets are resolved.
//! Field meanings and defaults are documented for operators in `docs/connectors/`.

use std::time::Duration;

use super::secrets::Secret;

/// One pipeline: its connectors and how changes flow between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pipeline {
    /// Matches `[A-Za-z0-9_-]{1,63}`; used in replication slot and checkpoint identifiers.
    pub name: String,
    /// In file order; names are unique.
    pub connectors: Vec<Connector>,
    /// In file order; each source appears in at most one route.
    pub routes: Vec<Route>,
    /// Pipeline-wide settings.
    pub settings: Settings,
}

impl Pipeline {
    /// The connector named `name`.
    pub fn connector(&self, name: &str) -> Option<&Connector> {
        self.connectors.iter().find(|c| c.name == name)
    }
}

/// Pipeline-wide settings (the optional top-level `settings:` map).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// How often progress (frontier, lag, throughput) is logged. Default 5s.
    pub progress_interval: Duration,
    /// How old an instance's heartbeat in a sink's fence row must be before another instance
    /// takes the pipeline over (when the old one's session lingers). Default 30s; at least 3s.
    pub instance_lease: Duration,
    /// Longest a graceful stop waits for the lanes to commit what they hold; then the
    /// pipeline exits non-zero, confirming only what is durable. Default 30s.
    pub drain_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            progress_interval: Duration::from_secs(5),
            instance_lease: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// A named source or sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connector {
    /// Unique within the pipeline; matches `[A-Za-z0-9_-]{1,63}`.
    pub name: String,
    /// The connector type and its settings.
    pub kind: ConnectorKind,
}

/// A connector's type (the YAML `type` key) and its type-specific settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectorKind {
    /// `type: source/postgres`.
    PostgresSource(PostgresSource),
    /// `type: sink/mysql`.
    MysqlSink(MysqlSink),
    /// `type: source/sqlserver`.
    SqlServerSource(SqlServerSource),
    /// `type: sink/postgres`.
    PostgresSink(PostgresSink),
}

impl ConnectorKind {
    /// The YAML spelling of the type, e.g. `source/postgres`.
    pub fn type_name(&self) -> &'static str {
        match self {
            ConnectorKind::PostgresSource(_) => "source/postgres",
            ConnectorKind::MysqlSink(_) => "sink/mysql",
            ConnectorKind::SqlServerSource(_) => "source/sqlserver",
            ConnectorKind::PostgresSink(_) => "sink/postgres",
        }
    }

    /// Whether changes come out of this connector (it may appear in a route's `from`).
    pub fn is_source(&self) -> bool {
        matches!(
            self,
            ConnectorKind::PostgresSource(_) | ConnectorKind::SqlServerSource(_)
        )
    }

    /// Whether changes go into this connector (it may appear in a route's `to`).
    pub fn is_sink(&self) -> bool {
        matches!(
            self,
            ConnectorKind::MysqlSink(_) | ConnectorKind::PostgresSink(_)
        )
    }
}

/// `source/postgres`: PostgreSQL logical replication with the pgoutput plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresSource {
    /// Server host name or address. Required.
    pub host: String,
    /// Server port. Default 5432.
    pub port: u16,
    /// Database to replicate. Required.
    pub database: String,
    /// Role with the REPLICATION attribute. Required.
    pub user: String,
    /// From `password:` or `secret_refs`; `None` for trust/peer authentication.
    pub password: Option<Secret>,
    /// Publication to subscribe to (must exist). Required; 1–63 bytes.
    pub publication: String,
    /// Logical replication slot (created if absent). Required; `[a-z0-9_]{1,63}`.
    pub slot_name: String,
    /// Tables to replicate, always schema-qualified (`table` is loaded as `public.table`);
    /// `None` replicates every table in the publication.
    pub tables: Option<Vec<String>>,
    /// Time allowed for one connection attempt. Default 10s.
    pub connect_timeout: Duration,
    /// Further attempts after a failed connect before giving up. Default 5.
    pub connect_retries: u32,
    /// Period of standby status updates (feedback) to the server. Default 10s.
    pub status_interval: Duration,
    /// Silence from the server after which the replication connection counts as lost
    /// (a network partition sends no reset). Default 60s.
    pub receive_timeout: Duration,
    /// Receive large transactions while they run (pgoutput protocol 2, PostgreSQL 14+),
    /// spilled to `spill_dir` until they commit. Default true.
    pub stream_in_progress: bool,
    /// Directory for streamed transactions awaiting commit. Default: the system temporary
    /// directory, `zipline-spill/<pipeline>-<slot>`.
    pub spill_dir: Option<std::path::PathBuf>,
    /// Copy the tables' existing rows when Zipline creates the slot. Default
    /// [`PostgresSnapshot::Initial`].
    pub snapshot: PostgresSnapshot,
    /// Snapshot reader connections (and sink connections loading chunks). Default 2; 1–64.
    pub snapshot_parallelism: u32,
    /// Target rows per snapshot chunk (the unit of parallelism and of resuming). Default 50000.
    pub snapshot_chunk_rows: u64,
    /// Retained WAL above which the slot is reported with a WARN (`slot_warn_bytes`). Default
    /// 1GiB.
    pub slot_warn_bytes: u64,
    /// How often to write a transactional logical message (`pg_logical_emit_message`), so a
    /// slot on a database with no writes at all still advances (`heartbeat_interval`).
    /// Default off.
    pub heartbeat_interval: Option<Duration>,
    /// What a table dropped and created again (or gone from the publication) does
    /// (`on_table_recreate`). Default: stop.
    pub on_table_recreate: OnTableRecreate,
    /// `sslmode`, `sslrootcert`, `sslcert`, `sslkey`. Default: `prefer`.
    pub tls: super::tls::Tls,
}

/// `on_table_recreate:` of `source/postgres`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTableRecreate {
    /// `stop`: stop, naming the table and the choices.
    Stop,
    /// `resnapshot`: empty the table's sink tables, copy it again from a new snapshot, then
    /// follow it.
    Resnapshot,
}

/// `snapshot:` of `source/postgres`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostgresSnapshot {
    /// `initial`: when Zipline creates the slot, copy the tables' rows, then stream.
    Initial,
    /// `never`: stream only changes committed after the slot was created.
    Never,
    /// `when_needed`: as `initial`, and when the slot is gone or unusable, or a sink lost its
    /// state, start over by itself: a new slot and a whole new snapshot (the sinks' tables are
    /// emptied first). Without it those cases stop the pipeline with the remedy.
    WhenNeeded,
}

/// `source/sqlserver`: SQL Server change data capture, polled from the change tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlServerSource {
    /// Server host name or address. Required.
    pub host: String,
    /// Server port. Default 1433.
    pub port: u16,
    /// Database with CDC enabled. Required.
    pub database: String,
    /// SQL Server login. Required.
    pub user: String,
    /// From `password:` or `secret_refs`; `None` sends an empty password.
    pub password: Option<Secret>,
    /// Tables to replicate as `(schema, table)`; `table` alone is `dbo.table`. Required,
    /// non-empty.
    pub tables: Vec<(String, String)>,
    /// Pause between polls of the change tables that found nothing new. Default 500ms.
    pub poll_interval: Duration,
    /// Encrypt the connection with TLS, failing if the server cannot. Default true.
    pub encrypt: bool,
    /// Accept the server certificate without validating it. Default false.
    pub trust_server_certificate: bool,
    /// `sslmode`, `sslrootcert`, `sslcert`, `sslkey`, when any is given (then `encrypt` and
    /// `trust_server_certificate` are not).
    pub tls: Option<super::tls::Tls>,
    /// Copy the existing rows before streaming when the sinks hold no position. Default
    /// [`SqlServerSnapshot::Initial`].
    pub snapshot: SqlServerSnapshot,
    /// Time allowed for one connection attempt. Default 10s.
    pub connect_timeout: Duration,
    /// Further attempts after a failed connect before giving up. Default 5.
    pub connect_retries: u32,
}

/// `snapshot:` of `source/sqlserver`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlServerSnapshot {
    /// `initial`: copy the tables' rows, then stream.
    Initial,
    /// `never`: stream only changes committed after the first start.
    Never,
}

/// The lane fields every sink type shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkTuning {
    /// Number of parallel lanes (one connection each). Default 4; 1–256.
    pub lanes: u32,
    /// Most changes in one lane batch (one transaction). Default 1000.
    pub batch_size: usize,
    /// Longest a partial batch waits for more changes before it is written. Default 20ms.
    pub max_wait: Duration,
    /// Capacity of each lane's bounded queue, in changes. Default 4096.
    pub queue_capacity: usize,
    /// Time allowed for one connection attempt. Default 10s.
    pub connect_timeout: Duration,
    /// Longest one sink statement (or a batch's commit) may go without an answer before its
    /// connection is presumed stalled: dropped, reconnected and the batch retried. Default 60s.
    pub statement_timeout: Duration,
    /// How long the sink may keep failing transiently (down, unreachable, stalled) while
    /// lanes retry with capped backoff, before the pipeline stops (`sink_outage_timeout`).
    /// Default 5m.
    pub outage_timeout: Duration,
    /// What a row the sink rejects for good (too long, a constraint, a type, a missing table)
    /// does: halt (default), skip it, or write it to `dead_letter_table`.
    pub on_error: super::OnError,
    /// The dead-letter table in the sink (`on_error: dead_letter`). Default
    /// `_zipline_dead_letters`.
    pub dead_letter_table: String,
}

/// `sink/mysql`: MySQL or MariaDB, written by parallel keyed lanes with idempotent batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MysqlSink {
    /// Server host name or address. Default `127.0.0.1`.
    pub host: String,
    /// Server port. Default 3306.
    pub port: u16,
    /// Target database. Default: the pipeline name.
    pub database: String,
    /// User. Default `root`.
    pub user: String,
    /// From `password:` or `secret_refs`; `None` for no password.
    pub password: Option<Secret>,
    /// Create missing target tables from the source's columns (see `docs/types.md`).
    /// Default false.
    pub create_tables: bool,
    /// How the sink's lanes batch, queue, connect and retry.
    pub tuning: SinkTuning,
    /// `ssl_mode`, `ssl_ca`, `ssl_cert`, `ssl_key`. Default: `PREFERRED`.
    pub tls: super::tls::Tls,
}

/// `sink/postgres`: PostgreSQL, written by parallel keyed lanes with idempotent batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresSink {
    /// Server host name or address. Required.
    pub host: String,
    /// Server port. Default 5432.
    pub port: u16,
    /// Target database. Required; at most 63 bytes.
    pub database: String,
    /// User. Required.
    pub user: String,
    /// From `password:` or `secret_refs`; `None` for trust/peer authentication.
    pub password: Option<Secret>,
    /// Schema of every target table (and of the checkpoint table); `None`: each source
    /// table's own schema (checkpoints in `public`).
    pub schema: Option<String>,
    /// Create missing target tables with the source's column types. Default false.
    pub create_tables: bool,
    /// How the sink's lanes batch, queue, connect and retry.
    pub tuning: SinkTuning,
    /// `sslmode`, `sslrootcert`, `sslcert`, `sslkey`. Default: `prefer`.
    pub tls: super::tls::Tls,
}

/// Changes of some of a source's tables go, through an optional transform, to every listed
/// sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// A source connector's name.
    pub from: String,
    /// Sink connector names; non-empty, no duplicates, none fed by another route.
    pub to: Vec<String>,
    /// The WebAssembly transform changes pass through before the lanes (`transform:`).
    pub transform: Option<super::transform::TransformSpec>,
    /// The source tables it takes (`tables:`); `None`: every table no other route lists.
    pub tables: Option<Vec<RouteTable>>,
    /// Where the route is in the file (`file:line: routes[i]`), for messages.
    pub at: String,
    /// Where its transform's `module` and `config` are, for errors found when the module is
    /// compiled (a step of its own: loading a file never compiles WebAssembly).
    pub transform_at: Option<(Location, Location)>,
}

/// A place in the pipeline file, for errors found after loading.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Location {
    /// The file as named.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// The field's path, e.g. `routes[0].transform.module`.
    pub path: String,
}

impl Location {
    /// An error at this place.
    pub fn error(&self, message: impl Into<String>) -> super::ConfigError {
        super::ConfigError::new(&self.file, self.line, self.path.clone(), message)
    }
}

/// A table a route lists, as written (`schema.table` or `table`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTable {
    /// The name as written.
    pub name: String,
    /// Where it is written (`file:line: routes[i].tables[j]`), for messages.
    pub at: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connector_lookup_and_kind_helpers() {
        let sink = MysqlSink {
            host: "h".into(),
            port: 3306,
            database: "d".into(),
            user: "u".into(),
            password: Some(Secret::new("pw-value")),
            create_tables: false,
            tls: Default::default(),
            tuning: SinkTuning {
                lanes: 4,
                batch_size: 1000,
                max_wait: Duration::from_millis(20),
                queue_capacity: 4096,
                connect_timeout: Duration::from_secs(10),
                statement_timeout: Duration::from_secs(60),
                outage_timeout: Duration::from_secs(300),
                on_error: crate::config::OnError::Halt,
                dead_letter_table: "_zipline_dead_letters".into(),
            },
        };
        let p = Pipeline {
            name: "p".into(),
            connectors: vec![Connector {
                name: "out".into(),
                kind: ConnectorKind::MysqlSink(sink),
            }],
            routes: vec![],
            settings: Settings::default(),
        };
        let c = p.connector("out").unwrap();
        assert!(c.kind.is_sink() && !c.kind.is_source());
        assert_eq!(c.kind.type_name(), "sink/mysql");
        assert!(p.connector("nope").is_none());
        let debug = format!("{p:?}");
        assert!(!debug.contains("pw-value") && debug.contains("<redacted>"));
        assert_eq!(p.settings.progress_interval, Duration::from_secs(5));
    }
}
