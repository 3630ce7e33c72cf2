//! Pipeline configuration: YAML file → validated [`Pipeline`], read once.
//!
//! Loading runs in three passes, each reporting `file:line: field.path: message`
//! ([`ConfigError`]):
//!
//! 1. serde-saphyr parses the text into a located tree (`tree`): every node knows its field
//!    path and line; syntax errors carry line and column;
//! 2. `interpolate` expands `${VAR}` / `${VAR:-default}` in every string value;
//! 3. the typed model is deserialized from the tree with serde (`deserializer`): each
//!    connector type is one `#[derive(Deserialize)]` struct with `deny_unknown_fields`,
//!    defaults and field readers (`values`), which its connector takes as it is; then what
//!    needs more than one field: `secret_refs` are resolved (`secrets`), pipeline-dependent
//!    defaults filled in and routes checked against the connectors (`routes`).
//!
//! The first problem found stops loading. Secret values never reach an error; they stay a
//! [`Secret`] until a driver's connect call. Loading never compiles WebAssembly:
//! [`check_transforms`] does, as a step of its own. Operator documentation:
//! `docs/connectors/README.md` (file format, interpolation, secrets) and one page per
//! connector type.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny};

mod connectors;
mod defaults;
mod deserializer;
mod error;
mod interpolate;
mod model;
mod mysql_sink;
mod postgres_sink;
mod postgres_source;
mod routes;
mod secrets;
mod sqlserver;
mod tls;
mod transform;
mod tree;
mod values;

pub use error::ConfigError;
pub use model::{
    Connector, ConnectorKind, Location, Pipeline, Route, RouteTable, Settings, SinkTuning,
};
pub use mysql_sink::MysqlSink;
pub use postgres_sink::PostgresSink;
pub use postgres_source::{OnTableRecreate, PostgresSnapshot, PostgresSource};
pub use routes::check_transforms;
pub use secrets::{Secret, SecretRef};
pub use sqlserver::{SqlServerSnapshot, SqlServerSource};
pub use tls::{ClientCert, RootCerts, SslMode, Tls};
pub use transform::{OnError, TransformLimits, TransformSpec};

use tree::{Ctx, LineIndex, Node, Value, child_index};

/// An environment lookup: variable name → value, `None` when unset.
pub type EnvLookup = dyn Fn(&str) -> Option<String> + Send + Sync;

/// Where `${VAR}` values and secrets come from.
pub struct LoadOptions {
    /// Directory of secret files (`<dir>/<ref>`), consulted after `ZIPLINE_SECRET_*` variables.
    pub secrets_dir: Option<PathBuf>,
    /// Environment lookup, for `${VAR}` and `ZIPLINE_SECRET_*`; injectable for tests.
    pub env: Box<EnvLookup>,
}

impl LoadOptions {
    /// Reads variables from the process environment. A variable whose value is not valid
    /// Unicode counts as unset.
    pub fn from_process_env(secrets_dir: Option<PathBuf>) -> Self {
        LoadOptions {
            secrets_dir,
            env: Box::new(|name| std::env::var(name).ok()),
        }
    }
}

impl fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadOptions")
            .field("secrets_dir", &self.secrets_dir)
            .finish_non_exhaustive()
    }
}

/// Loads and validates the pipeline file at `path`; errors are labelled with `path` as given.
pub fn load(path: &Path, opts: &LoadOptions) -> std::result::Result<Pipeline, ConfigError> {
    let label = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(
            &label,
            None,
            "",
            format!("cannot read configuration file: {e}"),
        )
    })?;
    load_str(&label, &text, opts)
}

/// Loads and validates pipeline YAML `text`; `file_label` prefixes every error.
pub fn load_str(
    file_label: &str,
    text: &str,
    opts: &LoadOptions,
) -> std::result::Result<Pipeline, ConfigError> {
    let root = interpolated(file_label, text, opts)?;
    let index = LineIndex::build(&root);
    let ctx = Ctx {
        file: file_label,
        index: &index,
    };
    parse_pipeline(&ctx, &root, opts)
}

/// The located tree of `text` with `${VAR}` expanded.
fn interpolated(
    file_label: &str,
    text: &str,
    opts: &LoadOptions,
) -> std::result::Result<Node, ConfigError> {
    let mut root = tree::parse(file_label, text)?;
    interpolate::interpolate_tree(&mut root, &*opts.env).map_err(|(path, line, message)| {
        ConfigError::new(file_label, Some(line).filter(|&l| l > 0), path, message)
    })?;
    Ok(root)
}

