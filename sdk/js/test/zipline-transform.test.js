// The JavaScript SDK on hand-built batches shaped as componentize-js's bindings shape them,
// natively under node (`sdk/js/test.sh`). The host import resolves to test/host.js.
import assert from "node:assert/strict";
import { register } from "node:module";
import { test } from "node:test";

// Before the SDK is loaded: its host import must resolve to the stand-in.
register("./hooks.js", import.meta.url);
const { logged } = await import("./host.js");
const zt = await import("../zipline-transform.js");
const { Config, Refuse, Transform, UNCHANGED, exportTransform, log, run } = zt;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

const col = (name, typeOid = 25, isKey = false) => ({ name, typeOid, typeModifier: -1, isKey });

const USERS = { schema: "public", name: "users", columns: [col("id", 23, true), col("email"), col("status")] };

// Changes of [id, email, status] rows; `oldIds` gives updates an old key.
function batch(rows, op = "insert", oldIds = []) {
  const data = [];
  const values = [];
  const changes = [];
  const text = (s) => {
    const b = encoder.encode(s);
    const span = { start: data.length, len: b.length };
    data.push(...b);
    return { tag: "text", val: span };
  };
  rows.forEach(([id, email, status], n) => {
    const key = { start: values.length, len: 1 };
    values.push({ tag: "int4", val: id });
    let oldKey;
    if (oldIds[n] !== undefined && oldIds[n] !== null) {
      oldKey = { start: values.length, len: 1 };
      values.push({ tag: "int4", val: oldIds[n] });
    }
    const row = { start: values.length, len: op === "delete" ? 0 : 3 };
    if (op !== "delete") values.push({ tag: "int4", val: id }, text(email), text(status));
    const position = { lsnHigh: 0n, lsnLow: 10n, ordinal: n + 1 };
    changes.push({ table: 0, op, position, key, oldKey, values: row });
  });
  return { tables: [USERS], data: Uint8Array.from(data), values, changes };
}

// Each output change as `op table(columns) key=... [old=...] row=...`, texts resolved.
function show(inp, out) {
  const base = inp.data.length;
  const value = (v) => {
    if (["text", "numeric", "json", "bytes"].includes(v.tag)) {
      const { start, len } = v.val;
      const [bytes, at] = start < base ? [inp.data, start] : [out.data, start - base];
      const b = bytes.subarray(at, at + len);
      return decoder.decode(b);
    }
    return v.tag === "unchanged" ? "unchanged" : String(v.val);
  };
  const span = (s) => out.values.slice(s.start, s.start + s.len).map(value).join(",");
  return out.changes.map((c) => {
    const t = out.tables[c.table];
    const old = c.oldKey === undefined ? "" : ` old=${span(c.oldKey)}`;
    const cols = t.columns.map((x) => x.name).join("/");
    return `${c.op} ${t.schema}.${t.name}(${cols}) key=${span(c.key)}${old} row=${span(c.values)}`;
  });
}

const transformWith = (change) =>
  class extends Transform {
    change(c) {
      change(c);
    }
  };

const runWith = (change, inp) => run(new (transformWith(change))(new Config([])), inp);

test("a change left alone goes out exactly as it came", () => {
  const inp = batch([[1, "a@x", "new"], [2, "b@x", "test"]]);
  const changes = [...inp.changes];
  const values = [...inp.values];
  const out = run(new Transform(new Config([])), inp);
  assert.equal(out.values, inp.values);
  assert.equal(out.tables, inp.tables);
  assert.deepEqual(out.values, values); // the very objects, in place
  out.changes.forEach((c, i) => assert.equal(c, changes[i]));
  assert.equal(out.data.length, 0);
  assert.deepEqual(out.errors, []);
});

