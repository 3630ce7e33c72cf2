//! [`ConfigError`]: one configuration problem, located by file, line and field path.
//!
//! Every message is written for the operator who has the file open: `orders.yaml:9:
//! connectors[0].slot_name: environment variable POSTGRES_SLOT_NAME is not set`. Messages never
//! contain secret values; at most they name the environment variable or file a secret comes from.

use std::fmt;

use crate::error::{Classify, ErrorClass};

/// A configuration problem: where it is (file, line, field path) and what is wrong.
///
/// Displays as `file:line: field.path: message`; YAML syntax errors, which have a column but no
/// field, display as `file:line:column: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", Rendered(self))]
pub struct ConfigError {
    file: String,
    line: Option<usize>,
    column: Option<usize>,
    field: String,
    message: String,
}

impl ConfigError {
    pub(crate) fn new(
        file: &str,
        line: Option<usize>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError {
            file: file.to_owned(),
            line,
            column: None,
            field: field.into(),
            message: message.into(),
        }
    }

    /// A YAML syntax error, located by the parser (1-based line and column).
    pub(crate) fn syntax(
        file: &str,
        line: Option<usize>,
        column: Option<usize>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError {
            file: file.to_owned(),
            line,
            column,
            field: String::new(),
            message: message.into(),
        }
    }

    /// The file label given to [`super::load_str`], or the path given to [`super::load`].
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The 1-based line of the offending field, when the error has a place in the file.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The 1-based column; only YAML syntax errors have one.
    pub fn column(&self) -> Option<usize> {
        self.column
    }

    /// The field path, e.g. `connectors[0].slot_name`; empty for syntax and file errors.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong, without the location prefix.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// A bad configuration cannot fix itself: the operator must edit the file or the environment.
impl Classify for ConfigError {
    fn class(&self) -> ErrorClass {
        ErrorClass::Fatal
    }
}

struct Rendered<'a>(&'a ConfigError);

impl fmt::Display for Rendered<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.0;
        f.write_str(&e.file)?;
        if let Some(line) = e.line {
            write!(f, ":{line}")?;
            if let Some(column) = e.column {
                write!(f, ":{column}")?;
            }
        }
        f.write_str(": ")?;
        if !e.field.is_empty() {
            write!(f, "{}: ", e.field)?;
        }
        f.write_str(&e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_with_line_and_field() {
        let e = ConfigError::new(
            "orders.yaml",
            Some(9),
            "connectors[0].slot_name",
            "environment variable POSTGRES_SLOT_NAME is not set",
        );
        assert_eq!(
            e.to_string(),
            "orders.yaml:9: connectors[0].slot_name: environment variable POSTGRES_SLOT_NAME is not set"
        );
        assert_eq!(e.line(), Some(9));
        assert_eq!(e.field(), "connectors[0].slot_name");
        assert_eq!(e.class(), ErrorClass::Fatal);
    }

    #[test]
    fn display_syntax_error_has_column_and_no_field() {
        let e = ConfigError::syntax("a.yaml", Some(3), Some(7), "did not find expected key");
        assert_eq!(e.to_string(), "a.yaml:3:7: did not find expected key");
        assert_eq!(e.field(), "");
        assert_eq!(e.column(), Some(7));
    }

    #[test]
    fn display_without_line() {
        let e = ConfigError::new("missing.yaml", None, "", "cannot read file: not found");
        assert_eq!(e.to_string(), "missing.yaml: cannot read file: not found");
    }
}
