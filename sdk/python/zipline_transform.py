"""Zipline transforms in Python (componentize-py): you write what happens to one change.

    from zipline_transform import Change, Transform, export

    class NoTest(Transform):
        def change(self, c: Change) -> None:
            c.filter(lambda row: row.get_str("status") != "test")

    WitWorld = export(NoTest)

`export(T)` makes the class componentize-py looks for (`WitWorld`, in the app module): its
`init` builds `T(config)` once per instance, its `transform` runs `T.change` on each change of
a batch, in commit order, and returns what they made. Raising `Refuse(message)` (or a setter's
own `Refuse`) refuses that change: the route's `on_error` decides what happens to it. Any other
exception fails the whole batch. An exception in `T(config)` stops the pipeline at start-up.

The batch's layout (contract 0.3.0: four flat lists, values as spans of one `data` buffer)
stays hidden: getters decode the one value asked for, setters append new bytes and point the
value at them, and a change nobody touched goes out exactly as it came in.
"""

import uuid as _uuid

import wit_world
from componentize_py_types import Err
from wit_world.imports import host
from wit_world.imports import types as w

Op = w.Op
Level = host.Level

__all__ = [
    "Change", "Config", "Level", "Op", "Refuse", "Transform", "UNCHANGED", "export", "log",
]


class Refuse(Exception):
    """Refuses the change being transformed, with this message."""


class _Unchanged:
    def __repr__(self):
        return "UNCHANGED"


UNCHANGED = _Unchanged()
"""A large (TOASTed) value the update did not touch: the sink keeps what it has."""

_TEXT_KINDS = (w.Value_Text, w.Value_Numeric, w.Value_Json)
_INT_OIDS = {21: (w.Value_Int2, 1 << 15), 23: (w.Value_Int4, 1 << 31)}
_FLOAT4_OID = 700


def log(level, message: str) -> None:
    """Writes `message` to Zipline's log, tagged with the route and module."""
    host.log(level, message)


class Config:
    """The route's `config:` map (values are strings), with typed parsing."""

    def __init__(self, pairs):
        self.pairs = list(pairs)

    def get(self, key: str, default=None):
        """The value of `key`, or `default` when unset."""
        for k, v in self.pairs:
            if k == key:
                return v
        return default

    def list(self, key: str) -> list:
        """The comma-separated items of `key`, trimmed, empty ones left out."""
        value = self.get(key)
        return [] if value is None else [s.strip() for s in value.split(",") if s.strip()]

    def parse(self, key: str, kind=str):
        """`key` converted by `kind` (`int`, `float`, ...), or None when unset."""
        value = self.get(key)
        if value is None:
            return None
        try:
            return kind(value.strip())
        except (TypeError, ValueError) as e:
            raise ValueError(f"config `{key}`: cannot read `{value}`: {e}") from None

    def require(self, key: str, kind=str):
        """Like `parse`, but an unset key is an error."""
        value = self.parse(key, kind)
        if value is None:
            raise ValueError(f"config `{key}` is required")
        return value

    def allow_only(self, *known: str) -> None:
        """Raises naming the first key not in `known`: a typo must stop the pipeline."""
        for k, _ in self.pairs:
            if k not in known:
                raise ValueError(f"unknown config key `{k}`; expected {', '.join(known)}")


class Transform:
    """Subclass and override `change`; `__init__(self, config)` reads the route's config."""

    def __init__(self, config: Config):
        config.allow_only()

    def change(self, c: "Change") -> None:
        """Transforms one change in place; the default passes it on."""


