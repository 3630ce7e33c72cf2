//! __NAME__: keeps only the rows whose `column` is not `value` (both from the route's config).
//! Filtered tables need `row_filter: true` on the route's transform and REPLICA IDENTITY FULL.
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
        // An insert failing the test is dropped, an update failing it deletes the row.
        c.filter(|row| row.get_str(&*self.column) != Some(&self.value));
        Ok(())
    }
}

zipline_transform::export!(Filter);