test("getters read by name and index, and deletes read their key", () => {
  const seen = [];
  const read = (c) =>
    seen.push([c.op, c.schema, c.table, c.get("id"), c.get(1), c.getStr("status"), c.getInt("email"),
      c.isNull("email"), c.get("nope"), c.hasColumn("status"), c.hasColumn(3), c.isTable("public.users"),
      c.isTable("users"), c.isTable("other.users"), c.kind("email"), c.columns.join("/")]);
  runWith(read, batch([[7, "a@x", "new"]]));
  runWith(read, batch([[8, "", ""]], "delete"));
  assert.deepEqual(seen, [
    ["insert", "public", "users", 7, "a@x", "new", undefined, false, undefined, true, false, true, true, false,
      "text", "id/email/status"],
    ["delete", "public", "users", 8, undefined, undefined, undefined, false, undefined, true, false, true, true,
      false, undefined, "id/email/status"],
  ]);
});

test("get decodes every variant; typed getters only their own", () => {
  const t = {
    schema: "s",
    name: "t",
    columns: [col("n"), col("b", 16), col("i2", 21), col("i8", 20), col("f", 700), col("u", 2950), col("x", 17),
      col("j", 3802), col("o", 600), col("u2"), col("num", 1700), col("ts", 1184)],
  };
  const data = encoder.encode("\x01\x02{}(1,2)12.5");
  const values = [
    { tag: "null" }, { tag: "boolean", val: true }, { tag: "int2", val: -3 }, { tag: "int8", val: 2n ** 62n + 1n },
    { tag: "float4", val: 1.5 }, { tag: "uuid", val: [0xffffffffffffffffn, 0x0123456789abcdefn] },
    { tag: "bytes", val: { start: 0, len: 2 } }, { tag: "json", val: { start: 2, len: 2 } },
    { tag: "other", val: { typeOid: 600, text: { start: 4, len: 5 } } }, { tag: "unchanged" },
    { tag: "numeric", val: { start: 9, len: 4 } }, { tag: "timestamptz", val: -1n },
  ];
  const inp = {
    tables: [t], data, values,
    changes: [{ table: 0, op: "update", position: {}, key: { start: 0, len: 0 }, values: { start: 0, len: 12 } }],
  };
  let got;
  runWith((c) => {
    got = {
      all: c.columns.map((n) => c.get(n)),
      str: c.columns.map((n) => c.getStr(n)),
      int: c.columns.map((n) => c.getInt(n)),
      float: ["i2", "i8", "f", "n"].map((n) => c.getFloat(n)),
      bool: c.getBool("b"),
      nulls: c.columns.map((n) => c.isNull(n)),
    };
  }, inp);
  assert.deepEqual(got.all, [null, true, -3, 2n ** 62n + 1n, 1.5, "ffffffff-ffff-ffff-0123-456789abcdef",
    Uint8Array.of(1, 2), "{}", "(1,2)", UNCHANGED, "12.5", -1n]);
  assert.deepEqual(got.str, [undefined, undefined, undefined, undefined, undefined, undefined, undefined, "{}",
    "(1,2)", undefined, "12.5", undefined]);
  assert.deepEqual(got.int.slice(0, 5), [undefined, undefined, -3, 2n ** 62n + 1n, undefined]);
  assert.deepEqual(got.float, [-3, 2 ** 62, 1.5, undefined]);
  assert.equal(got.bool, true);
  assert.deepEqual(got.nulls.map(Number).join(""), "100000000000");
});

test("mapStr writes new text everywhere the change holds it, and keeps a text left as it was", () => {
  const inp = batch([[1, "alice@x", "new"], [2, "bob@y", "paid"]]);
  const out = runWith((c) => c.mapStr("email", (s) => s[0] + "***"), inp);
  assert.deepEqual(show(inp, out), [
    "insert public.users(id/email/status) key=1 row=1,a***,new",
    "insert public.users(id/email/status) key=2 row=2,b***,paid",
  ]);
  assert.equal(decoder.decode(out.data), "a***b***");
  const same = batch([[1, "a", "b"]]);
  const before = same.values[2];
  const kept = runWith((c) => c.mapStr("email", (s) => s), same);
  assert.equal(kept.values[2], before);
  assert.equal(kept.data.length, 0);
});