class _Out:
    """The output being built: the input's values (edited in place) and the new bytes, whose
    spans count on from the end of the input's `data`."""

    __slots__ = ("input", "base", "data", "values", "tables", "changes", "errors", "names",
                 "reshaped")

    def __init__(self, batch):
        self.input = batch.data
        self.base = len(batch.data)
        self.data = bytearray()
        self.values = batch.values
        self.tables = list(batch.tables)
        self.changes = []
        self.errors = []
        # table index -> (column names in order, name -> index), made on first use.
        self.names = {}
        # (table index, edit) -> table index: a batch's changes of one table get the same
        # edits, so each new shape is built and looked up once.
        self.reshaped = {}

    def bytes(self, span) -> bytes:
        start = span.start
        if start >= self.base:
            start -= self.base
            return bytes(self.data[start:start + span.len])
        return bytes(self.input[start:start + span.len])

    def append(self, b: bytes):
        span = w.Span(start=self.base + len(self.data), len=len(b))
        self.data += b
        return span

    def table(self, t) -> int:
        """The index of table `t` in the output, added when no equal one is listed."""
        for i, x in enumerate(self.tables):
            if x == t:
                return i
        self.tables.append(t)
        return len(self.tables) - 1

    def columns(self, table: int) -> tuple:
        return self._names(table)[0]

    def _names(self, table: int) -> tuple:
        found = self.names.get(table)
        if found is None:
            names = tuple(c.name for c in self.tables[table].columns)
            found = self.names[table] = (names, {n: i for i, n in enumerate(names)})
        return found

    def index(self, table: int, column):
        """The index of `column` (a name or an index) in table #`table`, or None."""
        cols = self.tables[table].columns
        if isinstance(column, int):
            return column if 0 <= column < len(cols) else None
        return self._names(table)[1].get(column)


