//! Secrets: the [`Secret`] wrapper and `secret_refs` resolution.
//!
//! A `secret_refs` entry `{ field: password, ref: postgres-password }` is looked up first in the
//! environment variable `ZIPLINE_SECRET_POSTGRES_PASSWORD` (the ref upper-cased, `-` → `_`),
//! then in the file `<secrets_dir>/postgres-password` (the Docker/Kubernetes secret-mount
//! convention), with one trailing newline removed. Environment first, so an operator can
//! override a mounted secret for one run without touching the mount.
//!
//! Secret values go straight from there into a [`Secret`]; they never enter the YAML tree, and
//! errors name only the variable and the path, never content.

use std::fmt;
use std::io::ErrorKind;
use std::path::Path;

use serde::{Deserialize, Deserializer};

use super::LoadOptions;
use super::model::Connector;
use super::tree::{Ctx, child_index, child_key};

/// A secret value (a password). `Debug` and `Display` print `<redacted>`; call
/// [`Secret::expose`] only where the value is handed to a driver.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value (for code that builds connector settings without a file, e.g. tests).
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself. Never log or format it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Inline secrets (`password: ...`): a string, whose content no error ever shows.
impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Checks a ref's spelling: it becomes both an environment variable name and a file name, so
/// only letters, digits, `-` and `_` are allowed (no `/`, no `..`).
pub(crate) fn check_ref(reference: &str) -> Result<(), String> {
    if reference.is_empty() {
        return Err("secret ref must not be empty".to_owned());
    }
    if !reference
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "invalid secret ref `{reference}`: use only letters, digits, `-` and `_` \
             (it names an environment variable and a file)"
        ));
    }
    Ok(())
}

/// `postgres-password` → `ZIPLINE_SECRET_POSTGRES_PASSWORD`.
pub(crate) fn env_var_name(reference: &str) -> String {
    format!(
        "ZIPLINE_SECRET_{}",
        reference.to_ascii_uppercase().replace('-', "_")
    )
}

