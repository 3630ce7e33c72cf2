//! From a coalesced batch to SQL statements, written into one reused buffer.
//!
//! [`Plan::next_statement`] yields, per table in order of first appearance: `DELETE FROM t`
//! for a truncate, `DELETE … WHERE key IN (…)`, and `INSERT … VALUES (…),(…) ON DUPLICATE KEY
//! UPDATE c=VALUES(c)` for each group of rows sharing a shape and set of unchanged columns.
//! Deletes go first so that a key moved away and back, or a row deleted and re-inserted, ends
//! right; rows keep the order of their last change. Statements are cut at about
//! [`STATEMENT_LIMIT`] bytes, well under the 16 MiB default `max_allowed_packet`
//! (<https://mariadb.com/kb/en/server-system-variables/#max_allowed_packet>). One buffer is
//! reused for every statement.
//!
//! `VALUES(col)` is deprecated in MySQL 8.0.20+ in favour of a row alias, which MariaDB lacks;
//! it still works in both (<https://dev.mysql.com/doc/refman/8.0/en/insert-on-duplicate.html>).

mod bulk;

pub(crate) use self::bulk::Bulk;
use super::coalesce::{DeleteGroup, Row, TablePlan, UpsertGroup, coalesce};
use super::literal::{SinkClass, Written, note_nulled, push_cell, push_ident, push_value};
use super::schema::SinkTypes;
use crate::change::{Change, Table, Value};
use crate::sink::SinkError;

/// Soft cap on one statement's SQL text; a single row may exceed it.
pub(crate) const STATEMENT_LIMIT: usize = 4 << 20;

/// What a statement from [`Plan::next_statement`] does, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StmtKind {
    /// `DELETE FROM t` for a truncate.
    DeleteAll,
    /// `DELETE … WHERE key IN (…)`.
    Delete,
    /// `INSERT … ON DUPLICATE KEY UPDATE`.
    Upsert,
}

/// Which rows a statement carries, to name them in errors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StmtInfo {
    table: usize,
    pub(crate) kind: StmtKind,
    group: usize,
    first_row: usize,
    rows: usize,
    /// Written into a [`Bulk`] for bulk execution rather than into the text buffer.
    pub(crate) bulk: bool,
}

/// The coalesced effects of one batch, and a cursor over the statements that write them.
pub(crate) struct Plan<'a> {
    database: &'a str,
    sink: &'a str,
    /// The sink columns' types; without them values MySQL cannot hold are errors.
    types: Option<&'a SinkTypes>,
    limit: usize,
    tables: Vec<TablePlan<'a>>,
    cursor: Cursor,
}

#[derive(Debug, Clone, Copy, Default)]
struct Cursor {
    table: usize,
    stage: Stage,
    group: usize,
    row: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Stage {
    #[default]
    DeleteAll,
    Deletes,
    Upserts,
}

impl<'a> Plan<'a> {
    /// Coalesces `changes` (in position order) for sink `sink` writing into `database`.
    /// Errors are about malformed changes (wrong number of values, a table without a key).
    pub(crate) fn build(
        changes: &'a [Change],
        database: &'a str,
        sink: &'a str,
    ) -> Result<Self, SinkError> {
        let tables = coalesce(changes, sink)?;
        Ok(Plan {
            database,
            sink,
            types: None,
            limit: STATEMENT_LIMIT,
            tables,
            cursor: Cursor::default(),
        })
    }

    /// A plan that removes every row of `table` (the truncate operation).
    pub(crate) fn delete_all(table: &'a Table, database: &'a str, sink: &'a str) -> Self {
        Plan {
            database,
            sink,
            types: None,
            limit: STATEMENT_LIMIT,
            tables: vec![TablePlan {
                source: table,
                delete_all: true,
                deletes: Vec::new(),
                upserts: Vec::new(),
            }],
            cursor: Cursor::default(),
        }
    }

