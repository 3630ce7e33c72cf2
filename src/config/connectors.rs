//! Connector entries: the `type` dispatch into each type's serde-derived settings
//! (`postgres_source`, `sqlserver`, `mysql_sink`, `postgres_sink`), then what needs the whole
//! entry: `secret_refs`, defaults that depend on the pipeline, and checks across list items.
//!
//! The operator-facing reference for every field is `docs/connectors/` (one page per type);
//! keep the two in step. The entry's `name` and `type` are checked first, then its fields in
//! file order; the first failure is returned.

use super::LoadOptions;
use super::deserializer::{DeError, from_node};
use super::model::{Connector, ConnectorKind};
use super::mysql_sink::MysqlSink;
use super::postgres_sink::PostgresSink;
use super::postgres_source::{self, PostgresSource};
use super::sqlserver::{self, SqlServerSource};
use super::tree::{Ctx, Node, Value, child_index, child_key};
use super::values;
use super::{ConfigError, secrets};

const KNOWN_TYPES: &str = "source/postgres, source/sqlserver, sink/mysql, sink/postgres";

/// Reads `connectors[i]` (`node`). `pipeline` is the pipeline name (the MySQL `database` and
/// the spill directory defaults).
pub(crate) fn parse_connector(
    ctx: &Ctx<'_>,
    node: &Node,
    opts: &LoadOptions,
    pipeline: &str,
) -> Result<Connector, ConfigError> {
    if !matches!(node.value, Value::Map(_)) {
        return Err(ctx.err(
            &node.path,
            format!(
                "expected a connector (a mapping), found {}",
                node.value.kind()
            ),
        ));
    }
    let name = field(ctx, node, "name", values::identifier)?;
    let type_name = field(ctx, node, "type", values::non_empty)?;
    let file = ctx.file;
    let tls_err = |key: &str, message: String| ctx.err(&child_key(&node.path, key), message);
    let kind = match type_name.as_str() {
        "source/postgres" => {
            let mut c: PostgresSource = from_node(file, node)?;
            if c.spill_dir.as_os_str().is_empty() {
                c.spill_dir = PostgresSource::default_spill_dir(pipeline, &c.slot_name);
            }
            if let Some(tables) = &c.tables
                && let Some((i, message)) = postgres_source::repeated_table(tables)
            {
                let tables_path = child_key(&node.path, "tables");
                return Err(ctx.err(&child_index(&tables_path, i), message));
            }
            c.tls = super::tls::postgres(&super::tls::Raw {
                mode: c.sslmode.as_deref(),
                roots: c.sslrootcert.as_deref(),
                cert: c.sslcert.as_deref(),
                key: c.sslkey.as_deref(),
                err: &tls_err,
            })?;
            ConnectorKind::PostgresSource(c)
        }
        "sink/mysql" => {
            let mut c: MysqlSink = from_node(file, node)?;
            if c.database.is_empty() {
                c.database = pipeline.to_owned();
            }
            c.tls = super::tls::mysql(&super::tls::Raw {
                mode: c.ssl_mode.as_deref(),
                roots: c.ssl_ca.as_deref(),
                cert: c.ssl_cert.as_deref(),
                key: c.ssl_key.as_deref(),
                err: &tls_err,
            })?;
            ConnectorKind::MysqlSink(c)
        }
        "sink/postgres" => {
            let mut c: PostgresSink = from_node(file, node)?;
            c.tls = super::tls::postgres(&super::tls::Raw {
                mode: c.sslmode.as_deref(),
                roots: c.sslrootcert.as_deref(),
                cert: c.sslcert.as_deref(),
                key: c.sslkey.as_deref(),
                err: &tls_err,
            })?;
            ConnectorKind::PostgresSink(c)
        }
        "source/sqlserver" => {
            let mut c: SqlServerSource = from_node(file, node)?;
            c.tls = sqlserver::tls(&c, node, &tls_err)?;
            if let Some((i, message)) = sqlserver::repeated_table(&c.tables) {
                let tables_path = child_key(&node.path, "tables");
                return Err(ctx.err(&child_index(&tables_path, i), message));
            }
            ConnectorKind::SqlServerSource(c)
        }
        other => {
            return Err(ctx.err(
                &child_key(&node.path, "type"),
                format!("unknown connector type `{other}`; known types: {KNOWN_TYPES}"),
            ));
        }
    };
    let mut connector = Connector { name, kind };
    secrets::resolve_refs(ctx, &node.path, &mut connector, opts)?;
    Ok(connector)
}

