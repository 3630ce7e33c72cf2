//! `sink/postgres`: the connector's settings, defaults and checks (operator reference:
//! `docs/connectors/postgres-sink.md`). The sink takes this type as it is loaded.

use std::time::Duration;

use serde::Deserialize;
use serde::de::{Deserializer, Error as _};

use super::model::SinkTuning;
use super::mysql_sink::{dead_letter_table, dead_letter_table_default, lanes};
use super::secrets::{Secret, SecretRef};
use super::transform::OnError;
use super::values::PG_NAME_MAX;
use super::{defaults, values};

/// `sink/postgres`: PostgreSQL, written by parallel keyed lanes with idempotent batches.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename = "a connector")]
pub struct PostgresSink {
    /// The connector's name, for logs, errors and checkpoint keys.
    #[serde(deserialize_with = "values::identifier")]
    pub name: String,
    /// The connector type as written (`sink/postgres`).
    #[serde(rename = "type")]
    pub type_name: String,
    /// Where secret-capable fields come from instead (resolved into them at load).
    #[serde(default)]
    pub secret_refs: Vec<SecretRef>,
    /// Server host name or address. Required.
    #[serde(deserialize_with = "values::non_empty")]
    pub host: String,
    /// Server port. Default 5432.
    #[serde(default = "defaults::u16_::<5432>", deserialize_with = "values::port")]
    pub port: u16,
    /// Target database. Required; at most 63 bytes.
    #[serde(deserialize_with = "pg_name")]
    pub database: String,
    /// User. Required.
    #[serde(deserialize_with = "values::non_empty")]
    pub user: String,
    /// From `password:` or `secret_refs`; `None` for trust/peer authentication.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Schema of every target table (and of the checkpoint table); `None`: each source
    /// table's own schema (checkpoints in `public`).
    #[serde(default, deserialize_with = "some_pg_name")]
    pub schema: Option<String>,
    /// Create missing target tables with the source's column types. Default false.
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
    /// Time allowed for opening a connection. Default 10s.
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
    /// The dead-letter table, in the checkpoint schema (`on_error: dead_letter`; read by
    /// `zipline dlq`). Default `_zipline_dead_letters`.
    #[serde(
        default = "dead_letter_table_default",
        deserialize_with = "dead_letter_table"
    )]
    pub dead_letter_table: String,
}

impl PostgresSink {
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

/// A database or schema name.
fn pg_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = values::non_empty(d)?;
    if s.len() > PG_NAME_MAX {
        return Err(D::Error::custom(format_args!(
            "name is {} bytes; PostgreSQL names are at most {PG_NAME_MAX} bytes",
            s.len()
        )));
    }
    Ok(s)
}

