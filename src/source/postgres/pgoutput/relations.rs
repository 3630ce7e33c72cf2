//! The relation cache, and turning Insert/Update/Delete/Truncate messages into [`Change`]s.
//!
//! pgoutput sends a Relation message before the first row of a table on each connection and
//! again whenever the table's shape changes, so the cache starts empty after every
//! reconnect. Keys follow the replica identity: the primary key (`DEFAULT`), a chosen unique
//! index (`USING INDEX`). Under `FULL` the message flags every column as key, which a sink
//! cannot upsert by (a changed column would make a new row), so the key is the one preflight
//! found for the table (its primary key, or a unique index on NOT NULL columns), handed in as
//! [`KeyHints`]. See
//! <https://www.postgresql.org/docs/15/sql-altertable.html#SQL-ALTERTABLE-REPLICA-IDENTITY>.
//!
//! A new Relation message for a cached relation is a schema change. Added columns simply
//! appear in the new shape (the sinks add them), dropped ones disappear (the sinks keep
//! theirs). A column whose type or type modifier changed is an error: the sink column would
//! silently convert, truncate or reject the new values, so the pipeline stops for the
//! operator to alter the sink column first.

use std::collections::HashMap;
use std::sync::Arc;

use super::{OldTuple, PgOutput, RelationBody, ReplicaIdentity, Tuple, TupleValue};
use crate::change::{Change, Column, Key, Op, Position, Table, Value};

use crate::source::postgres::types::{self, TypeError};

/// A row message that cannot become a [`Change`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChangeError {
    /// A row message for a relation id no Relation message described.
    #[error(
        "pgoutput sent a row for relation id {rel_id} before describing it in a Relation message"
    )]
    UnknownRelation {
        /// The relation id.
        rel_id: u32,
    },
    /// The table has no replica identity key to route and apply rows by.
    #[error(
        "table {table} has no replica identity key (REPLICA IDENTITY NOTHING, or DEFAULT \
         without a primary key); Zipline needs one to route and apply its rows: add a \
         primary key, or run ALTER TABLE {table} REPLICA IDENTITY USING INDEX <unique index \
         on NOT NULL columns> (or REPLICA IDENTITY FULL to key on every column)"
    )]
    NoKey {
        /// `schema.name`.
        table: String,
    },
    /// A tuple's column count differs from the Relation message's.
    #[error(
        "{tuple} tuple for table {table} has {found} columns, but its Relation message has {expected}"
    )]
    ColumnCount {
        /// `schema.name`.
        table: String,
        /// Which tuple (`new`, `old`).
        tuple: &'static str,
        /// Columns in the Relation message.
        expected: usize,
        /// Columns in the tuple.
        found: usize,
    },
    /// A value could not be parsed for its column's type.
    #[error("table {table}, column {column}: {source}")]
    Value {
        /// `schema.name`.
        table: String,
        /// Column name.
        column: String,
        /// The parse failure.
        source: TypeError,
    },
    /// A key column's value was not sent and cannot be recovered from an old tuple.
    #[error(
        "table {table}: key column {column} was sent as an unchanged TOAST value with no old value to take it from"
    )]
    MissingKey {
        /// `schema.name`.
        table: String,
        /// Column name.
        column: String,
    },
    /// [`Relations::build_change`] was given a message that is not Insert, Update or Delete.
    #[error("{0} is not a row message")]
    NotARowMessage(&'static str),
    /// A column of a known relation changed its type mid-stream.
    #[error(
        "column {table}.{column} changed type from {old} to {new} on the source; Zipline \
         stopped before applying any row written after the change"
    )]
    TypeChanged {
        /// `schema.name`.
        table: String,
        /// Column name.
        column: String,
        /// The type before, as PostgreSQL names it.
        old: String,
        /// The type now.
        new: String,
        /// The table's new shape, and its relation id.
        shape: Box<(Table, u32)>,
    },
    /// A table the pipeline applied under one relation id arrives under another: it was
    /// dropped and created again.
    #[error(
        "table {table} was dropped and created again on the source (relation id {old}, now \
         {new}): the sinks still hold the old table's rows, and the new table's rows from \
         before this change were never streamed"
    )]
    Recreated {
        /// `schema.name`.
        table: String,
        /// The relation id the pipeline applied.
        old: u32,
        /// The relation id now.
        new: u32,
    },
    /// A `REPLICA IDENTITY FULL` table whose real key preflight did not record.
    #[error(
        "table {table} has REPLICA IDENTITY FULL and Zipline has no key for it (it was not \
         published when Zipline started, or its key columns are gone); restart Zipline so it \
         reads the table's primary key (or unique index on NOT NULL columns), or give it one"
    )]
    FullWithoutKey {
        /// `schema.name`.
        table: String,
    },
}

