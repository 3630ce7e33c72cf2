"""Renames tables and columns (config `tables` and `columns`, comma-separated `old=new`; see
README.md). A rename that gives a table two columns of one name refuses its changes."""

from zipline_transform import Change, Config, Refuse, Transform, export


def rules(config: Config, key: str, parts: int, new_parts: int) -> dict:
    """`old=new` items of `key`, with at most `parts` and `new_parts` dotted names."""
    found = {}
    for item in config.list(key):
        old, sep, new = (s.strip() for s in item.partition("="))
        names = old.split(".") + new.split(".")
        if not sep or "" in names or old.count(".") >= parts or new.count(".") >= new_parts:
            raise ValueError(f"config key `{key}`: `{item}` is not of the form old=new")
        found[old] = new
    return found


class Rename(Transform):
    def __init__(self, config: Config):
        config.allow_only("tables", "columns")
        self.tables, self.columns = rules(config, "tables", 2, 2), rules(config, "columns", 3, 1)
        self.plans = {}  # (schema, table, columns) -> (column renames, clash, new table)

    def plan(self, schema: str, table: str, columns: tuple) -> tuple:
        renames, seen, clash = [], set(), None
        for column in columns:
            names = (f"{schema}.{table}.{column}", f"{table}.{column}", column)
            new = next((self.columns[n] for n in names if n in self.columns), column)
            if new in seen:
                clash = f"renaming columns of {schema}.{table} gives two columns named `{new}`"
            seen.add(new)
            if new != column:
                renames.append((column, new))
        new = self.tables.get(f"{schema}.{table}", self.tables.get(table))
        schema_, dot, name = (new or "").rpartition(".")
        return renames, clash, new and (schema_ if dot else schema, name)

    def change(self, c: Change) -> None:
        shape = (c.schema, c.table, c.columns)
        if shape not in self.plans:
            self.plans[shape] = self.plan(*shape)
        renames, clash, table = self.plans[shape]
        if clash:
            raise Refuse(clash)
        for column, new in renames:
            c.rename_column(column, new)
        if table:
            c.rename_table(*table)


WitWorld = export(Rename)
