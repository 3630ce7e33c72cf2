//! The loaded, validated pipeline configuration the runtime consumes.
//!
//! Everything here has passed validation: names are unique and well formed, routes point at
//! existing connectors of the right direction, numbers are in range, secrets are resolved.
//! Field meanings and defaults are documented for operators in `docs/connectors/`.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::mysql_sink::MysqlSink;
use super::postgres_sink::PostgresSink;
use super::postgres_source::PostgresSource;
use super::secrets::{Secret, SecretRef};
use super::sqlserver::SqlServerSource;
use super::values;

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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default, rename = "settings")]
pub struct Settings {
    /// How often progress (frontier, lag, throughput) is logged. Default 5s.
    #[serde(deserialize_with = "values::duration")]
    pub progress_interval: Duration,
    /// How old an instance's heartbeat in a sink's fence row must be before another instance
    /// takes the pipeline over (when the old one's session lingers). Default 30s; at least 3s.
    #[serde(deserialize_with = "instance_lease")]
    pub instance_lease: Duration,
    /// Longest a graceful stop waits for the lanes to commit what they hold; then the
    /// pipeline exits non-zero, confirming only what is durable. Default 30s.
    #[serde(deserialize_with = "values::duration")]
    pub drain_timeout: Duration,
    /// Where `pipeline apply` serves `/metrics`, `/healthz` and `/readyz` over HTTP (an IP
    /// address and port, e.g. `127.0.0.1:9464`). Off by default.
    #[serde(deserialize_with = "metrics_address")]
    pub metrics: Option<std::net::SocketAddr>,
}

/// `IP:port`: what is bound is said in the file, never looked up in DNS.
fn metrics_address<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<std::net::SocketAddr>, D::Error> {
    let text = values::non_empty(d)?;
    text.trim().parse().map(Some).map_err(|_| {
        serde::de::Error::custom(format_args!(
            "{text:?} is not an address to listen on: expected IP:port, such as \
             127.0.0.1:9464, 0.0.0.0:9464 or [::1]:9464"
        ))
    })
}

/// A lease shorter than a few heartbeats would hand the pipeline over while its holder lives.
fn instance_lease<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let min = Duration::from_secs(3);
    let lease = values::duration(d)?;
    if lease < min {
        return Err(serde::de::Error::custom(format_args!(
            "must be at least {}",
            values::humantime_text(min)
        )));
    }
    Ok(lease)
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            progress_interval: Duration::from_secs(5),
            instance_lease: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(30),
            metrics: None,
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
    /// The connector's secret-capable settings: its type's name, its `secret_refs` and the
    /// field they may fill (`password`, the only secret so far).
    pub(crate) fn secret_slot(&mut self) -> (&'static str, &[SecretRef], &mut Option<Secret>) {
        let type_name = self.type_name();
        match self {
            ConnectorKind::PostgresSource(c) => (type_name, &c.secret_refs, &mut c.password),
            ConnectorKind::MysqlSink(c) => (type_name, &c.secret_refs, &mut c.password),
            ConnectorKind::SqlServerSource(c) => (type_name, &c.secret_refs, &mut c.password),
            ConnectorKind::PostgresSink(c) => (type_name, &c.secret_refs, &mut c.password),
        }
    }

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

/// Changes of some of a source's tables go, through an optional transform, to every listed
/// sink.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename = "a route `{ from, to }`")]
pub struct Route {
    /// A source connector's name.
    #[serde(deserialize_with = "values::non_empty")]
    pub from: String,
    /// Sink connector names; non-empty, no duplicates, none fed by another route.
    #[serde(deserialize_with = "super::routes::sink_names")]
    pub to: Vec<String>,
    /// The source tables it takes (`tables:`); `None`: every table no other route lists.
    #[serde(default, deserialize_with = "super::routes::route_tables")]
    pub tables: Option<Vec<RouteTable>>,
    /// The WebAssembly transform changes pass through before the lanes (`transform:`).
    #[serde(default)]
    pub transform: Option<super::transform::TransformSpec>,
    /// Where the route is in the file (`file:line: routes[i]`), for messages.
    #[serde(skip)]
    pub at: String,
    /// Where its transform's `module` and `config` are, for errors found when the module is
    /// compiled (a step of its own: loading a file never compiles WebAssembly).
    #[serde(skip)]
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

/// The name only: where it is written is filled in by the route checks.
impl<'de> Deserialize<'de> for RouteTable {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(RouteTable {
            name: values::non_empty(d)?,
            at: String::new(),
        })
    }
}

/// The lane settings every sink type has (`lanes`, `batch_size`, ... `dead_letter_table`),
/// as the runtime takes them.
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
}

#[cfg(test)]
mod tests {
    use super::super::{LoadOptions, load_str};
    use super::*;

    #[test]
    fn connector_lookup_and_kind_helpers() {
        let opts = LoadOptions {
            secrets_dir: None,
            env: Box::new(|_| None),
        };
        let text = "name: p\nconnectors:\n  - name: src\n    type: source/postgres\n    host: h\n    \
                    database: d\n    user: u\n    publication: p\n    slot_name: s\n  - name: out\n    \
                    type: sink/mysql\n    password: pw-value\nroutes:\n  - from: src\n    to: [out]\n";
        let p = load_str("p.yaml", text, &opts).unwrap();
        let c = p.connector("out").unwrap();
        assert!(c.kind.is_sink() && !c.kind.is_source());
        assert_eq!(c.kind.type_name(), "sink/mysql");
        assert!(p.connector("nope").is_none());
        let debug = format!("{p:?}");
        assert!(!debug.contains("pw-value") && debug.contains("<redacted>"));
        assert_eq!(p.settings.progress_interval, Duration::from_secs(5));
    }
}
