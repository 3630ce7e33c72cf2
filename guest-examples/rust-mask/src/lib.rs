//! A Zipline transform: masks the configured columns and drops the configured tables.
//!
//! Config (the route's `transform.config` map):
//! - `columns` (or `column`): comma-separated column names to mask, in every table;
//! - `drop`: comma-separated tables whose changes are dropped (`schema.table`, or a bare name
//!   for any schema).
//!
//! A masked text keeps its first character and, for an address, its domain:
//! `alice@example.com` becomes `a***@example.com`, `Alice Smith` becomes `A***`. NULL and
//! untouched TOASTed values (`unchanged`) pass as they are; other types are left alone. A
//! masked key column is masked in the key too, so updates and deletes still find their row.
//! With an empty config the transform passes every change through unchanged.
//!
//! After `init` it allocates from a per-batch arena (`arena.rs`): everything a call allocates
//! is freed when the call ends, so a bump pointer and a count do what a general allocator
//! would, for less.

use std::sync::OnceLock;

mod arena;

#[global_allocator]
static ALLOC: arena::Arena = arena::Arena;

wit_bindgen::generate!({
    path: "../../wit",
    world: "transform",
});

use zipline::transform::host::{Level, log};
use zipline::transform::types::{Span, Table, Value};

struct Config {
    columns: Vec<String>,
    drop: Vec<String>,
}

static CONFIG: OnceLock<Config> = OnceLock::new();

fn list(value: Option<&String>) -> Vec<String> {
    value
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// `a***@example.com` for an address, `A***` otherwise; the empty string stays empty.
pub fn mask_text(s: &str) -> String {
    let mut out = Vec::new();
    mask_into(s, &mut out);
    String::from_utf8(out).expect("built from whole chars of a str")
}

/// Appends the mask of `s` to `out` (no allocation of its own: this runs once per value).
fn mask_into(s: &str, out: &mut Vec<u8>) {
    let Some(first) = s.chars().next() else {
        return;
    };
    out.extend_from_slice(&s.as_bytes()[..first.len_utf8()]);
    out.extend_from_slice(b"***");
    if let Some(at) = s.rfind('@') {
        out.extend_from_slice(&s.as_bytes()[at..]);
    }
}

/// The output's new bytes. Its spans count on from the end of the input's `data` (the WIT's
/// `output` says why): a value left alone keeps its input span and costs nothing.
struct NewData {
    base: usize,
    bytes: Vec<u8>,
}

impl NewData {
    /// Replaces the text `value` points at with its mask.
    fn mask(&mut self, value: &mut Value, input: &[u8]) -> Result<(), String> {
        let span = match value {
            Value::Text(s) | Value::Json(s) | Value::Numeric(s) => s,
            Value::Other(o) => &mut o.text,
            _ => return Ok(()),
        };
        let text = input
            .get(span.start as usize..(span.start + span.len) as usize)
            .and_then(|b| std::str::from_utf8(b).ok())
            .ok_or("a text value outside the batch's data")?;
        let start = self.base + self.bytes.len();
        mask_into(text, &mut self.bytes);
        *span = Span {
            start: start as u32,
            len: (self.base + self.bytes.len() - start) as u32,
        };
        Ok(())
    }
}

/// Per input table: drop it, or which column positions (and key positions) to mask.
struct Plan {
    dropped: bool,
    values: Vec<usize>,
    key: Vec<usize>,
}

fn plan(cfg: &Config, table: &Table) -> Plan {
    let qualified = format!("{}.{}", table.schema, table.name);
    let dropped = cfg
        .drop
        .iter()
        .any(|d| *d == qualified || *d == table.name);
    let mut values = Vec::new();
    let mut key = Vec::new();
    let mut key_pos = 0;
    for (i, c) in table.columns.iter().enumerate() {
        let masked = cfg.columns.iter().any(|m| *m == c.name);
        if masked {
            values.push(i);
            if c.is_key {
                key.push(key_pos);
            }
        }
        if c.is_key {
            key_pos += 1;
        }
    }
    Plan {
        dropped,
        values,
        key,
    }
}

struct Component;

impl Guest for Component {
    fn init(config: Vec<(String, String)>) -> Result<(), String> {
        let get = |k: &str| config.iter().find(|(key, _)| key == k).map(|(_, v)| v);
        let mut columns = list(get("columns"));
        columns.extend(list(get("column")));
        let drop = list(get("drop"));
        for (k, _) in &config {
            if !matches!(k.as_str(), "columns" | "column" | "drop") {
                return Err(format!(
                    "unknown config key `{k}`; expected columns, column, drop"
                ));
            }
        }
        log(
            Level::Info,
            &format!("masking [{}], dropping [{}]", columns.join(", "), drop.join(", ")),
        );
        CONFIG
            .set(Config { columns, drop })
            .map_err(|_| "init called twice".to_owned())?;
        arena::enable();
        Ok(())
    }

    fn transform(batch: Batch) -> Result<Output, String> {
        let cfg = CONFIG.get().ok_or("transform called before init")?;
        let plans: Vec<Plan> = batch.tables.iter().map(|t| plan(cfg, t)).collect();
        // The input's values list becomes the output's, edited in place where masked.
        let mut values = batch.values;
        let mut new = NewData {
            base: batch.data.len(),
            bytes: Vec::new(),
        };
        let mut changes = Vec::with_capacity(batch.changes.len());
        for change in batch.changes {
            let Some(p) = plans.get(change.table as usize) else {
                return Err(format!("change refers to table #{} of {}", change.table, plans.len()));
            };
            if p.dropped {
                continue;
            }
            let mut mask_at = |span: Span, i: usize| match values.get_mut(span.start as usize + i) {
                Some(v) if i < span.len as usize => new.mask(v, &batch.data),
                _ => Ok(()),
            };
            for &i in &p.values {
                mask_at(change.values, i)?;
            }
            for &i in &p.key {
                mask_at(change.key, i)?;
                if let Some(old) = change.old_key {
                    mask_at(old, i)?;
                }
            }
            changes.push(change);
        }
        Ok(Output {
            tables: batch.tables,
            data: new.bytes,
            values,
            changes,
            errors: Vec::new(),
        })
    }
}

export!(Component);

#[cfg(test)]
mod tests {
    use super::mask_text;

    #[test]
    fn masks_keep_first_char_and_domain() {
        assert_eq!(mask_text("alice@example.com"), "a***@example.com");
        assert_eq!(mask_text("Alice Smith"), "A***");
        assert_eq!(mask_text(""), "");
        assert_eq!(mask_text("é@x"), "é***@x");
    }
}