    /// Every table shape the plan writes.
    pub(crate) fn shapes(&self) -> impl Iterator<Item = &'a Table> + '_ {
        self.tables
            .iter()
            .flat_map(|t| std::iter::once(t.source).chain(t.upserts.iter().map(|g| g.shape)))
    }

    /// Writes values MySQL cannot hold as the sink columns' types allow (see `literal.rs`).
    pub(crate) fn with_types(mut self, types: &'a SinkTypes) -> Self {
        self.types = Some(types);
        self
    }

    #[cfg(test)]
    fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Appends the next statement to `buf` (which the caller clears between statements), or
    /// returns `None` when every statement has been written. An error is a value MySQL cannot
    /// hold (definite), naming the table, column and row key.
    pub(crate) fn next_statement(
        &mut self,
        buf: &mut String,
    ) -> Result<Option<StmtInfo>, SinkError> {
        self.next_step(buf, None)
    }

    /// As [`Plan::next_statement`], except that the rest of a group of at least
    /// `bulk.min_rows` rows (when `bulk` is given) goes into `bulk` as one single-row
    /// statement and every row's parameters, and the [`StmtInfo`] says `bulk`.
    pub(crate) fn next_step(
        &mut self,
        buf: &mut String,
        mut bulk: Option<&mut Bulk>,
    ) -> Result<Option<StmtInfo>, SinkError> {
        loop {
            let c = self.cursor;
            let Some(plan) = self.tables.get(c.table) else {
                return Ok(None);
            };
            let mut info = StmtInfo {
                table: c.table,
                kind: StmtKind::DeleteAll,
                group: c.group,
                first_row: c.row,
                rows: 0,
                bulk: false,
            };
            match c.stage {
                Stage::DeleteAll => {
                    self.cursor.stage = Stage::Deletes;
                    if plan.delete_all {
                        buf.push_str("DELETE FROM ");
                        self.push_table(buf, plan.source);
                        return Ok(Some(info));
                    }
                }
                Stage::Deletes => {
                    if let Some(group) = plan.deletes.get(c.group) {
                        info.kind = StmtKind::Delete;
                        let rows = group.keys.len() - c.row;
                        info.rows = match Bulk::taking(&mut bulk, rows)
                            .filter(|_| Self::bulk_deletable(group, c.row))
                        {
                            Some(bulk) => {
                                info.bulk = true;
                                self.bulk_delete(bulk, group, c.row)?
                            }
                            None => self.write_delete(buf, group, c.row)?,
                        };
                        self.advance(info.rows, group.keys.len());
                        return Ok(Some(info));
                    }
                    self.cursor = Cursor {
                        stage: Stage::Upserts,
                        ..Cursor::default()
                    };
                    self.cursor.table = c.table;
                }
                Stage::Upserts => {
                    if let Some(group) = plan.upserts.get(c.group) {
                        info.kind = StmtKind::Upsert;
                        info.rows = match Bulk::taking(&mut bulk, group.rows.len() - c.row) {
                            Some(bulk) => {
                                info.bulk = true;
                                self.bulk_upsert(bulk, group, c.row)?
                            }
                            None => self.write_upsert(buf, group, c.row)?,
                        };
                        self.advance(info.rows, group.rows.len());
                        return Ok(Some(info));
                    }
                    self.cursor = Cursor {
                        table: c.table + 1,
                        ..Cursor::default()
                    };
                }
            }
        }
    }

    fn advance(&mut self, written: usize, total: usize) {
        self.cursor.row += written;
        if self.cursor.row >= total {
            self.cursor.group += 1;
            self.cursor.row = 0;
        }
    }

    fn push_table(&self, buf: &mut String, table: &Table) {
        push_ident(buf, self.database);
        buf.push('.');
        push_ident(buf, &table.name);
    }

