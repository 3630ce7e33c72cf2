//! Keeps only the rows whose `column` is not `value` (config), correctly across updates: the
//! sink's table equals `SELECT … WHERE column IS DISTINCT FROM value` on the source. Filtered
//! tables need whole rows: set `row_filter: true` and REPLICA IDENTITY FULL.
use zipline_transform::{Change, Config, Transform};

struct Filter {
    column: String,
    value: String,
}

impl Transform for Filter {
    fn init(config: &Config) -> Result<Self, String> {
        config.allow_only(&["column", "value"])?;
        let (column, value) = (config.require("column")?, config.require("value")?);
        Ok(Filter { column, value })
    }

    fn change(&mut self, c: &mut Change<'_>) -> Result<(), String> {
        c.filter(|row| row.get_str(&*self.column) != Some(&self.value));
        Ok(())
    }
}

zipline_transform::export!(Filter);
