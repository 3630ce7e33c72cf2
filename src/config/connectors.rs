//! Connector entries: the `type` dispatch, each type's fields and defaults, and `secret_refs`.
//!
//! The operator-facing reference for every field here is `docs/connectors/` (one page per type);
//! keep the two in step. Checks run in file-reading order and the first failure is returned:
//! `name`, `type`, unknown keys, the `secret_refs` entries, then the type's fields in the order
//! of [`PostgresSource`] / [`MysqlSink`] (a secret is resolved when its field is read).

use std::collections::HashSet;
use std::time::Duration;

use serde_yaml::Value;

use super::LoadOptions;
use super::fields::{
    Ctx, Fields, Result, boolean, duration, identifier, list, non_empty, port, positive, retries,
};
use super::locate::child_index;
use super::model::{
    Connector, ConnectorKind, MysqlSink, OnTableRecreate, PostgresSnapshot, PostgresSource,
    SinkTuning,
};
use super::secrets::{SecretRef, secret_field, secret_refs};
use super::transform::OnError;

const SOURCE_POSTGRES: &str = "source/postgres";
const SINK_MYSQL: &str = "sink/mysql";
const KNOWN_TYPES: &str = "source/postgres, source/sqlserver, sink/mysql, sink/postgres";

const POSTGRES_FIELDS: &[&str] = &[
    "name",
    "type",
    "secret_refs",
    "host",
    "port",
    "database",
    "user",
    "password",
    "publication",
    "slot_name",
    "tables",
    "connect_timeout",
    "connect_retries",
    "status_interval",
    "receive_timeout",
    "stream_in_progress",
    "spill_dir",
    "snapshot",
    "snapshot_parallelism",
    "snapshot_chunk_rows",
    "slot_warn_bytes",
    "heartbeat_interval",
    "on_table_recreate",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
];

const MYSQL_FIELDS: &[&str] = &[
    "name",
    "type",
    "secret_refs",
    "host",
    "port",
    "database",
    "user",
    "password",
    "create_tables",
    "lanes",
    "batch_size",
    "max_wait",
    "queue_capacity",
    "connect_timeout",
    "statement_timeout",
    "sink_outage_timeout",
    "on_error",
    "dead_letter_table",
    "ssl_mode",
    "ssl_ca",
    "ssl_cert",
    "ssl_key",
];

/// Fields that may come from `secret_refs`, the same for both types for now.
const SECRET_FIELDS: &[&str] = &["password"];

/// Reads `connectors[i]`. `pipeline` is the pipeline name (the MySQL `database` default).
pub(crate) fn parse_connector(
    ctx: &Ctx<'_>,
    value: &Value,
    path: &str,
    opts: &LoadOptions,
    pipeline: &str,
) -> Result<Connector> {
    let f = Fields::new(ctx, value, path, "a connector")?;
    let name = f.required("name", &identifier)?;
    let type_name = f.required("type", &non_empty)?;
    let kind = match type_name.as_str() {
        SOURCE_POSTGRES => {
            f.deny_unknown(POSTGRES_FIELDS)?;
            let refs = secret_refs(&f, SOURCE_POSTGRES, SECRET_FIELDS)?;
            ConnectorKind::PostgresSource(postgres(&f, &refs, opts)?)
        }
        SINK_MYSQL => {
            f.deny_unknown(MYSQL_FIELDS)?;
            let refs = secret_refs(&f, SINK_MYSQL, SECRET_FIELDS)?;
            ConnectorKind::MysqlSink(mysql(&f, &refs, opts, pipeline)?)
        }
        super::postgres_sink::TYPE => {
            f.deny_unknown(super::postgres_sink::FIELDS)?;
            let refs = secret_refs(&f, super::postgres_sink::TYPE, SECRET_FIELDS)?;
            ConnectorKind::PostgresSink(super::postgres_sink::parse(&f, &refs, opts)?)
        }
        super::sqlserver::TYPE => {
            f.deny_unknown(super::sqlserver::FIELDS)?;
            let refs = secret_refs(&f, super::sqlserver::TYPE, SECRET_FIELDS)?;
            ConnectorKind::SqlServerSource(super::sqlserver::parse(&f, &refs, opts)?)
        }
        other => {
            return Err(ctx.err(
                &f.field_path("type"),
                format!("unknown connector type `{other}`; known types: {KNOWN_TYPES}"),
            ));
        }
    };
    Ok(Connector { name, kind })
}