/// The key columns preflight found per table (`(schema, name)` → column names), for tables
/// whose Relation messages do not say it (`REPLICA IDENTITY FULL`).
pub(crate) type KeyHints = Arc<HashMap<(String, String), Vec<String>>>;

/// What the pipeline last applied of a table (its records in the sinks): relation id and
/// shape, by `(schema, name)`.
pub(crate) type Known = HashMap<(String, String), (u32, Table)>;

/// The table shapes announced by Relation messages on this connection, by relation id, and
/// what the pipeline applied before, to compare new connections' Relation messages with.
#[derive(Debug, Default)]
pub(crate) struct Relations {
    /// Looked up for every row message: foldhash costs a fraction of std's SipHash.
    tables: HashMap<u32, Arc<Table>, foldhash::fast::RandomState>,
    keys: KeyHints,
    known: Known,
    /// The relation id each table name arrived under in this run.
    names: HashMap<(String, String), u32>,
}

impl Relations {
    /// An empty cache that keys `FULL` tables by `keys` and checks first sightings against
    /// `known`.
    pub(crate) fn new(keys: KeyHints, known: Known) -> Self {
        Relations {
            tables: HashMap::default(),
            keys,
            known,
            names: HashMap::new(),
        }
    }

    /// Whether `table` under relation `rel_id` is what the pipeline has recorded (same id,
    /// same shape): then there is nothing new to record.
    pub(crate) fn is_known(&self, rel_id: u32, table: &Table) -> bool {
        self.known
            .get(&(table.schema.clone(), table.name.clone()))
            .is_some_and(|(id, shape)| *id == rel_id && shape == table)
    }

    /// The pipeline recorded `table` under `rel_id`.
    pub(crate) fn remember(&mut self, rel_id: u32, table: &Table) {
        self.known.insert(
            (table.schema.clone(), table.name.clone()),
            (rel_id, table.clone()),
        );
    }

    /// Forgets every shape (a new connection announces them again), keeping the key hints.
    pub(crate) fn reset(&mut self) {
        self.tables.clear();
    }

    /// Records a Relation message and returns the table shape that changes of that relation
    /// carry from now on. A shape equal to the cached one keeps the same `Arc`. A column whose
    /// type changed since the last Relation message of that relation is an error, and the
    /// cached shape stays as it was.
    pub(crate) fn apply_relation(&mut self, r: RelationBody) -> Result<Arc<Table>, ChangeError> {
        let mut columns = r.columns;
        match r.replica_identity {
            // NOTHING flags no column; clearing the flags anyway guarantees an empty key,
            // which `build_change` rejects with advice.
            ReplicaIdentity::Nothing => columns.iter_mut().for_each(|c| c.is_key = false),
            ReplicaIdentity::Full => {
                let qualified = || format!("{}.{}", r.namespace, r.name);
                let key = self
                    .keys
                    .get(&(r.namespace.clone(), r.name.clone()))
                    .filter(|key| key.iter().all(|k| columns.iter().any(|c| &c.name == k)))
                    .ok_or_else(|| ChangeError::FullWithoutKey { table: qualified() })?;
                for c in &mut columns {
                    c.is_key = key.contains(&c.name);
                }
            }
            ReplicaIdentity::Default | ReplicaIdentity::Index => {}
        }
        let table = Table::new(r.namespace, r.name, columns);
        let name = (table.schema.clone(), table.name.clone());
        if let Some(old) = self.tables.get(&r.rel_id) {
            if **old == table {
                return Ok(Arc::clone(old));
            }
            check_types(old, &table, r.rel_id)?;
        } else {
            // First sight on this connection: against this run's ids and the records of what
            // the pipeline applied before (a change made while it was stopped or lagging).
            let before = self
                .names
                .get(&name)
                .copied()
                .or_else(|| self.known.get(&name).map(|(id, _)| *id));
            if let Some(old) = before
                && old != r.rel_id
            {
                return Err(ChangeError::Recreated {
                    table: table.qualified_name(),
                    old,
                    new: r.rel_id,
                });
            }
            if let Some((_, shape)) = self.known.get(&name) {
                check_types(shape, &table, r.rel_id)?;
            }
        }
        self.names.insert(name, r.rel_id);
        tracing::debug!(
            table = %table.qualified_name(),
            rel_id = r.rel_id,
            columns = table.columns.len(),
            key_columns = table.key.len(),
            replica_identity = ?r.replica_identity,
            "table shape received"
        );
        let table = Arc::new(table);
        self.tables.insert(r.rel_id, Arc::clone(&table));
        Ok(table)
    }