class Change:
    """One change of a batch. Getters read the new row (for a delete: its key columns);
    setters write new values, and setting a key column sets the change's key too."""

    __slots__ = ("_out", "_raw", "dropped")

    def __init__(self, out: _Out, raw):
        self._out = out
        self._raw = raw
        self.dropped = False

    # Reading.

    @property
    def op(self):
        """`Op.INSERT`, `Op.UPDATE`, `Op.DELETE` or `Op.TRUNCATE`."""
        return self._raw.op

    @property
    def schema(self) -> str:
        return self._shape().schema

    @property
    def table(self) -> str:
        return self._shape().name

    @property
    def columns(self) -> tuple:
        """The table's column names, in order."""
        return self._out.columns(self._raw.table)

    def is_table(self, name: str) -> bool:
        """Whether the table is `name`: `schema.table`, or a bare name for any schema."""
        schema, dot, table = name.rpartition(".")
        return self.table == table and (not dot or self.schema == schema)

    def has_column(self, column) -> bool:
        return self._out.index(self._raw.table, column) is not None

    def get(self, column):
        """The value of `column` as Python sees it: None (NULL), bool, int, float, str (text,
        numeric, json and other types), bytes, uuid.UUID, or UNCHANGED. Dates, times and
        timestamps are the contract's integers. None too when there is no such column or the
        change holds no value for it."""
        i = self._out.index(self._raw.table, column)
        slot = None if i is None else self._slot(i)
        return None if slot is None else self._decode(self._out.values[slot])

    def get_str(self, column):
        v = self.get(column)
        return v if isinstance(v, str) else None

    def get_int(self, column):
        v = self.get(column)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def get_float(self, column):
        v = self.get(column)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def get_bool(self, column):
        v = self.get(column)
        return v if isinstance(v, bool) else None

    def is_null(self, column) -> bool:
        i = self._out.index(self._raw.table, column)
        slot = None if i is None else self._slot(i)
        return slot is not None and isinstance(self._out.values[slot], w.Value_Null)

    # Writing.

    def set(self, column, value) -> None:
        """Sets `column` (a key column's key value follows). Raises `Refuse` for a column the
        table lacks or an integer too wide for it."""
        i = self._index_of(column)
        v = self._encode(i, value)
        for slot in self._slots(i, old_key=False):
            self._out.values[slot] = v

    def set_str(self, column, value: str) -> None:
        self.set(column, str(value))

    def set_int(self, column, value: int) -> None:
        self.set(column, int(value))

    def set_null(self, column) -> None:
        self.set(column, None)

    def map_str(self, column, f) -> None:
        """Replaces the text of `column` by `f(text)` everywhere the change holds it: the row,
        the key and an update's old key (a mask or hash of a key column needs that)."""
        values = self._out.values
        for slot in self._slots(self._index_of(column), old_key=True):
            v = values[slot]
            if isinstance(v, _TEXT_KINDS):
                values[slot] = type(v)(self._out.append(f(self._text(v.value)).encode()))
            elif isinstance(v, w.Value_Other):
                span = self._out.append(f(self._text(v.value.text)).encode())
                values[slot] = w.Value_Other(w.OtherValue(v.value.type_oid, span))

    def drop(self) -> None:
        """Nothing of this change reaches the sinks (changes it emitted still do)."""
        self.dropped = True

    def keep(self) -> None:
        self.dropped = False

    def rename_table(self, schema: str, name: str) -> None:
        self._reshape(("table", schema, name),
                      lambda t: w.Table(schema=schema, name=name, columns=t.columns))

    def rename_column(self, column, new_name: str) -> None:
        i = self._index_of(column)

        def edit(t):
            cols = list(t.columns)
            c = cols[i]
            cols[i] = w.Column(new_name, c.type_oid, c.type_modifier, c.is_key)
            return w.Table(schema=t.schema, name=t.name, columns=cols)

        self._reshape(("column", i, new_name), edit)

    def drop_column(self, column) -> None:
        """Removes a column that is not a key column from the change and its table."""
        i = self._index_of(column)
        if self._shape().columns[i].is_key:
            raise Refuse(f"cannot drop key column {self.columns[i]} of {self.schema}.{self.table}")
        span = self._raw.values
        if i < span.len:
            values, start, end = self._out.values, span.start, span.start + span.len
            values[start + i:end] = values[start + i + 1:end] + [values[start + i]]
            self._raw.values = w.Span(span.start, span.len - 1)
        self._reshape(("drop", i), lambda t: w.Table(
            schema=t.schema, name=t.name, columns=t.columns[:i] + t.columns[i + 1:]))

    def emit_copy(self, schema: str, name: str) -> None:
        """Emits a copy of this change into table `schema.name` of the same columns."""
        t = self._shape()
        r = self._raw
        table = self._out.table(w.Table(schema=schema, name=name, columns=t.columns))
        self._out.changes.append(w.Change(table, r.op, r.position, r.key, r.old_key, r.values))

    def emit(self, op, table, values: list) -> None:
        """Emits a new change of `op` into `table` (a `types.Table`) with the row `values`
        (one per column); its key is taken from the key columns."""
        if len(values) != len(table.columns):
            raise Refuse(f"emit into {table.schema}.{table.name}: {len(values)} values for "
                         f"{len(table.columns)} columns")
        index = self._out.table(table)
        probe = Change(self._out, w.Change(index, op, self._raw.position, w.Span(0, 0), None,
                                           w.Span(0, 0)))
        row = [probe._encode(i, v) for i, v in enumerate(values)]
        key = [v for v, c in zip(row, table.columns) if c.is_key]
        out = self._out.values
        whole = op in (Op.INSERT, Op.UPDATE)
        key_span = w.Span(len(out), 0 if op == Op.TRUNCATE else len(key))
        if op != Op.TRUNCATE:
            out.extend(key)
        row_span = w.Span(len(out), len(row) if whole else 0)
        if whole:
            out.extend(row)
        self._out.changes.append(w.Change(index, op, self._raw.position, key_span, None, row_span))

    def filter(self, keep) -> None:
        """Keeps only rows for which `keep(change)` holds, correctly across updates: a failing
        insert is dropped; a failing update becomes a delete of its (old) key, since the row
        may have matched before; a passing update goes on as an update, which the sinks apply
        as an upsert of the whole row. Deletes and truncates pass. The sink then equals
        `SELECT ... WHERE keep` on the source if `keep` reads only the row's own values and
        the table sends whole rows (`row_filter: true`, REPLICA IDENTITY FULL)."""
        r = self._raw
        if r.op == Op.INSERT and not keep(self):
            self.dropped = True
        elif r.op == Op.UPDATE and not keep(self):
            r.op, r.key, r.old_key = Op.DELETE, r.old_key or r.key, None
            r.values = w.Span(r.values.start, 0)

    # Internals.

    def _shape(self):
        return self._out.tables[self._raw.table]

    def _reshape(self, edit, make) -> None:
        """Gives the change the table shape `make(current shape)`, which `edit` names."""
        out, memo = self._out, (self._raw.table, edit)
        index = out.reshaped.get(memo)
        if index is None:
            index = out.reshaped[memo] = out.table(make(self._shape()))
        self._raw.table = index

    def _index_of(self, column) -> int:
        i = self._out.index(self._raw.table, column)
        if i is None:
            raise Refuse(f"{self.schema}.{self.table} has no column {column!r} "
                         f"(it has {', '.join(self.columns)})")
        return i

    def _key_position(self, i: int):
        cols = self._shape().columns
        return sum(1 for c in cols[:i] if c.is_key) if cols[i].is_key else None

    def _slot(self, i: int):
        """Where column `i`'s value is: in the row, or for a delete in the key."""
        r = self._raw
        if i < r.values.len:
            return r.values.start + i
        k = self._key_position(i) if i < len(self._shape().columns) else None
        return r.key.start + k if k is not None and k < r.key.len else None

    def _slots(self, i: int, old_key: bool) -> list:
        r = self._raw
        slots = [r.values.start + i] if i < r.values.len else []
        k = self._key_position(i)
        if k is not None:
            spans = [r.key] + ([r.old_key] if old_key and r.old_key is not None else [])
            slots += [s.start + k for s in spans if k < s.len]
        return slots

    def _text(self, span) -> str:
        return self._out.bytes(span).decode()

    def _decode(self, v):
        if isinstance(v, _TEXT_KINDS):
            return self._text(v.value)
        if isinstance(v, w.Value_Null):
            return None
        if isinstance(v, w.Value_Bytes):
            return self._out.bytes(v.value)
        if isinstance(v, w.Value_Other):
            return self._text(v.value.text)
        if isinstance(v, w.Value_Uuid):
            return _uuid.UUID(int=(v.value[0] << 64) | v.value[1])
        if isinstance(v, w.Value_Unchanged):
            return UNCHANGED
        return v.value

    def _encode(self, i: int, value):
        """The contract's form of `value` for column `i`: integers at the column's width,
        texts in the kind the column's current value has."""
        column = self._shape().columns[i]
        if value is None:
            return w.Value_Null()
        if value is UNCHANGED:
            return w.Value_Unchanged()
        if isinstance(value, bool):
            return w.Value_Boolean(value)
        if isinstance(value, int):
            kind, bound = _INT_OIDS.get(column.type_oid, (w.Value_Int8, 1 << 63))
            if not -bound <= value < bound:
                raise Refuse(f"{value} does not fit column {column.name}")
            return kind(value)
        if isinstance(value, float):
            return (w.Value_Float4 if column.type_oid == _FLOAT4_OID else w.Value_Float8)(value)
        if isinstance(value, (bytes, bytearray)):
            return w.Value_Bytes(self._out.append(bytes(value)))
        if isinstance(value, _uuid.UUID):
            return w.Value_Uuid((value.int >> 64, value.int & ((1 << 64) - 1)))
        if isinstance(value, str):
            span = self._out.append(value.encode())
            slot = self._slot(i)
            current = None if slot is None else self._out.values[slot]
            if isinstance(current, w.Value_Other):
                return w.Value_Other(w.OtherValue(current.value.type_oid, span))
            return (type(current) if isinstance(current, _TEXT_KINDS) else w.Value_Text)(span)
        raise Refuse(f"column {column.name}: cannot write a {type(value).__name__}")


def run(state: Transform, batch):
    """Runs `state.change` over each change of `batch`; returns the output."""
    out = _Out(batch)
    for index, raw in enumerate(batch.changes):
        mark = len(out.changes)
        c = Change(out, raw)
        try:
            state.change(c)
        except Refuse as e:
            del out.changes[mark:]
            out.errors.append(w.ChangeError(index=index, message=str(e)))
            continue
        if not c.dropped:
            out.changes.insert(mark, c._raw)
    return w.Output(tables=out.tables, data=bytes(out.data), values=out.values,
                    changes=out.changes, errors=out.errors)


def export(cls):
    """The `WitWorld` class componentize-py exports, running transform class `cls`."""

    class WitWorld(wit_world.WitWorld):
        state = None

        def init(self, config):
            try:
                WitWorld.state = cls(Config(config))
            except Exception as e:
                raise Err(str(e)) from None

        def transform(self, batch):
            if WitWorld.state is None:
                raise Err("transform called before init")
            try:
                return run(WitWorld.state, batch)
            except Exception as e:
                raise Err(f"{type(e).__name__}: {e}") from None

    return WitWorld
