// Zipline transforms in JavaScript (componentize-js): you write what happens to one change.
//
//   import { Transform, exportTransform } from "./zipline-transform.js";
//
//   class NoTest extends Transform {
//     change(c) {
//       c.filter((row) => row.getStr("status") !== "test");
//     }
//   }
//
//   export const { init, transform } = exportTransform(NoTest);
//
// `exportTransform(T)` makes the component's two exports: `init` builds `new T(config)` once
// per instance, `transform` runs `change(c)` on each change of a batch, in commit order, and
// returns what they made. Throwing `new Refuse(message)` (a setter throws one too) refuses that
// change: the route's `on_error` decides what happens to it. Any other exception fails the
// whole batch. An exception in the constructor stops the pipeline at start-up.
//
// The batch's layout (contract 0.3.0: four flat lists, values as spans of one `data` buffer)
// stays hidden: getters decode the one value asked for, setters append new bytes and point the
// value at them, and a change nobody touched goes out exactly as it came in (the very objects
// the bindings made, so 64-bit integers and UUIDs round-trip exactly).

import { log as hostLog } from "zipline:transform/host@0.3.0";

/** Refuses the change being transformed, with this message. */
export class Refuse extends Error {
  constructor(message) {
    super(message);
    this.name = "Refuse";
  }
}

/** A large (TOASTed) value the update did not touch: the sink keeps what it has. */
export const UNCHANGED = Symbol("UNCHANGED");

/** Writes `message` to Zipline's log at `level` ("trace", "debug", "info", "warn", "error"). */
export function log(level, message) {
  hostLog(level, message);
}

// One decoder and encoder for every value: spans are UTF-8 byte ranges, never string indices.
const decoder = new TextDecoder();
const encoder = new TextEncoder();

const TEXT_KINDS = new Set(["text", "numeric", "json"]);
// Integer-valued variants by column type OID, with their bounds; any other column takes int8.
const INT_OIDS = new Map([
  [21, ["int2", 1n << 15n]],
  [23, ["int4", 1n << 31n]],
  [1082, ["date", 1n << 31n]],
  [1083, ["time", 1n << 63n]],
  [1114, ["timestamp", 1n << 63n]],
  [1184, ["timestamptz", 1n << 63n]],
]);
const INT8 = ["int8", 1n << 63n];
const INT_KINDS = new Set(["int2", "int4", "int8"]);
// The bindings carry these as Number, the other integer variants as BigInt.
const NUMBER_INTS = new Set(["int2", "int4", "date"]);
const INT8_OID = 20;
const FLOAT4_OID = 700;
const FLOAT8_OID = 701;
const NUMERIC_OID = 1700;
// A string written where the change holds no value, or NULL, takes the kind of the column's
// type: these, text for the other types the contract names, `other` for the rest.
const STRING_OIDS = new Map([
  [114, "json"],
  [3802, "json"],
  [1700, "numeric"],
  [2950, "uuid"],
]);
const NAMED_OIDS = new Set([
  16, 17, 19, 20, 21, 23, 25, 700, 701, 1042, 1043, 1082, 1083, 1114, 1184,
]);

/** The route's `config:` map (values are strings), with typed parsing. */
export class Config {
  constructor(pairs) {
    this.pairs = Array.from(pairs, ([k, v]) => [k, v]);
  }

  /** The value of `key`, or `fallback` when unset. */
  get(key, fallback = undefined) {
    for (const [k, v] of this.pairs) if (k === key) return v;
    return fallback;
  }

  /** The comma-separated items of `key`, trimmed, empty ones left out. */
  list(key) {
    const value = this.get(key);
    if (value === undefined) return [];
    return value.split(",").map((s) => s.trim()).filter((s) => s !== "");
  }