    /// The current shape of relation `rel_id`.
    pub(crate) fn get(&self, rel_id: u32) -> Option<&Arc<Table>> {
        self.tables.get(&rel_id)
    }

    fn table(&self, rel_id: u32) -> Result<&Arc<Table>, ChangeError> {
        self.get(rel_id)
            .ok_or(ChangeError::UnknownRelation { rel_id })
    }

    fn keyed_table(&self, rel_id: u32) -> Result<&Arc<Table>, ChangeError> {
        let table = self.table(rel_id)?;
        if table.key.is_empty() {
            return Err(ChangeError::NoKey {
                table: table.qualified_name(),
            });
        }
        Ok(table)
    }

    /// Builds the change for an Insert, Update or Delete message at `position`.
    ///
    /// An update's key columns sent as unchanged TOAST values are taken from the old tuple;
    /// with a full old row (`REPLICA IDENTITY FULL`) every unchanged column is filled in, so
    /// only updates under other identities leave [`Value::Unchanged`] in `values`.
    pub(crate) fn build_change(
        &self,
        msg: PgOutput,
        position: Position,
    ) -> Result<Change, ChangeError> {
        let change = |table: &Arc<Table>, op, key, old_key, values| Change {
            position,
            op,
            table: Arc::clone(table),
            key,
            old_key,
            values,
        };
        let (op, rel_id, old, new) = match msg {
            PgOutput::Insert { rel_id, new, .. } => (Op::Insert, rel_id, None, new),
            PgOutput::Update {
                rel_id, old, new, ..
            } => (Op::Update, rel_id, old, new),
            PgOutput::Delete { rel_id, old, .. } => {
                let table = self.keyed_table(rel_id)?;
                let key = parse_key(table, old.tuple())?;
                return Ok(change(table, Op::Delete, key, None, Vec::new()));
            }
            other => return Err(ChangeError::NotARowMessage(other.name())),
        };
        let table = self.keyed_table(rel_id)?;
        let mut values = parse_row(table, "new", &new)?;
        let Some(old) = old else {
            let key = key_of(table, &values)?;
            return Ok(change(table, op, key, None, values));
        };
        let old_values = parse_row(table, "old", old.tuple())?;
        // A key-only old tuple has nulls, not values, outside the key.
        let old_is_full = matches!(old, OldTuple::Full(_));
        for ((v, old), column) in values.iter_mut().zip(&old_values).zip(&table.columns) {
            if *v == Value::Unchanged && (old_is_full || column.is_key) {
                *v = old.clone();
            }
        }
        let key = key_of(table, &values)?;
        let old_key: Key = table
            .key
            .iter()
            .zip(&key)
            .map(|(&i, new)| match &old_values[i] {
                Value::Unchanged => new.clone(),
                v => v.clone(),
            })
            .collect();
        let old_key = (old_key != key).then(|| Box::new(old_key));
        Ok(change(table, op, key, old_key, values))
    }

    /// Builds the change truncating relation `rel_id` (one per id of a Truncate message).
    pub(crate) fn build_truncate(
        &self,
        rel_id: u32,
        position: Position,
    ) -> Result<Change, ChangeError> {
        Ok(Change {
            position,
            op: Op::Truncate,
            table: Arc::clone(self.table(rel_id)?),
            key: Key::new(),
            old_key: None,
            values: Vec::new(),
        })
    }
}

