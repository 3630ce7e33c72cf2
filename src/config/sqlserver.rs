//! `source/sqlserver`: the connector's settings, defaults and checks (operator reference:
//! `docs/connectors/sqlserver-source.md`). The source takes this type as it is loaded.

use std::collections::HashSet;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{Deserializer, Error as _};

use super::secrets::{Secret, SecretRef};
use super::{defaults, values};

/// SQL Server identifiers (`sysname`) are at most 128 characters.
const SYSNAME_MAX: usize = 128;

/// `source/sqlserver`: SQL Server change data capture, polled from the change tables.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename = "a connector")]
pub struct SqlServerSource {
    /// The connector's name, for logs and errors.
    #[serde(deserialize_with = "values::identifier")]
    pub name: String,
    /// The connector type as written (`source/sqlserver`).
    #[serde(rename = "type")]
    pub type_name: String,
    /// Where secret-capable fields come from instead (resolved into them at load).
    #[serde(default)]
    pub secret_refs: Vec<SecretRef>,
    /// Server host name or address. Required.
    #[serde(deserialize_with = "values::non_empty")]
    pub host: String,
    /// Server port. Default 1433.
    #[serde(default = "defaults::u16_::<1433>", deserialize_with = "values::port")]
    pub port: u16,
    /// Database with CDC enabled. Required.
    #[serde(deserialize_with = "sysname")]
    pub database: String,
    /// SQL Server login. Required.
    #[serde(deserialize_with = "values::non_empty")]
    pub user: String,
    /// From `password:` or `secret_refs`; `None` sends an empty password.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Tables to replicate as `(schema, table)`; `table` alone is `dbo.table`. Required,
    /// non-empty.
    #[serde(deserialize_with = "tables")]
    pub tables: Vec<(String, String)>,
    /// Pause between polls of the change tables that found nothing new. Default 500ms.
    #[serde(
        default = "defaults::millis::<500>",
        deserialize_with = "values::duration"
    )]
    pub poll_interval: Duration,
    /// Encrypt the connection with TLS, failing if the server cannot. Default true.
    #[serde(default = "defaults::yes", deserialize_with = "values::boolean")]
    pub encrypt: bool,
    /// Accept the server certificate without validating it. Default false.
    #[serde(default, deserialize_with = "values::boolean")]
    pub trust_server_certificate: bool,
    /// Copy the existing rows before streaming when the sinks hold no position. Default
    /// [`SqlServerSnapshot::Initial`].
    #[serde(default)]
    pub snapshot: SqlServerSnapshot,
    /// Time allowed for one connection attempt. Default 10s.
    #[serde(
        default = "defaults::secs::<10>",
        deserialize_with = "values::duration"
    )]
    pub connect_timeout: Duration,
    /// Further attempts after a failed connect before giving up. Default 5.
    #[serde(default = "defaults::u32_::<5>", deserialize_with = "values::retries")]
    pub connect_retries: u32,
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
    pub tls: Option<super::tls::Tls>,
}

/// `snapshot:` of `source/sqlserver`: whether a pipeline without a durable frontier first
/// copies the tables' current rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SqlServerSnapshot {
    /// `initial`: copy the tables' rows (consistently with the change stream), then stream.
    #[default]
    Initial,
    /// `never`: stream only changes committed after the first start.
    Never,
}

impl<'de> Deserialize<'de> for SqlServerSnapshot {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        values::keyword(
            d,
            &[
                ("initial", SqlServerSnapshot::Initial),
                ("never", SqlServerSnapshot::Never),
            ],
            "snapshot mode",
            "`initial` or `never`",
        )
    }
}

fn sysname<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = values::non_empty(d)?;
    if s.chars().count() > SYSNAME_MAX {
        return Err(D::Error::custom(format_args!(
            "SQL Server names are at most {SYSNAME_MAX} characters"
        )));
    }
    Ok(s)
}

/// `tables: [orders, sales.items]` → `[("dbo", "orders"), ("sales", "items")]`; each item is
/// checked where it is written.
fn tables<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, String)>, D::Error> {
    let items = Vec::<SqlServerTable>::deserialize(d)?;
    if items.is_empty() {
        return Err(D::Error::custom(
            "empty table list; name at least one table (`schema.table`)",
        ));
    }
    Ok(items.into_iter().map(|t| (t.0, t.1)).collect())
}

struct SqlServerTable(String, String);

impl<'de> Deserialize<'de> for SqlServerTable {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = values::non_empty(d)?;
        let parts: Vec<&str> = name.split('.').collect();
        let (schema, table) = match parts.as_slice() {
            [table] => ("dbo", *table),
            [schema, table] => (*schema, *table),
            _ => ("", ""),
        };
        let valid = |s: &str| !s.trim().is_empty() && s.chars().count() <= SYSNAME_MAX;
        if !valid(schema) || !valid(table) {
            return Err(D::Error::custom(format_args!(
                "invalid table `{name}`: expected `schema.table` or `table` (schema dbo), \
                 names of 1 to {SYSNAME_MAX} characters"
            )));
        }
        Ok(SqlServerTable(schema.to_owned(), table.to_owned()))
    }
}

/// The first table listed twice, as `(index, message)`. SQL Server's usual collations compare
/// names case-insensitively.
pub(crate) fn repeated_table(tables: &[(String, String)]) -> Option<(usize, String)> {
    let mut seen = HashSet::new();
    let i = tables
        .iter()
        .position(|(s, t)| !seen.insert((s.to_lowercase(), t.to_lowercase())))?;
    let (s, t) = &tables[i];
    Some((i, format!("table `{s}.{t}` is listed twice")))
}

/// libpq's TLS vocabulary where SQL Server's driver can honour it: `verify-ca` cannot be (the
/// driver checks the host name whenever it checks the chain), and the older `encrypt` /
/// `trust_server_certificate` pair cannot be mixed with it.
pub(crate) fn tls(
    c: &SqlServerSource,
    node: &super::tree::Node,
    err: &dyn Fn(&str, String) -> super::ConfigError,
) -> Result<Option<super::tls::Tls>, super::ConfigError> {
    let given = [
        ("sslmode", &c.sslmode),
        ("sslrootcert", &c.sslrootcert),
        ("sslcert", &c.sslcert),
        ("sslkey", &c.sslkey),
    ];
    let Some((given, _)) = given.iter().find(|(_, v)| v.is_some()) else {
        return Ok(None);
    };
    for legacy in ["encrypt", "trust_server_certificate"] {
        if node.get(legacy).is_some() {
            return Err(err(
                legacy,
                format!(
                    "`{legacy}` cannot be combined with `{given}`; use sslmode (disable, \
                     prefer, require, verify-full) instead"
                ),
            ));
        }
    }
    let tls = super::tls::postgres(&super::tls::Raw {
        mode: c.sslmode.as_deref(),
        roots: c.sslrootcert.as_deref(),
        cert: c.sslcert.as_deref(),
        key: c.sslkey.as_deref(),
        err,
    })?;
    if tls.mode == super::tls::SslMode::VerifyCa {
        return Err(err(
            "sslmode",
            "SQL Server connections cannot check the certificate chain without the host name \
             (the driver always checks both); use `verify-full`, or `require` to skip checks"
                .into(),
        ));
    }
    Ok(Some(tls))
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
                 connect_retries, sslmode, sslrootcert, sslcert, sslkey",
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