  /** `key` converted by `kind` (String, Number, BigInt, Boolean or a function that throws on
   * bad input), or undefined when unset. */
  parse(key, kind = String) {
    const value = this.get(key);
    if (value === undefined) return undefined;
    const s = value.trim();
    let parsed;
    let why = "not a number";
    try {
      if (kind === Number) parsed = s === "" ? NaN : Number(s);
      else if (kind === Boolean) {
        why = "not true or false";
        parsed = s === "true" ? true : s === "false" ? false : NaN;
      } else parsed = kind(s);
    } catch (e) {
      parsed = NaN;
      why = e instanceof Error ? e.message : String(e);
    }
    if (Number.isNaN(parsed)) {
      throw new Error(`config \`${key}\`: cannot read \`${value}\`: ${why}`);
    }
    return parsed;
  }

  /** Like `parse`, but an unset key is an error. */
  require(key, kind = String) {
    const value = this.parse(key, kind);
    if (value === undefined) throw new Error(`config \`${key}\` is required`);
    return value;
  }

  /** Throws naming the first key not in `known`: a typo must stop the pipeline. */
  allowOnly(...known) {
    for (const [k] of this.pairs) {
      if (!known.includes(k)) {
        const expected = known.length === 0 ? "none" : known.join(", ");
        throw new Error(`unknown config key \`${k}\`; expected ${expected}`);
      }
    }
  }
}

/** Extend and override `change(c)`. `super(config, ...keys)` names the config keys the
 * transform takes: any other key stops the pipeline (the default takes none). */
export class Transform {
  constructor(config, ...known) {
    config.allowOnly(...known);
  }

  /** Transforms one change in place; the default passes it on. */
  change(c) {}
}

// The output being built: the input's values (edited in place) and the new bytes, whose spans
// count on from the end of the input's `data`.
class Out {
  constructor(batch) {
    this.input = batch.data;
    this.base = batch.data.length;
    this.bytes = new Uint8Array(0);
    this.used = 0;
    this.values = batch.values;
    this.tables = batch.tables;
    this.changes = [];
    this.errors = [];
    // Per table index: column names, name -> index, key position of each column.
    this.shapes = [];
    // (table index, edit) -> table index: a batch's changes of one table get the same edits,
    // so each new shape is built and looked up once.
    this.reshaped = new Map();
  }

  /** The bytes of `span` (a view, not a copy). */
  read({ start, len }) {
    if (start >= this.base) return this.bytes.subarray(start - this.base, start - this.base + len);
    return this.input.subarray(start, start + len);
  }

  text(span) {
    return decoder.decode(this.read(span));
  }

  // Room for `n` more bytes; doubling keeps appending amortised constant time.
  reserve(n) {
    if (this.used + n <= this.bytes.length) return;
    const grown = new Uint8Array(Math.max(this.bytes.length * 2, this.used + n, 256));
    grown.set(this.bytes.subarray(0, this.used));
    this.bytes = grown;
  }

  advance(n) {
    const span = { start: this.base + this.used, len: n };
    this.used += n;
    return span;
  }

  appendBytes(b) {
    this.reserve(b.length);
    this.bytes.set(b, this.used);
    return this.advance(b.length);
  }

  appendText(s) {
    this.reserve(s.length * 3); // a UTF-16 code unit is at most 3 bytes of UTF-8
    const { written } = encoder.encodeInto(s, this.bytes.subarray(this.used));
    return this.advance(written);
  }

  /** The index of table `t` in the output, added when no equal one is listed. */
  table(t) {
    const i = this.tables.findIndex((x) => sameTable(x, t));
    if (i >= 0) return i;
    this.tables.push(t);
    return this.tables.length - 1;
  }

  shape(table) {
    let s = this.shapes[table];
    if (s === undefined) {
      const columns = this.tables[table].columns;
      let k = 0;
      s = this.shapes[table] = {
        names: Object.freeze(columns.map((c) => c.name)),
        index: new Map(columns.map((c, i) => [c.name, i]).reverse()),
        keys: columns.map((c) => (c.isKey ? k++ : -1)),
      };
    }
    return s;
  }

  finish() {
    return this.bytes.subarray(0, this.used);
  }
}

function sameTable(a, b) {
  return (
    a.schema === b.schema &&
    a.name === b.name &&
    a.columns.length === b.columns.length &&
    a.columns.every((c, i) => {
      const d = b.columns[i];
      return c.name === d.name && c.typeOid === d.typeOid && c.typeModifier === d.typeModifier &&
        c.isKey === d.isKey;
    })
  );
}