/// Fails on the first column of `new` that `old` has under the same name with another type
/// or type modifier. A renamed column is not one: it looks like a drop and an add.
fn check_types(old: &Table, new: &Table, rel_id: u32) -> Result<(), ChangeError> {
    for column in &new.columns {
        let Some(before) = old.columns.iter().find(|c| c.name == column.name) else {
            continue;
        };
        if (before.type_oid, before.type_modifier) != (column.type_oid, column.type_modifier) {
            return Err(ChangeError::TypeChanged {
                table: new.qualified_name(),
                column: column.name.clone(),
                old: types::describe_type(before.type_oid, before.type_modifier),
                new: types::describe_type(column.type_oid, column.type_modifier),
                shape: Box::new((new.clone(), rel_id)),
            });
        }
    }
    Ok(())
}

/// The key column values of a parsed row (which has one value per column).
fn key_of(table: &Table, row: &[Value]) -> Result<Key, ChangeError> {
    let mut key = Key::with_capacity(table.key.len());
    for &i in &table.key {
        key.push(match &row[i] {
            Value::Unchanged => return Err(missing_key(table, i)),
            v => v.clone(),
        });
    }
    Ok(key)
}

fn missing_key(table: &Table, column: usize) -> ChangeError {
    ChangeError::MissingKey {
        table: table.qualified_name(),
        column: table.columns[column].name.clone(),
    }
}

/// The key column values of an old tuple (a delete's), parsing only those columns.
fn parse_key(table: &Table, raw: &Tuple) -> Result<Key, ChangeError> {
    check_count(table, "old", raw)?;
    let mut key = Key::with_capacity(table.key.len());
    for (i, (v, col)) in raw.values().zip(&table.columns).enumerate() {
        if col.is_key {
            key.push(match parse_value(table, col, v)? {
                Value::Unchanged => return Err(missing_key(table, i)),
                v => v,
            });
        }
    }
    Ok(key)
}

fn check_count(table: &Table, tuple: &'static str, raw: &Tuple) -> Result<(), ChangeError> {
    if raw.len() != table.columns.len() {
        return Err(ChangeError::ColumnCount {
            table: table.qualified_name(),
            tuple,
            expected: table.columns.len(),
            found: raw.len(),
        });
    }
    Ok(())
}

/// Parses a tuple's values by the table's column types.
fn parse_row(table: &Table, tuple: &'static str, raw: &Tuple) -> Result<Vec<Value>, ChangeError> {
    check_count(table, tuple, raw)?;
    // Sized up front: collecting a fallible iterator would grow the vector from its
    // unknown lower bound, a reallocation per row.
    let mut values = Vec::with_capacity(table.columns.len());
    // The match is written out here rather than calling `parse_value`: the call, even
    // always inlined, cost more per value than the parsing (its large `Result`).
    for (v, col) in raw.values().zip(&table.columns) {
        values.push(match v {
            TupleValue::Null => Value::Null,
            TupleValue::Unchanged => Value::Unchanged,
            TupleValue::Text(text) => types::parse_text(col.type_oid, text)
                .map_err(|source| value_error(table, col, source))?,
            TupleValue::Binary(bytes) => types::parse_binary(col.type_oid, bytes)
                .map_err(|source| value_error(table, col, source))?,
        });
    }
    Ok(values)
}

/// One value of a tuple (as [`parse_row`] parses each).
fn parse_value(table: &Table, col: &Column, v: TupleValue<'_>) -> Result<Value, ChangeError> {
    Ok(match v {
        TupleValue::Null => Value::Null,
        TupleValue::Unchanged => Value::Unchanged,
        TupleValue::Text(text) => types::parse_text(col.type_oid, text)
            .map_err(|source| value_error(table, col, source))?,
        TupleValue::Binary(bytes) => types::parse_binary(col.type_oid, bytes)
            .map_err(|source| value_error(table, col, source))?,
    })
}