fn postgres(f: &Fields<'_>, refs: &[SecretRef], opts: &LoadOptions) -> Result<PostgresSource> {
    Ok(PostgresSource {
        host: f.required("host", &non_empty)?,
        port: f.optional("port", &port)?.unwrap_or(5432),
        database: f.required("database", &non_empty)?,
        user: f.required("user", &non_empty)?,
        password: secret_field(f, "password", refs, opts)?,
        publication: f.required("publication", &publication)?,
        slot_name: f.required("slot_name", &slot_name)?,
        tables: f.optional("tables", &tables)?,
        connect_timeout: f
            .optional("connect_timeout", &duration)?
            .unwrap_or(Duration::from_secs(10)),
        connect_retries: f.optional("connect_retries", &retries)?.unwrap_or(5),
        status_interval: f
            .optional("status_interval", &duration)?
            .unwrap_or(Duration::from_secs(10)),
        receive_timeout: f
            .optional("receive_timeout", &duration)?
            .unwrap_or(Duration::from_secs(60)),
        stream_in_progress: f.optional("stream_in_progress", &boolean)?.unwrap_or(true),
        spill_dir: f
            .optional("spill_dir", &non_empty)?
            .map(std::path::PathBuf::from),
        snapshot: f
            .optional("snapshot", &postgres_snapshot)?
            .unwrap_or(PostgresSnapshot::Initial),
        snapshot_parallelism: f
            .optional("snapshot_parallelism", &positive::<u32>(64))?
            .unwrap_or(2),
        snapshot_chunk_rows: f
            .optional("snapshot_chunk_rows", &positive::<u64>(COUNT_MAX))?
            .unwrap_or(50_000),
        slot_warn_bytes: f
            .optional("slot_warn_bytes", &super::transform::size)?
            .unwrap_or(1 << 30),
        heartbeat_interval: f.optional("heartbeat_interval", &duration)?,
        on_table_recreate: f
            .optional("on_table_recreate", &on_table_recreate)?
            .unwrap_or(OnTableRecreate::Stop),
        tls: super::tls::postgres(f)?,
    })
}