    fn write_delete(
        &self,
        buf: &mut String,
        group: &DeleteGroup<'_>,
        from: usize,
    ) -> Result<usize, SinkError> {
        let shape = group.shape;
        let composite = shape.key.len() > 1;
        buf.push_str("DELETE FROM ");
        self.push_table(buf, shape);
        buf.push_str(" WHERE ");
        if composite {
            buf.push('(');
        }
        for (n, &i) in shape.key.iter().enumerate() {
            if n > 0 {
                buf.push(',');
            }
            push_ident(buf, &shape.columns[i].name);
        }
        buf.push_str(if composite { ") IN (" } else { " IN (" });
        let written = self.push_rows(buf, shape, &group.keys[from..], |buf, key| {
            if composite {
                buf.push('(');
            }
            for (n, (v, &i)) in key.iter().zip(&shape.key).enumerate() {
                if n > 0 {
                    buf.push(',');
                }
                push_value(buf, v).map_err(|e| (i, e))?;
            }
            if composite {
                buf.push(')');
            }
            Ok(())
        })?;
        buf.push(')');
        Ok(written)
    }

    fn write_upsert(
        &self,
        buf: &mut String,
        group: &UpsertGroup<'_>,
        from: usize,
    ) -> Result<usize, SinkError> {
        let shape = group.shape;
        self.push_upsert_head(buf, group);
        let classes = self.classes(shape);
        let written = self.push_rows(buf, shape, &group.rows[from..], |buf, row| {
            let values = row.values();
            buf.push('(');
            for (n, (i, col)) in kept_columns(group).enumerate() {
                if n > 0 {
                    buf.push(',');
                }
                if push_cell(buf, &values[i], classes[i]).map_err(|e| (i, e))? == Written::Nulled {
                    note_nulled(self.sink, &shape.name, &col.name, &values[i]);
                }
            }
            buf.push(')');
            Ok(())
        })?;
        push_upsert_tail(buf, group);
        Ok(written)
    }

    /// `INSERT INTO t (c1,c2) VALUES ` for `group`'s kept columns.
    fn push_upsert_head(&self, buf: &mut String, group: &UpsertGroup<'_>) {
        buf.push_str("INSERT INTO ");
        self.push_table(buf, group.shape);
        buf.push_str(" (");
        for (n, (_, col)) in kept_columns(group).enumerate() {
            if n > 0 {
                buf.push(',');
            }
            push_ident(buf, &col.name);
        }
        buf.push_str(") VALUES ");
    }

    /// Per column of `shape`, what the sink column can take (all strict without the types).
    fn classes(&self, shape: &Table) -> Vec<SinkClass> {
        self.types.map_or_else(
            || vec![SinkClass::Strict; shape.columns.len()],
            |t| t.classes(shape),
        )
    }

    /// The definite error for a value of `shape`'s column `column` that cannot be written.
    fn value_error<T: RowKey>(
        &self,
        shape: &Table,
        column: usize,
        problem: &str,
        item: &T,
    ) -> SinkError {
        SinkError::definite(format!(
            "sink {}: {}.{}: {problem} (row key {})",
            self.sink,
            shape.qualified_name(),
            shape.columns[column].name,
            key_text(shape, item.key_values(shape)),
        ))
    }

    /// Writes rows separated by commas until the statement passes the limit (at least one row).
    fn push_rows<T: RowKey>(
        &self,
        buf: &mut String,
        shape: &Table,
        items: &[T],
        mut write: impl FnMut(&mut String, &T) -> Result<(), (usize, String)>,
    ) -> Result<usize, SinkError> {
        let mut written = 0;
        for item in items {
            let mark = buf.len();
            if written > 0 {
                buf.push(',');
            }
            if let Err((column, problem)) = write(buf, item) {
                return Err(self.value_error(shape, column, &problem, item));
            }
            if written > 0 && buf.len() > self.limit {
                buf.truncate(mark);
                break;
            }
            written += 1;
        }
        Ok(written)
    }

