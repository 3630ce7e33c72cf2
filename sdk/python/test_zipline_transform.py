"""The Python SDK on hand-built batches, natively, against the contract's real generated
bindings (`sdk/python/test.sh` generates them with componentize-py and runs this)."""

import unittest
import uuid

from componentize_py_types import Err
from wit_world.imports import host
from wit_world.imports import types as w

import zipline_transform as zt
from zipline_transform import UNCHANGED, Change, Config, Op, Refuse, Transform

LOGGED = []
host.log = lambda level, message: LOGGED.append((level, message))


def col(name, oid=25, key=False):
    return w.Column(name=name, type_oid=oid, type_modifier=-1, is_key=key)


USERS = w.Table(schema="public", name="users",
                columns=[col("id", 23, True), col("email"), col("status")])


def batch(rows, op=Op.INSERT, old_ids=None):
    """Changes of (id, email, status) rows; `old_ids` gives updates an old key."""
    data, values, changes = bytearray(), [], []

    def text(s):
        span = w.Span(len(data), len(s.encode()))
        data.extend(s.encode())
        return w.Value_Text(span)

    for n, (id_, email, status) in enumerate(rows):
        key = w.Span(len(values), 1)
        values.append(w.Value_Int4(id_))
        old = None
        if old_ids and old_ids[n] is not None:
            old = w.Span(len(values), 1)
            values.append(w.Value_Int4(old_ids[n]))
        row = w.Span(len(values), 0 if op == Op.DELETE else 3)
        if op != Op.DELETE:
            values += [w.Value_Int4(id_), text(email), text(status)]
        changes.append(w.Change(0, op, w.Position(0, 10, n + 1), key, old, row))
    return w.Batch(tables=[USERS], data=bytes(data), values=values, changes=changes)


def show(inp, out):
    """Each output change as `op table key [old] values`, texts resolved."""
    base = len(inp.data)

    def value(v):
        if isinstance(v, (w.Value_Text, w.Value_Numeric, w.Value_Json, w.Value_Bytes)):
            s = v.value
            b = inp.data[s.start:s.start + s.len] if s.start < base else \
                out.data[s.start - base:s.start - base + s.len]
            return bytes(b).decode()
        return "unchanged" if isinstance(v, w.Value_Unchanged) else repr(getattr(v, "value", None))

    def span(s):
        return ",".join(value(v) for v in out.values[s.start:s.start + s.len])

    lines = []
    for c in out.changes:
        t = out.tables[c.table]
        old = f" old={span(c.old_key)}" if c.old_key is not None else ""
        cols = "/".join(x.name for x in t.columns)
        lines.append(f"{c.op.name.lower()} {t.schema}.{t.name}({cols}) key={span(c.key)}{old} "
                     f"row={span(c.values)}")
    return lines


def run(cls, inp, config=()):
    return zt.run(cls(Config(list(config))), inp)


class Passes(Transform):
    pass


