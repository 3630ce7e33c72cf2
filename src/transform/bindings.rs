//! The WIT contract (`wit/transform.wit`) as Rust types, and the conversions between Zipline's
//! [`Change`] and the component's `batch`/`output`.
//!
//! Input: each distinct table of a batch (by `Arc` identity, which is how the source shares
//! one shape among all changes of a table) is listed once in `batch.tables`; changes refer to
//! it by index. Values are moved, not cloned: the converted batch keeps the only copy, and
//! [`InputBatch::change`] rebuilds an original change from it when a failure must name or
//! dead-letter one.
//!
//! Outputs are checked and converted back in [`super::output`].

use std::collections::HashMap;
use std::sync::Arc;

use crate::change::{self, Change, Lsn, Op, Position};

wasmtime::component::bindgen!({
    path: "wit",
    world: "transform",
    additional_derives: [PartialEq],
});

pub(crate) use zipline::transform::host::Level;
use zipline::transform::types as w;

/// A batch in WIT form plus what is needed to map outputs back to inputs.
pub(crate) struct InputBatch {
    pub(crate) wit: Batch,
    /// `wit.tables[i]` came from `tables[i]`.
    pub(crate) tables: Vec<Arc<change::Table>>,
    /// Input positions, strictly increasing (the source's order).
    pub(super) positions: Vec<Position>,
}