/// The top level of the file. `connectors` and `routes` are only checked to be non-empty
/// lists here; their items are read one by one after, with what they need.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename = "a pipeline")]
struct Document {
    #[serde(deserialize_with = "values::identifier")]
    name: String,
    #[serde(rename = "connectors", deserialize_with = "connector_list")]
    _connectors: IgnoredAny,
    /// Required, but checked after the connectors, whose errors come first in the file.
    #[serde(rename = "routes", default, deserialize_with = "route_list")]
    _routes: Option<IgnoredAny>,
    #[serde(default)]
    settings: Settings,
}

fn connector_list<'de, D: Deserializer<'de>>(d: D) -> Result<IgnoredAny, D::Error> {
    Vec::<IgnoredAny>::deserialize(d).map(|_| IgnoredAny)
}

fn route_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IgnoredAny>, D::Error> {
    Vec::<IgnoredAny>::deserialize(d).map(|_| Some(IgnoredAny))
}

fn parse_pipeline(
    ctx: &Ctx<'_>,
    root: &Node,
    opts: &LoadOptions,
) -> std::result::Result<Pipeline, ConfigError> {
    if root.value == Value::Null {
        return Err(ConfigError::new(
            ctx.file,
            None,
            "",
            "the file is empty; expected a pipeline with `name`, `connectors` and `routes`",
        ));
    }
    let document: Document = deserializer::from_node(ctx.file, root)?;
    if root.get("connectors").is_none_or(|c| c.items().is_empty()) {
        return Err(ctx.err("connectors", "at least one connector is required"));
    }
    let mut connectors: Vec<Connector> = Vec::new();
    for item in root.get("connectors").map(Node::items).unwrap_or_default() {
        let c = connectors::parse_connector(ctx, item, opts, &document.name)?;
        if let Some(j) = connectors.iter().position(|d| d.name == c.name) {
            let first = child_index("connectors", j);
            return Err(ctx.err(
                &format!("{}.name", item.path),
                format!(
                    "duplicate connector name `{}` (first defined at {first}, line {})",
                    c.name,
                    ctx.line(&first)
                ),
            ));
        }
        connectors.push(c);
    }
    let routes = match root.get("routes") {
        Some(node) if node.items().is_empty() => {
            return Err(ctx.err("routes", "at least one route is required"));
        }
        Some(node) => routes::parse_routes(ctx, node, &connectors)?,
        None => return Err(ctx.err("routes", "required field is missing")),
    };
    Ok(Pipeline {
        name: document.name,
        connectors,
        routes,
        settings: document.settings,
    })
}

/// Loads one `connectors` entry on its own (a mapping such as `name: out\ntype: sink/mysql`),
/// as in a pipeline named `pipeline`: for tools and tests that need one connector's settings
/// without a whole pipeline file (no routes are checked).
pub fn load_connector(
    file_label: &str,
    text: &str,
    pipeline: &str,
    opts: &LoadOptions,
) -> std::result::Result<Connector, ConfigError> {
    let root = interpolated(file_label, text, opts)?;
    let index = LineIndex::build(&root);
    let ctx = Ctx {
        file: file_label,
        index: &index,
    };
    connectors::parse_connector(&ctx, &root, opts, pipeline)
}