    /// "upserting 3 rows into `db`.`t` (source public.t)", for error messages.
    pub(crate) fn describe(&self, info: StmtInfo) -> String {
        let source = self.tables[info.table].source;
        let mut target = String::new();
        self.push_table(&mut target, source);
        let action = match info.kind {
            StmtKind::DeleteAll => "deleting all rows from".to_owned(),
            StmtKind::Delete => format!("deleting {} {} from", info.rows, plural(info.rows, "key")),
            StmtKind::Upsert => {
                format!("upserting {} {} into", info.rows, plural(info.rows, "row"))
            }
        };
        format!(
            "{action} {target} (source table {})",
            source.qualified_name()
        )
    }

    /// The shape and rows of an upsert statement.
    pub(crate) fn upsert_rows(&self, info: StmtInfo) -> Option<(&'a Table, &[Row<'a>])> {
        if info.kind != StmtKind::Upsert {
            return None;
        }
        let group = self.tables.get(info.table)?.upserts.get(info.group)?;
        let rows = group.rows.get(info.first_row..info.first_row + info.rows)?;
        Some((group.shape, rows))
    }

    /// The key of row `n` (1-based, as MySQL's "at row N") of a statement, as `(id)=(42)`.
    pub(crate) fn row_key(&self, info: StmtInfo, n: usize) -> Option<String> {
        if n == 0 || n > info.rows {
            return None;
        }
        let plan = &self.tables[info.table];
        let index = info.first_row + n - 1;
        match info.kind {
            StmtKind::DeleteAll => None,
            StmtKind::Delete => {
                let group = plan.deletes.get(info.group)?;
                Some(key_text(group.shape, *group.keys.get(index)?))
            }
            StmtKind::Upsert => {
                let group = plan.upserts.get(info.group)?;
                let row = group.rows.get(index)?;
                Some(key_text(group.shape, row.key_values(group.shape)))
            }
        }
    }
}

/// `group`'s columns that its statements write, with their indexes in the shape.
fn kept_columns<'g>(
    group: &'g UpsertGroup<'_>,
) -> impl Iterator<Item = (usize, &'g crate::change::Column)> + 'g {
    group
        .shape
        .columns
        .iter()
        .enumerate()
        .filter(|&(i, _)| !group.omit[i])
}

/// ` ON DUPLICATE KEY UPDATE ` with the key guard and every kept non-key column.
fn push_upsert_tail(buf: &mut String, group: &UpsertGroup<'_>) {
    let shape = group.shape;
    buf.push_str(" ON DUPLICATE KEY UPDATE ");
    push_key_guard(buf, shape);
    for (i, col) in kept_columns(group) {
        if shape.key.contains(&i) {
            continue;
        }
        buf.push(',');
        push_ident(buf, &col.name);
        buf.push_str("=VALUES(");
        push_ident(buf, &col.name);
        buf.push(')');
    }
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        word.to_owned()
    } else {
        format!("{word}s")
    }
}

/// Rows and keys both know their key values, for error messages.
trait RowKey {
    fn key_values<'s>(&'s self, shape: &Table) -> Vec<&'s Value>;
}

impl RowKey for &[Value] {
    fn key_values<'s>(&'s self, _: &Table) -> Vec<&'s Value> {
        self.iter().collect()
    }
}

impl RowKey for Row<'_> {
    fn key_values<'s>(&'s self, shape: &Table) -> Vec<&'s Value> {
        shape.key.iter().map(|&i| &self.values()[i]).collect()
    }
}

/// The first assignment of every upsert's `ON DUPLICATE KEY UPDATE`: it keeps the key when the
/// row found is the one with the change's key, and otherwise fails the statement with
/// "Division by 0" (1365 under the lane session's `ERROR_FOR_DIVISION_BY_ZERO`), whatever the
/// key columns' types and nullability. MySQL finds the row to update through *any* unique
/// index the new row conflicts with, so without this a sink table with another unique key
/// would have its other row overwritten by the change (see `unique.rs`). Assignments run left
/// to right against the row as found, so this one sees the stored key.
pub(super) fn push_key_guard(buf: &mut String, shape: &Table) {
    let first = &shape.columns[shape.key[0]].name;
    push_ident(buf, first);
    buf.push_str("=IF(");
    for (n, &i) in shape.key.iter().enumerate() {
        if n > 0 {
            buf.push_str(" AND ");
        }
        let name = &shape.columns[i].name;
        push_ident(buf, name);
        buf.push_str("<=>VALUES(");
        push_ident(buf, name);
        buf.push(')');
    }
    buf.push(',');
    push_ident(buf, first);
    buf.push_str(",1/0)");
}