function uuidText([hi, lo]) {
  const h = hi.toString(16).padStart(16, "0") + lo.toString(16).padStart(16, "0");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

function sameBytes(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

// The input change behind a `Change`, for `run`.
let rawOf;

/** One change of a batch. Getters read the new row (for a delete: its key columns); setters
 * write new values, and setting a key column sets the change's key too. A column is a name
 * ("email") or an index (1). */
export class Change {
  #out;
  #raw;
  /** Whether nothing of this change reaches the sinks. */
  dropped = false;

  static {
    rawOf = (c) => c.#raw;
  }

  constructor(out, raw) {
    this.#out = out;
    this.#raw = raw;
  }

  // Reading.

  /** "insert", "update", "delete" or "truncate". */
  get op() {
    return this.#raw.op;
  }

  get schema() {
    return this.#table().schema;
  }

  get table() {
    return this.#table().name;
  }

  /** The table's column names, in order. */
  get columns() {
    return this.#out.shape(this.#raw.table).names;
  }

  /** Whether the table is `name`: `schema.table`, or a bare name for any schema. */
  isTable(name) {
    const dot = name.lastIndexOf(".");
    if (dot < 0) return this.table === name;
    return this.table === name.slice(dot + 1) && this.schema === name.slice(0, dot);
  }

  hasColumn(column) {
    return this.#index(column) !== undefined;
  }

  /** The value of `column`: null (NULL), a boolean, a Number (int2, int4, floats, date), a
   * BigInt (int8, time, timestamps), a string (text, numeric, json, other types, a UUID's
   * text), a Uint8Array (bytea) or UNCHANGED; undefined when there is no such column or the
   * change holds no value for it. */
  get(column) {
    const v = this.#value(column);
    return v === undefined ? undefined : this.#decode(v);
  }

  /** The value's variant ("text", "int8", "json", "null", "unchanged", ...), or undefined. */
  kind(column) {
    return this.#value(column)?.tag;
  }

  /** The text of a text, numeric, json or other-typed column. */
  getStr(column) {
    const v = this.#value(column);
    if (v === undefined) return undefined;
    if (TEXT_KINDS.has(v.tag)) return this.#out.text(v.val);
    return v.tag === "other" ? this.#out.text(v.val.text) : undefined;
  }

  /** An integer column: a Number for int2 and int4, a BigInt for int8. */
  getInt(column) {
    const v = this.#value(column);
    return INT_KINDS.has(v?.tag) ? v.val : undefined;
  }

  /** A float column (or an integer one, converted). */
  getFloat(column) {
    const v = this.#value(column);
    if (v?.tag === "float4" || v?.tag === "float8") return v.val;
    return INT_KINDS.has(v?.tag) ? Number(v.val) : undefined;
  }

  getBool(column) {
    const v = this.#value(column);
    return v?.tag === "boolean" ? v.val : undefined;
  }

  isNull(column) {
    return this.#value(column)?.tag === "null";
  }

  // Writing.

  /** Sets `column` (a key column's key value follows). Throws `Refuse` for a column the table
   * lacks or a value that does not fit it. */
  set(column, value) {
    const i = this.#indexOf(column);
    const v = this.#encode(this.#table(), i, value, this.#slotValue(i));
    for (const slot of this.#slots(i, false)) this.#out.values[slot] = v;
  }

  setStr(column, value) {
    this.set(column, String(value));
  }

  /** Sets an integer column (a Number or a BigInt), at the column's width. */
  setInt(column, value) {
    if (typeof value !== "bigint" && !Number.isInteger(value)) {
      throw new Refuse(`${value} is not an integer, for column ${this.#name(column)}`);
    }
    this.set(column, value);
  }

  setNull(column) {
    this.set(column, null);
  }

  /** Replaces the text of `column` by `f(text)` everywhere the change holds it: the row, the
   * key and an update's old key (a mask or hash of a key column needs that). Other variants
   * are left alone, and so is a text `f` returns as it was. */
  mapStr(column, f) {
    const values = this.#out.values;
    for (const slot of this.#slots(this.#indexOf(column), true)) {
      const v = values[slot];
      if (TEXT_KINDS.has(v.tag)) {
        const s = this.#out.text(v.val);
        const next = f(s);
        if (next !== s) values[slot] = { tag: v.tag, val: this.#out.appendText(next) };
      } else if (v.tag === "other") {
        const s = this.#out.text(v.val.text);
        const next = f(s);
        if (next !== s) {
          const text = this.#out.appendText(next);
          values[slot] = { tag: "other", val: { typeOid: v.val.typeOid, text } };
        }
      }
    }
  }

  /** Like `mapStr`, for bytea values: `f` gets a copy of the bytes, returns a Uint8Array. */
  mapBytes(column, f) {
    const values = this.#out.values;
    for (const slot of this.#slots(this.#indexOf(column), true)) {
      const v = values[slot];
      if (v.tag !== "bytes") continue;
      const b = this.#out.read(v.val);
      const next = f(b.slice());
      if (!sameBytes(next, b)) values[slot] = { tag: "bytes", val: this.#out.appendBytes(next) };
    }
  }

  /** Nothing of this change reaches the sinks (changes it emitted still do). */
  drop() {
    this.dropped = true;
  }

  keep() {
    this.dropped = false;
  }

  renameTable(schema, name) {
    this.#reshape(["table", schema, name], (t) => ({ schema, name, columns: t.columns }));
  }

  renameColumn(column, newName) {
    const i = this.#indexOf(column);
    this.#reshape(["column", i, newName], (t) => ({
      ...t,
      columns: t.columns.map((c, j) => (j === i ? { ...c, name: newName } : c)),
    }));
  }

  /** Removes a column that is not a key column from the change and its table. */
  dropColumn(column) {
    const i = this.#indexOf(column);
    const t = this.#table();
    if (t.columns[i].isKey) {
      throw new Refuse(`cannot drop key column ${t.columns[i].name} of ${t.schema}.${t.name}`);
    }
    const r = this.#raw;
    if (i < r.values.len) {
      // The row without it goes to the end of the list: copies emitted earlier keep theirs.
      const values = this.#out.values;
      const start = values.length;
      for (let j = 0; j < r.values.len; j++) if (j !== i) values.push(values[r.values.start + j]);
      r.values = { start, len: r.values.len - 1 };
    }
    this.#reshape(["drop", i], (x) => ({ ...x, columns: x.columns.filter((_, j) => j !== i) }));
  }

  /** Emits a copy of this change as it is now into table `schema.name` of the same columns,
   * after this change. */
  emitCopy(schema, name) {
    const r = this.#raw;
    const table = this.#out.table({ ...this.#table(), schema, name });
    // Its own entries (the same value objects, no bytes copied), so later edits of this change
    // leave the copy as it was.
    const copy = (span) => {
      if (span === undefined) return undefined;
      const values = this.#out.values;
      const start = values.length;
      for (let j = 0; j < span.len; j++) values.push(values[span.start + j]);
      return { start, len: span.len };
    };
    this.#out.changes.push({
      table,
      op: r.op,
      position: r.position,
      key: copy(r.key),
      oldKey: copy(r.oldKey),
      values: copy(r.values),
    });
  }

  /** Emits a new change of `op` into `table` ({schema, name, columns: [{name, typeOid,
   * isKey}]}) with the row `values` (one per column); its key is taken from the key columns. */
  emit(op, table, values) {
    const t = {
      schema: table.schema,
      name: table.name,
      columns: table.columns.map((c) => ({
        name: c.name,
        typeOid: c.typeOid,
        typeModifier: c.typeModifier ?? -1,
        isKey: c.isKey ?? false,
      })),
    };
    if (values.length !== t.columns.length) {
      throw new Refuse(
        `emit into ${t.schema}.${t.name}: ${values.length} values for ${t.columns.length} columns`,
      );
    }
    const row = values.map((v, i) => this.#encode(t, i, v, undefined));
    const key = row.filter((_, i) => t.columns[i].isKey);
    const out = this.#out.values;
    const whole = op === "insert" || op === "update";
    const keySpan = { start: out.length, len: op === "truncate" ? 0 : key.length };
    if (op !== "truncate") out.push(...key);
    const rowSpan = { start: out.length, len: whole ? row.length : 0 };
    if (whole) out.push(...row);
    this.#out.changes.push({
      table: this.#out.table(t),
      op,
      position: this.#raw.position,
      key: keySpan,
      oldKey: undefined,
      values: rowSpan,
    });
  }

  /** Keeps only rows for which `keep(change)` holds, correctly across updates: a failing
   * insert is dropped; a failing update becomes a delete of its (old) key, since the row may
   * have matched before; a passing update goes on as an update, which the sinks apply as an
   * upsert of the whole row. Deletes and truncates pass. The sink then equals `SELECT ...
   * WHERE keep` on the source if `keep` reads only the row's own values and the table sends
   * whole rows (`row_filter: true`, REPLICA IDENTITY FULL). */
  filter(keep) {
    const r = this.#raw;
    if (r.op === "insert" && !keep(this)) {
      this.dropped = true;
    } else if (r.op === "update" && !keep(this)) {
      r.op = "delete";
      r.key = r.oldKey ?? r.key;
      r.oldKey = undefined;
      r.values = { start: r.values.start, len: 0 };
    }
  }

  // Internals.

  #table() {
    return this.#out.tables[this.#raw.table];
  }

  /** Gives the change the table shape `make(current shape)`, which `edit` names. */
  #reshape(edit, make) {
    const memo = JSON.stringify([this.#raw.table, ...edit]);
    let index = this.#out.reshaped.get(memo);
    if (index === undefined) {
      index = this.#out.table(make(this.#table()));
      this.#out.reshaped.set(memo, index);
    }
    this.#raw.table = index;
  }

  #index(column) {
    if (typeof column === "number") {
      const fits = Number.isInteger(column) && column >= 0 && column < this.#table().columns.length;
      return fits ? column : undefined;
    }
    return this.#out.shape(this.#raw.table).index.get(column);
  }

  #name(column) {
    return typeof column === "number" ? column : JSON.stringify(column);
  }

  #indexOf(column) {
    const i = this.#index(column);
    if (i === undefined) {
      const has = `(it has ${this.columns.join(", ")})`;
      throw new Refuse(`${this.schema}.${this.table} has no column ${this.#name(column)} ${has}`);
    }
    return i;
  }

  /** Where column `i`'s value is: in the row, or for a delete in the key. */
  #slot(i) {
    const r = this.#raw;
    if (i < r.values.len) return r.values.start + i;
    const k = this.#out.shape(r.table).keys[i];
    return k !== undefined && k >= 0 && k < r.key.len ? r.key.start + k : undefined;
  }

  #slotValue(i) {
    const slot = this.#slot(i);
    return slot === undefined ? undefined : this.#out.values[slot];
  }

  #value(column) {
    const i = this.#index(column);
    return i === undefined ? undefined : this.#slotValue(i);
  }

  /** Every slot holding column `i`: the row, the key and, with `oldKey`, the old key. */
  #slots(i, oldKey) {
    const r = this.#raw;
    const slots = i < r.values.len ? [r.values.start + i] : [];
    const k = this.#out.shape(r.table).keys[i];
    if (k >= 0) {
      for (const span of oldKey ? [r.key, r.oldKey] : [r.key]) {
        // A slot listed twice would be rewritten twice.
        const slot = span !== undefined && k < span.len ? span.start + k : undefined;
        if (slot !== undefined && !slots.includes(slot)) slots.push(slot);
      }
    }
    return slots;
  }

  #decode(v) {
    switch (v.tag) {
      case "null":
        return null;
      case "text":
      case "numeric":
      case "json":
        return this.#out.text(v.val);
      case "other":
        return this.#out.text(v.val.text);
      case "bytes":
        return this.#out.read(v.val).slice();
      case "uuid":
        return uuidText(v.val);
      case "unchanged":
        return UNCHANGED;
      default:
        return v.val;
    }
  }

  /** The contract's form of `value` for column `i` of table `t`, whose value is `current`:
   * integers at the column's width, texts in the kind of the current value (else of the
   * column's type). */
  #encode(t, i, value, current) {
    const column = t.columns[i];
    const oid = column.typeOid;
    const misfit = () => new Refuse(`${value} does not fit column ${column.name}`);
    if (value === null) return { tag: "null" };
    if (value === UNCHANGED) return { tag: "unchanged" };
    if (typeof value === "boolean") return { tag: "boolean", val: value };
    if (typeof value === "number" || typeof value === "bigint") {
      if (oid === FLOAT4_OID || oid === FLOAT8_OID) {
        return { tag: oid === FLOAT4_OID ? "float4" : "float8", val: Number(value) };
      }
      if (oid === NUMERIC_OID) return { tag: "numeric", val: this.#out.appendText(String(value)) };
      const [tag, bound] = INT_OIDS.get(oid) ?? INT8;
      if (typeof value === "number" && !Number.isInteger(value)) {
        if (INT_OIDS.has(oid) || oid === INT8_OID) throw misfit();
        return { tag: "float8", val: value };
      }
      const n = BigInt(value);
      if (n < -bound || n >= bound) throw misfit();
      return { tag, val: NUMBER_INTS.has(tag) ? Number(n) : n };
    }
    if (value instanceof Uint8Array) return { tag: "bytes", val: this.#out.appendBytes(value) };
    if (typeof value === "string") {
      const now = current?.tag;
      const kind = now !== undefined && now !== "null" && now !== "unchanged" ? now
        : STRING_OIDS.get(oid) ?? (NAMED_OIDS.has(oid) ? "text" : "other");
      if (kind === "uuid") {
        const hex = value.replace(/-/g, "");
        if (!/^[0-9a-fA-F]{32}$/.test(hex)) {
          throw new Refuse(`column ${column.name}: \`${value}\` is not a UUID`);
        }
        const half = (from, to) => BigInt(`0x${hex.slice(from, to)}`);
        return { tag: "uuid", val: [half(0, 16), half(16, 32)] };
      }
      const span = this.#out.appendText(value);
      if (kind === "other") {
        const typeOid = now === "other" ? current.val.typeOid : oid;
        return { tag: "other", val: { typeOid, text: span } };
      }
      return { tag: TEXT_KINDS.has(kind) ? kind : "text", val: span };
    }
    throw new Refuse(`column ${column.name}: cannot write ${typeof value} ${String(value)}`);
  }
}