impl InputBatch {
    /// Converts `changes` (in commit order), moving their values.
    pub(crate) fn new(changes: Vec<Change>) -> Self {
        let mut tables: Vec<Arc<change::Table>> = Vec::new();
        let mut index: HashMap<*const change::Table, u32> = HashMap::new();
        let mut last: Option<(*const change::Table, u32)> = None;
        let mut wit_tables = Vec::new();
        let mut positions = Vec::with_capacity(changes.len());
        let mut wit_changes = Vec::with_capacity(changes.len());
        for c in changes {
            let ptr = Arc::as_ptr(&c.table);
            let t = match last {
                Some((p, i)) if p == ptr => i,
                _ => {
                    let i = *index.entry(ptr).or_insert_with(|| {
                        wit_tables.push(table_to_wit(&c.table));
                        tables.push(c.table.clone());
                        (tables.len() - 1) as u32
                    });
                    last = Some((ptr, i));
                    i
                }
            };
            positions.push(c.position);
            wit_changes.push(w::Change {
                table: t,
                op: op_to_wit(c.op),
                position: position_to_wit(c.position),
                key: c.key.into_iter().map(value_to_wit).collect(),
                old_key: c.old_key.map(|k| k.into_iter().map(value_to_wit).collect()),
                values: c.values.into_iter().map(value_to_wit).collect(),
            });
        }
        InputBatch {
            wit: Batch {
                tables: wit_tables,
                changes: wit_changes,
            },
            tables,
            positions,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.positions.len()
    }

    /// The original input change `i`, rebuilt from its WIT form.
    pub(crate) fn change(&self, i: usize) -> Change {
        let c = &self.wit.changes[i];
        Change {
            position: self.positions[i],
            op: op_from_wit(c.op),
            table: self.tables[c.table as usize].clone(),
            key: c.key.iter().cloned().map(value_from_wit).collect(),
            old_key: c
                .old_key
                .as_ref()
                .map(|k| k.iter().cloned().map(value_from_wit).collect()),
            values: c.values.iter().cloned().map(value_from_wit).collect(),
        }
    }

    /// A one-change batch holding input `i`.
    pub(crate) fn single(&self, i: usize) -> InputBatch {
        InputBatch::new(vec![self.change(i)])
    }

    pub(super) fn input_of(&self, p: &w::Position) -> Option<usize> {
        let lsn = lsn_of(p);
        self.positions
            .binary_search_by(|q| (q.lsn, q.ordinal).cmp(&(lsn, p.ordinal)))
            .ok()
    }
}

fn table_to_wit(t: &change::Table) -> w::Table {
    w::Table {
        schema: t.schema.clone(),
        name: t.name.clone(),
        columns: t
            .columns
            .iter()
            .map(|c| w::Column {
                name: c.name.clone(),
                type_oid: c.type_oid,
                type_modifier: c.type_modifier,
                is_key: c.is_key,
            })
            .collect(),
    }
}

pub(super) fn table_from_wit(t: &w::Table) -> change::Table {
    change::Table::new(
        t.schema.clone(),
        t.name.clone(),
        t.columns
            .iter()
            .map(|c| change::Column {
                name: c.name.clone(),
                type_oid: c.type_oid,
                type_modifier: c.type_modifier,
                is_key: c.is_key,
            })
            .collect(),
    )
}

pub(super) fn lsn_of(p: &w::Position) -> Lsn {
    Lsn((u128::from(p.lsn_high) << 64) | u128::from(p.lsn_low))
}

fn position_to_wit(p: Position) -> w::Position {
    w::Position {
        lsn_high: (p.lsn.0 >> 64) as u64,
        lsn_low: p.lsn.0 as u64,
        ordinal: p.ordinal,
    }
}

fn op_to_wit(op: Op) -> w::Op {
    match op {
        Op::Insert => w::Op::Insert,
        Op::Update => w::Op::Update,
        Op::Delete => w::Op::Delete,
        Op::Truncate => w::Op::Truncate,
    }
}

pub(super) fn op_from_wit(op: w::Op) -> Op {
    match op {
        w::Op::Insert => Op::Insert,
        w::Op::Update => Op::Update,
        w::Op::Delete => Op::Delete,
        w::Op::Truncate => Op::Truncate,
    }
}

fn value_to_wit(v: change::Value) -> w::Value {
    use change::Value as V;
    match v {
        V::Null => w::Value::Null,
        V::Bool(b) => w::Value::Boolean(b),
        V::Int2(i) => w::Value::Int2(i),
        V::Int4(i) => w::Value::Int4(i),
        V::Int8(i) => w::Value::Int8(i),
        V::Float4(f) => w::Value::Float4(f),
        V::Float8(f) => w::Value::Float8(f),
        V::Numeric(s) => w::Value::Numeric(s),
        V::Text(s) => w::Value::Text(s),
        V::Bytes(b) => w::Value::Bytes(b),
        V::Date(d) => w::Value::Date(d),
        V::Time(t) => w::Value::Time(t),
        V::Timestamp(t) => w::Value::Timestamp(t),
        V::TimestampTz(t) => w::Value::Timestamptz(t),
        V::Uuid(u) => {
            let n = u128::from_be_bytes(u);
            w::Value::Uuid(((n >> 64) as u64, n as u64))
        }
        V::Json(s) => w::Value::Json(s),
        V::Other { type_oid, text } => w::Value::Other(w::OtherValue { type_oid, text }),
        V::Unchanged => w::Value::Unchanged,
    }
}

pub(super) fn value_from_wit(v: w::Value) -> change::Value {
    use change::Value as V;
    match v {
        w::Value::Null => V::Null,
        w::Value::Boolean(b) => V::Bool(b),
        w::Value::Int2(i) => V::Int2(i),
        w::Value::Int4(i) => V::Int4(i),
        w::Value::Int8(i) => V::Int8(i),
        w::Value::Float4(f) => V::Float4(f),
        w::Value::Float8(f) => V::Float8(f),
        w::Value::Numeric(s) => V::Numeric(s),
        w::Value::Text(s) => V::Text(s),
        w::Value::Bytes(b) => V::Bytes(b),
        w::Value::Date(d) => V::Date(d),
        w::Value::Time(t) => V::Time(t),
        w::Value::Timestamp(t) => V::Timestamp(t),
        w::Value::Timestamptz(t) => V::TimestampTz(t),
        w::Value::Uuid((hi, lo)) => {
            V::Uuid(((u128::from(hi) << 64) | u128::from(lo)).to_be_bytes())
        }
        w::Value::Json(s) => V::Json(s),
        w::Value::Other(o) => V::Other {
            type_oid: o.type_oid,
            text: o.text,
        },
        w::Value::Unchanged => V::Unchanged,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::change::{Column, Table, Value};
    use crate::transform::output::{TableCache, check_output};

    pub(crate) fn users() -> Arc<Table> {
        Arc::new(Table::new(
            "public".into(),
            "users".into(),
            vec![
                Column {
                    name: "id".into(),
                    type_oid: 20,
                    type_modifier: -1,
                    is_key: true,
                },
                Column {
                    name: "email".into(),
                    type_oid: 25,
                    type_modifier: -1,
                    is_key: false,
                },
            ],
        ))
    }

    pub(crate) fn insert(table: &Arc<Table>, ordinal: u32, id: i64, email: &str) -> Change {
        Change {
            position: Position::new(Lsn(0x1_0000_0000_0000_0001), ordinal),
            op: Op::Insert,
            table: table.clone(),
            key: vec![Value::Int8(id)],
            old_key: None,
            values: vec![Value::Int8(id), Value::Text(email.into())],
        }
    }

    pub(crate) fn echo(input: &InputBatch) -> Output {
        Output {
            tables: input.wit.tables.clone(),
            changes: input.wit.changes.clone(),
            errors: Vec::new(),
        }
    }

    #[test]
    fn tables_are_listed_once_and_round_trip() {
        let t = users();
        let other = Arc::new(Table::new("s".into(), "o".into(), t.columns.clone()));
        let mut c = insert(&t, 3, 7, "a@b");
        c.values.push(Value::Uuid([7; 16]));
        c.values.pop();
        let changes = vec![
            insert(&t, 1, 1, "x"),
            insert(&other, 2, 2, "y"),
            c.clone(),
            insert(&t, 4, 9, "z"),
        ];
        let input = InputBatch::new(changes.clone());
        assert_eq!(input.wit.tables.len(), 2);
        assert_eq!(
            input
                .wit
                .changes
                .iter()
                .map(|c| c.table)
                .collect::<Vec<_>>(),
            [0, 1, 0, 0]
        );
        assert_eq!(input.wit.changes[0].position.lsn_high, 1);
        for (i, want) in changes.iter().enumerate() {
            assert_eq!(&input.change(i), want);
        }
        let mut cache = TableCache::default();
        let checked = check_output(echo(&input), &input, &mut cache, u64::MAX).unwrap();
        assert_eq!(checked.outputs.len(), 4);
        for ((i, out), want) in checked.outputs.iter().zip(&changes) {
            assert_eq!(out, want, "input {i}");
        }
        // The input's own Arc comes back, not a copy.
        assert!(Arc::ptr_eq(&checked.outputs[0].1.table, &t));
    }

    #[test]
    fn uuid_and_values_convert_both_ways() {
        let u: [u8; 16] = *b"0123456789abcdef";
        for v in [
            Value::Uuid(u),
            Value::Other {
                type_oid: 600,
                text: "(1,2)".into(),
            },
            Value::Unchanged,
            Value::TimestampTz(-5),
            Value::Float4(1.5),
        ] {
            assert_eq!(value_from_wit(value_to_wit(v.clone())), v);
        }
        let w::Value::Uuid((hi, _)) = value_to_wit(Value::Uuid(u)) else {
            panic!()
        };
        assert_eq!(hi.to_be_bytes(), u[..8]);
    }
}