fn some_pg_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    pg_name(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::super::{ConnectorKind, LoadOptions, OnError, Pipeline, load_str};
    use super::*;

    const HEAD: &str = "\
name: orders
connectors:
  - name: src
    type: source/postgres
    host: db
    database: app
    user: repl
    publication: pub
    slot_name: zipline_orders
  - name: out
    type: sink/postgres
";
    const TAIL: &str = "routes:\n  - from: src\n    to: [out]\n";

    fn opts(vars: &[(&str, &str)]) -> LoadOptions {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        LoadOptions {
            secrets_dir: None,
            env: Box::new(move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())),
        }
    }

    /// Loads HEAD + `fields` (the sink's fields, from line 12 on) + TAIL.
    fn load(fields: &str, o: &LoadOptions) -> std::result::Result<Pipeline, String> {
        load_str("p.yaml", &format!("{HEAD}{fields}{TAIL}"), o).map_err(|e| e.to_string())
    }

    fn sink(p: &Pipeline) -> &PostgresSink {
        match &p.connectors[1].kind {
            ConnectorKind::PostgresSink(s) => s,
            other => panic!("connector 1 is {}", other.type_name()),
        }
    }

    const REQUIRED: &str = "    host: replica\n    database: shop\n    user: writer\n";

    #[test]
    fn defaults() {
        let p = load(REQUIRED, &opts(&[])).unwrap();
        let k = sink(&p);
        assert_eq!(p.connectors[1].kind.type_name(), "sink/postgres");
        assert!(p.connectors[1].kind.is_sink() && !p.connectors[1].kind.is_source());
        assert_eq!(
            (
                k.host.as_str(),
                k.port,
                k.database.as_str(),
                k.user.as_str()
            ),
            ("replica", 5432, "shop", "writer")
        );
        assert!(k.password.is_none() && k.schema.is_none() && !k.create_tables);
        assert_eq!(
            (k.lanes, k.batch_size, k.queue_capacity, k.on_error),
            (4, 1000, 4096, OnError::Halt)
        );
        assert_eq!(k.max_wait, Duration::from_millis(20));
        assert_eq!(k.connect_timeout, Duration::from_secs(10));
    }

    #[test]
    fn every_field_set() {
        let fields = "    host: replica
    port: \"6432\"
    database: shop
    user: writer
    schema: mirror
    create_tables: true
    lanes: 8
    batch_size: 500
    max_wait: 5ms
    queue_capacity: 100
    connect_timeout: 3s
    on_error: skip
    sink_outage_timeout: 90s
    secret_refs: [{ field: password, ref: pg-sink-pw }]
";
        let o = opts(&[("ZIPLINE_SECRET_PG_SINK_PW", "s3cret")]);
        let p = load(fields, &o).unwrap();
        let k = sink(&p);
        assert_eq!(k.port, 6432);
        assert_eq!(k.password.as_ref().unwrap().expose(), "s3cret");
        assert_eq!(k.schema.as_deref(), Some("mirror"));
        assert!(k.create_tables);
        assert_eq!(
            (k.lanes, k.batch_size, k.queue_capacity, k.on_error),
            (8, 500, 100, OnError::Skip)
        );
        assert_eq!(k.max_wait, Duration::from_millis(5));
        assert_eq!(k.outage_timeout, Duration::from_secs(90));
        assert_eq!(k.connect_timeout, Duration::from_secs(3));
        let debug = format!("{p:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
    }

    #[test]
    fn errors_are_located() {
        let o = opts(&[]);
        let long = "s".repeat(64);
        let cases: Vec<(String, String)> = vec![
            (
                "    database: shop\n    user: writer\n".to_owned(),
                "p.yaml:10: connectors[1].host: required field is missing".to_owned(),
            ),
            (
                format!("{REQUIRED}    create_tables: yes-please\n"),
                "p.yaml:15: connectors[1].create_tables: expected true or false, found a string"
                    .to_owned(),
            ),
            (
                format!("{REQUIRED}    schema: {long}\n"),
                "p.yaml:15: connectors[1].schema: name is 64 bytes; PostgreSQL names are at \
                 most 63 bytes"
                    .to_owned(),
            ),
            (
                format!("{REQUIRED}    lanes: 0\n"),
                "p.yaml:15: connectors[1].lanes: must be between 1 and 256, found 0".to_owned(),
            ),
            (
                format!("{REQUIRED}    slot_name: x\n"),
                "p.yaml:15: connectors[1].slot_name: unknown field `slot_name`; expected one \
                 of: name, type, secret_refs, host, port, database, user, password, schema, \
                 create_tables, lanes, batch_size, max_wait, queue_capacity, connect_timeout, \
                 statement_timeout, sink_outage_timeout, on_error, dead_letter_table"
                    .to_owned(),
            ),
            (
                format!(
                    "{REQUIRED}    password: inline\n    secret_refs: [{{ field: password, ref: x }}]\n"
                ),
                "p.yaml:16: connectors[1].secret_refs[0].field: `password` is set both inline \
                 (line 15) and by this secret ref; remove one"
                    .to_owned(),
            ),
        ];
        for (fields, want) in &cases {
            let got = load(fields, &o).unwrap_err();
            assert!(
                got.starts_with(want.as_str()),
                "fields:\n{fields}\ngot:  {got}\nwant: {want}"
            );
        }
    }
}