pub(super) fn key_text<'v>(shape: &Table, key: impl IntoIterator<Item = &'v Value>) -> String {
    let mut out = String::from("(");
    for (n, &i) in shape.key.iter().enumerate() {
        if n > 0 {
            out.push_str(", ");
        }
        out.push_str(&shape.columns[i].name);
    }
    out.push_str(")=(");
    for (n, v) in key.into_iter().enumerate() {
        if n > 0 {
            out.push_str(", ");
        }
        let mark = out.len();
        if push_value(&mut out, v).is_err() {
            out.truncate(mark);
            out.push_str(&format!("{v:?}"));
        }
    }
    out.push(')');
    out
}

#[cfg(test)]
mod tests {
    use super::super::coalesce::fixtures::{Changes, orders, table};
    use super::*;
    use crate::change::Op;
    use crate::error::ErrorClass;

    fn sql(c: &Changes) -> Vec<String> {
        statements(Plan::build(&c.list, "shop", "out").unwrap())
    }

    fn statements(mut plan: Plan<'_>) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = String::new();
        while plan.next_statement(&mut buf).unwrap().is_some() {
            out.push(std::mem::take(&mut buf));
        }
        out
    }

    const UPSERT_TAIL: &str = " ON DUPLICATE KEY UPDATE `id`=IF(`id`<=>VALUES(`id`),`id`,1/0),\
                               `note`=VALUES(`note`),`qty`=VALUES(`qty`)";

    #[test]
    fn upserts_and_deletes_become_one_statement_each() {
        let t = orders();
        let mut c = Changes::new();
        c.upsert(&t, 1, "it's", 5)
            .upsert(&t, 2, r"back\slash", 6)
            .delete(&t, 3)
            .delete(&t, 4);
        assert_eq!(
            sql(&c),
            [
                "DELETE FROM `shop`.`orders` WHERE `id` IN (3,4)".to_owned(),
                format!(
                    "INSERT INTO `shop`.`orders` (`id`,`note`,`qty`) VALUES (1,'it''s',5),\
                     (2,'back\\slash',6){UPSERT_TAIL}"
                ),
            ]
        );
    }

    #[test]
    fn insert_update_delete_of_one_key_coalesce_to_a_single_delete() {
        let t = orders();
        let mut c = Changes::new();
        c.push(
            Op::Insert,
            &t,
            vec![Value::Int4(7)],
            None,
            vec![Value::Int4(7), Value::Null, Value::Int8(1)],
        );
        c.upsert(&t, 7, "x", 2).delete(&t, 7);
        assert_eq!(sql(&c), ["DELETE FROM `shop`.`orders` WHERE `id` IN (7)"]);
        // ... and a later insert of the same key wins over the delete.
        c.upsert(&t, 7, "again", 3);
        assert_eq!(
            sql(&c),
            [format!(
                "INSERT INTO `shop`.`orders` (`id`,`note`,`qty`) VALUES (7,'again',3){UPSERT_TAIL}"
            )]
        );
    }

    #[test]
    fn key_changing_update_deletes_the_old_key() {
        let t = orders();
        let mut c = Changes::new();
        c.upsert(&t, 1, "a", 1);
        let v = vec![Value::Int4(2), Value::Text("a".into()), Value::Int8(1)];
        c.push(
            Op::Update,
            &t,
            vec![Value::Int4(2)],
            Some(vec![Value::Int4(1)]),
            v,
        );
        assert_eq!(
            sql(&c),
            [
                "DELETE FROM `shop`.`orders` WHERE `id` IN (1)".to_owned(),
                format!(
                    "INSERT INTO `shop`.`orders` (`id`,`note`,`qty`) VALUES (2,'a',1){UPSERT_TAIL}"
                ),
            ]
        );
    }

