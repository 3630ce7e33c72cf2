//! The `sink/postgres` connector's fields, defaults and checks (operator reference:
//! `docs/connectors/postgres-sink.md`). Fields are read in the order of [`PostgresSink`]; the
//! first failure is returned.

use serde_yaml::Value;

use super::LoadOptions;
use super::fields::{Ctx, Fields, Result, boolean, non_empty, port};
use super::model::PostgresSink;
use super::secrets::{SecretRef, secret_field};

/// The `type` value.
pub(crate) const TYPE: &str = "sink/postgres";

/// Every key a `sink/postgres` entry may have.
pub(crate) const FIELDS: &[&str] = &[
    "name",
    "type",
    "secret_refs",
    "host",
    "port",
    "database",
    "user",
    "password",
    "schema",
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
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
];

/// PostgreSQL names are at most NAMEDATALEN - 1 = 63 bytes; the server truncates longer ones,
/// which would make Zipline address a different object than configured.
const NAME_MAX: usize = 63;

/// Reads the type's fields (after `name`, `type`, unknown keys and `secret_refs`).
pub(crate) fn parse(
    f: &Fields<'_>,
    refs: &[SecretRef],
    opts: &LoadOptions,
) -> Result<PostgresSink> {
    Ok(PostgresSink {
        host: f.required("host", &non_empty)?,
        port: f.optional("port", &port)?.unwrap_or(5432),
        database: f.required("database", &pg_name)?,
        user: f.required("user", &non_empty)?,
        password: secret_field(f, "password", refs, opts)?,
        schema: f.optional("schema", &pg_name)?,
        create_tables: f.optional("create_tables", &boolean)?.unwrap_or(false),
        tuning: super::connectors::sink_tuning(f)?,
        tls: super::tls::postgres(f)?,
    })
}

/// A database or schema name.
fn pg_name(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<String> {
    let s = non_empty(ctx, path, value)?;
    if s.len() > NAME_MAX {
        return Err(ctx.err(
            path,
            format!(
                "name is {} bytes; PostgreSQL names are at most {NAME_MAX} bytes",
                s.len()
            ),
        ));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::super::{ConnectorKind, LoadOptions, OnError, Pipeline, load_str};
    use super::*;
    use std::time::Duration;

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
    fn tls_fields_follow_libpq() {
        use crate::config::{ClientCert, RootCerts, SslMode, Tls};
        let o = opts(&[]);
        let tls =
            |extra: &str| load(&format!("{REQUIRED}{extra}"), &o).map(|p| sink(&p).tls.clone());
        assert_eq!(tls("").unwrap(), Tls::default());
        assert_eq!(tls("").unwrap().mode, SslMode::Prefer);
        assert_eq!(
            tls("    sslrootcert: system\n").unwrap(),
            Tls {
                mode: SslMode::VerifyFull,
                roots: Some(RootCerts::System),
                client: None
            }
        );
        // libpq: `require` with a CA file verifies the chain.
        assert_eq!(
            tls("    sslmode: require\n    sslrootcert: /ca.pem\n")
                .unwrap()
                .mode,
            SslMode::VerifyCa
        );
        assert_eq!(
            tls("    sslmode: verify-ca\n    sslrootcert: /ca.pem\n    sslcert: /c.crt\n    sslkey: /c.key\n")
                .unwrap(),
            Tls {
                mode: SslMode::VerifyCa,
                roots: Some(RootCerts::File("/ca.pem".into())),
                client: Some(ClientCert { cert: "/c.crt".into(), key: "/c.key".into() }),
            }
        );
        for (extra, want) in [
            (
                "    sslmode: verify-full\n",
                "connectors[1].sslmode: this mode checks the server's certificate and needs `sslrootcert`",
            ),
            (
                "    sslmode: require\n    sslrootcert: system\n",
                "connectors[1].sslmode: sslmode `require` cannot be used with `sslrootcert: system`",
            ),
            (
                "    sslmode: verify_full\n",
                "connectors[1].sslmode: unknown sslmode `verify_full`",
            ),
            (
                "    sslcert: /c.crt\n",
                "connectors[1].sslcert: a client certificate needs its private key in `sslkey` too",
            ),
            (
                "    sslmode: disable\n    sslrootcert: /ca.pem\n",
                "connectors[1].sslmode: TLS is disabled",
            ),
        ] {
            let got = tls(extra).unwrap_err();
            assert!(got.contains(want), "{extra}: got {got}");
        }
    }

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
            (
                k.tuning.lanes,
                k.tuning.batch_size,
                k.tuning.queue_capacity,
                k.tuning.on_error
            ),
            (8, 500, 100, OnError::Skip)
        );
        assert_eq!(k.tuning.max_wait, Duration::from_millis(5));
        assert_eq!(k.tuning.outage_timeout, Duration::from_secs(90));
        assert_eq!(k.tuning.connect_timeout, Duration::from_secs(3));
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
                format!(
                    "p.yaml:15: connectors[1].slot_name: unknown field `slot_name`; expected one \
                     of: {}",
                    FIELDS.join(", ")
                ),
            ),
            (
                format!(
                    "{REQUIRED}    password: inline\n    secret_refs: [{{ field: password, ref: x }}]\n"
                ),
                "p.yaml:16: connectors[1].secret_refs[0].field".to_owned(),
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
