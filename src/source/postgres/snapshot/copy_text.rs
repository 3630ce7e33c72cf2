//! Decoding `COPY … TO STDOUT` output in text format into rows of [`Value`]s.
//!
//! Text format (<https://www.postgresql.org/docs/15/sql-copy.html#id-1.9.3.55.9.2>): one line
//! per row ending in `\n`, columns separated by a tab, `\N` for NULL, and inside a value a
//! backslash escapes: `\b \f \n \r \t \v \\`, `\` + 1–3 octal digits, `\x` + 1–2 hex digits,
//! and `\` + any other character stands for that character. Each value, once unescaped, is its
//! type's text output — what pgoutput sends too — so [`parse_text`] turns it into a [`Value`].
//!
//! The server sends one CopyData message per row, but nothing here relies on it: bytes are
//! buffered until a whole line is there.

use std::borrow::Cow;

use crate::change::{Column, Value};
use crate::source::postgres::types::{TypeError, parse_text};

/// Why a line of COPY output could not be decoded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CopyTextError {
    /// The line has another number of columns than the table.
    #[error("a row has {found} columns, the table {expected}")]
    Columns { expected: usize, found: usize },
    /// A value is not valid text output for its column's type.
    #[error("column {column}: {source}")]
    Value {
        column: String,
        #[source]
        source: TypeError,
    },
}

/// Splits a byte stream into lines and decodes each into a row.
#[derive(Debug, Default)]
pub(crate) struct RowDecoder {
    pending: Vec<u8>,
}

impl RowDecoder {
    /// Decodes every whole line of `pending` + `data` into `rows`, keeping a partial last line
    /// for the next call.
    pub(crate) fn push(
        &mut self,
        data: &[u8],
        columns: &[Column],
        rows: &mut Vec<Vec<Value>>,
    ) -> Result<(), CopyTextError> {
        let mut rest = data;
        if !self.pending.is_empty() {
            let Some(end) = memchr(b'\n', rest) else {
                self.pending.extend_from_slice(rest);
                return Ok(());
            };
            self.pending.extend_from_slice(&rest[..end]);
            let line = std::mem::take(&mut self.pending);
            rows.push(decode_line(&line, columns)?);
            rest = &rest[end + 1..];
        }
        while let Some(end) = memchr(b'\n', rest) {
            rows.push(decode_line(&rest[..end], columns)?);
            rest = &rest[end + 1..];
        }
        self.pending.extend_from_slice(rest);
        Ok(())
    }

    /// Whether a partial line is left over (the stream ended mid-row).
    pub(crate) fn has_partial(&self) -> bool {
        !self.pending.is_empty()
    }
}

fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&b| b == needle)
}

/// Decodes one line (without its `\n`) into the values of `columns`.
pub(crate) fn decode_line(line: &[u8], columns: &[Column]) -> Result<Vec<Value>, CopyTextError> {
    let mut values = Vec::with_capacity(columns.len());
    for field in line.split(|&b| b == b'\t') {
        let Some(column) = columns.get(values.len()) else {
            return Err(CopyTextError::Columns {
                expected: columns.len(),
                found: line.split(|&b| b == b'\t').count(),
            });
        };
        let value = if field == b"\\N" {
            Value::Null
        } else {
            parse_text(column.type_oid, &unescape(field)).map_err(|source| {
                CopyTextError::Value {
                    column: column.name.clone(),
                    source,
                }
            })?
        };
        values.push(value);
    }
    if values.len() != columns.len() {
        return Err(CopyTextError::Columns {
            expected: columns.len(),
            found: values.len(),
        });
    }
    Ok(values)
}

/// A field with its backslash escapes resolved (borrowed when it has none).
fn unescape(field: &[u8]) -> Cow<'_, [u8]> {
    if !field.contains(&b'\\') {
        return Cow::Borrowed(field);
    }
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let b = field[i];
        i += 1;
        if b != b'\\' || i == field.len() {
            out.push(b);
            continue;
        }
        let c = field[i];
        i += 1;
        match c {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut n = u32::from(c - b'0');
                for _ in 0..2 {
                    match field.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            n = n * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                // PostgreSQL keeps the low byte of an octal escape above \377.
                out.push((n & 0xff) as u8);
            }
            b'x' if field.get(i).is_some_and(u8::is_ascii_hexdigit) => {
                let mut n = 0u8;
                for _ in 0..2 {
                    match field.get(i).and_then(|d| (*d as char).to_digit(16)) {
                        Some(d) => {
                            n = n * 16 + d as u8;
                            i += 1;
                        }
                        None => break,
                    }
                }
                out.push(n);
            }
            other => out.push(other),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, type_oid: u32) -> Column {
        Column {
            name: name.into(),
            type_oid,
            type_modifier: -1,
            is_key: false,
        }
    }

    #[test]
    fn unescapes_every_form() {
        assert_eq!(&*unescape(b"plain"), b"plain");
        assert_eq!(&*unescape(b"a\\tb\\\\c\\nd\\r"), b"a\tb\\c\nd\r");
        assert_eq!(&*unescape(b"\\b\\f\\v"), &[8, 12, 11]);
        assert_eq!(&*unescape(b"\\101\\0\\7x"), b"A\0\x07x");
        assert_eq!(&*unescape(b"\\x41\\x4z\\xg"), b"A\x04zxg");
        assert_eq!(&*unescape(b"\\q trailing\\"), b"q trailing\\");
    }

    #[test]
    fn decodes_rows_across_chunk_boundaries() {
        // bigint, text, bytea, boolean
        let cols = [col("id", 20), col("s", 25), col("b", 17), col("f", 16)];
        let mut decoder = RowDecoder::default();
        let mut rows = Vec::new();
        decoder
            .push(
                b"1\tZo\xc3\xab\t\\\\x00ff\tt\n2\t\\N\t\\N",
                &cols,
                &mut rows,
            )
            .unwrap();
        assert_eq!(rows.len(), 1);
        assert!(decoder.has_partial());
        decoder.push(b"\tf\n", &cols, &mut rows).unwrap();
        assert!(!decoder.has_partial());
        assert_eq!(
            rows,
            vec![
                vec![
                    Value::Int8(1),
                    Value::Text("Zoë".into()),
                    Value::Bytes(vec![0, 255]),
                    Value::Bool(true)
                ],
                vec![Value::Int8(2), Value::Null, Value::Null, Value::Bool(false)],
            ]
        );
        // A text value holding a tab, a newline and a literal "\N".
        let row = decode_line(b"3\ta\\tb\\nc\\\\N\t\\N\tf", &cols).unwrap();
        assert_eq!(row[1], Value::Text("a\tb\nc\\N".into()));
    }

    #[test]
    fn rejects_wrong_column_counts_and_bad_values() {
        let cols = [col("id", 20), col("s", 25)];
        let err = decode_line(b"1", &cols).unwrap_err();
        assert!(
            matches!(
                err,
                CopyTextError::Columns {
                    expected: 2,
                    found: 1
                }
            ),
            "{err}"
        );
        let err = decode_line(b"1\ta\tb", &cols).unwrap_err();
        assert!(
            matches!(
                err,
                CopyTextError::Columns {
                    expected: 2,
                    found: 3
                }
            ),
            "{err}"
        );
        let err = decode_line(b"x\ta", &cols).unwrap_err();
        assert!(
            err.to_string().starts_with("column id: invalid bigint"),
            "{err}"
        );
    }
}