/// A required field of `node`, read by `read` (one of the `values` readers) and located.
pub(crate) fn field<'n, T>(
    ctx: &Ctx<'_>,
    node: &'n Node,
    key: &str,
    read: fn(&'n Node) -> Result<T, DeError>,
) -> Result<T, ConfigError> {
    match node.get(key) {
        Some(child) => read(child).map_err(|e| e.at(child).into_config(ctx.file)),
        None => Err(ctx.err(&child_key(&node.path, key), "required field is missing")),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{LoadOptions, OnError, PostgresSnapshot, load_str};
    use super::*;

    const BASE: &str = "\
name: orders
connectors:
  - name: src
    type: source/postgres
    host: db
    database: app
    user: repl
    publication: pub
    slot_name: zipline_orders
";
    const TAIL: &str =
        "  - name: out\n    type: sink/mysql\nroutes:\n  - from: src\n    to: [out]\n";

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

    /// Loads BASE + `extra` (appended to the postgres connector, at line 10 on) + TAIL.
    fn load_with(
        extra: &str,
        o: &LoadOptions,
    ) -> std::result::Result<super::super::Pipeline, String> {
        load_str("p.yaml", &format!("{BASE}{extra}{TAIL}"), o).map_err(|e| e.to_string())
    }

    fn source(p: &super::super::Pipeline) -> &PostgresSource {
        match &p.connectors[0].kind {
            ConnectorKind::PostgresSource(s) => s,
            _ => panic!("connector 0 is not the source"),
        }
    }

    fn sink(p: &super::super::Pipeline) -> &MysqlSink {
        match &p.connectors[1].kind {
            ConnectorKind::MysqlSink(s) => s,
            _ => panic!("connector 1 is not the sink"),
        }
    }

    #[test]
    fn defaults() {
        let p = load_with("", &opts(&[])).unwrap();
        let s = source(&p);
        assert_eq!(
            (s.port, s.password.is_none(), s.tables.is_none()),
            (5432, true, true)
        );
        assert_eq!(s.connect_timeout, Duration::from_secs(10));
        assert_eq!(s.connect_retries, 5);
        assert_eq!(s.status_interval, Duration::from_secs(10));
        let k = sink(&p);
        assert_eq!(
            (k.host.as_str(), k.port, k.user.as_str()),
            ("127.0.0.1", 3306, "root")
        );
        assert_eq!(k.database, "orders");
        assert!(k.password.is_none());
        assert_eq!(
            (k.lanes, k.batch_size, k.queue_capacity, k.on_error),
            (4, 1000, 4096, OnError::Halt)
        );
        assert_eq!(k.max_wait, Duration::from_millis(20));
        assert_eq!(k.connect_timeout, Duration::from_secs(10));
        assert_eq!(k.dead_letter_table, "_zipline_dead_letters");
        assert_eq!(k.outage_timeout, Duration::from_secs(300));
        assert_eq!(k.statement_timeout, Duration::from_secs(60));
    }

    #[test]
    fn snapshot_settings() {
        let p = load_with("", &opts(&[])).unwrap();
        let s = source(&p);
        assert_eq!(
            (s.snapshot, s.snapshot_parallelism, s.snapshot_chunk_rows),
            (PostgresSnapshot::Initial, 2, 50_000)
        );
        let extra =
            "    snapshot: never\n    snapshot_parallelism: 8\n    snapshot_chunk_rows: 1000\n";
        let p = load_with(extra, &opts(&[])).unwrap();
        let s = source(&p);
        assert_eq!(
            (s.snapshot, s.snapshot_parallelism, s.snapshot_chunk_rows),
            (PostgresSnapshot::Never, 8, 1000)
        );
        let err = load_with("    snapshot: always\n", &opts(&[])).unwrap_err();
        assert_eq!(
            err,
            "p.yaml:10: connectors[0].snapshot: unknown snapshot mode `always`; expected \
             `initial`, `never` or `when_needed`"
        );
        let err = load_with("    snapshot_parallelism: 65\n", &opts(&[])).unwrap_err();
        assert!(
            err.starts_with(
                "p.yaml:10: connectors[0].snapshot_parallelism: must be between 1 and 64"
            ),
            "{err}"
        );
        let err = load_with("    snapshot_chunk_rows: 0\n", &opts(&[])).unwrap_err();
        assert!(
            err.starts_with("p.yaml:10: connectors[0].snapshot_chunk_rows: must be between 1"),
            "{err}"
        );
    }

    #[test]
    fn every_field_set() {
        let extra = "    port: 6543\n    password: inline-pw\n    tables: [orders, sales.items]\n    \
                     connect_timeout: 3s\n    connect_retries: 0\n    status_interval: 1.5s\n";
        let tail = "  - name: out
    type: sink/mysql
    host: my.internal
    port: \"3307\"
    database: target
    user: writer
    lanes: 256
    batch_size: 50
    max_wait: 5ms
    queue_capacity: 100
    connect_timeout: 1m
    on_error: dead_letter
    dead_letter_table: my_dead
    sink_outage_timeout: 2m
    statement_timeout: 15s
    secret_refs: [{ field: password, ref: mysql-pw }]
routes:
  - from: src
    to: [out]
";
        let o = opts(&[("ZIPLINE_SECRET_MYSQL_PW", "m-secret")]);
        let p = load_str("p.yaml", &format!("{BASE}{extra}{tail}"), &o).unwrap();
        let s = source(&p);
        assert_eq!(s.port, 6543);
        assert_eq!(s.password.as_ref().unwrap().expose(), "inline-pw");
        assert_eq!(
            s.tables.as_deref().unwrap(),
            ["public.orders", "sales.items"]
        );
        assert_eq!(s.connect_timeout, Duration::from_secs(3));
        assert_eq!(s.connect_retries, 0);
        assert_eq!(s.status_interval, Duration::from_millis(1500));
        let k = sink(&p);
        assert_eq!((k.host.as_str(), k.port), ("my.internal", 3307));
        assert_eq!((k.database.as_str(), k.user.as_str()), ("target", "writer"));
        assert_eq!(k.password.as_ref().unwrap().expose(), "m-secret");
        assert_eq!(
            (k.lanes, k.batch_size, k.queue_capacity, k.on_error),
            (256, 50, 100, OnError::DeadLetter)
        );
        assert_eq!(k.max_wait, Duration::from_millis(5));
        assert_eq!(k.connect_timeout, Duration::from_secs(60));
        assert_eq!(k.dead_letter_table, "my_dead");
        assert_eq!(k.outage_timeout, Duration::from_secs(120));
        assert_eq!(k.statement_timeout, Duration::from_secs(15));
        let debug = format!("{p:?}");
        assert!(!debug.contains("m-secret") && !debug.contains("inline-pw"));
    }

    #[test]
    fn field_errors_are_located() {
        let o = opts(&[]);
        let cases: &[(&str, &str)] = &[
            (
                "    hots: x\n",
                "p.yaml:10: connectors[0].hots: unknown field `hots`; expected one of: name, type, secret_refs, host, port, database, user, password, publication, slot_name, tables, connect_timeout, connect_retries, status_interval, receive_timeout, stream_in_progress, binary_values, spill_dir, snapshot, snapshot_parallelism, snapshot_chunk_rows, slot_warn_bytes, heartbeat_interval, on_table_recreate, sslmode, sslrootcert, sslcert, sslkey",
            ),
            (
                "    port: 0\n",
                "p.yaml:10: connectors[0].port: must be between 1 and 65535, found 0",
            ),
            (
                "    port: \"${NOPE:-99999}\"\n",
                "p.yaml:10: connectors[0].port: must be between 1 and 65535, found 99999",
            ),
            (
                "    tables: []\n",
                "p.yaml:10: connectors[0].tables: empty table list; omit `tables` to replicate every table in the publication",
            ),
            (
                "    tables:\n      - a\n      - a.b.c\n",
                "p.yaml:12: connectors[0].tables[1]: invalid table `a.b.c`: expected `schema.table` or `table`",
            ),
            (
                "    tables: [a, public.a]\n",
                "p.yaml:10: connectors[0].tables[1]: table `public.a` is listed twice",
            ),
            (
                "    status_interval: 0s\n",
                "p.yaml:10: connectors[0].status_interval: duration `0s` must be greater than zero",
            ),
            (
                "    connect_retries: -1\n",
                "p.yaml:10: connectors[0].connect_retries: expected a non-negative whole number, found -1",
            ),
            (
                "    password: 1234\n",
                "p.yaml:10: connectors[0].password: expected a string, found a number; quote the value so YAML keeps it as written",
            ),
        ];
        for (extra, want) in cases {
            assert_eq!(load_with(extra, &o).unwrap_err(), *want, "extra: {extra}");
        }
    }

    #[test]
    fn name_and_identifier_errors() {
        let o = opts(&[]);
        let text = BASE.replace("slot_name: zipline_orders", "slot_name: Zipline-Orders");
        assert_eq!(
            load_str("p.yaml", &format!("{text}{TAIL}"), &o)
                .unwrap_err()
                .to_string(),
            "p.yaml:9: connectors[0].slot_name: invalid replication slot name `Zipline-Orders`: \
             PostgreSQL allows only lower-case letters, digits and underscores, at most 63 characters"
        );
        let text = BASE.replace(
            "slot_name: zipline_orders",
            &format!("slot_name: {}", "a".repeat(64)),
        );
        assert!(
            load_str("p.yaml", &format!("{text}{TAIL}"), &o)
                .unwrap_err()
                .to_string()
                .starts_with("p.yaml:9: connectors[0].slot_name: invalid replication slot name")
        );
        let text = BASE.replace(
            "publication: pub",
            &format!("publication: {}", "p".repeat(64)),
        );
        assert_eq!(
            load_str("p.yaml", &format!("{text}{TAIL}"), &o)
                .unwrap_err()
                .to_string(),
            "p.yaml:8: connectors[0].publication: publication name is 64 bytes; PostgreSQL names are at most 63 bytes"
        );
        let text = BASE.replace("    host: db\n", "");
        assert_eq!(
            load_str("p.yaml", &format!("{text}{TAIL}"), &o)
                .unwrap_err()
                .to_string(),
            "p.yaml:3: connectors[0].host: required field is missing"
        );
        let text = BASE.replace("source/postgres", "source/kafka");
        assert_eq!(
            load_str("p.yaml", &format!("{text}{TAIL}"), &o)
                .unwrap_err()
                .to_string(),
            "p.yaml:4: connectors[0].type: unknown connector type `source/kafka`; known types: source/postgres, source/sqlserver, sink/mysql, sink/postgres"
        );
    }

    #[test]
    fn sink_errors() {
        let o = opts(&[]);
        let tail = TAIL.replace("type: sink/mysql", "type: sink/mysql\n    lanes: 257\n");
        assert_eq!(
            load_str("p.yaml", &format!("{BASE}{tail}"), &o)
                .unwrap_err()
                .to_string(),
            "p.yaml:12: connectors[1].lanes: must be between 1 and 256, found 257"
        );
        for (key, value) in [
            ("batch_size", "0"),
            ("queue_capacity", "0"),
            ("max_wait", "0ms"),
        ] {
            let tail = TAIL.replace(
                "type: sink/mysql",
                &format!("type: sink/mysql\n    {key}: {value}"),
            );
            let err = load_str("p.yaml", &format!("{BASE}{tail}"), &o).unwrap_err();
            assert_eq!(
                (err.line(), err.field()),
                (Some(12), format!("connectors[1].{key}").as_str())
            );
        }
        let tail = TAIL.replace("type: sink/mysql", "type: sink/mysql\n    slot_name: x");
        assert_eq!(
            load_str("p.yaml", &format!("{BASE}{tail}"), &o)
                .unwrap_err()
                .field(),
            "connectors[1].slot_name"
        );
    }
}