test("setting a key column sets the key, and mapStr the old key", () => {
  const inp = batch([[1, "a", "new"]], "update", [5]);
  const out = runWith((c) => c.set("id", c.getInt("id") * 10), inp);
  assert.deepEqual(show(inp, out), ["update public.users(id/email/status) key=10 old=5 row=10,a,new"]);

  const leads = { schema: "public", name: "leads", columns: [col("phone", 25, true)] };
  const leadsBatch = () => ({
    tables: [leads],
    data: encoder.encode("+47 55+47 00"),
    values: [{ tag: "text", val: { start: 0, len: 6 } }, { tag: "text", val: { start: 6, len: 6 } },
      { tag: "text", val: { start: 0, len: 6 } }],
    changes: [{ table: 0, op: "update", position: {}, key: { start: 0, len: 1 }, oldKey: { start: 1, len: 1 },
      values: { start: 2, len: 1 } }],
  });
  const masked = leadsBatch();
  const out2 = runWith((c) => c.mapStr("phone", (s) => s.slice(0, 3) + "***"), masked);
  assert.deepEqual(show(masked, out2), ["update public.leads(phone) key=+47*** old=+47*** row=+47***"]);

  // A value two spans share is rewritten once.
  const shared = leadsBatch();
  shared.changes[0].key = { start: 2, len: 1 };
  const out3 = runWith((c) => c.mapStr("phone", (s) => `<${s}>`), shared);
  assert.deepEqual(show(shared, out3), ["update public.leads(phone) key=<+47 55> old=<+47 00> row=<+47 55>"]);
});

test("setters write texts in the column's kind, null, unchanged, bytes, uuids and floats", () => {
  const t = {
    schema: "s", name: "t",
    columns: [col("id", 2950, true), col("j", 3802), col("o", 600), col("b", 17), col("f", 700), col("d", 701),
      col("n", 1700), col("s")],
  };
  const data = encoder.encode("{}(1,2)");
  const uuid = { tag: "uuid", val: [0x1234567812345678n, 0x1234567812345678n] };
  const inp = {
    tables: [t], data,
    values: [
      uuid,
      { tag: "json", val: { start: 0, len: 2 } },
      { tag: "other", val: { typeOid: 600, text: { start: 2, len: 5 } } },
      ...Array.from({ length: 4 }, () => ({ tag: "null" })),
      { tag: "text", val: { start: 0, len: 2 } },
      uuid,
    ],
    changes: [{ table: 0, op: "insert", position: {}, key: { start: 8, len: 1 }, values: { start: 0, len: 8 } }],
  };
  const out = runWith((c) => {
    c.set("j", "[1]");
    c.setStr("o", "(3,4)");
    c.set("b", Uint8Array.of(0xff));
    c.set("f", 2);
    c.set("d", 2n);
    c.set("n", 12.5);
    c.setNull("s");
    c.set("id", "ffffffff-ffff-ffff-ffff-fffffffffffe");
    assert.equal(c.get("id"), "ffffffff-ffff-ffff-ffff-fffffffffffe");
    assert.throws(() => c.set("id", "nope"), (e) => e instanceof Refuse && /is not a UUID/.test(e.message));
    c.set("s", UNCHANGED);
  }, inp);
  const v = out.values;
  assert.deepEqual([v[1].tag, v[2].tag, v[2].val.typeOid, v[3].tag, v[4], v[5], v[6].tag, v[7]],
    ["json", "other", 600, "bytes", { tag: "float4", val: 2 }, { tag: "float8", val: 2 }, "numeric",
      { tag: "unchanged" }]);
  assert.deepEqual(v[0], { tag: "uuid", val: [2n ** 64n - 1n, 2n ** 64n - 2n] });
  assert.equal(v[8], v[0]); // the key follows
  assert.deepEqual([...out.data], [...encoder.encode("[1](3,4)"), 0xff, ...encoder.encode("12.5")]);
});