    #[test]
    fn composite_keys_use_row_constructors() {
        let t = table(
            "lines",
            &[("order_id", true), ("line", true), ("sku", false)],
        );
        let mut c = Changes::new();
        for (o, l) in [(1, 1), (1, 2)] {
            c.push(
                Op::Delete,
                &t,
                vec![Value::Int4(o), Value::Int2(l)],
                None,
                vec![],
            );
        }
        assert_eq!(
            sql(&c),
            ["DELETE FROM `shop`.`lines` WHERE (`order_id`,`line`) IN ((1,1),(1,2))"]
        );
    }

    #[test]
    fn all_key_tables_update_the_key_to_itself() {
        let t = table("tags", &[("a", true), ("b", true)]);
        let mut c = Changes::new();
        c.push(
            Op::Insert,
            &t,
            vec![Value::Int4(1), Value::Int4(2)],
            None,
            vec![Value::Int4(1), Value::Int4(2)],
        );
        assert_eq!(
            sql(&c),
            [
                "INSERT INTO `shop`.`tags` (`a`,`b`) VALUES (1,2) ON DUPLICATE KEY UPDATE \
              `a`=IF(`a`<=>VALUES(`a`) AND `b`<=>VALUES(`b`),`a`,1/0)"
            ]
        );
    }

    #[test]
    fn unchanged_columns_split_rows_into_groups_that_omit_them() {
        let t = orders();
        let mut c = Changes::new();
        c.upsert(&t, 1, "full", 1);
        let toast = |id| vec![Value::Int4(id), Value::Unchanged, Value::Int8(9)];
        c.push(Op::Update, &t, vec![Value::Int4(2)], None, toast(2));
        c.push(Op::Update, &t, vec![Value::Int4(3)], None, toast(3));
        assert_eq!(
            sql(&c),
            [
                format!(
                    "INSERT INTO `shop`.`orders` (`id`,`note`,`qty`) VALUES (1,'full',1){UPSERT_TAIL}"
                ),
                "INSERT INTO `shop`.`orders` (`id`,`qty`) VALUES (2,9),(3,9) \
                 ON DUPLICATE KEY UPDATE `id`=IF(`id`<=>VALUES(`id`),`id`,1/0),`qty`=VALUES(`qty`)"
                    .to_owned(),
            ]
        );
        // An unchanged column of a key upserted earlier in the batch takes that value.
        c.push(Op::Update, &t, vec![Value::Int4(1)], None, toast(1));
        assert_eq!(
            sql(&c)[1],
            format!(
                "INSERT INTO `shop`.`orders` (`id`,`note`,`qty`) VALUES (1,'full',9){UPSERT_TAIL}"
            )
        );
    }

    #[test]
    fn truncate_drops_earlier_changes_of_its_table() {
        let t = orders();
        let other = table("other", &[("id", true)]);
        let mut c = Changes::new();
        c.upsert(&t, 1, "gone", 1);
        c.push(
            Op::Insert,
            &other,
            vec![Value::Int4(5)],
            None,
            vec![Value::Int4(5)],
        );
        c.push(Op::Truncate, &t, vec![], None, vec![]);
        c.upsert(&t, 2, "kept", 2);
        assert_eq!(
            sql(&c),
            [
                "DELETE FROM `shop`.`orders`".to_owned(),
                format!(
                    "INSERT INTO `shop`.`orders` (`id`,`note`,`qty`) VALUES (2,'kept',2){UPSERT_TAIL}"
                ),
                "INSERT INTO `shop`.`other` (`id`) VALUES (5) ON DUPLICATE KEY UPDATE \
                 `id`=IF(`id`<=>VALUES(`id`),`id`,1/0)"
                    .to_owned(),
            ]
        );
    }

