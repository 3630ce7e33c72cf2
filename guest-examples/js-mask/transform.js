// A Zipline transform in JavaScript, on the SDK (sdk/js): masks the configured columns.
//
// Config (the route's `transform.config` map):
//   columns  comma-separated column names (in every table) to mask; required
//   keep     how many trailing characters stay visible (default 0): `keep: 4` turns
//            "+1 555 0100" into "*******0100"
//
// Masking keeps a value's variant, so the sink's column type still fits: `text` and `other`
// values get one `*` per character (except the kept tail), `json` values become a JSON string
// of stars (nothing kept), `bytes` become zero bytes of the same length (except the kept
// tail). NULL and `unchanged` (a TOASTed value the update did not touch) pass as they are,
// and so do numbers, dates, UUIDs and numerics: masking them would need a value of the
// column's type, so a configured column of such a type is logged once as a warning and left
// alone. `mapStr` and `mapBytes` rewrite a key column in the change's key and old key too, so
// updates and deletes still find their row; a value masking leaves as it is keeps its bytes.

import { Transform, exportTransform, log } from "../../sdk/js/zipline-transform.js";

class Mask extends Transform {
  constructor(config) {
    super(config, "columns", "keep");
    this.columns = new Set(config.list("columns"));
    if (this.columns.size === 0) {
      throw "config key `columns` is required: the comma-separated columns to mask";
    }
    const keep = config.get("keep", "0");
    if (!/^\d+$/.test(keep.trim())) {
      throw `config key \`keep\` must be a whole number of characters, got "${keep}"`;
    }
    this.keep = Number(keep.trim());
    this.warned = new Set();
    const masking = [...this.columns].join(", ");
    log("info", `js-mask: masking [${masking}], keeping ${this.keep} trailing characters`);
  }

  // Stars for all but the kept tail, by code point so a tail never splits a surrogate pair.
  // A text no longer than the tail comes back as it was, so `mapStr` keeps its bytes.
  mask(s) {
    const chars = [...s], hidden = Math.max(0, chars.length - this.keep);
    return "*".repeat(hidden) + chars.slice(hidden).join("");
  }

  change(c) {
    for (const column of c.columns.filter((name) => this.columns.has(name))) {
      const kind = c.kind(column);
      if (kind === "text" || kind === "other") {
        c.mapStr(column, (s) => this.mask(s));
      } else if (kind === "json") {
        // A kept tail of JSON text would be a meaningless fragment (`"}`): all of it goes.
        c.mapStr(column, (s) => JSON.stringify("*".repeat([...s].length)));
      } else if (kind === "bytes") {
        c.mapBytes(column, (b) => b.fill(0, 0, Math.max(0, b.length - this.keep)));
      } else if (!["null", "unchanged", undefined].includes(kind)) {
        const what = `${c.schema}.${c.table}.${column}`;
        if (this.warned.has(what)) continue;
        this.warned.add(what);
        log("warn", `js-mask: ${what} holds ${kind} values, which are not masked`);
      }
    }
  }
}

export const { init, transform } = exportTransform(Mask);