test("filter keeps the replica equal to the predicate", () => {
  const noTest = (c) => c.filter((row) => row.getStr("status") !== "test");
  const ins = batch([[1, "a", "new"], [2, "b", "test"]]);
  assert.deepEqual(show(ins, runWith(noTest, ins)), ["insert public.users(id/email/status) key=1 row=1,a,new"]);
  const upd = batch([[1, "a", "test"], [2, "b", "paid"], [30, "c", "test"]], "update", [null, null, 3]);
  const out = runWith(noTest, upd);
  assert.deepEqual(show(upd, out), [
    "delete public.users(id/email/status) key=1 row=",
    "update public.users(id/email/status) key=2 row=2,b,paid",
    "delete public.users(id/email/status) key=3 row=",
  ]);
  assert.equal(out.changes[2].oldKey, undefined);
  const dels = batch([[4, "", ""]], "delete");
  assert.deepEqual(show(dels, runWith(noTest, dels)), ["delete public.users(id/email/status) key=4 row="]);
  const trunc = { ...batch([]), changes: [{ table: 0, op: "truncate", position: {}, key: { start: 0, len: 0 },
    values: { start: 0, len: 0 } }] };
  assert.equal(runWith(noTest, trunc).changes.length, 1);
});

test("integers are written at the column's width, and too wide refuses", () => {
  const columns = [col("a", 21), col("b", 23), col("c", 20), col("d", 25), col("e", 1082)];
  const t = { schema: "s", name: "t", columns };
  const inp = () => ({
    tables: [t], data: new Uint8Array(0), values: Array.from({ length: 5 }, () => ({ tag: "null" })),
    changes: [{ table: 0, op: "insert", position: {}, key: { start: 0, len: 0 }, values: { start: 0, len: 5 } }],
  });
  const out = runWith((c) => {
    c.set("a", -32768);
    c.set("b", 2n ** 31n - 1n); // a BigInt into int4 becomes a Number
    c.set("c", 7); // a Number into int8 becomes a BigInt
    c.setInt("d", -(2n ** 63n));
    c.set("e", 19000);
  }, inp());
  assert.deepEqual(out.values, [{ tag: "int2", val: -32768 }, { tag: "int4", val: 2 ** 31 - 1 },
    { tag: "int8", val: 7n },
    { tag: "int8", val: -(2n ** 63n) }, { tag: "date", val: 19000 }]);
  assert.deepEqual(out.errors, []);

  const refused = (column, value, setter = "set") =>
    runWith((c) => c[setter](column, value), inp()).errors.map((e) => e.message);
  assert.deepEqual(refused("a", 32768), ["32768 does not fit column a"]);
  assert.deepEqual(refused("b", 2 ** 40), [`${2 ** 40} does not fit column b`]);
  assert.deepEqual(refused("b", -(2n ** 31n) - 1n), ["-2147483649 does not fit column b"]);
  assert.deepEqual(refused("c", 2n ** 63n), ["9223372036854775808 does not fit column c"]);
  assert.deepEqual(refused("c", 1.5), ["1.5 does not fit column c"]);
  assert.deepEqual(refused("d", 1.5, "setInt"), ["1.5 is not an integer, for column \"d\""]);
  assert.deepEqual(refused("d", {}), ["column d: cannot write object [object Object]"]);
});

test("shapes change per change and each new shape is listed once", () => {
  const inp = batch([[1, "a", "x"], [2, "b", "y"], [3, "c", "z"]]);
  const out = runWith((c) => {
    if (c.getInt("id") % 2) {
      c.renameTable("crm", "customers");
      c.renameColumn("email", "mail");
      c.dropColumn("status");
    }
  }, inp);
  assert.deepEqual(show(inp, out), [
    "insert crm.customers(id/mail) key=1 row=1,a",
    "insert public.users(id/email/status) key=2 row=2,b,y",
    "insert crm.customers(id/mail) key=3 row=3,c",
  ]);
  assert.equal(out.tables.length, 4); // users, then one per edit step
  assert.equal(out.changes[0].table, out.changes[2].table);
});

