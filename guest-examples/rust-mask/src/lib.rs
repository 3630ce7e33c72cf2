//! Masks the configured columns (`columns`) and drops the configured tables (`drop`:
//! `schema.table`, or a bare name for any schema). `alice@example.com` becomes
//! `a***@example.com`, `Alice Smith` becomes `A***`; a masked key is masked in the key too.
use zipline_transform::{Change, Config, Level, Transform, log};

struct Mask {
    columns: Vec<String>,
    drop: Vec<String>,
}

/// `a***@example.com` for an address, `A***` otherwise; the empty string stays empty.
pub fn mask_text(s: &str) -> String {
    let Some(first) = s.chars().next() else {
        return String::new();
    };
    format!("{first}***{}", s.rfind('@').map_or("", |at| &s[at..]))
}

impl Transform for Mask {
    fn init(config: &Config) -> Result<Self, String> {
        config.allow_only(&["columns", "column", "drop"])?;
        let columns = [config.list("columns"), config.list("column")].concat();
        let drop = config.list("drop");
        let message = format!("masking {columns:?}, dropping {drop:?}");
        log(Level::Info, &message);
        Ok(Mask { columns, drop })
    }

    fn change(&mut self, c: &mut Change<'_>) -> Result<(), String> {
        if self.drop.iter().any(|t| c.is_table(t)) {
            c.drop();
            return Ok(());
        }
        for column in &self.columns {
            if c.has_column(column) {
                c.map_str(column, mask_text)?;
            }
        }
        Ok(())
    }
}

zipline_transform::export!(Mask);

#[cfg(test)]
mod tests;
