// A Zipline transform in JavaScript: masks the configured columns.
//
// Config (the route's `transform.config` map):
//   columns  comma-separated column names (in every table) to mask; required
//   keep     how many trailing characters stay visible (default 0): `keep: 4` turns
//            "+1 555 0100" into "*******0100"
//
// Masking keeps a value's variant, so the sink's column type still fits: `text` and `other`
// values get one `*` per character (except the kept tail), `json` values become a JSON string
// of stars (nothing kept), `bytes` become zero bytes of the same length (except the kept tail). NULL and
// `unchanged` (a TOASTed value the update did not touch) pass as they are, and so do numbers,
// dates, UUIDs and numerics: masking them would need a value of the column's type, so a
// configured column of such a type is logged once as a warning and left alone. A masked key
// column is masked in `key` and `old-key` too, so updates and deletes still find their row.
//
// Values the transform does not touch are handed back as the very objects it received, so
// every variant round-trips exactly (64-bit integers and UUID halves included).
//
// Bindings (componentize-js): variants are `{tag, val}`, enums strings, records objects with
// camelCase fields, 64-bit integers BigInt, `list<u8>` Uint8Array, `option` undefined or the
// value; returning from an export means `ok`, throwing means `err` (with the thrown message).

import { log } from "zipline:transform/host@0.1.0";

let columns = null;
let keep = 0;
const warned = new Set();

export function init(config) {
  for (const [key, value] of config) {
    if (key === "columns") {
      columns = new Set(value.split(",").map((c) => c.trim()).filter((c) => c !== ""));
    } else if (key === "keep") {
      if (!/^\d+$/.test(value.trim())) {
        throw `config key \`keep\` must be a whole number of characters, got "${value}"`;
      }
      keep = Number(value.trim());
    } else {
      throw `unknown config key \`${key}\`; expected columns, keep`;
    }
  }
  if (columns === null || columns.size === 0) {
    throw "config key `columns` is required: the comma-separated columns to mask";
  }
  log("info", `js-mask: masking [${[...columns].join(", ")}], keeping ${keep} trailing characters`);
}

function maskText(s) {
  // By code point, so a kept tail never splits a surrogate pair.
  const chars = [...s];
  const hidden = Math.max(0, chars.length - keep);
  return "*".repeat(hidden) + chars.slice(hidden).join("");
}

function maskBytes(bytes) {
  const out = new Uint8Array(bytes.length);
  const hidden = Math.max(0, bytes.length - keep);
  out.set(bytes.subarray(hidden), hidden);
  return out;
}

// The masked value, or `null` when the variant cannot be masked (left as it is).
function mask(value) {
  switch (value.tag) {
    case "text":
      return { tag: "text", val: maskText(value.val) };
    case "json":
      // A kept tail of JSON text would be a meaningless fragment (`"}`): all of it goes.
      return { tag: "json", val: JSON.stringify("*".repeat([...value.val].length)) };
    case "other":
      return { tag: "other", val: { typeOid: value.val.typeOid, text: maskText(value.val.text) } };
    case "bytes":
      return { tag: "bytes", val: maskBytes(value.val) };
    case "null":
    case "unchanged":
      return value;
    default:
      return null;
  }
}

function maskAt(list, i, table, column) {
  if (!list || i >= list.length) return;
  const masked = mask(list[i]);
  if (masked !== null) {
    list[i] = masked;
    return;
  }
  const what = `${table.schema}.${table.name}.${column}`;
  if (!warned.has(what)) {
    warned.add(what);
    log("warn", `js-mask: ${what} holds ${list[i].tag} values, which are not masked`);
  }
}

export function transform(batch) {
  if (columns === null) throw "transform called before init";
  // Per table: [column index, key index or -1] of each masked column.
  const plans = batch.tables.map((table) => {
    const plan = [];
    let k = 0;
    table.columns.forEach((column, i) => {
      if (columns.has(column.name)) plan.push([i, column.isKey ? k : -1, column.name]);
      if (column.isKey) k++;
    });
    return plan;
  });
  for (const change of batch.changes) {
    const plan = plans[change.table];
    if (plan === undefined) {
      throw `change refers to table #${change.table} of ${batch.tables.length}`;
    }
    const table = batch.tables[change.table];
    for (const [i, k, name] of plan) {
      maskAt(change.values, i, table, name);
      if (k >= 0) {
        maskAt(change.key, k, table, name);
        maskAt(change.oldKey, k, table, name);
      }
    }
  }
  return { tables: batch.tables, changes: batch.changes, errors: [] };
}