test("a key column cannot be dropped, and unknown columns are named", () => {
  const inp = batch([[1, "a", "x"]]);
  assert.equal(runWith((c) => c.dropColumn("id"), inp).errors[0].message,
    "cannot drop key column id of public.users");
  assert.equal(runWith((c) => c.setStr("nope", "x"), inp).errors[0].message,
    'public.users has no column "nope" (it has id, email, status)');
  assert.equal(runWith((c) => c.mapStr(9, (s) => s), inp).errors[0].message,
    "public.users has no column 9 (it has id, email, status)");
});

test("emitted changes follow theirs, and a refusal takes them too", () => {
  // typeModifier and isKey may be left out.
  const columns = [{ name: "id", typeOid: 20, isKey: true }, { name: "what", typeOid: 25 }];
  const audit = { schema: "ops", name: "audit", columns };
  const inp = batch([[1, "a", "x"], [2, "b", "y"], [3, "c", "z"]]);
  const out = runWith((c) => {
    c.emitCopy("public", "users_copy");
    c.emit("insert", audit, [c.getInt("id"), "seen " + c.getStr("email")]);
    if (c.getInt("id") === 2) throw new Refuse("no 2");
    if (c.getInt("id") === 3) {
      c.setStr("email", "changed after the copy");
      c.dropColumn("status");
      return;
    }
    c.drop();
  }, inp);
  assert.deepEqual(show(inp, out), [
    "insert public.users_copy(id/email/status) key=1 row=1,a,x",
    "insert ops.audit(id/what) key=1 row=1,seen a",
    "insert public.users(id/email) key=3 row=3,changed after the copy",
    "insert public.users_copy(id/email/status) key=3 row=3,c,z",
    "insert ops.audit(id/what) key=3 row=3,seen c",
  ]);
  assert.deepEqual(out.errors, [{ index: 1, message: "no 2" }]);
  assert.equal(out.values[out.changes[1].key.start].tag, "int8"); // the audit table's id is int8
  assert.equal(out.changes[1].position, inp.changes[0].position);
  assert.equal(runWith((c) => c.emit("insert", audit, [1]), inp).errors[0].message,
    "emit into ops.audit: 1 values for 2 columns");
  const del = runWith((c) => c.emit("delete", audit, [5, null]), batch([[1, "a", "x"]]));
  assert.deepEqual(show(batch([[1, "a", "x"]]), del).slice(1), ["delete ops.audit(id/what) key=5 row="]);
});

test("a string where there is no value, or NULL, takes the kind of the column's type", () => {
  const t = {
    schema: "s",
    name: "t",
    columns: [col("id", 2950, true), col("j", 3802), col("p", 600), col("n", 1700), col("s", 1043)],
  };
  const u = "00000000-0000-0000-0000-000000000001";
  const inp = batch([[1, "a", "x"]]);
  const out = runWith((c) => c.emit("insert", t, [u, "{}", "(1,2)", "1.5", "v"]), inp);
  const row = out.changes[1].values;
  assert.deepEqual(out.values.slice(row.start, row.start + row.len).map((v) => v.tag),
    ["uuid", "json", "other", "numeric", "text"]);
  assert.equal(out.values[row.start + 2].val.typeOid, 600);
  assert.deepEqual(out.values[out.changes[1].key.start], { tag: "uuid", val: [0n, 1n] });

  const nulls = {
    tables: [t], data: new Uint8Array(0), values: Array.from({ length: 5 }, () => ({ tag: "null" })),
    changes: [{ table: 0, op: "insert", position: {}, key: { start: 0, len: 0 }, values: { start: 0, len: 5 } }],
  };
  const set = runWith((c) => c.columns.forEach((n, i) => c.set(n, [u, "[]", "(3,4)", "2", "w"][i])), nulls);
  assert.deepEqual(set.values.map((v) => v.tag), ["uuid", "json", "other", "numeric", "text"]);
});