/// Resolves a (checked) ref: environment first, then `<secrets_dir>/<ref>`.
pub(crate) fn resolve(
    reference: &str,
    env: &dyn Fn(&str) -> Option<String>,
    secrets_dir: Option<&Path>,
) -> Result<Secret, String> {
    let var = env_var_name(reference);
    if let Some(value) = env(&var) {
        return Ok(Secret(value));
    }
    let Some(dir) = secrets_dir else {
        return Err(format!(
            "secret `{reference}` not found: environment variable {var} is not set and no \
             secrets directory is configured"
        ));
    };
    let file = dir.join(reference);
    match std::fs::read(&file) {
        Ok(bytes) => {
            let mut text = String::from_utf8(bytes).map_err(|_| {
                format!(
                    "secret `{reference}`: file {} is not valid UTF-8",
                    file.display()
                )
            })?;
            // Files written by `echo` or editors end with one newline that is not part of the
            // secret; anything beyond that one is kept as written.
            if text.ends_with('\n') {
                text.pop();
                if text.ends_with('\r') {
                    text.pop();
                }
            }
            Ok(Secret(text))
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Err(format!(
            "secret `{reference}` not found: environment variable {var} is not set and file {} \
             does not exist",
            file.display()
        )),
        Err(e) => Err(format!(
            "secret `{reference}`: environment variable {var} is not set and file {} cannot be \
             read: {}",
            file.display(),
            e.kind()
        )),
    }
}

/// One `secret_refs` entry: which field it fills and the secret's name.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename = "a secret ref `{ field, ref }`")]
pub struct SecretRef {
    /// The secret-capable field it fills, e.g. `password`.
    pub field: String,
    /// The secret's name: `ZIPLINE_SECRET_<REF>` or `<secrets_dir>/<ref>`.
    #[serde(rename = "ref")]
    pub reference: String,
}

/// Fields that may come from `secret_refs`, the same for every type for now.
const SECRET_FIELDS: &[&str] = &["password"];

/// Checks `connectors[i]`'s `secret_refs` and resolves them into its secret field: inline,
/// from a secret ref, or absent — never both.
pub(crate) fn resolve_refs(
    ctx: &Ctx<'_>,
    path: &str,
    connector: &mut Connector,
    opts: &LoadOptions,
) -> Result<(), super::ConfigError> {
    let (type_name, refs, password) = connector.kind.secret_slot();
    let refs_path = child_key(path, "secret_refs");
    for (i, r) in refs.iter().enumerate() {
        let entry = child_index(&refs_path, i);
        let field_path = child_key(&entry, "field");
        if !SECRET_FIELDS.contains(&r.field.as_str()) {
            return Err(ctx.err(
                &field_path,
                format!(
                    "`{}` cannot come from a secret in a {type_name} connector; \
                     secret-capable fields: {}",
                    r.field,
                    SECRET_FIELDS.join(", ")
                ),
            ));
        }
        if let Some(first) = refs[..i].iter().position(|f| f.field == r.field) {
            return Err(ctx.err(
                &field_path,
                format!(
                    "`{}` already comes from the secret ref at line {}",
                    r.field,
                    ctx.line(&child_index(&refs_path, first))
                ),
            ));
        }
        check_ref(&r.reference).map_err(|msg| ctx.err(&child_key(&entry, "ref"), msg))?;
    }
    let Some(i) = refs.iter().position(|r| r.field == "password") else {
        return Ok(());
    };
    let entry = child_index(&refs_path, i);
    if password.is_some() {
        return Err(ctx.err(
            &child_key(&entry, "field"),
            format!(
                "`password` is set both inline (line {}) and by this secret ref; remove one",
                ctx.line(&child_key(path, "password"))
            ),
        ));
    }
    let secret = resolve(&refs[i].reference, &*opts.env, opts.secrets_dir.as_deref())
        .map_err(|msg| ctx.err(&child_key(&entry, "ref"), msg))?;
    *password = Some(secret);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{ConnectorKind, Pipeline, load_str};
    use super::*;

    /// A pipeline whose source connector takes `extra` lines from line 10 on.
    fn load_with(extra: &str, o: &LoadOptions) -> std::result::Result<Pipeline, String> {
        let text = format!(
            "name: p\nconnectors:\n  - name: src\n    type: source/postgres\n    host: db\n    \
             database: app\n    user: repl\n    publication: pub\n    slot_name: s\n{extra}  \
             - name: out\n    type: sink/mysql\nroutes:\n  - from: src\n    to: [out]\n"
        );
        load_str("p.yaml", &text, o).map_err(|e| e.to_string())
    }

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

    fn source_password(p: &Pipeline) -> Option<&str> {
        match &p.connectors[0].kind {
            ConnectorKind::PostgresSource(s) => s.password.as_ref().map(Secret::expose),
            _ => panic!("connector 0 is not the source"),
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn redacted_in_debug_and_display() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(format!("{s}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some(<redacted>)");
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn env_var_names() {
        assert_eq!(
            env_var_name("postgres-password"),
            "ZIPLINE_SECRET_POSTGRES_PASSWORD"
        );
        assert_eq!(env_var_name("My_db-pw"), "ZIPLINE_SECRET_MY_DB_PW");
    }

    #[test]
    fn ref_spelling() {
        assert!(check_ref("postgres-password_2").is_ok());
        assert!(check_ref("").is_err());
        assert!(
            check_ref("../etc/passwd")
                .unwrap_err()
                .contains("`../etc/passwd`")
        );
        assert!(check_ref("a.b").is_err());
    }

    #[test]
    fn env_wins_over_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), "from-file\n").unwrap();
        let env = |name: &str| (name == "ZIPLINE_SECRET_PW").then(|| "from-env".to_owned());
        let s = resolve("pw", &env, Some(dir.path())).unwrap();
        assert_eq!(s.expose(), "from-env");
        let s = resolve("pw", &no_env, Some(dir.path())).unwrap();
        assert_eq!(s.expose(), "from-file");
    }

    #[test]
    fn file_loses_exactly_one_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        for (content, want) in [
            ("a\n", "a"),
            ("a\r\n", "a"),
            ("a\n\n", "a\n"),
            ("a", "a"),
            (" a \n", " a "),
        ] {
            std::fs::write(dir.path().join("s"), content).unwrap();
            assert_eq!(
                resolve("s", &no_env, Some(dir.path())).unwrap().expose(),
                want
            );
        }
    }

    #[test]
    fn missing_everywhere_names_both_places() {
        let dir = tempfile::tempdir().unwrap();
        let err = resolve("postgres-password", &no_env, Some(dir.path())).unwrap_err();
        let file = dir.path().join("postgres-password");
        assert_eq!(
            err,
            format!(
                "secret `postgres-password` not found: environment variable \
                 ZIPLINE_SECRET_POSTGRES_PASSWORD is not set and file {} does not exist",
                file.display()
            )
        );
        let err = resolve("postgres-password", &no_env, None).unwrap_err();
        assert!(err.contains("ZIPLINE_SECRET_POSTGRES_PASSWORD is not set"));
        assert!(err.contains("no secrets directory is configured"));
    }

    #[test]
    fn unreadable_file_names_path_not_content() {
        let dir = tempfile::tempdir().unwrap();
        // A directory in the secret's place cannot be read as a file.
        std::fs::create_dir(dir.path().join("pw")).unwrap();
        let err = resolve("pw", &no_env, Some(dir.path())).unwrap_err();
        assert!(err.contains("cannot be read"), "{err}");
        assert!(err.contains(&dir.path().join("pw").display().to_string()));

        std::fs::remove_dir(dir.path().join("pw")).unwrap();
        std::fs::write(dir.path().join("pw"), [0xff, 0xfe, b's', b'3']).unwrap();
        let err = resolve("pw", &no_env, Some(dir.path())).unwrap_err();
        assert!(err.contains("not valid UTF-8"), "{err}");
    }

    #[test]
    fn secret_ref_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts(&[("ZIPLINE_SECRET_PG", "env-pw")]);
        let refs = |body: &str| format!("    secret_refs:\n      - {body}\n");
        let err = |extra: &str, o: &LoadOptions| load_with(extra, o).unwrap_err();

        assert_eq!(
            err(&refs("{ field: host, ref: pg }"), &o),
            "p.yaml:11: connectors[0].secret_refs[0].field: `host` cannot come from a secret in a \
             source/postgres connector; secret-capable fields: password"
        );
        assert_eq!(
            err(
                &format!("    password: x\n{}", refs("{ field: password, ref: pg }")),
                &o
            ),
            "p.yaml:12: connectors[0].secret_refs[0].field: `password` is set both inline (line 10) \
             and by this secret ref; remove one"
        );
        assert_eq!(
            err(
                &format!(
                    "{}      - {{ field: password, ref: pg }}\n",
                    refs("{ field: password, ref: pg }")
                ),
                &o
            ),
            "p.yaml:12: connectors[0].secret_refs[1].field: `password` already comes from the secret \
             ref at line 11"
        );
        assert_eq!(
            err(&refs("{ field: password, ref: pg, extra: 1 }"), &o),
            "p.yaml:11: connectors[0].secret_refs[0].extra: unknown field `extra`; expected one of: field, ref"
        );
        assert!(
            err(&refs("{ field: password, ref: ../x }"), &o).starts_with(
                "p.yaml:11: connectors[0].secret_refs[0].ref: invalid secret ref `../x`"
            )
        );

        o.secrets_dir = Some(dir.path().to_path_buf());
        let missing = dir.path().join("other");
        assert_eq!(
            err(&refs("{ field: password, ref: other }"), &o),
            format!(
                "p.yaml:11: connectors[0].secret_refs[0].ref: secret `other` not found: environment \
                 variable ZIPLINE_SECRET_OTHER is not set and file {} does not exist",
                missing.display()
            )
        );
    }

    #[test]
    fn secrets_from_env_and_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pg"), "file-pw\n").unwrap();
        std::fs::write(dir.path().join("only-file"), "only-file-pw\n").unwrap();
        let mut o = opts(&[("ZIPLINE_SECRET_PG", "env-pw")]);
        o.secrets_dir = Some(dir.path().to_path_buf());
        let extra = "    secret_refs: [{ field: password, ref: pg }]\n";
        let p = load_with(extra, &o).unwrap();
        assert_eq!(source_password(&p), Some("env-pw"));
        let extra = "    secret_refs: [{ field: password, ref: only-file }]\n";
        let p = load_with(extra, &o).unwrap();
        assert_eq!(source_password(&p), Some("only-file-pw"));
        let debug = format!("{p:?}");
        assert!(!debug.contains("only-file-pw") && debug.contains("password: Some(<redacted>)"));
    }
}
