//! Coalescing a batch to the last effect per key.
//!
//! The batch is walked in position order into a map keyed by (table, key), so a later change
//! to a key replaces an earlier one: an insert or update becomes "upsert this row", a delete
//! becomes "delete this key", an update that moved the key also deletes the old key, and a
//! truncate drops everything planned for its table and marks the table to be emptied first.
//! An update whose row holds [`Value::Unchanged`] (a TOASTed column the update did not touch)
//! takes those columns from an earlier upsert of the same key in the batch when there is one;
//! otherwise the columns stay unchanged and the sink's statement builder (`mysql::plan`,
//! `postgres::sql`) leaves them out of the statement so the sink keeps its stored value.
//!
//! Sink-independent: shared by every SQL sink.
//!
//! The surviving effects are grouped per table, in the order of their last change: deletes by
//! key-column list, upserts by shape and set of unchanged columns (each group becomes one
//! multi-row statement).

use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::hash::{Hash, Hasher};

use crate::change::{Change, Op, Table, Value};
use crate::sink::SinkError;

pub(super) struct TablePlan<'a> {
    /// The first shape seen, for names in statements and errors.
    pub(super) source: &'a Table,
    /// A truncate: delete every row before the rest.
    pub(super) delete_all: bool,
    pub(super) deletes: Vec<DeleteGroup<'a>>,
    pub(super) upserts: Vec<UpsertGroup<'a>>,
}

/// Keys to delete, all of one key-column list.
pub(super) struct DeleteGroup<'a> {
    pub(super) shape: &'a Table,
    pub(super) keys: Vec<&'a [Value]>,
}

/// Rows to upsert, all of one shape and one set of unchanged columns.
pub(super) struct UpsertGroup<'a> {
    pub(super) shape: &'a Table,
    /// Per column: left out because every row of the group has it unchanged.
    pub(super) omit: Vec<bool>,
    /// Some column is left out: rows without unchanged columns never need `omit` compared.
    partial: bool,
    pub(super) rows: Vec<Row<'a>>,
    /// Per row: the batch's first change to the row's key was an insert, so a sink that was
    /// in step with the source before the batch does not have the key. Such rows may be
    /// written with a plain INSERT, upserting only if that meets the key after all (a
    /// replayed batch).
    pub(super) fresh: Vec<bool>,
}

/// A whole row of values in column order.
pub(super) enum Row<'a> {
    Borrowed(&'a [Value]),
    /// Unchanged columns filled in from an earlier change of the same key in the batch.
    Merged(Vec<Value>),
}

impl Row<'_> {
    pub(super) fn values(&self) -> &[Value] {
        match self {
            Row::Borrowed(v) => v,
            Row::Merged(v) => v,
        }
    }
}

struct Entry<'a> {
    shape: &'a Table,
    upsert: Option<Row<'a>>,
    /// The upsert's row holds unchanged columns.
    partial: bool,
    /// The batch's first change to this key was an insert (see [`UpsertGroup::fresh`]).
    fresh: bool,
}

/// Key values compared and hashed structurally (floats by bit pattern), borrowed from a change.
#[derive(Clone, Copy)]
struct KeyRef<'a>(&'a [Value]);

impl Hash for KeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for v in self.0 {
            std::mem::discriminant(v).hash(state);
            match v {
                Value::Null | Value::Unchanged => {}
                Value::Bool(b) => b.hash(state),
                Value::Int2(i) => i.hash(state),
                Value::Int4(i) | Value::Date(i) => i.hash(state),
                Value::Int8(i) | Value::Time(i) | Value::Timestamp(i) | Value::TimestampTz(i) => {
                    i.hash(state)
                }
                Value::Float4(f) => f.to_bits().hash(state),
                Value::Float8(f) => f.to_bits().hash(state),
                Value::Numeric(s) | Value::Text(s) | Value::Json(s) => s.hash(state),
                Value::Bytes(b) => b.hash(state),
                Value::Uuid(u) => u.hash(state),
                Value::Other { type_oid, text } => {
                    type_oid.hash(state);
                    text.hash(state);
                }
            }
        }
    }
}

