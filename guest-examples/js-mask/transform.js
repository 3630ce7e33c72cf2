// A Zipline transform in JavaScript: masks the configured columns.
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
// alone. A masked key column is masked in `key` and `old-key` too, so updates and deletes
// still find their row.
//
// The batch (contract 0.3.0) is four flat lists: `tables`, `data` (the bytes of every text,
// numeric, json, bytea and other value, back to back), `values` (every value of every change;
// a text value is `{tag: "text", val: {start, len}}`, a span of `data`) and `changes` (whose
// `key`, `oldKey` and `values` are spans of `values`). This transform edits the input's
// `values` list in place, replacing only the values it masks, and returns it with the input's
// `tables` and `changes`: every other value keeps its span, so nothing else is copied, and
// 64-bit integers and UUID halves round-trip exactly because they are the very objects that
// came in. The masked text goes into the output's `data`, which holds new bytes only: a span
// that points there starts at the input data's length plus the offset in the output's `data`.
//
// Bindings (componentize-js): variants are `{tag, val}`, enums strings, records objects with
// camelCase fields, u32 `Number`, 64-bit integers BigInt, `list<u8>` Uint8Array, `option`
// undefined or the value; returning from an export means `ok`, throwing means `err` (with the
// thrown message).

import { log } from "zipline:transform/host@0.3.0";

let columns = null;
let keep = 0;
const warned = new Set();

// One decoder and encoder for every value: spans are UTF-8 byte ranges, never string indices.
const decoder = new TextDecoder();
const encoder = new TextEncoder();

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

// The output's `data`: a growable byte buffer whose spans are numbered from `base`, the input
// data's length, as the contract wants. It doubles when full, so appending is amortised
// constant time and the bytes cross back to the host as one Uint8Array.
class OutputData {
  constructor(base) {
    this.base = base;
    this.bytes = new Uint8Array(256);
    this.length = 0;
  }

  // Room for `n` more bytes.
  reserve(n) {
    if (this.length + n <= this.bytes.length) return;
    const grown = new Uint8Array(Math.max(this.bytes.length * 2, this.length + n));
    grown.set(this.bytes.subarray(0, this.length));
    this.bytes = grown;
  }

  // Appends `s` as UTF-8 and returns its span.
  text(s) {
    this.reserve(s.length * 3); // a UTF-16 code unit is at most 3 bytes of UTF-8
    const { written } = encoder.encodeInto(s, this.bytes.subarray(this.length));
    return this.advance(written);
  }

  // Appends `zeros` zero bytes then `tail`, and returns the span of both.
  zerosThen(zeros, tail) {
    this.reserve(zeros + tail.length);
    this.bytes.fill(0, this.length, this.length + zeros);
    this.bytes.set(tail, this.length + zeros);
    return this.advance(zeros + tail.length);
  }

  advance(n) {
    const span = { start: this.base + this.length, len: n };
    this.length += n;
    return span;
  }

  // The bytes written, for `output.data`.
  finish() {
    return this.bytes.subarray(0, this.length);
  }
}

// The masked form of `s`, or `null` when masking would leave it as it is (short enough to be
// all kept tail), so that the value keeps its span and nothing is copied.
function maskText(s) {
  // By code point, so a kept tail never splits a surrogate pair.
  const chars = [...s];
  const hidden = Math.max(0, chars.length - keep);
  if (hidden === 0) return null;
  return "*".repeat(hidden) + chars.slice(hidden).join("");
}

// The masked value, `value` itself when masking leaves it as it is, or `null` when the variant
// cannot be masked (left as it is, with a warning).
function mask(value, data, out) {
  switch (value.tag) {
    case "text": {
      const masked = maskText(readText(data, value.val));
      return masked === null ? value : { tag: "text", val: out.text(masked) };
    }
    case "other": {
      const masked = maskText(readText(data, value.val.text));
      if (masked === null) return value;
      return { tag: "other", val: { typeOid: value.val.typeOid, text: out.text(masked) } };
    }
    case "json": {
      // A kept tail of JSON text would be a meaningless fragment (`"}`): all of it goes.
      const chars = [...readText(data, value.val)].length;
      return { tag: "json", val: out.text(JSON.stringify("*".repeat(chars))) };
    }
    case "bytes": {
      const { start, len } = value.val;
      const hidden = Math.max(0, len - keep);
      if (hidden === 0) return value;
      // Zeros, then the kept tail copied straight from the input's bytes (no decoding).
      const tail = data.subarray(start + hidden, start + len);
      return { tag: "bytes", val: out.zerosThen(hidden, tail) };
    }
    case "null":
    case "unchanged":
      return value;
    default:
      return null;
  }
}

// The text a span of the input's `data` holds. `subarray` is a view, not a copy.
function readText(data, { start, len }) {
  return decoder.decode(data.subarray(start, start + len));
}

export function transform(batch) {
  if (columns === null) throw "transform called before init";
  const { tables, data, values, changes } = batch;
  const out = new OutputData(data.length);
  // Values already masked, by index into `values`: a host may let two spans share values (a
  // key span inside the row's), and a value must be masked once, not masked again.
  const done = new Uint8Array(values.length);

  // Masks `values[span.start + i]`, the i-th value of `span`, in place.
  const maskAt = (span, i, table, column) => {
    if (span === undefined || i >= span.len) return;
    const at = span.start + i;
    if (done[at]) return;
    done[at] = 1;
    const masked = mask(values[at], data, out);
    if (masked !== null) {
      values[at] = masked;
      return;
    }
    const what = `${table.schema}.${table.name}.${column}`;
    if (!warned.has(what)) {
      warned.add(what);
      log("warn", `js-mask: ${what} holds ${values[at].tag} values, which are not masked`);
    }
  };

  // Per table: [column index, key index or -1, column name] of each masked column.
  const plans = tables.map((table) => {
    const plan = [];
    let k = 0;
    table.columns.forEach((column, i) => {
      if (columns.has(column.name)) plan.push([i, column.isKey ? k : -1, column.name]);
      if (column.isKey) k++;
    });
    return plan;
  });
  for (const change of changes) {
    const plan = plans[change.table];
    if (plan === undefined) {
      throw `change refers to table #${change.table} of ${tables.length}`;
    }
    const table = tables[change.table];
    for (const [i, k, name] of plan) {
      maskAt(change.values, i, table, name);
      if (k >= 0) {
        maskAt(change.key, k, table, name);
        maskAt(change.oldKey, k, table, name);
      }
    }
  }
  // The input's tables and changes as they came: their spans still address the same values.
  return { tables, data: out.finish(), values, changes, errors: [] };
}