    #[test]
    fn identifiers_and_special_strings_are_quoted() {
        let t = table("we`ird", &[("k`ey", true), ("v", false)]);
        let mut c = Changes::new();
        let v = vec![Value::Text("a\0b 🐢".into()), Value::Bytes(vec![0, 1])];
        c.push(Op::Insert, &t, vec![Value::Text("a\0b 🐢".into())], None, v);
        assert_eq!(
            sql(&c),
            [
                "INSERT INTO `shop`.`we``ird` (`k``ey`,`v`) VALUES ('a\0b 🐢',X'0001') \
              ON DUPLICATE KEY UPDATE `k``ey`=IF(`k``ey`<=>VALUES(`k``ey`),`k``ey`,1/0),\
              `v`=VALUES(`v`)"
            ]
        );
    }

    #[test]
    fn statements_are_split_at_the_limit() {
        let t = orders();
        let mut c = Changes::new();
        for id in 0..10 {
            c.upsert(&t, id, "0123456789", id.into());
        }
        let plan = Plan::build(&c.list, "shop", "out").unwrap().with_limit(120);
        let sql = statements(plan);
        assert!(sql.len() > 2, "{sql:?}");
        let mut seen = 0;
        for s in &sql {
            let rows = s.matches("'0123456789'").count();
            assert!(rows >= 1);
            // Only the first row may push a statement past the limit.
            assert!(rows == 1 || s.len() - UPSERT_TAIL.len() <= 120, "{s}");
            assert!(s.ends_with(UPSERT_TAIL));
            assert!(s.contains(&format!("({seen},")), "{s}");
            seen += rows;
        }
        assert_eq!(seen, 10);
    }

    #[test]
    fn bad_values_name_table_column_and_key() {
        let t = table("m", &[("id", true), ("score", false)]);
        let mut c = Changes::new();
        c.push(
            Op::Insert,
            &t,
            vec![Value::Int4(4)],
            None,
            vec![Value::Int4(4), Value::Float8(f64::NAN)],
        );
        let mut plan = Plan::build(&c.list, "shop", "out").unwrap();
        let err = plan.next_statement(&mut String::new()).unwrap_err();
        assert_eq!(err.class, ErrorClass::Definite);
        assert_eq!(
            err.message,
            "sink out: public.m.score: double precision value NaN has no MySQL equivalent \
             (MySQL has no NaN or infinity) (row key (id)=(4))"
        );
    }

    #[test]
    fn malformed_changes_are_rejected() {
        let t = orders();
        let mut c = Changes::new();
        c.push(
            Op::Insert,
            &t,
            vec![Value::Int4(1)],
            None,
            vec![Value::Int4(1)],
        );
        let err = Plan::build(&c.list, "shop", "out").err().unwrap();
        assert!(
            err.message.contains("1 values for 3 columns"),
            "{}",
            err.message
        );
        let keyless = table("k", &[("a", false)]);
        let mut c = Changes::new();
        c.push(Op::Delete, &keyless, vec![], None, vec![]);
        let err = Plan::build(&c.list, "shop", "out").err().unwrap();
        assert_eq!(err.class, ErrorClass::Fatal);
    }

    #[test]
    fn row_numbers_map_back_to_keys() {
        let t = orders();
        let mut c = Changes::new();
        c.upsert(&t, 10, "a", 1)
            .upsert(&t, 11, "b", 2)
            .delete(&t, 12);
        let mut plan = Plan::build(&c.list, "shop", "out").unwrap();
        let mut buf = String::new();
        let delete = plan.next_statement(&mut buf).unwrap().unwrap();
        assert_eq!(plan.row_key(delete, 1).as_deref(), Some("(id)=(12)"));
        let upsert = plan.next_statement(&mut buf).unwrap().unwrap();
        assert_eq!(plan.row_key(upsert, 2).as_deref(), Some("(id)=(11)"));
        assert_eq!(plan.row_key(upsert, 3), None);
        assert_eq!(
            plan.describe(upsert),
            "upserting 2 rows into `shop`.`orders` (source table public.orders)"
        );
    }
}
