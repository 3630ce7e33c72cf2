// __NAME__: keeps only the rows whose `column` is not `value` (both from the route's config).
// Filtered tables need `row_filter: true` on the route's transform and REPLICA IDENTITY FULL.
import { Transform, exportTransform } from "./zipline/sdk/js/zipline-transform.js";

class Filter extends Transform {
  constructor(config) {
    super(config, "column", "value");
    this.column = config.require("column");
    this.value = config.require("value");
  }

  change(c) {
    // An insert failing the test is dropped, an update failing it deletes the row.
    c.filter((row) => row.getStr(this.column) !== this.value);
  }
}

export const { init, transform } = exportTransform(Filter);