impl PartialEq for KeyRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        same_values(self.0, other.0)
    }
}

impl Eq for KeyRef<'_> {}

fn same_values(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|pair| match pair {
            (Value::Float4(x), Value::Float4(y)) => x.to_bits() == y.to_bits(),
            (Value::Float8(x), Value::Float8(y)) => x.to_bits() == y.to_bits(),
            (x, y) => x == y,
        })
}

fn same_columns(a: &Table, b: &Table) -> bool {
    std::ptr::eq(a, b) || a.columns == b.columns
}

fn same_key_columns(a: &Table, b: &Table) -> bool {
    std::ptr::eq(a, b)
        || a.key.len() == b.key.len()
            && a.key
                .iter()
                .zip(&b.key)
                .all(|(&i, &j)| a.columns[i].name == b.columns[j].name)
}

/// Coalesces `changes` (in position order) into per-table plans, tables in order of first
/// appearance. Errors are about malformed changes (wrong number of values, no key) of sink
/// `sink`.
/// Every key is hashed once or twice per change: foldhash is several times cheaper than
/// std's SipHash here, and still seeded per map, so crafted keys cannot force collisions.
type Seeds = foldhash::fast::RandomState;

/// The batch's effects per (table, key), in the order of each key's last change: a key's new
/// effect goes to the end and its earlier slot is emptied, so the plan is read off in order
/// without sorting.
struct Entries<'a> {
    /// Where each key's current effect is in `slots`.
    at: HashMap<(usize, KeyRef<'a>), usize, Seeds>,
    slots: Vec<Option<((usize, KeyRef<'a>), Entry<'a>)>>,
}

impl<'a> Entries<'a> {
    fn with_capacity(n: usize) -> Self {
        Entries {
            at: HashMap::with_capacity_and_hasher(n, Seeds::default()),
            slots: Vec::with_capacity(n),
        }
    }

    /// Makes the entry `make` builds the key's effect, after every other, and returns the one
    /// it replaces. `make` sees that one first. One lookup per change: the key is hashed once.
    fn replace(
        &mut self,
        key: (usize, KeyRef<'a>),
        make: impl FnOnce(Option<&Entry<'a>>) -> Entry<'a>,
    ) -> Option<Entry<'a>> {
        let next = self.slots.len();
        let earlier = match self.at.entry(key) {
            MapEntry::Occupied(mut at) => {
                let i = std::mem::replace(at.get_mut(), next);
                self.slots[i].take().map(|(_, entry)| entry)
            }
            MapEntry::Vacant(at) => {
                at.insert(next);
                None
            }
        };
        let entry = make(earlier.as_ref());
        self.slots.push(Some((key, entry)));
        earlier
    }

    /// Drops every effect on table `t`.
    fn clear_table(&mut self, t: usize) {
        let slots = &mut self.slots;
        self.at.retain(|(table, _), i| {
            if *table == t {
                slots[*i] = None;
            }
            *table != t
        });
    }
}

pub(super) fn coalesce<'a>(
    changes: &'a [Change],
    sink: &str,
) -> Result<Vec<TablePlan<'a>>, SinkError> {
    let mut tables: Vec<TablePlan<'a>> = Vec::new();
    let mut table_ids: HashMap<(&'a str, &'a str), usize, Seeds> = HashMap::default();
    let mut last: Option<(&'a Table, usize)> = None;
    let mut entries = Entries::with_capacity(changes.len());

    for change in changes {
        let change: &'a Change = change;
        let shape: &'a Table = &change.table;
        let t = match last {
            Some((prev, t)) if std::ptr::eq(prev, shape) => t,
            _ => {
                let t = *table_ids
                    .entry((shape.schema.as_str(), shape.name.as_str()))
                    .or_insert_with(|| {
                        tables.push(TablePlan {
                            source: shape,
                            delete_all: false,
                            deletes: Vec::new(),
                            upserts: Vec::new(),
                        });
                        tables.len() - 1
                    });
                last = Some((shape, t));
                t
            }
        };
        if change.op == Op::Truncate {
            entries.clear_table(t);
            tables[t].delete_all = true;
            continue;
        }
        check_key(sink, change, &change.key)?;
        // Whether a key was fresh is decided by its first change in the batch.
        let fresh = |earlier: Option<&Entry<'a>>, first: bool| earlier.map_or(first, |e| e.fresh);
        if change.op == Op::Delete {
            entries.replace((t, KeyRef(&change.key)), |earlier| Entry {
                shape,
                upsert: None,
                partial: false,
                fresh: fresh(earlier, false),
            });
            continue;
        }
        if change.values.len() != shape.columns.len() {
            return Err(malformed(
                sink,
                change,
                format!(
                    "{} values for {} columns",
                    change.values.len(),
                    shape.columns.len()
                ),
            ));
        }
        // A moved key: the old row goes; its planned values may fill unchanged columns.
        let mut moved_from = None;
        if let Some(old) = change.old_key.as_deref()
            && !same_values(old, &change.key)
        {
            check_key(sink, change, old)?;
            moved_from = Some(entries.replace((t, KeyRef(old)), |earlier| Entry {
                shape,
                upsert: None,
                partial: false,
                fresh: fresh(earlier, false),
            }));
        }
        let unchanged = change.values.iter().any(|v| matches!(v, Value::Unchanged));
        entries.replace((t, KeyRef(&change.key)), |earlier| {
            let (row, partial) = if unchanged {
                let row = merge_unchanged(
                    change,
                    match &moved_from {
                        Some(prev) => prev.as_ref(),
                        None => earlier,
                    },
                );
                let partial = row.values().iter().any(|v| matches!(v, Value::Unchanged));
                (row, partial)
            } else {
                (Row::Borrowed(&change.values), false)
            };
            Entry {
                shape,
                upsert: Some(row),
                partial,
                fresh: fresh(earlier, change.op == Op::Insert),
            }
        });
    }

    for ((t, key), entry) in entries.slots.into_iter().flatten() {
        let plan = &mut tables[t];
        match entry.upsert {
            None => match plan
                .deletes
                .iter_mut()
                .find(|g| same_key_columns(g.shape, entry.shape))
            {
                Some(group) => group.keys.push(key.0),
                None => plan.deletes.push(DeleteGroup {
                    shape: entry.shape,
                    keys: vec![key.0],
                }),
            },
            Some(row) => {
                let unchanged = |i: usize| matches!(row.values()[i], Value::Unchanged);
                let partial = entry.partial;
                let found = plan.upserts.iter_mut().find(|g| {
                    g.partial == partial
                        && same_columns(g.shape, entry.shape)
                        && (!partial || g.omit.iter().enumerate().all(|(i, &o)| o == unchanged(i)))
                });
                match found {
                    Some(group) => {
                        group.rows.push(row);
                        group.fresh.push(entry.fresh);
                    }
                    None => {
                        let omit = (0..entry.shape.columns.len()).map(unchanged).collect();
                        plan.upserts.push(UpsertGroup {
                            shape: entry.shape,
                            omit,
                            partial,
                            rows: vec![row],
                            fresh: vec![entry.fresh],
                        });
                    }
                }
            }
        }
    }
    Ok(tables)
}

fn check_key(sink: &str, change: &Change, key: &[Value]) -> Result<(), SinkError> {
    let table = &change.table;
    if table.key.is_empty() {
        return Err(SinkError::fatal(format!(
            "sink {sink}: source table {} has no key columns (replica identity); Zipline \
             needs a key to upsert and delete rows",
            table.qualified_name()
        )));
    }
    if key.len() != table.key.len() {
        return Err(malformed(
            sink,
            change,
            format!(
                "{} key values for {} key columns",
                key.len(),
                table.key.len()
            ),
        ));
    }
    if let Some(n) = key.iter().position(|v| matches!(v, Value::Unchanged)) {
        return Err(malformed(
            sink,
            change,
            format!(
                "key column {} is marked unchanged",
                table.columns[table.key[n]].name
            ),
        ));
    }
    Ok(())
}

fn malformed(sink: &str, change: &Change, problem: String) -> SinkError {
    SinkError::definite(format!(
        "sink {sink}: malformed {} on {} at position {}: {problem}",
        change.op.as_str(),
        change.table.qualified_name(),
        change.position
    ))
}

/// Fills the unchanged columns of `change` from an earlier upsert of the same row in the batch.
fn merge_unchanged<'a>(change: &'a Change, earlier: Option<&Entry<'a>>) -> Row<'a> {
    match earlier {
        Some(Entry {
            shape,
            upsert: Some(row),
            ..
        }) if same_columns(shape, &change.table) => Row::Merged(
            change
                .values
                .iter()
                .zip(row.values())
                .map(|(new, old)| match new {
                    Value::Unchanged => old.clone(),
                    _ => new.clone(),
                })
                .collect(),
        ),
        _ => Row::Borrowed(&change.values),
    }
}

/// Tables and changes for the tests of this module and of the sinks' statement builders.
#[cfg(test)]
pub(super) mod fixtures {
    use std::sync::Arc;

    use crate::change::{Change, Column, Lsn, Op, Position, Table, Value};

    pub(crate) fn table(name: &str, cols: &[(&str, bool)]) -> Arc<Table> {
        Arc::new(Table::new(
            "public".into(),
            name.into(),
            cols.iter()
                .map(|&(name, is_key)| Column {
                    name: name.into(),
                    type_oid: 25,
                    type_modifier: -1,
                    is_key,
                })
                .collect(),
        ))
    }

    pub(crate) fn orders() -> Arc<Table> {
        table("orders", &[("id", true), ("note", false), ("qty", false)])
    }

    pub(crate) struct Changes {
        pub(crate) list: Vec<Change>,
    }

    impl Changes {
        pub(crate) fn new() -> Self {
            Changes { list: Vec::new() }
        }
        pub(crate) fn push(
            &mut self,
            op: Op,
            t: &Arc<Table>,
            key: Vec<Value>,
            old: Option<Vec<Value>>,
            values: Vec<Value>,
        ) -> &mut Self {
            let n = self.list.len() as u32 + 1;
            self.list.push(Change {
                position: Position::new(Lsn(100), n),
                op,
                table: Arc::clone(t),
                key: key.into(),
                old_key: old.map(|k| Box::new(k.into())),
                values,
            });
            self
        }
        pub(crate) fn upsert(
            &mut self,
            t: &Arc<Table>,
            id: i32,
            note: &str,
            qty: i64,
        ) -> &mut Self {
            let v = vec![Value::Int4(id), Value::Text(note.into()), Value::Int8(qty)];
            self.push(Op::Update, t, vec![Value::Int4(id)], None, v)
        }
        pub(crate) fn delete(&mut self, t: &Arc<Table>, id: i32) -> &mut Self {
            self.push(Op::Delete, t, vec![Value::Int4(id)], None, vec![])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{Changes, orders, table};
    use super::*;

    #[test]
    fn keys_compare_floats_by_bits_and_types_strictly() {
        let nan = [Value::Float8(f64::NAN)];
        assert!(KeyRef(&nan) == KeyRef(&nan));
        let (zero, neg_zero) = ([Value::Float8(0.0)], [Value::Float8(-0.0)]);
        assert!(KeyRef(&zero) != KeyRef(&neg_zero));
        assert!(KeyRef(&[Value::Int4(1)]) != KeyRef(&[Value::Int8(1)]));
        let mut entries = HashMap::new();
        let a = [Value::Text("a".into()), Value::Int4(1)];
        let b = [Value::Text("a".into()), Value::Int4(1)];
        entries.insert(KeyRef(&a), 1);
        entries.insert(KeyRef(&b), 2);
        assert_eq!(entries.len(), 1);
    }

    #[test]
    fn later_changes_win_and_groups_keep_last_change_order() {
        let t = orders();
        let other = table("other", &[("id", true)]);
        let mut c = Changes::new();
        c.upsert(&t, 1, "a", 1).upsert(&t, 2, "b", 1);
        c.push(
            Op::Insert,
            &other,
            vec![Value::Int4(9)],
            None,
            vec![Value::Int4(9)],
        );
        c.upsert(&t, 1, "a2", 2).delete(&t, 3);
        let tables = coalesce(&c.list, "out").unwrap();
        assert_eq!(tables.len(), 2);
        assert_eq!(tables[0].source.name, "orders");
        assert_eq!(tables[1].source.name, "other");
        let orders = &tables[0];
        assert!(!orders.delete_all);
        assert_eq!(orders.deletes.len(), 1);
        assert_eq!(orders.deletes[0].keys, [&[Value::Int4(3)][..]]);
        assert_eq!(orders.upserts.len(), 1);
        let ids: Vec<&Value> = orders.upserts[0]
            .rows
            .iter()
            .map(|r| &r.values()[0])
            .collect();
        assert_eq!(ids, [&Value::Int4(2), &Value::Int4(1)]);
        assert_eq!(
            orders.upserts[0].rows[1].values()[1],
            Value::Text("a2".into())
        );
    }

    #[test]
    fn rows_first_inserted_in_the_batch_are_fresh() {
        let t = orders();
        let insert = |c: &mut Changes, id: i32| {
            let v = vec![Value::Int4(id), Value::Null, Value::Int8(1)];
            c.push(Op::Insert, &t, vec![Value::Int4(id)], None, v);
        };
        let mut c = Changes::new();
        // 1: inserted then updated (fresh); 2: updated then deleted and inserted (not: the
        // sink has it); 3: inserted, deleted, inserted (fresh); 4: moved to 5 after 5 was
        // inserted (5 fresh, whatever the later change); 6: a plain update.
        insert(&mut c, 1);
        c.upsert(&t, 1, "a", 2).upsert(&t, 2, "b", 1).delete(&t, 2);
        insert(&mut c, 2);
        insert(&mut c, 3);
        c.delete(&t, 3);
        insert(&mut c, 3);
        insert(&mut c, 5);
        c.delete(&t, 5);
        c.push(
            Op::Update,
            &t,
            vec![Value::Int4(5)],
            Some(vec![Value::Int4(4)]),
            vec![Value::Int4(5), Value::Null, Value::Int8(9)],
        );
        c.upsert(&t, 6, "f", 1);
        let tables = coalesce(&c.list, "out").unwrap();
        let group = &tables[0].upserts[0];
        let fresh: Vec<(i32, bool)> = group
            .rows
            .iter()
            .zip(&group.fresh)
            .map(|(r, &f)| match r.values()[0] {
                Value::Int4(id) => (id, f),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            fresh,
            [(1, true), (2, false), (3, true), (5, true), (6, false)]
        );
        // After a truncate every key is absent: first touches decide again.
        let mut c = Changes::new();
        c.upsert(&t, 7, "g", 1);
        c.push(Op::Truncate, &t, vec![], None, vec![]);
        insert(&mut c, 7);
        let tables = coalesce(&c.list, "out").unwrap();
        assert_eq!(tables[0].upserts[0].fresh, [true]);
    }

    #[test]
    fn unchanged_values_come_from_the_old_key_of_a_moved_row() {
        let t = orders();
        let mut c = Changes::new();
        c.upsert(&t, 1, "text", 1);
        let moved = vec![Value::Int4(2), Value::Unchanged, Value::Int8(5)];
        c.push(
            Op::Update,
            &t,
            vec![Value::Int4(2)],
            Some(vec![Value::Int4(1)]),
            moved,
        );
        let tables = coalesce(&c.list, "out").unwrap();
        assert_eq!(tables[0].deletes[0].keys, [&[Value::Int4(1)][..]]);
        let group = &tables[0].upserts[0];
        assert_eq!(group.omit, [false, false, false]);
        assert_eq!(
            group.rows[0].values(),
            [Value::Int4(2), Value::Text("text".into()), Value::Int8(5)]
        );
    }
}