class SdkTests(unittest.TestCase):
    def test_a_change_left_alone_goes_out_exactly_as_it_came(self):
        inp = batch([(1, "a@x", "new"), (2, "b@x", "test")])
        out = run(Passes, inp)
        self.assertEqual(out.changes, inp.changes)
        self.assertIs(out.values, inp.values)
        self.assertEqual((out.data, out.errors, out.tables), (b"", [], [USERS]))

    def test_getters_read_by_name_and_index_and_deletes_read_their_key(self):
        seen = []

        class Read(Transform):
            def change(self, c: Change):
                seen.append((c.op, c.schema, c.table, c.get("id"), c.get(1), c.get_str("status"),
                             c.get_int("email"), c.is_null("email"), c.get("nope"),
                             c.has_column("status"), c.is_table("public.users"),
                             c.is_table("users"), c.is_table("other.users")))

        run(Read, batch([(7, "a@x", "new")]))
        run(Read, batch([(8, "", "")], Op.DELETE))
        self.assertEqual(seen, [
            (Op.INSERT, "public", "users", 7, "a@x", "new", None, False, None, True, True, True,
             False),
            (Op.DELETE, "public", "users", 8, None, None, None, False, None, True, True, True,
             False),
        ])

    def test_map_str_writes_new_text_everywhere_the_change_holds_it(self):
        class Mask(Transform):
            def change(self, c):
                c.map_str("email", lambda s: s[0] + "***")

        inp = batch([(1, "alice@x", "new"), (2, "bob@y", "paid")])
        self.assertEqual(show(inp, run(Mask, inp)), [
            "insert public.users(id/email/status) key=1 row=1,a***,new",
            "insert public.users(id/email/status) key=2 row=2,b***,paid",
        ])

    def test_setting_a_key_column_sets_the_key_and_map_str_the_old_key(self):
        class Rekey(Transform):
            def change(self, c):
                c.set("id", c.get_int("id") * 10)

        inp = batch([(1, "a", "new")], Op.UPDATE, old_ids=[5])
        self.assertEqual(show(inp, run(Rekey, inp)),
                         ["update public.users(id/email/status) key=10 old=5 row=10,a,new"])

        class Mask(Transform):
            def change(self, c):
                c.map_str("phone", lambda s: s[:3] + "***")

        leads = w.Table(schema="public", name="leads", columns=[col("phone", key=True)])
        inp = w.Batch(tables=[leads], data=b"+47 55+47 00", values=[
            w.Value_Text(w.Span(0, 6)), w.Value_Text(w.Span(6, 6)), w.Value_Text(w.Span(0, 6))],
            changes=[w.Change(0, Op.UPDATE, w.Position(0, 1, 1), w.Span(0, 1), w.Span(1, 1),
                              w.Span(2, 1))])
        self.assertEqual(show(inp, run(Mask, inp)),
                         ["update public.leads(phone) key=+47*** old=+47*** row=+47***"])

    def test_filter_keeps_the_replica_equal_to_the_predicate(self):
        class NoTest(Transform):
            def change(self, c):
                c.filter(lambda row: row.get_str("status") != "test")

        ins = batch([(1, "a", "new"), (2, "b", "test")])
        self.assertEqual(show(ins, run(NoTest, ins)),
                         ["insert public.users(id/email/status) key=1 row=1,a,new"])
        upd = batch([(1, "a", "test"), (2, "b", "paid"), (30, "c", "test")], Op.UPDATE,
                    old_ids=[None, None, 3])
        self.assertEqual(show(upd, run(NoTest, upd)), [
            "delete public.users(id/email/status) key=1 row=",
            "update public.users(id/email/status) key=2 row=2,b,paid",
            "delete public.users(id/email/status) key=3 row=",
        ])
        dels = batch([(4, "", "")], Op.DELETE)
        self.assertEqual(show(dels, run(NoTest, dels)),
                         ["delete public.users(id/email/status) key=4 row="])

    def test_integers_are_written_at_the_column_width_and_too_wide_refuses(self):
        class Big(Transform):
            def change(self, c):
                c.set("id", 1 << 40)

        inp = batch([(1, "a", "new")])
        out = run(Big, inp)
        self.assertEqual(out.changes, [])
        self.assertEqual(out.errors, [w.ChangeError(0, f"{1 << 40} does not fit column id")])

        class Fits(Transform):
            def change(self, c):
                c.set("id", -(1 << 31))
                c.set("email", None)
                c.set("status", UNCHANGED)

        out = run(Fits, inp)
        row = out.values[out.changes[0].values.start:][:3]
        self.assertEqual(row, [w.Value_Int4(-(1 << 31)), w.Value_Null(), w.Value_Unchanged()])

    def test_shapes_change_per_change_and_each_new_shape_is_listed_once(self):
        class Shape(Transform):
            def change(self, c):
                if c.get_int("id") % 2:
                    c.rename_table("crm", "customers")
                    c.rename_column("email", "mail")
                    c.drop_column("status")

        inp = batch([(1, "a", "x"), (2, "b", "y"), (3, "c", "z")])
        out = run(Shape, inp)
        self.assertEqual(show(inp, out), [
            "insert crm.customers(id/mail) key=1 row=1,a",
            "insert public.users(id/email/status) key=2 row=2,b,y",
            "insert crm.customers(id/mail) key=3 row=3,c",
        ])
        self.assertEqual(len(out.tables), 4)  # users, then one per edit step

    def test_a_key_column_cannot_be_dropped_and_unknown_columns_are_named(self):
        class DropKey(Transform):
            def change(self, c):
                c.drop_column("id")

        class Unknown(Transform):
            def change(self, c):
                c.set_str("nope", "x")

        inp = batch([(1, "a", "x")])
        self.assertEqual(run(DropKey, inp).errors[0].message,
                         "cannot drop key column id of public.users")
        self.assertEqual(run(Unknown, inp).errors[0].message,
                         "public.users has no column 'nope' (it has id, email, status)")

    def test_emitted_changes_follow_theirs_and_a_refusal_takes_them_too(self):
        audit = w.Table(schema="ops", name="audit", columns=[col("id", 20, True), col("what")])

        class Fan(Transform):
            def change(self, c):
                c.emit_copy("public", "users_copy")
                c.emit(Op.INSERT, audit, [c.get_int("id"), "seen " + c.get_str("email")])
                if c.get_int("id") == 2:
                    raise Refuse("no 2")
                c.drop()

        inp = batch([(1, "a", "x"), (2, "b", "y")])
        out = run(Fan, inp)
        self.assertEqual(show(inp, out), [
            "insert public.users_copy(id/email/status) key=1 row=1,a,x",
            "insert ops.audit(id/what) key=1 row=1,seen a",
        ])
        self.assertEqual(out.errors, [w.ChangeError(1, "no 2")])

    def test_uuid_and_bytes_round_trip(self):
        table = w.Table(schema="s", name="t", columns=[col("id", 2950, True), col("b", 17)])
        u = uuid.UUID("12345678-1234-5678-1234-567812345678")
        inp = w.Batch(tables=[table], data=b"\x00\x01", values=[
            w.Value_Uuid((u.int >> 64, u.int & ((1 << 64) - 1))), w.Value_Bytes(w.Span(0, 2)),
            w.Value_Uuid((u.int >> 64, u.int & ((1 << 64) - 1)))],
            changes=[w.Change(0, Op.INSERT, w.Position(0, 1, 1), w.Span(2, 1), None,
                              w.Span(0, 2))])
        seen = []

        class Read(Transform):
            def change(self, c):
                seen.append((c.get("id"), c.get("b")))
                c.set("b", b"\xff")

        out = run(Read, inp)
        self.assertEqual(seen, [(u, b"\x00\x01")])
        self.assertEqual((out.values[1], out.data), (w.Value_Bytes(w.Span(2, 1)), b"\xff"))

    def test_config_is_typed_and_names_bad_or_unknown_keys(self):
        c = Config([("n", " 12 "), ("cols", "a, b,,c"), ("f", "x")])
        self.assertEqual((c.parse("n", int), c.require("n", int), c.list("cols"), c.get("z")),
                         (12, 12, ["a", "b", "c"], None))
        with self.assertRaisesRegex(ValueError, "config `f`: cannot read `x`"):
            c.parse("f", float)
        with self.assertRaisesRegex(ValueError, "config `z` is required"):
            c.require("z")
        with self.assertRaisesRegex(ValueError, "unknown config key `cols`; expected n, f"):
            c.allow_only("n", "f")

    def test_the_exported_world_reports_init_and_batch_failures_as_err(self):
        class Strict(Transform):
            def __init__(self, config):
                config.allow_only("x")
                zt.log(zt.Level.INFO, "ready")

            def change(self, c):
                raise KeyError("boom")

        world = zt.export(Strict)()
        with self.assertRaises(Err) as e:
            world.transform(batch([(1, "a", "b")]))
        self.assertEqual(e.exception.value, "transform called before init")
        with self.assertRaises(Err) as e:
            world.init([("y", "1")])
        self.assertEqual(e.exception.value, "unknown config key `y`; expected x")
        world.init([("x", "1")])
        self.assertEqual(LOGGED[-1], (zt.Level.INFO, "ready"))
        with self.assertRaises(Err) as e:
            world.transform(batch([(1, "a", "b")]))
        self.assertEqual(e.exception.value, "KeyError: 'boom'")


if __name__ == "__main__":
    unittest.main()