fn value_error(table: &Table, col: &Column, source: TypeError) -> ChangeError {
    ChangeError::Value {
        table: table.qualified_name(),
        column: col.name.clone(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::super::decode;
    use super::super::tests::{P, U, users_relation, wire};
    use super::*;
    use crate::change::Lsn;
    use P::*;

    /// A cache holding `public.users` (key `id`) with the given replica identity.
    fn relations(identity: u8) -> Relations {
        let mut rels = Relations::default();
        let Ok(PgOutput::Relation(body)) = decode(users_relation(None, identity), false) else {
            panic!("not a relation")
        };
        rels.apply_relation(body).expect("a usable relation");
        rels
    }

    fn pos(ordinal: u32) -> Position {
        Position::new(Lsn(100), ordinal)
    }

    fn t(s: &str) -> Value {
        Value::Text(s.into())
    }

    fn row(parts: &[P], rels: &Relations) -> Result<Change, ChangeError> {
        let msg = decode(wire(parts), false).expect("valid message");
        rels.build_change(msg, pos(1))
    }

    /// An update of `public.users` with an optional (marker, old tuple).
    fn update(
        rels: &Relations,
        old: Option<(u8, &[Option<&str>])>,
        new: &[Option<&str>],
    ) -> Result<Change, ChangeError> {
        let mut parts = vec![B(b'U'), W(16_384)];
        if let Some((marker, values)) = old {
            parts.extend([B(marker), T(values)]);
        }
        parts.extend([B(b'N'), T(new)]);
        row(&parts, rels)
    }

    #[test]
    fn relation_cache_keeps_shapes() {
        let mut rels = relations(b'd');
        let table = Arc::clone(rels.get(16_384).expect("cached"));
        assert_eq!(table.qualified_name(), "public.users");
        assert_eq!(table.key, vec![0]);
        let Ok(PgOutput::Relation(mut body)) = decode(users_relation(None, b'd'), false) else {
            panic!("not a relation")
        };
        assert!(Arc::ptr_eq(
            &rels.apply_relation(body.clone()).unwrap(),
            &table
        ));
        body.columns.pop();
        let narrower = rels.apply_relation(body).unwrap();
        assert_eq!(narrower.columns.len(), 2);
        assert!(Arc::ptr_eq(rels.get(16_384).unwrap(), &narrower));
        assert!(rels.get(1).is_none());
    }

    #[test]
    fn insert_builds_typed_row_and_key() {
        let rels = relations(b'd');
        let c = row(
            &[
                B(b'I'),
                W(16_384),
                B(b'N'),
                T(&[Some("7"), Some("ann"), None]),
            ],
            &rels,
        );
        let c = c.unwrap();
        assert_eq!((c.op, c.position), (Op::Insert, pos(1)));
        assert_eq!(c.values, vec![Value::Int4(7), t("ann"), Value::Null]);
        assert_eq!(
            (c.key, c.old_key),
            (smallvec::smallvec![Value::Int4(7)], None)
        );
        assert!(Arc::ptr_eq(&c.table, rels.get(16_384).unwrap()));
    }

    #[test]
    fn update_without_old_tuple_keeps_unchanged_toast() {
        let rels = relations(b'd');
        let c = update(&rels, None, &[Some("7"), Some("bob"), U]).unwrap();
        assert_eq!(c.op, Op::Update);
        assert_eq!(c.values, vec![Value::Int4(7), t("bob"), Value::Unchanged]);
        assert_eq!(
            (c.key, c.old_key),
            (smallvec::smallvec![Value::Int4(7)], None)
        );
    }

    #[test]
    fn update_reports_old_key_only_when_the_key_changed() {
        let rels = relations(b'd');
        let old_key: &[Option<&str>] = &[Some("7"), None, None];
        let c = update(&rels, Some((b'K', old_key)), &[Some("8"), Some("b"), U]).unwrap();
        assert_eq!(c.key[..], [Value::Int4(8)]);
        assert_eq!(
            c.old_key,
            Some(Box::new(smallvec::smallvec![Value::Int4(7)]))
        );
        // The key tuple's nulls outside the key are not values to fill Unchanged from.
        assert_eq!(c.values[2], Value::Unchanged);

        // PostgreSQL also sends the old key when it has external TOAST values.
        let c = update(&rels, Some((b'K', old_key)), &[Some("7"), None, None]).unwrap();
        assert_eq!(c.old_key, None);

        let c = update(&rels, Some((b'K', old_key)), &[U, Some("c"), None]).unwrap();
        assert_eq!(
            (c.key, c.old_key),
            (smallvec::smallvec![Value::Int4(7)], None)
        );
        assert_eq!(c.values[0], Value::Int4(7));

        let e = update(&rels, None, &[U, Some("c"), None]).unwrap_err();
        assert!(
            matches!(&e, ChangeError::MissingKey { column, .. } if column == "id"),
            "{e}"
        );
    }

    #[test]
    fn full_old_row_fills_unchanged_columns() {
        let rels = relations(b'd');
        let old: &[Option<&str>] = &[Some("7"), Some("a"), Some("long")];
        let c = update(&rels, Some((b'O', old)), &[Some("7"), Some("b"), U]).unwrap();
        assert_eq!(c.values, vec![Value::Int4(7), t("b"), t("long")]);
        assert_eq!(c.old_key, None);
    }

    /// `public.users` under REPLICA IDENTITY FULL: the walsender flags every column as key.
    fn full_relation() -> RelationBody {
        let Ok(PgOutput::Relation(mut body)) = decode(users_relation(None, b'f'), false) else {
            panic!("not a relation")
        };
        body.columns.iter_mut().for_each(|c| c.is_key = true);
        body
    }

    #[test]
    fn replica_identity_full_keys_on_the_preflight_key() {
        let hints = HashMap::from([(("public".into(), "users".into()), vec!["id".to_owned()])]);
        let mut rels = Relations::new(Arc::new(hints), Known::new());
        let table = rels.apply_relation(full_relation()).unwrap();
        assert_eq!(table.key, vec![0]);
        assert!(!table.columns[1].is_key && !table.columns[2].is_key);
        let old: &[Option<&str>] = &[Some("1"), Some("a"), Some("x")];
        let c = update(&rels, Some((b'O', old)), &[Some("1"), Some("b"), U]).unwrap();
        assert_eq!(c.key[..], [Value::Int4(1)]);
        assert_eq!(c.old_key, None);
        // The full old row fills the TOASTed column the update did not send.
        assert_eq!(c.values, vec![Value::Int4(1), t("b"), t("x")]);
        let c = update(&rels, Some((b'O', old)), &[Some("2"), Some("a"), U]).unwrap();
        assert_eq!(c.key[..], [Value::Int4(2)]);
        assert_eq!(
            c.old_key,
            Some(Box::new(smallvec::smallvec![Value::Int4(1)]))
        );
        let c = row(&[B(b'D'), W(16_384), B(b'O'), T(old)], &rels).unwrap();
        assert_eq!(c.key[..], [Value::Int4(1)]);

        // A reconnect forgets shapes, not hints.
        rels.reset();
        assert!(rels.get(16_384).is_none());
        assert_eq!(rels.apply_relation(full_relation()).unwrap().key, vec![0]);
    }

    #[test]
    fn replica_identity_full_without_a_known_key_is_fatal() {
        let e = Relations::default()
            .apply_relation(full_relation())
            .unwrap_err();
        assert!(matches!(&e, ChangeError::FullWithoutKey { table } if table == "public.users"));
        // A hinted key column that the table no longer has is no key either.
        let hints = HashMap::from([(("public".into(), "users".into()), vec!["gone".to_owned()])]);
        let e = Relations::new(Arc::new(hints), Known::new())
            .apply_relation(full_relation())
            .unwrap_err();
        assert!(e.to_string().contains("REPLICA IDENTITY FULL"), "{e}");
    }

    #[test]
    fn added_and_dropped_columns_are_new_shapes_but_type_changes_are_fatal() {
        let mut rels = relations(b'd');
        let Ok(PgOutput::Relation(body)) = decode(users_relation(None, b'd'), false) else {
            panic!("not a relation")
        };
        let mut wider = body.clone();
        wider.columns.push(crate::change::Column {
            name: "email".into(),
            type_oid: 25,
            type_modifier: -1,
            is_key: false,
        });
        let t = rels.apply_relation(wider.clone()).unwrap();
        assert_eq!(t.columns.len(), 4);
        let mut narrower = wider.clone();
        narrower.columns.remove(2);
        assert_eq!(rels.apply_relation(narrower).unwrap().columns.len(), 3);

        // name: varchar(64) → varchar(200) is a type change (typmod = length + 4).
        let mut retyped = body;
        retyped.columns[1].type_modifier = 204;
        let before = Arc::clone(rels.get(16_384).unwrap());
        let e = rels.apply_relation(retyped).unwrap_err();
        let text = e.to_string();
        assert_eq!(
            text,
            "column public.users.name changed type from character varying(64) to character \
             varying(200) on the source; Zipline stopped before applying any row written after \
             the change"
        );
        // The cache keeps the last good shape.
        assert!(Arc::ptr_eq(rels.get(16_384).unwrap(), &before));
    }

    #[test]
    fn delete_keys_from_old_tuple() {
        let rels = relations(b'd');
        for (marker, old) in [
            (b'K', [Some("7"), None, None]),
            (b'O', [Some("7"), Some("x"), None]),
        ] {
            let c = row(&[B(b'D'), W(16_384), B(marker), T(&old)], &rels).unwrap();
            assert_eq!(c.op, Op::Delete);
            assert_eq!(c.key[..], [Value::Int4(7)]);
            assert!(c.values.is_empty() && c.old_key.is_none());
        }
    }

    #[test]
    fn binary_values_give_the_values_their_text_gives() {
        let rels = relations(b'd');
        // id int4 7, name varchar "ab", bio null: in binary, then in text.
        let binary = [
            B(b'I'),
            W(16_384),
            B(b'N'),
            H(3),
            B(b'b'),
            I(4),
            W(7),
            B(b'b'),
            I(2),
            B(b'a'),
            B(b'b'),
            B(b'n'),
        ];
        let text = [
            B(b'I'),
            W(16_384),
            B(b'N'),
            T(&[Some("7"), Some("ab"), None]),
        ];
        let (b, t) = (row(&binary, &rels).unwrap(), row(&text, &rels).unwrap());
        assert_eq!((&b.key, &b.values), (&t.key, &t.values));
        assert_eq!(b.values[1], Value::Text("ab".into()));
    }

    #[test]
    fn truncate_needs_only_a_known_relation() {
        let rels = relations(b'n');
        let c = rels.build_truncate(16_384, pos(3)).unwrap();
        assert_eq!((c.op, c.position), (Op::Truncate, pos(3)));
        assert_eq!(c.table.name, "users");
        assert!(c.key.is_empty() && c.values.is_empty() && c.old_key.is_none());
        let e = rels.build_truncate(99, pos(3)).unwrap_err();
        assert!(matches!(e, ChangeError::UnknownRelation { rel_id: 99 }));
    }

    #[test]
    fn unusable_rows_are_errors_naming_the_table() {
        let insert = [B(b'I'), W(16_384), B(b'N'), T(&[Some("1"), None, None])];
        let e = row(&insert, &relations(b'n')).unwrap_err();
        assert!(matches!(&e, ChangeError::NoKey { table } if table == "public.users"));
        assert!(e.to_string().contains("REPLICA IDENTITY"), "{e}");

        let e = row(&insert, &Relations::default()).unwrap_err();
        assert!(matches!(e, ChangeError::UnknownRelation { rel_id: 16_384 }));

        let rels = relations(b'd');
        let e = row(&[B(b'I'), W(16_384), B(b'N'), T(&[Some("1")])], &rels).unwrap_err();
        assert!(
            e.to_string().contains("table public.users has 1 columns"),
            "{e}"
        );
        assert!(matches!(
            e,
            ChangeError::ColumnCount {
                expected: 3,
                found: 1,
                ..
            }
        ));

        let e = update(&rels, Some((b'K', &[Some("1")])), &[Some("1"), None, None]).unwrap_err();
        assert!(matches!(e, ChangeError::ColumnCount { tuple: "old", .. }));

        let e = row(
            &[B(b'I'), W(16_384), B(b'N'), T(&[Some("x1"), None, None])],
            &rels,
        );
        let e = e.unwrap_err().to_string();
        assert!(
            e.contains("public.users, column id") && e.contains("\"x1\""),
            "{e}"
        );

        let binary = [
            B(b'I'),
            W(16_384),
            B(b'N'),
            H(3),
            B(b'b'),
            I(1),
            B(1),
            B(b'n'),
            B(b'n'),
        ];
        let e = row(&binary, &rels).unwrap_err();
        assert!(
            matches!(&e, ChangeError::Value { column, source, .. }
                if column == "id" && source.reason == "expected 4 bytes"),
            "{e}"
        );

        let e = rels.build_change(PgOutput::StreamStop, pos(1)).unwrap_err();
        assert!(matches!(e, ChangeError::NotARowMessage("Stream Stop")));
    }
}