fn on_table_recreate(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<OnTableRecreate> {
    match non_empty(ctx, path, value)?.as_str() {
        "stop" => Ok(OnTableRecreate::Stop),
        "resnapshot" => Ok(OnTableRecreate::Resnapshot),
        other => Err(ctx.err(
            path,
            format!("unknown policy `{other}`; expected `stop` or `resnapshot`"),
        )),
    }
}

fn postgres_snapshot(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<PostgresSnapshot> {
    match non_empty(ctx, path, value)?.as_str() {
        "initial" => Ok(PostgresSnapshot::Initial),
        "never" => Ok(PostgresSnapshot::Never),
        "when_needed" => Ok(PostgresSnapshot::WhenNeeded),
        other => Err(ctx.err(
            path,
            format!(
                "unknown snapshot mode `{other}`; expected `initial`, `never` or `when_needed`"
            ),
        )),
    }
}

fn mysql(
    f: &Fields<'_>,
    refs: &[SecretRef],
    opts: &LoadOptions,
    pipeline: &str,
) -> Result<MysqlSink> {
    Ok(MysqlSink {
        host: f
            .optional("host", &non_empty)?
            .unwrap_or_else(|| "127.0.0.1".to_owned()),
        port: f.optional("port", &port)?.unwrap_or(3306),
        database: f
            .optional("database", &mysql_database)?
            .unwrap_or_else(|| pipeline.to_owned()),
        user: f
            .optional("user", &non_empty)?
            .unwrap_or_else(|| "root".to_owned()),
        password: secret_field(f, "password", refs, opts)?,
        create_tables: f.optional("create_tables", &boolean)?.unwrap_or(false),
        tuning: sink_tuning(f)?,
        tls: super::tls::mysql(f)?,
    })
}

/// The lane fields of any sink type.
pub(super) fn sink_tuning(f: &Fields<'_>) -> Result<SinkTuning> {
    Ok(SinkTuning {
        lanes: f.optional("lanes", &positive::<u32>(256))?.unwrap_or(4),
        batch_size: f
            .optional("batch_size", &positive::<usize>(COUNT_MAX))?
            .unwrap_or(1000),
        max_wait: f
            .optional("max_wait", &duration)?
            .unwrap_or(Duration::from_millis(20)),
        queue_capacity: f
            .optional("queue_capacity", &positive::<usize>(COUNT_MAX))?
            .unwrap_or(4096),
        connect_timeout: f
            .optional("connect_timeout", &duration)?
            .unwrap_or(Duration::from_secs(10)),
        statement_timeout: f
            .optional("statement_timeout", &duration)?
            .unwrap_or(Duration::from_secs(60)),
        outage_timeout: f
            .optional("sink_outage_timeout", &duration)?
            .unwrap_or(Duration::from_secs(300)),
        on_error: f
            .optional("on_error", &sink_on_error)?
            .unwrap_or(OnError::Halt),
        dead_letter_table: f
            .optional("dead_letter_table", &table_name)?
            .unwrap_or_else(|| DEAD_LETTER_TABLE.to_owned()),
    })
}

/// The default `dead_letter_table`.
pub(crate) const DEAD_LETTER_TABLE: &str = "_zipline_dead_letters";

fn sink_on_error(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<OnError> {
    match non_empty(ctx, path, value)?.as_str() {
        "halt" => Ok(OnError::Halt),
        "skip" => Ok(OnError::Skip),
        "dead_letter" => Ok(OnError::DeadLetter),
        other => Err(ctx.err(
            path,
            format!("unknown policy `{other}`; expected halt, skip or dead_letter"),
        )),
    }
}

/// A table name both MySQL (64 characters) and PostgreSQL (63 bytes) take as written.
fn table_name(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<String> {
    let s = non_empty(ctx, path, value)?;
    let plain = s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !s.starts_with(|c: char| c.is_ascii_digit());
    if !plain || s.len() > PG_NAME_MAX {
        return Err(ctx.err(
            path,
            format!(
                "invalid table name `{s}`: use letters, digits and underscores (not first), at \
                 most {PG_NAME_MAX} characters"
            ),
        ));
    }
    Ok(s)
}

/// Upper bound for batch and queue sizes: far above any sane value, and fits `usize` on
/// 32-bit targets.
const COUNT_MAX: u64 = u32::MAX as u64;

/// PostgreSQL names are at most NAMEDATALEN - 1 = 63 bytes; longer ones are truncated by the
/// server, which would make Zipline address a different object than configured.
const PG_NAME_MAX: usize = 63;

fn publication(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<String> {
    let s = non_empty(ctx, path, value)?;
    if s.len() > PG_NAME_MAX {
        return Err(ctx.err(
            path,
            format!(
                "publication name is {} bytes; PostgreSQL names are at most {PG_NAME_MAX} bytes",
                s.len()
            ),
        ));
    }
    Ok(s)
}

fn slot_name(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<String> {
    let s = non_empty(ctx, path, value)?;
    let valid_chars = s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !valid_chars || s.len() > PG_NAME_MAX {
        return Err(ctx.err(
            path,
            format!(
                "invalid replication slot name `{s}`: PostgreSQL allows only lower-case letters, \
                 digits and underscores, at most {PG_NAME_MAX} characters"
            ),
        ));
    }
    Ok(s)
}

/// `tables: [orders, sales.items]` → `["public.orders", "sales.items"]`.
fn tables(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<Vec<String>> {
    let items = list(ctx, path, value)?;
    if items.is_empty() {
        return Err(ctx.err(
            path,
            "empty table list; omit `tables` to replicate every table in the publication",
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let item_path = child_index(path, i);
        let name = non_empty(ctx, &item_path, item)?;
        let parts: Vec<&str> = name.split('.').collect();
        let qualified = match parts.as_slice() {
            [table] if !table.trim().is_empty() => format!("public.{table}"),
            [schema, table] if !schema.trim().is_empty() && !table.trim().is_empty() => {
                name.clone()
            }
            _ => {
                return Err(ctx.err(
                    &item_path,
                    format!("invalid table `{name}`: expected `schema.table` or `table`"),
                ));
            }
        };
        if !seen.insert(qualified.clone()) {
            return Err(ctx.err(&item_path, format!("table `{qualified}` is listed twice")));
        }
        out.push(qualified);
    }
    Ok(out)
}

fn mysql_database(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<String> {
    let s = non_empty(ctx, path, value)?;
    if s.chars().count() > 64 {
        return Err(ctx.err(path, "MySQL database names are at most 64 characters"));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::super::{LoadOptions, load_str};
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
            (
                k.tuning.lanes,
                k.tuning.batch_size,
                k.tuning.queue_capacity,
                k.tuning.on_error
            ),
            (4, 1000, 4096, OnError::Halt)
        );
        assert_eq!(k.tuning.max_wait, Duration::from_millis(20));
        assert_eq!(k.tuning.connect_timeout, Duration::from_secs(10));
        assert_eq!(k.tuning.dead_letter_table, "_zipline_dead_letters");
        assert_eq!(k.tuning.outage_timeout, Duration::from_secs(300));
        assert_eq!(k.tuning.statement_timeout, Duration::from_secs(60));
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
            (
                k.tuning.lanes,
                k.tuning.batch_size,
                k.tuning.queue_capacity,
                k.tuning.on_error
            ),
            (256, 50, 100, OnError::DeadLetter)
        );
        assert_eq!(k.tuning.max_wait, Duration::from_millis(5));
        assert_eq!(k.tuning.connect_timeout, Duration::from_secs(60));
        assert_eq!(k.tuning.dead_letter_table, "my_dead");
        assert_eq!(k.tuning.outage_timeout, Duration::from_secs(120));
        assert_eq!(k.tuning.statement_timeout, Duration::from_secs(15));
        let debug = format!("{p:?}");
        assert!(!debug.contains("m-secret") && !debug.contains("inline-pw"));
    }

    #[test]
    fn field_errors_are_located() {
        let o = opts(&[]);
        let cases: &[(&str, &str)] = &[
            (
                "    hots: x\n",
                "p.yaml:10: connectors[0].hots: unknown field `hots`; expected one of: name, type, secret_refs, host, port, database, user, password, publication, slot_name, tables, connect_timeout, connect_retries, status_interval, receive_timeout, stream_in_progress, spill_dir, snapshot, snapshot_parallelism, snapshot_chunk_rows, slot_warn_bytes, heartbeat_interval, on_table_recreate",
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
