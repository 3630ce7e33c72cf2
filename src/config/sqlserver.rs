//! The `source/sqlserver` connector's fields, defaults and checks (operator reference:
//! `docs/connectors/sqlserver-source.md`). Fields are read in the order of
//! [`SqlServerSource`]; the first failure is returned.

use std::collections::HashSet;
use std::time::Duration;

use serde_yaml::Value;

use super::LoadOptions;
use super::fields::{Ctx, Fields, Result, duration, kind, list, non_empty, port, retries};
use super::locate::child_index;
use super::model::{SqlServerSnapshot, SqlServerSource};
use super::secrets::{SecretRef, secret_field};

/// The `type` value.
pub(crate) const TYPE: &str = "source/sqlserver";

/// Every key a `source/sqlserver` entry may have.
pub(crate) const FIELDS: &[&str] = &[
    "name",
    "type",
    "secret_refs",
    "host",
    "port",
    "database",
    "user",
    "password",
    "tables",
    "poll_interval",
    "encrypt",
    "trust_server_certificate",
    "snapshot",
    "connect_timeout",
    "connect_retries",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
];

/// SQL Server identifiers (`sysname`) are at most 128 characters.
const SYSNAME_MAX: usize = 128;

/// Reads the type's fields (after `name`, `type`, unknown keys and `secret_refs`).
pub(crate) fn parse(
    f: &Fields<'_>,
    refs: &[SecretRef],
    opts: &LoadOptions,
) -> Result<SqlServerSource> {
    Ok(SqlServerSource {
        host: f.required("host", &non_empty)?,
        port: f.optional("port", &port)?.unwrap_or(1433),
        database: f.required("database", &sysname)?,
        user: f.required("user", &non_empty)?,
        password: secret_field(f, "password", refs, opts)?,
        tables: f.required("tables", &tables)?,
        poll_interval: f
            .optional("poll_interval", &duration)?
            .unwrap_or(Duration::from_millis(500)),
        encrypt: f.optional("encrypt", &boolean)?.unwrap_or(true),
        trust_server_certificate: f
            .optional("trust_server_certificate", &boolean)?
            .unwrap_or(false),
        snapshot: f
            .optional("snapshot", &snapshot)?
            .unwrap_or(SqlServerSnapshot::Initial),
        connect_timeout: f
            .optional("connect_timeout", &duration)?
            .unwrap_or(Duration::from_secs(10)),
        connect_retries: f.optional("connect_retries", &retries)?.unwrap_or(5),
        tls: tls(f)?,
    })
}

/// libpq's TLS vocabulary where SQL Server's driver can honour it: `verify-ca` cannot be (the
/// driver checks the host name whenever it checks the chain), and the older `encrypt` /
/// `trust_server_certificate` pair cannot be mixed with it.
fn tls(f: &Fields<'_>) -> Result<Option<super::tls::Tls>> {
    let Some(given) = super::tls::PG_FIELDS.iter().find(|k| f.get(k).is_some()) else {
        return Ok(None);
    };
    for legacy in ["encrypt", "trust_server_certificate"] {
        if f.get(legacy).is_some() {
            return Err(f.ctx().err(
                &f.field_path(legacy),
                format!(
                    "`{legacy}` cannot be combined with `{given}`; use sslmode (disable, \
                     prefer, require, verify-full) instead"
                ),
            ));
        }
    }
    let tls = super::tls::postgres(f)?;
    if tls.mode == super::tls::SslMode::VerifyCa {
        return Err(f.ctx().err(
            &f.field_path("sslmode"),
            "SQL Server connections cannot check the certificate chain without the host name \
             (the driver always checks both); use `verify-full`, or `require` to skip checks",
        ));
    }
    Ok(Some(tls))
}

