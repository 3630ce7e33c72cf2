//! `${VAR}` interpolation of scalar string values.
//!
//! Runs on the parsed `Value` tree, never on the raw text, so a substituted value cannot change
//! the YAML structure (a `:` or `#` in a variable stays data). Rules, documented for operators
//! in `docs/connectors/README.md`:
//!
//! - `${VAR}` is replaced by the variable's value; an unset variable is an error.
//! - `${VAR:-default}` uses `default` when `VAR` is unset **or empty** (as in POSIX shells).
//!   The default is literal text up to the first `}`; it is not itself interpolated.
//! - `$${` is a literal `${`. Any other `$` is literal.
//! - Substitution is single-pass: a value containing `${` is not expanded again.
//! - Only string values are interpolated, never mapping keys; quoted numbers such as
//!   `port: "${PORT}"` become numbers later, when the field's type is known.

use super::tree::{Node, Value};

/// Interpolates every string scalar under `node`; on failure returns the failing node's path,
/// its line and the message.
pub(crate) fn interpolate_tree(
    node: &mut Node,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), (String, usize, String)> {
    match &mut node.value {
        Value::Str(s) => {
            if s.contains('$') {
                *s = interpolate(s, env).map_err(|msg| (node.path.clone(), node.line, msg))?;
            }
            Ok(())
        }
        Value::Seq(items) => items
            .iter_mut()
            .try_for_each(|item| interpolate_tree(item, env)),
        Value::Map(entries) => entries
            .iter_mut()
            .try_for_each(|(_, item)| interpolate_tree(item, env)),
        Value::Null | Value::Bool(_) | Value::Int(_) | Value::UInt(_) | Value::Float(_) => Ok(()),
    }
}

/// Interpolates one string. Errors name the variable, never a value.
pub(crate) fn interpolate(
    input: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(dollar) = rest.find('$') {
        out.push_str(&rest[..dollar]);
        let after = &rest[dollar..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let close = tail.find('}').ok_or_else(|| {
                format!(
                    "unterminated `${{` (write `$${{` for a literal `${{`) in `{}`",
                    shorten(after)
                )
            })?;
            out.push_str(&expand(&tail[..close], env)?);
            rest = &tail[close + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Expands the inside of one `${...}`.
fn expand(inner: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let (name, default) = match inner.split_once(":-") {
        Some((name, default)) => (name, Some(default)),
        None => (inner, None),
    };
    if !is_var_name(name) {
        return Err(format!(
            "invalid variable reference `${{{inner}}}`: expected `${{NAME}}` or \
             `${{NAME:-default}}` where NAME is letters, digits and `_`, not starting with a digit"
        ));
    }
    match (env(name), default) {
        (Some(value), None) => Ok(value),
        (Some(value), Some(_)) if !value.is_empty() => Ok(value),
        (_, Some(default)) => Ok(default.to_owned()),
        (None, None) => Err(format!("environment variable {name} is not set")),
    }
}

fn is_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// The start of a malformed reference, for the message (never the whole, maybe long, value).
fn shorten(s: &str) -> String {
    match s.char_indices().nth(24) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("db.internal".to_owned()),
            "PORT" => Some("6543".to_owned()),
            "EMPTY" => Some(String::new()),
            "TRICKY" => Some("${HOST}".to_owned()),
            _ => None,
        }
    }

    fn interp(s: &str) -> Result<String, String> {
        interpolate(s, &env)
    }

    #[test]
    fn plain_and_embedded_references() {
        assert_eq!(interp("${HOST}").unwrap(), "db.internal");
        assert_eq!(
            interp("tcp://${HOST}:${PORT}/x").unwrap(),
            "tcp://db.internal:6543/x"
        );
        assert_eq!(interp("no refs").unwrap(), "no refs");
    }

    #[test]
    fn defaults_apply_when_unset_or_empty() {
        assert_eq!(interp("${NOPE:-5432}").unwrap(), "5432");
        assert_eq!(interp("${EMPTY:-fallback}").unwrap(), "fallback");
        assert_eq!(interp("${PORT:-1}").unwrap(), "6543");
        assert_eq!(interp("${NOPE:-}").unwrap(), "");
        assert_eq!(interp("${NOPE:-a:-b}").unwrap(), "a:-b");
    }

    #[test]
    fn set_but_empty_without_default_is_empty() {
        assert_eq!(interp("x${EMPTY}y").unwrap(), "xy");
    }

    #[test]
    fn missing_variable_is_an_error_naming_it() {
        assert_eq!(
            interp("${POSTGRES_SLOT_NAME}").unwrap_err(),
            "environment variable POSTGRES_SLOT_NAME is not set"
        );
    }

    #[test]
    fn double_dollar_escapes() {
        assert_eq!(interp("$${HOST}").unwrap(), "${HOST}");
        // Scanning is left to right: the first `$` is literal, then `$${` is the escape.
        assert_eq!(interp("a$$${HOST}").unwrap(), "a$${HOST}");
        assert_eq!(interp("cost $5 and $$").unwrap(), "cost $5 and $$");
        assert_eq!(interp("$").unwrap(), "$");
    }

    #[test]
    fn single_pass() {
        assert_eq!(interp("${TRICKY}").unwrap(), "${HOST}");
    }

    #[test]
    fn malformed_references() {
        assert!(
            interp("${HOST")
                .unwrap_err()
                .starts_with("unterminated `${`")
        );
        assert!(
            interp("${}")
                .unwrap_err()
                .starts_with("invalid variable reference `${}`")
        );
        assert!(interp("${1X}").unwrap_err().contains("`${1X}`"));
        assert!(interp("${A-B}").unwrap_err().contains("`${A-B}`"));
    }

    #[test]
    fn tree_paths_name_the_failing_scalar() {
        let text = "a:\n  - x\n  - { b: \"${NOPE}\" }\nc: ${HOST}\n";
        let mut root = super::super::tree::parse("t.yaml", text).unwrap();
        let err = interpolate_tree(&mut root, &env).unwrap_err();
        assert_eq!(
            err,
            (
                "a[1].b".to_owned(),
                3,
                "environment variable NOPE is not set".to_owned()
            )
        );

        let mut root = super::super::tree::parse("t.yaml", "c: ${HOST}\nn: 5\n").unwrap();
        interpolate_tree(&mut root, &env).unwrap();
        assert_eq!(
            root.get("c").unwrap().value,
            Value::Str("db.internal".to_owned())
        );
        assert!(matches!(
            root.get("n").unwrap().value,
            Value::Int(5) | Value::UInt(5)
        ));
    }
}