/// The connector `entry` as loaded with no environment, for unit tests that need one.
#[cfg(test)]
pub(crate) fn connector_for_tests(entry: &str) -> ConnectorKind {
    let opts = LoadOptions {
        secrets_dir: None,
        env: Box::new(|_| None),
    };
    load_connector("test.yaml", entry, "p", &opts)
        .expect("the test connector loads")
        .kind
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The product's own example, verbatim.
    const EXAMPLE: &str = r#"name: orders
connectors:
  - name: orders-db
    type: source/postgres
    host: "${POSTGRES_HOST}"
    port: "${POSTGRES_PORT}"
    database: "${POSTGRES_DATABASE}"
    user: "${POSTGRES_USER}"
    publication: "${POSTGRES_PUBLICATION}"
    slot_name: "${POSTGRES_SLOT_NAME}"
    secret_refs:
      - { field: password, ref: postgres-password }
  - name: mysql-out
    type: sink/mysql
    # required config: /connectors/mysql
routes:
  - from: orders-db
    to: [mysql-out]
"#;

    const EXAMPLE_ENV: &[(&str, &str)] = &[
        ("POSTGRES_HOST", "pg.internal"),
        ("POSTGRES_PORT", "6432"),
        ("POSTGRES_DATABASE", "shop"),
        ("POSTGRES_USER", "replicator"),
        ("POSTGRES_PUBLICATION", "zipline_pub"),
        ("POSTGRES_SLOT_NAME", "zipline_orders"),
        ("ZIPLINE_SECRET_POSTGRES_PASSWORD", "s3cr3t-pw"),
    ];

    fn opts_without(skip: &str) -> LoadOptions {
        LoadOptions {
            secrets_dir: None,
            env: Box::new({
                let skip = skip.to_owned();
                move |name| {
                    EXAMPLE_ENV
                        .iter()
                        .find(|(k, _)| *k == name && *k != skip)
                        .map(|(_, v)| (*v).to_owned())
                }
            }),
        }
    }

    fn example_err(skip: &str) -> String {
        load_str("orders.yaml", EXAMPLE, &opts_without(skip))
            .unwrap_err()
            .to_string()
    }

    fn no_env() -> LoadOptions {
        LoadOptions {
            secrets_dir: None,
            env: Box::new(|_| None),
        }
    }

    fn err(text: &str) -> String {
        load_str("f.yaml", text, &no_env()).unwrap_err().to_string()
    }

    #[test]
    fn example_loads_verbatim() {
        let p = load_str("orders.yaml", EXAMPLE, &opts_without("")).unwrap();
        assert_eq!(p.name, "orders");
        assert_eq!(p.connectors.len(), 2);
        let ConnectorKind::PostgresSource(src) = &p.connector("orders-db").unwrap().kind else {
            panic!("orders-db is not a postgres source");
        };
        assert_eq!(src.host, "pg.internal");
        assert_eq!(src.port, 6432);
        assert_eq!(src.database, "shop");
        assert_eq!(src.user, "replicator");
        assert_eq!(src.publication, "zipline_pub");
        assert_eq!(src.slot_name, "zipline_orders");
        assert_eq!(src.password.as_ref().map(Secret::expose), Some("s3cr3t-pw"));
        assert_eq!(src.tables, None);
        let ConnectorKind::MysqlSink(sink) = &p.connector("mysql-out").unwrap().kind else {
            panic!("mysql-out is not a mysql sink");
        };
        assert_eq!(sink.database, "orders");
        assert_eq!(sink.host, "127.0.0.1");
        let [route] = p.routes.as_slice() else {
            panic!("one route: {:?}", p.routes);
        };
        assert_eq!(
            (&route.from, &route.to, &route.tables, &route.transform),
            (
                &"orders-db".to_owned(),
                &vec!["mysql-out".to_owned()],
                &None,
                &None
            )
        );
        assert!(route.at.ends_with(": routes[0]"), "{}", route.at);
        assert_eq!(p.settings.progress_interval, Duration::from_secs(5));
        let debug = format!("{p:?}");
        assert!(!debug.contains("s3cr3t-pw"), "{debug}");
        assert!(debug.contains("<redacted>"));
    }

    #[test]
    fn example_errors_name_file_line_and_field() {
        assert_eq!(
            example_err("POSTGRES_SLOT_NAME"),
            "orders.yaml:10: connectors[0].slot_name: environment variable POSTGRES_SLOT_NAME is not set"
        );
        assert_eq!(
            example_err("POSTGRES_HOST"),
            "orders.yaml:5: connectors[0].host: environment variable POSTGRES_HOST is not set"
        );
        assert_eq!(
            example_err("ZIPLINE_SECRET_POSTGRES_PASSWORD"),
            "orders.yaml:12: connectors[0].secret_refs[0].ref: secret `postgres-password` not found: \
             environment variable ZIPLINE_SECRET_POSTGRES_PASSWORD is not set and no secrets \
             directory is configured"
        );
    }

    #[test]
    fn quoted_port_from_env_must_be_numeric() {
        let opts = LoadOptions {
            secrets_dir: None,
            env: Box::new(|name| match name {
                "POSTGRES_PORT" => Some("54x2".into()),
                _ => EXAMPLE_ENV
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned()),
            }),
        };
        assert_eq!(
            load_str("orders.yaml", EXAMPLE, &opts)
                .unwrap_err()
                .to_string(),
            "orders.yaml:6: connectors[0].port: expected a non-negative whole number, found `54x2`"
        );
    }

    #[test]
    fn secret_from_file_and_secret_never_in_errors() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("postgres-password"), "file-pw\n").unwrap();
        let mut opts = opts_without("ZIPLINE_SECRET_POSTGRES_PASSWORD");
        opts.secrets_dir = Some(dir.path().to_path_buf());
        let p = load_str("orders.yaml", EXAMPLE, &opts).unwrap();
        let ConnectorKind::PostgresSource(src) = &p.connectors[0].kind else {
            panic!("connector 0 is not the source");
        };
        assert_eq!(src.password.as_ref().unwrap().expose(), "file-pw");

        // A later error after the secret was read must not carry it.
        let broken = EXAMPLE.replace("to: [mysql-out]", "to: [nope]");
        let e = load_str("orders.yaml", &broken, &opts).unwrap_err();
        assert!(!e.to_string().contains("file-pw") && !format!("{e:?}").contains("file-pw"));
        assert_eq!(e.line(), Some(18));
    }

    #[test]
    fn defaults_and_escapes_in_interpolation() {
        let text = "name: \"${PIPE:-orders}\"\nconnectors:\n  - name: src\n    type: source/postgres\n    \
                    host: \"$${literal}\"\n    database: d\n    user: u\n    publication: p\n    \
                    slot_name: s\n  - name: out\n    type: sink/mysql\n    port: ${MY_PORT:-3307}\n\
                    routes:\n  - from: src\n    to: [out]\n";
        let p = load_str("f.yaml", text, &no_env()).unwrap();
        assert_eq!(p.name, "orders");
        let ConnectorKind::PostgresSource(src) = &p.connectors[0].kind else {
            panic!("connector 0 is not the source");
        };
        assert_eq!(src.host, "${literal}");
        let ConnectorKind::MysqlSink(sink) = &p.connectors[1].kind else {
            panic!("connector 1 is not the sink");
        };
        assert_eq!((sink.port, sink.database.as_str()), (3307, "orders"));
    }

    #[test]
    fn malformed_yaml_has_line_and_column() {
        assert_eq!(
            err("name: a\n  bad: [\n"),
            "f.yaml:2:6: invalid YAML: mapping values are not allowed in this context"
        );
        // The parser (serde-saphyr's) words this one its own way; the place is what matters.
        assert!(
            err("a: [1, 2\nb: 3\n").starts_with("f.yaml:2:2: invalid YAML: "),
            "{}",
            err("a: [1, 2\nb: 3\n")
        );
        assert!(err("a: 1\n---\nb: 2\n").contains("more than one document"));
    }

    #[test]
    fn duplicate_keys_point_at_the_repetition() {
        assert_eq!(
            err("name: x\nconnectors:\n  - name: a\n    type: sink/mysql\n    name: b\n"),
            "f.yaml:5: connectors[0].name: duplicate key (first at line 3)"
        );
    }

    #[test]
    fn top_level_errors() {
        assert_eq!(
            err(""),
            "f.yaml: the file is empty; expected a pipeline with `name`, `connectors` and `routes`"
        );
        assert_eq!(
            err("- a\n"),
            "f.yaml:1: expected a pipeline (a mapping), found a list"
        );
        assert_eq!(
            err("name: x\nsetings: {}\n"),
            "f.yaml:2: setings: unknown field `setings`; expected one of: name, connectors, routes, settings"
        );
        assert_eq!(
            err("connectors: []\n"),
            "f.yaml:1: name: required field is missing"
        );
        assert_eq!(
            err("name: \"orders v2\"\n"),
            "f.yaml:1: name: invalid name `orders v2`: use 1 to 63 letters, digits, `-` and `_` \
             (names are used in slot and checkpoint identifiers)"
        );
        assert_eq!(err("name: \"\"\n"), "f.yaml:1: name: must not be empty");
        assert_eq!(
            err("name: x\n"),
            "f.yaml:1: connectors: required field is missing"
        );
        assert_eq!(
            err("name: x\nconnectors: []\n"),
            "f.yaml:2: connectors: at least one connector is required"
        );
        assert_eq!(
            err("name: x\nconnectors:\n  - name: a\n    type: sink/mysql\n"),
            "f.yaml:1: routes: required field is missing"
        );
        assert_eq!(
            err(
                "name: x\nconnectors:\n  - name: a\n    type: sink/mysql\n  - name: a\n    type: sink/mysql\n"
            ),
            "f.yaml:5: connectors[1].name: duplicate connector name `a` (first defined at connectors[0], line 3)"
        );
        assert_eq!(
            err("name: x\nconnectors:\n  - type: sink/mysql\n"),
            "f.yaml:3: connectors[0].name: required field is missing"
        );
        assert_eq!(
            err("name: x\nconnectors:\n  - name: a\n"),
            "f.yaml:3: connectors[0].type: required field is missing"
        );
        assert_eq!(
            err("name: x\nconnectors:\n  - name: a\n    type: 7\n"),
            "f.yaml:4: connectors[0].type: expected a string, found a number; quote the value so \
             YAML keeps it as written"
        );
    }

    #[test]
    fn settings() {
        let base = EXAMPLE.to_owned();
        let with = |s: &str| format!("{base}settings:\n{s}");
        let p = load_str(
            "o.yaml",
            &with("  progress_interval: 250ms\n"),
            &opts_without(""),
        )
        .unwrap();
        assert_eq!(p.settings.progress_interval, Duration::from_millis(250));
        let e = load_str("o.yaml", &with("  progress: 1s\n"), &opts_without("")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "o.yaml:20: settings.progress: unknown field `progress`; expected one of: progress_interval, instance_lease, drain_timeout, metrics"
        );
        let e = load_str(
            "o.yaml",
            &with("  progress_interval: 5\n"),
            &opts_without(""),
        )
        .unwrap_err();
        assert_eq!(
            (e.line(), e.field()),
            (Some(20), "settings.progress_interval")
        );
    }

    #[test]
    fn settings_metrics_is_an_ip_and_port_or_nothing() {
        let base = EXAMPLE.to_owned();
        let with = |s: &str| format!("{base}settings:\n{s}");
        let p = load_str("o.yaml", &base, &opts_without("")).unwrap();
        assert_eq!(p.settings.metrics, None, "off by default");
        let p = load_str(
            "o.yaml",
            &with("  metrics: 127.0.0.1:9464\n"),
            &opts_without(""),
        )
        .unwrap();
        assert_eq!(p.settings.metrics, Some("127.0.0.1:9464".parse().unwrap()));
        let p = load_str(
            "o.yaml",
            &with("  metrics: \"[::1]:0\"\n"),
            &opts_without(""),
        )
        .unwrap();
        assert_eq!(p.settings.metrics, Some("[::1]:0".parse().unwrap()));
        for bad in ["localhost:9464", "127.0.0.1", "9464", "127.0.0.1:99999"] {
            let e = load_str(
                "o.yaml",
                &with(&format!("  metrics: \"{bad}\"\n")),
                &opts_without(""),
            )
            .unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "o.yaml:20: settings.metrics: {bad:?} is not an address to listen on: \
                     expected IP:port, such as 127.0.0.1:9464, 0.0.0.0:9464 or [::1]:9464"
                )
            );
        }
    }

    #[test]
    fn load_reads_a_file_and_reports_unreadable_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.yaml");
        std::fs::write(&path, EXAMPLE).unwrap();
        let p = load(&path, &opts_without("")).unwrap();
        assert_eq!(p.name, "orders");

        let e = load(&path, &opts_without("POSTGRES_USER")).unwrap_err();
        assert_eq!(e.file(), path.display().to_string());
        assert_eq!(e.line(), Some(8));

        let missing = dir.path().join("nope.yaml");
        let e = load(&missing, &opts_without("")).unwrap_err();
        assert_eq!(e.line(), None);
        assert!(
            e.to_string().starts_with(&format!(
                "{}: cannot read configuration file: ",
                missing.display()
            )),
            "{e}"
        );
    }

    #[test]
    fn process_env_options() {
        let opts = LoadOptions::from_process_env(Some(PathBuf::from("/run/secrets")));
        assert_eq!((opts.env)("PATH"), std::env::var("PATH").ok());
        assert_eq!(
            format!("{opts:?}"),
            "LoadOptions { secrets_dir: Some(\"/run/secrets\"), .. }"
        );
    }
}