test("mapBytes rewrites bytea values and keeps bytes left as they were", () => {
  const t = { schema: "s", name: "t", columns: [col("b", 17)] };
  const inp = {
    tables: [t], data: Uint8Array.of(1, 2, 3),
    values: [{ tag: "bytes", val: { start: 0, len: 3 } }],
    changes: [{ table: 0, op: "insert", position: {}, key: { start: 0, len: 0 }, values: { start: 0, len: 1 } }],
  };
  const out = runWith((c) => c.mapBytes("b", (b) => b.fill(0, 0, 2)), inp);
  assert.deepEqual(out.values[0], { tag: "bytes", val: { start: 3, len: 3 } });
  assert.deepEqual([...out.data], [0, 0, 3]);
  assert.deepEqual([...inp.data], [1, 2, 3]); // the input's bytes are not written
  const kept = runWith((c) => c.mapBytes("b", (b) => b), inp);
  assert.equal(kept.data.length, 0);
});

test("config is typed and names bad or unknown keys", () => {
  const c = new Config([
    ["n", " 12 "], ["cols", "a, b,,c"], ["f", "x"], ["big", "9007199254740993"], ["on", "true"],
  ]);
  assert.deepEqual([c.parse("n", Number), c.require("n", Number), c.list("cols"), c.get("z"), c.get("z", "d")],
    [12, 12, ["a", "b", "c"], undefined, "d"]);
  assert.equal(c.parse("big", BigInt), 9007199254740993n);
  assert.equal(c.parse("on", Boolean), true);
  assert.equal(c.parse("z", Number), undefined);
  assert.deepEqual(c.list("z"), []);
  assert.throws(() => c.parse("f", Number), { message: "config `f`: cannot read `x`: not a number" });
  assert.throws(() => c.parse("f", Boolean), { message: "config `f`: cannot read `x`: not true or false" });
  assert.throws(() => c.parse("f", BigInt), /^Error: config `f`: cannot read `x`: /);
  assert.throws(() => c.parse("f", (s) => { throw `no ${s}`; }), { message: "config `f`: cannot read `x`: no x" });
  assert.throws(() => c.require("z"), { message: "config `z` is required" });
  assert.throws(() => c.allowOnly("n", "f"), { message: "unknown config key `cols`; expected n, f" });
  assert.throws(() => new Transform(new Config([["a", "1"]])),
    { message: "unknown config key `a`; expected none" });
});

test("the exports report init and batch failures as thrown strings", () => {
  class Strict extends Transform {
    constructor(config) {
      super(config, "x");
      log("info", "ready");
    }

    change(c) {
      if (c.getInt("id") === 2) throw new Refuse("not 2");
      if (c.getInt("id") === 3) null.boom;
    }
  }
  const { init, transform } = exportTransform(Strict);
  assert.throws(() => transform(batch([[1, "a", "b"]])), (e) => e === "transform called before init");
  assert.throws(() => init([["y", "1"]]), (e) => e === "unknown config key `y`; expected x");
  assert.equal(init([["x", "1"]]), undefined);
  assert.deepEqual(logged.at(-1), ["info", "ready"]);
  assert.deepEqual(transform(batch([[1, "a", "b"], [2, "c", "d"]])).errors, [{ index: 1, message: "not 2" }]);
  assert.throws(() => transform(batch([[3, "a", "b"]])),
    (e) => typeof e === "string" && e.startsWith("TypeError: "));
  const thrower = exportTransform(class { constructor() { throw "no config for you"; } });
  assert.throws(() => thrower.init([]), (e) => e === "no config for you");
  assert.throws(() => thrower.transform(batch([])), (e) => e === "transform called before init");
});
