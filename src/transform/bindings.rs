//! The WIT contract (`wit/transform.wit`) as Rust types, and the conversions between Zipline's
//! [`Change`] and the component's `batch`/`output`.
//!
//! Input: each distinct table of a batch (by `Arc` identity, which is how the source shares
//! one shape among all changes of a table) is listed once in `batch.tables`; changes refer to
//! it by index. Every value goes into the one flat `batch.values` list and every string or
//! byte string into the one `batch.data` buffer, so a call crosses the canonical ABI with four
//! allocations in the guest however many changes and strings the batch holds. The converted
//! batch keeps the only copy of the values: [`InputBatch::change`] rebuilds an original change
//! from it when a failure must name or dead-letter one.
//!
//! Outputs are checked and converted back in [`super::output`].

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;

use crate::change::{self, Change, CompactString, Key, Lsn, Op, Position};

/// What `bindgen!` makes of `wit/`; [`super::abi`] says how `limits.output` is kept.
pub(super) mod generated {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "transform",
        additional_derives: [PartialEq],
    });
}

use super::abi as w;
pub(super) use super::abi::{Batch, Output};
pub(crate) use generated::zipline::transform::host::Level;
pub(super) use generated::{Transform, TransformPre, zipline::transform::host::Host};

/// A batch in WIT form plus what is needed to map outputs back to inputs.
pub(crate) struct InputBatch {
    /// Shared with the call that lowers it (a typed function's parameter must own or `'static`-
    /// borrow it); read afterwards to resolve the output.
    pub(crate) wit: Arc<Batch>,
    /// `wit.tables[i]` came from `tables[i]`.
    pub(crate) tables: Vec<Arc<change::Table>>,
    /// Input positions, strictly increasing (the source's order).
    pub(super) positions: Vec<Position>,
    /// The input's own string and byte buffers, for outputs to take back.
    pub(super) buffers: Buffers,
    /// The input changes' emptied value lists (rows, keys), for outputs to fill again.
    pub(super) spare: Spare,
}

/// Emptied value lists of the input changes. An output change needs a row (and a key longer
/// than [`Key`] holds inline) just like the input it came from; refilling the input's saves
/// their allocations and frees.
#[derive(Default)]
pub(super) struct Spare {
    rows: RefCell<Vec<Vec<change::Value>>>,
    keys: RefCell<Vec<Key>>,
}

impl Spare {
    /// An empty row for `n` values: a spare one when one is left.
    pub(super) fn row(&self, n: usize) -> Vec<change::Value> {
        let mut v = self.rows.borrow_mut().pop().unwrap_or_default();
        v.reserve(n);
        v
    }