/** Runs `state.change` over each change of `batch`; returns the output. */
export function run(state, batch) {
  const out = new Out(batch);
  const changes = batch.changes;
  for (let index = 0; index < changes.length; index++) {
    const mark = out.changes.length;
    const c = new Change(out, changes[index]);
    try {
      state.change(c);
    } catch (e) {
      if (!(e instanceof Refuse)) throw e;
      out.changes.length = mark;
      out.errors.push({ index, message: e.message });
      continue;
    }
    if (c.dropped) continue;
    if (out.changes.length === mark) out.changes.push(rawOf(c));
    else out.changes.splice(mark, 0, rawOf(c));
  }
  const { tables, values, errors } = out;
  return { tables, data: out.finish(), values, changes: out.changes, errors };
}

// What an exception says across the boundary: componentize-js turns a thrown string into `err`.
function message(e, withName) {
  if (!(e instanceof Error)) return String(e);
  return withName ? `${e.name}: ${e.message}` : e.message;
}

/** The component's exports, `{init, transform}`, running transform class `T`:
 * `export const { init, transform } = exportTransform(T);` */
export function exportTransform(T) {
  let state = null;
  return {
    init(config) {
      state = null;
      try {
        state = new T(new Config(config));
      } catch (e) {
        throw message(e, false);
      }
    },
    transform(batch) {
      if (state === null) throw "transform called before init";
      try {
        return run(state, batch);
      } catch (e) {
        throw message(e, true);
      }
    },
  };
}
