"""A Zipline transform in Python: renames tables and columns.

Config (the route's `transform.config` map):
  tables   comma-separated `old=new` table renames. `old` is `schema.table`, or a bare `table`
           for any schema; `new` is `schema.table`, or a bare `table` that keeps the schema.
  columns  comma-separated `old=new` column renames. `old` is `column` (in every table),
           `table.column` or `schema.table.column` (the table's name before any rename);
           `new` is the new column name.

Only the table shapes change: values are positional, so every change passes with its values,
keys and variants exactly as they came (`unchanged` included). The output's `tables` are the
renamed copies of the input's, one for one, so changes keep their table index.

The batch (contract 0.3.0) is four flat lists: `tables`, `data` (the bytes of every text,
numeric, json, bytea and other value), `values` (every value of every change; a text value is
`Value_Text(Span(start, len))`, a span of `data`) and `changes` (whose `key`, `old_key` and
`values` are spans of `values`). A rename touches none of the last three, so the output hands
them back as they came: `values` is the input's list, the changes' spans still address it,
and its data spans still address the input's `data` (spans below the input data's length
point there), so `output.data`, which holds only new bytes, is empty. Nothing is copied or
decoded.

A rename that would give a table two columns of one name cannot be applied: each change of
that table is reported in the output's `errors` (the route's `on_error` policy decides what
happens to it), and the other changes of the batch pass.

Bindings (componentize-py): records are dataclasses, variants `Value_Text(value)` and
friends, enums `Op.INSERT`; raising `componentize_py_types.Err(message)` returns `err`.
"""

from dataclasses import replace

import wit_world
from componentize_py_types import Err
from wit_world.imports import host
from wit_world.imports.types import Batch, ChangeError, Column, Output, Table

# (schema or None, table) -> (new schema or None to keep, new table)
TABLES: dict = {}
# (schema or None, table or None, column) -> new column
COLUMNS: dict = {}
READY = False


def _pairs(key: str, value: str):
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        old, sep, new = item.partition("=")
        old, new = old.strip(), new.strip()
        if not sep or not old or not new:
            raise Err(f"config key `{key}`: `{item}` is not of the form old=new")
        yield item, old, new


def _split(key: str, item: str, name: str, parts: int) -> list:
    """`name` split on dots into at most `parts` non-empty pieces."""
    pieces = name.split(".")
    if len(pieces) > parts or any(p == "" for p in pieces):
        raise Err(f"config key `{key}`: `{item}` has a malformed name `{name}`")
    return pieces


def _parse_tables(value: str) -> None:
    for item, old, new in _pairs("tables", value):
        old_p = _split("tables", item, old, 2)
        new_p = _split("tables", item, new, 2)
        old_key = (old_p[0], old_p[1]) if len(old_p) == 2 else (None, old_p[0])
        TABLES[old_key] = (new_p[0], new_p[1]) if len(new_p) == 2 else (None, new_p[0])


def _parse_columns(value: str) -> None:
    for item, old, new in _pairs("columns", value):
        old_p = _split("columns", item, old, 3)
        _split("columns", item, new, 1)
        old_key = tuple([None] * (3 - len(old_p)) + old_p)
        COLUMNS[old_key] = new


def _lookup(table: dict, schema: str, *rest: str):
    """Most specific match first: with the schema, then without it, then any table."""
    for key in ((schema, *rest), (None, *rest)):
        if key in table:
            return table[key]
    if len(rest) == 2 and (None, None, rest[1]) in table:
        return table[(None, None, rest[1])]
    return None


def _rename(table: Table) -> tuple:
    """The renamed table, and an error message if its renamed columns clash."""
    target = _lookup(TABLES, table.schema, table.name)
    schema, name = table.schema, table.name
    if target is not None:
        schema = target[0] or table.schema
        name = target[1]
    columns = []
    for c in table.columns:
        new = _lookup(COLUMNS, table.schema, table.name, c.name)
        columns.append(replace(c, name=new) if new is not None else c)
    seen, clash = set(), None
    for c in columns:
        if c.name in seen:
            clash = c.name
        seen.add(c.name)
    renamed = Table(schema=schema, name=name, columns=columns)
    if clash is None:
        return renamed, None
    return renamed, (
        f"renaming columns of {table.schema}.{table.name} gives two columns named `{clash}`"
    )


class WitWorld(wit_world.WitWorld):
    def init(self, config):
        global READY
        for key, value in config:
            if key == "tables":
                _parse_tables(value)
            elif key == "columns":
                _parse_columns(value)
            else:
                raise Err(f"unknown config key `{key}`; expected tables, columns")
        host.log(
            host.Level.INFO,
            f"python-rename: {len(TABLES)} table and {len(COLUMNS)} column rename(s)",
        )
        READY = True

    def transform(self, batch: Batch) -> Output:
        if not READY:
            raise Err("transform called before init")
        tables, clashes = [], []
        for table in batch.tables:
            renamed, clash = _rename(table)
            tables.append(renamed)
            clashes.append(clash)
        # The output's lists other than `tables`: no new bytes, the input's values as they came.
        data, values = b"", batch.values
        if all(clash is None for clash in clashes):
            # Nothing to refuse: the changes go back as they came, table indexes included.
            return Output(
                tables=tables, data=data, values=values, changes=batch.changes, errors=[]
            )
        # A refused change is left out of `changes`. Its values stay in `values`, unreferenced:
        # the host reads only the values output changes point at.
        changes, errors = [], []
        for index, change in enumerate(batch.changes):
            if not 0 <= change.table < len(tables):
                raise Err(f"change {index} refers to table #{change.table} of {len(tables)}")
            clash = clashes[change.table]
            if clash is None:
                changes.append(change)
            else:
                errors.append(ChangeError(index=index, message=clash))
        return Output(tables=tables, data=data, values=values, changes=changes, errors=errors)
