# __NAME__: keeps only the rows whose `column` is not `value` (both from the route's config).
# Filtered tables need `row_filter: true` on the route's transform and REPLICA IDENTITY FULL.
from zipline_transform import Change, Config, Transform, export


class Filter(Transform):
    def __init__(self, config: Config):
        config.allow_only("column", "value")
        self.column, self.value = config.require("column"), config.require("value")

    def change(self, c: Change) -> None:
        # An insert failing the test is dropped, an update failing it deletes the row.
        c.filter(lambda row: row.get_str(self.column) != self.value)


WitWorld = export(Filter)