    /// An empty key for `n` values: a spare one when one is left.
    pub(super) fn key(&self, n: usize) -> Key {
        let mut v = self.keys.borrow_mut().pop().unwrap_or_default();
        v.reserve(n);
        v
    }
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
        let width = changes.first().map_or(0, |c| c.key.len() + c.values.len());
        let mut values = Values {
            values: Vec::with_capacity(changes.len() * width),
            // About what an 8-column row of short strings needs, so the buffer rarely regrows.
            data: Vec::with_capacity(changes.len() * width * 24),
            buffers: Buffers::default(),
            spare: Spare::default(),
        };
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
            let key = values.push_key(c.key);
            let old_key = c.old_key.map(|k| values.push_key(*k));
            let row = values.push_row(c.values);
            wit_changes.push(w::Change {
                table: t,
                op: op_to_wit(c.op),
                position: position_to_wit(c.position),
                key,
                old_key,
                values: row,
            });
        }
        InputBatch {
            wit: Arc::new(Batch {
                tables: wit_tables,
                data: values.data,
                values: values.values,
                changes: wit_changes,
            }),
            tables,
            positions,
            buffers: values.buffers,
            spare: values.spare,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.positions.len()
    }

    /// The original input change `i`, rebuilt from its WIT form.
    pub(crate) fn change(&self, i: usize) -> Change {
        let c = &self.wit.changes[i];
        let data = Data {
            input: &self.wit.data,
            output: &[],
            buffers: None,
        };
        let values = |s: w::Span| -> Vec<change::Value> {
            let mut out = Vec::new();
            data.resolve(
                &self.wit.values[s.start as usize..(s.start + s.len) as usize],
                &mut out,
            )
            .unwrap_or_else(|e| unreachable!("the host's own input: {e}"));
            out
        };
        Change {
            position: self.positions[i],
            op: op_from_wit(c.op),
            table: self.tables[c.table as usize].clone(),
            key: values(c.key).into(),
            old_key: c.old_key.map(|k| Box::new(values(k).into())),
            values: values(c.values),
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

/// The flat `values` list and `data` buffer of a batch being built.
struct Values {
    values: Vec<w::Value>,
    data: Vec<u8>,
    buffers: Buffers,
    spare: Spare,
}

/// The input's string and byte buffers, by where their copies sit in `data`. An output value
/// that passes through (same span) takes its buffer back instead of allocating a new one:
/// most values pass through, and a heap allocation per string was the host's largest cost
/// after the ABI copies themselves.
#[derive(Default)]
pub(super) struct Buffers {
    /// Data offset of each non-empty buffer, strictly increasing (spans are laid out in order).
    starts: Vec<u32>,
    /// The buffer at `starts[i]`, until an output takes it. A `RefCell` because outputs are
    /// resolved through `&InputBatch`; one thread owns a batch.
    held: RefCell<Vec<Option<Buffer>>>,
    /// Where the next lookup starts.
    next: Cell<usize>,
}

/// An input buffer as it came: a `String` goes back as one without being validated again.
enum Buffer {
    Text(CompactString),
    Bytes(Vec<u8>),
}

impl Buffer {
    fn len(&self) -> usize {
        match self {
            Buffer::Text(s) => s.len(),
            Buffer::Bytes(b) => b.len(),
        }
    }
}

impl Buffers {
    fn take(&self, s: w::Span) -> Option<Buffer> {
        // Outputs mostly come in input order: try the entry after the last one taken first.
        let next = self.next.get();
        let i = if self.starts.get(next) == Some(&s.start) {
            next
        } else {
            self.starts.binary_search(&s.start).ok()?
        };
        self.next.set(i + 1);
        let mut held = self.held.borrow_mut();
        match &held[i] {
            Some(b) if b.len() == s.len as usize => held[i].take(),
            _ => None,
        }
    }
}

impl Values {
    fn push_row(&mut self, mut vs: Vec<change::Value>) -> w::Span {
        let span = self.push_all(vs.drain(..));
        if vs.capacity() > 0 {
            self.spare.rows.get_mut().push(vs);
        }
        span
    }

    fn push_key(&mut self, mut vs: Key) -> w::Span {
        let span = self.push_all(vs.drain(..));
        if vs.spilled() {
            self.spare.keys.get_mut().push(vs);
        }
        span
    }

    fn push_all(&mut self, vs: impl Iterator<Item = change::Value>) -> w::Span {
        let start = self.values.len() as u32;
        for v in vs {
            let wv = self.lay_out(v);
            self.values.push(wv);
        }
        w::Span {
            start,
            len: self.values.len() as u32 - start,
        }
    }

    /// Copies `b` into `data`, keeping `b` itself for an output to take back.
    // Inlined for the same reason as `Data::value`: a span returned in two registers was
    // stored in halves and reloaded as one word.
    #[inline(always)]
    fn keep(&mut self, b: Buffer) -> w::Span {
        let start = self.data.len() as u32;
        self.data.extend_from_slice(match &b {
            Buffer::Text(s) => s.as_bytes(),
            Buffer::Bytes(b) => b,
        });
        let len = b.len() as u32;
        if len > 0 {
            self.buffers.starts.push(start);
            self.buffers.held.get_mut().push(Some(b));
        }
        w::Span { start, len }
    }

    fn text(&mut self, s: CompactString) -> w::Span {
        self.keep(Buffer::Text(s))
    }

    /// `v` in WIT form, its string or bytes moved to the buffers and copied into `data`.
    fn lay_out(&mut self, v: change::Value) -> w::Value {
        use change::Value as V;
        match v {
            V::Null => w::Value::Null,
            V::Bool(b) => w::Value::Boolean(b),
            V::Int2(i) => w::Value::Int2(i),
            V::Int4(i) => w::Value::Int4(i),
            V::Int8(i) => w::Value::Int8(i),
            V::Float4(f) => w::Value::Float4(f),
            V::Float8(f) => w::Value::Float8(f),
            V::Numeric(s) => w::Value::Numeric(self.text(s)),
            V::Text(s) => w::Value::Text(self.text(s)),
            V::Bytes(b) => w::Value::Bytes(self.keep(Buffer::Bytes(b))),
            V::Date(d) => w::Value::Date(d),
            V::Time(t) => w::Value::Time(t),
            V::Timestamp(t) => w::Value::Timestamp(t),
            V::TimestampTz(t) => w::Value::Timestamptz(t),
            V::Uuid(u) => {
                let n = u128::from_be_bytes(u);
                w::Value::Uuid(((n >> 64) as u64, n as u64))
            }
            V::Json(s) => w::Value::Json(self.text(s)),
            V::Other { type_oid, text } => w::Value::Other(w::OtherValue {
                type_oid,
                text: self.text(text),
            }),
            V::Unchanged => w::Value::Unchanged,
        }
    }
}

/// What an output's data spans address: the input's `data`, then the output's own.
#[derive(Clone, Copy)]
pub(super) struct Data<'a> {
    pub(super) input: &'a [u8],
    pub(super) output: &'a [u8],
    /// The input's buffers, when outputs may take them.
    pub(super) buffers: Option<&'a Buffers>,
}

impl<'a> Data<'a> {
    pub(super) fn bytes(&self, s: w::Span) -> Result<&'a [u8], String> {
        let (start, len) = (s.start as usize, s.len as usize);
        let n = self.input.len();
        let found = if start + len <= n {
            self.input.get(start..start + len)
        } else if start >= n {
            self.output.get(start - n..start - n + len)
        } else {
            return Err(format!(
                "data span {start}+{len} straddles the input's data (which ends at {n}) and the output's"
            ));
        };
        found.ok_or_else(|| {
            format!(
                "data span {start}+{len} is out of range (input data {n} bytes, output data {} bytes)",
                self.output.len()
            )
        })
    }

    #[inline(always)]
    fn text(&self, s: w::Span) -> Result<CompactString, String> {
        let not_utf8 = |e: std::str::Utf8Error| {
            format!("data span {}+{} is not UTF-8 text: {e}", s.start, s.len)
        };
        match self.buffers.and_then(|b| b.take(s)) {
            Some(Buffer::Text(s)) => Ok(s),
            // A guest may point a text value at what was a bytea.
            // Through `String`, so a long value keeps its buffer instead of being copied.
            Some(Buffer::Bytes(b)) => String::from_utf8(b)
                .map(CompactString::from)
                .map_err(|e| not_utf8(e.utf8_error())),
            None => CompactString::from_utf8(self.bytes(s)?).map_err(not_utf8),
        }
    }

    #[inline(always)]
    fn byte_string(&self, s: w::Span) -> Result<Vec<u8>, String> {
        match self.buffers.and_then(|b| b.take(s)) {
            Some(Buffer::Text(s)) => Ok(s.into_string().into_bytes()),
            Some(Buffer::Bytes(b)) => Ok(b),
            None => Ok(self.bytes(s)?.to_vec()),
        }
    }

    /// Appends the values `vs`, their spans resolved, to `out` (a row or a key, which the
    /// caller has sized).
    pub(super) fn resolve(
        &self,
        vs: &[w::Value],
        out: &mut impl Extend<change::Value>,
    ) -> Result<(), String> {
        for v in vs {
            out.extend(std::iter::once(self.value(*v)?));
        }
        Ok(())
    }

    /// The value `v`, its spans resolved. Inlined into [`Data::resolve`]'s loop: returned
    /// through memory, the `Result` was stored in pieces and reloaded whole, a stall per value.
    #[inline(always)]
    fn value(&self, v: w::Value) -> Result<change::Value, String> {
        use change::Value as V;
        Ok(match v {
            w::Value::Null => V::Null,
            w::Value::Boolean(b) => V::Bool(b),
            w::Value::Int2(i) => V::Int2(i),
            w::Value::Int4(i) => V::Int4(i),
            w::Value::Int8(i) => V::Int8(i),
            w::Value::Float4(f) => V::Float4(f),
            w::Value::Float8(f) => V::Float8(f),
            w::Value::Numeric(s) => V::Numeric(self.text(s)?),
            w::Value::Text(s) => V::Text(self.text(s)?),
            w::Value::Bytes(s) => V::Bytes(self.byte_string(s)?),
            w::Value::Date(d) => V::Date(d),
            w::Value::Time(t) => V::Time(t),
            w::Value::Timestamp(t) => V::Timestamp(t),
            w::Value::Timestamptz(t) => V::TimestampTz(t),
            w::Value::Uuid((hi, lo)) => {
                V::Uuid(((u128::from(hi) << 64) | u128::from(lo)).to_be_bytes())
            }
            w::Value::Json(s) => V::Json(self.text(s)?),
            w::Value::Other(o) => V::Other {
                type_oid: o.type_oid,
                text: self.text(o.text)?,
            },
            w::Value::Unchanged => V::Unchanged,
        })
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
            key: vec![Value::Int8(id)].into(),
            old_key: None,
            values: vec![Value::Int8(id), Value::Text(email.into())],
        }
    }

    pub(crate) fn echo(input: &InputBatch) -> Output {
        Output {
            tables: input.wit.tables.clone(),
            data: Vec::new(),
            values: input.wit.values.clone(),
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
    fn values_convert_both_ways_through_one_data_buffer() {
        let u: [u8; 16] = *b"0123456789abcdef";
        let zoo = vec![
            Value::Uuid(u),
            Value::Other {
                type_oid: 600,
                text: "(1,2)".into(),
            },
            Value::Unchanged,
            Value::TimestampTz(-5),
            Value::Float4(1.5),
            Value::Text("añb".into()),
            Value::Bytes(vec![0, 255]),
            Value::Numeric("-1.50".into()),
            Value::Json("{}".into()),
        ];
        let t = users();
        let mut c = insert(&t, 1, 1, "e");
        c.op = Op::Update;
        c.old_key = Some(Box::new(vec![Value::Int8(0)].into()));
        c.values = zoo.clone();
        let input = InputBatch::new(vec![c.clone()]);
        assert_eq!(input.change(0), c);
        let wc = &input.wit.changes[0];
        assert_eq!((wc.key.start, wc.key.len), (0, 1));
        assert_eq!(wc.old_key.map(|s| (s.start, s.len)), Some((1, 1)));
        assert_eq!((wc.values.start, wc.values.len), (2, zoo.len() as u32));
        let w::Value::Uuid((hi, _)) = input.wit.values[2] else {
            panic!("{:?}", input.wit.values[2])
        };
        assert_eq!(hi.to_be_bytes(), u[..8]);
        // Every string and byte string sits back to back in the one buffer.
        assert_eq!(input.wit.data, b"(1,2)a\xc3\xb1b\x00\xff-1.50{}");
    }
}