fn sysname(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<String> {
    let s = non_empty(ctx, path, value)?;
    if s.chars().count() > SYSNAME_MAX {
        return Err(ctx.err(
            path,
            format!("SQL Server names are at most {SYSNAME_MAX} characters"),
        ));
    }
    Ok(s)
}

/// `tables: [orders, sales.items]` → `[("dbo", "orders"), ("sales", "items")]`.
fn tables(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<Vec<(String, String)>> {
    let items = list(ctx, path, value)?;
    if items.is_empty() {
        return Err(ctx.err(
            path,
            "empty table list; name at least one table (`schema.table`)",
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let item_path = child_index(path, i);
        let name = non_empty(ctx, &item_path, item)?;
        let parts: Vec<&str> = name.split('.').collect();
        let (schema, table) = match parts.as_slice() {
            [table] => ("dbo", *table),
            [schema, table] => (*schema, *table),
            _ => ("", ""),
        };
        let valid = |s: &str| !s.trim().is_empty() && s.chars().count() <= SYSNAME_MAX;
        if !valid(schema) || !valid(table) {
            return Err(ctx.err(
                &item_path,
                format!(
                    "invalid table `{name}`: expected `schema.table` or `table` (schema dbo), \
                     names of 1 to {SYSNAME_MAX} characters"
                ),
            ));
        }
        // SQL Server's usual collations compare names case-insensitively.
        if !seen.insert((schema.to_lowercase(), table.to_lowercase())) {
            return Err(ctx.err(
                &item_path,
                format!("table `{schema}.{table}` is listed twice"),
            ));
        }
        out.push((schema.to_owned(), table.to_owned()));
    }
    Ok(out)
}

/// `true`/`false`, also as the strings an interpolated `${VAR}` leaves.
fn boolean(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<bool> {
    match value {
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s == "true" => Ok(true),
        Value::String(s) if s == "false" => Ok(false),
        other => Err(ctx.err(
            path,
            format!("expected true or false, found {}", kind(other)),
        )),
    }
}

fn snapshot(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<SqlServerSnapshot> {
    match non_empty(ctx, path, value)?.as_str() {
        "initial" => Ok(SqlServerSnapshot::Initial),
        "never" => Ok(SqlServerSnapshot::Never),
        other => Err(ctx.err(
            path,
            format!("unknown snapshot mode `{other}`; expected `initial` or `never`"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::ConnectorKind;
    use super::super::{LoadOptions, Pipeline, load_str};
    use super::*;

    const HEAD: &str = "\
name: orders
connectors:
  - name: src
    type: source/sqlserver
    host: mssql.internal
    database: shop
    user: zipline
    tables: [orders, sales.items]
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

    /// HEAD with `extra` appended to the source entry (from line 9 on), then TAIL.
    fn load(extra: &str, o: &LoadOptions) -> std::result::Result<Pipeline, String> {
        load_str("p.yaml", &format!("{HEAD}{extra}{TAIL}"), o).map_err(|e| e.to_string())
    }

    fn source(p: &Pipeline) -> &SqlServerSource {
        match &p.connectors[0].kind {
            ConnectorKind::SqlServerSource(s) => s,
            other => panic!("connector 0 is {}", other.type_name()),
        }
    }

    #[test]
    fn defaults() {
        let p = load("", &opts(&[])).unwrap();
        let s = source(&p);
        assert!(p.connectors[0].kind.is_source() && !p.connectors[0].kind.is_sink());
        assert_eq!(p.connectors[0].kind.type_name(), "source/sqlserver");
        assert_eq!((s.host.as_str(), s.port), ("mssql.internal", 1433));
        assert_eq!((s.database.as_str(), s.user.as_str()), ("shop", "zipline"));
        assert!(s.password.is_none());
        assert_eq!(
            s.tables,
            [
                ("dbo".to_owned(), "orders".to_owned()),
                ("sales".to_owned(), "items".to_owned())
            ]
        );
        assert_eq!(s.poll_interval, Duration::from_millis(500));
        assert!(s.encrypt && !s.trust_server_certificate);
        assert_eq!(s.snapshot, SqlServerSnapshot::Initial);
        assert_eq!(s.connect_timeout, Duration::from_secs(10));
        assert_eq!(s.connect_retries, 5);
    }

    #[test]
    fn every_field_set_and_the_password_from_a_secret() {
        let extra = "    port: \"${MSSQL_PORT}\"\n    poll_interval: 2s\n    encrypt: false\n    \
                     trust_server_certificate: \"${TRUST:-true}\"\n    snapshot: never\n    \
                     connect_timeout: 3s\n    connect_retries: 0\n    \
                     secret_refs: [{ field: password, ref: mssql-pw }]\n";
        let o = opts(&[
            ("MSSQL_PORT", "14330"),
            ("ZIPLINE_SECRET_MSSQL_PW", "s3cret-pw"),
        ]);
        let p = load(extra, &o).unwrap();
        let s = source(&p);
        assert_eq!(s.port, 14330);
        assert_eq!(s.password.as_ref().unwrap().expose(), "s3cret-pw");
        assert_eq!(s.poll_interval, Duration::from_secs(2));
        assert!(!s.encrypt && s.trust_server_certificate);
        assert_eq!(s.snapshot, SqlServerSnapshot::Never);
        assert_eq!(s.connect_timeout, Duration::from_secs(3));
        assert_eq!(s.connect_retries, 0);
        assert!(!format!("{p:?}").contains("s3cret-pw"));
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let o = opts(&[]);
        let cases: &[(&str, &str)] = &[
            (
                "    slot_name: x\n",
                "p.yaml:9: connectors[0].slot_name: unknown field `slot_name`; expected one of: \
                 name, type, secret_refs, host, port, database, user, password, tables, \
                 poll_interval, encrypt, trust_server_certificate, snapshot, connect_timeout, \
                 connect_retries",
            ),
            (
                "    snapshot: always\n",
                "p.yaml:9: connectors[0].snapshot: unknown snapshot mode `always`; expected \
                 `initial` or `never`",
            ),
            (
                "    encrypt: yes please\n",
                "p.yaml:9: connectors[0].encrypt: expected true or false, found a string",
            ),
            (
                "    poll_interval: 0s\n",
                "p.yaml:9: connectors[0].poll_interval: duration `0s` must be greater than zero",
            ),
        ];
        for (extra, want) in cases {
            assert_eq!(load(extra, &o).unwrap_err(), *want, "extra: {extra}");
        }
        let bad_tables: &[(&str, &str)] = &[
            (
                "tables: []",
                "p.yaml:8: connectors[0].tables: empty table list; name at least one table (`schema.table`)",
            ),
            (
                "tables: [a.b.c]",
                "p.yaml:8: connectors[0].tables[0]: invalid table `a.b.c`: expected `schema.table` \
                 or `table` (schema dbo), names of 1 to 128 characters",
            ),
            (
                "tables: [Orders, dbo.orders]",
                "p.yaml:8: connectors[0].tables[1]: table `dbo.orders` is listed twice",
            ),
        ];
        for (tables, want) in bad_tables {
            let text = format!(
                "{}{TAIL}",
                HEAD.replace("tables: [orders, sales.items]", tables)
            );
            assert_eq!(
                load_str("p.yaml", &text, &o).unwrap_err().to_string(),
                *want
            );
        }
        let text = format!(
            "{}{TAIL}",
            HEAD.replace("    tables: [orders, sales.items]\n", "")
        );
        assert_eq!(
            load_str("p.yaml", &text, &o).unwrap_err().to_string(),
            "p.yaml:3: connectors[0].tables: required field is missing"
        );
    }
}
