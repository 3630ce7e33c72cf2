//! One change of a batch, read and edited in place in the batch's flat lists.

use crate::Value;
use crate::bindings::zipline::transform::types as wit;
use wit::{Op, Span};

/// The output being built from one batch: the input's `values` list, edited in place, and the
/// new bytes new texts point at (counting on from the end of the input's `data`).
pub(crate) struct Out {
    pub(crate) input: Vec<u8>,
    pub(crate) base: usize,
    pub(crate) data: Vec<u8>,
    pub(crate) values: Vec<wit::Value>,
    pub(crate) tables: Vec<wit::Table>,
    pub(crate) changes: Vec<wit::Change>,
    pub(crate) errors: Vec<wit::ChangeError>,
}

impl Out {
    fn bytes(&self, s: Span) -> &[u8] {
        let (start, len) = (s.start as usize, s.len as usize);
        let found = if start >= self.base {
            self.data.get(start - self.base..start - self.base + len)
        } else {
            self.input.get(start..start + len)
        };
        found.unwrap_or_default()
    }

    fn text(&self, s: Span) -> &str {
        std::str::from_utf8(self.bytes(s)).unwrap_or_default()
    }

    fn append(&mut self, b: &[u8]) -> Span {
        let start = (self.base + self.data.len()) as u32;
        self.data.extend_from_slice(b);
        Span {
            start,
            len: b.len() as u32,
        }
    }

    /// The table `t` as the output lists it: an existing entry when one is equal.
    fn table(&mut self, t: wit::Table) -> u32 {
        match self.tables.iter().position(|x| *x == t) {
            Some(i) => i as u32,
            None => {
                self.tables.push(t);
                (self.tables.len() - 1) as u32
            }
        }
    }
}

/// A column of a change: by name (`"email"`) or by index in the table's columns (`1`).
pub trait Column {
    /// The column's index in `table`, if it has one.
    fn index(&self, table: &wit::Table) -> Option<usize>;
}

impl Column for &str {
    fn index(&self, table: &wit::Table) -> Option<usize> {
        table.columns.iter().position(|c| c.name == *self)
    }
}

impl Column for &String {
    fn index(&self, table: &wit::Table) -> Option<usize> {
        self.as_str().index(table)
    }
}

impl Column for usize {
    fn index(&self, table: &wit::Table) -> Option<usize> {
        (*self < table.columns.len()).then_some(*self)
    }
}

/// One change, as [`crate::Transform::change`] sees and edits it.
///
/// Getters read the row's new values (for a delete: its key columns). Setters write new
/// values; setting a key column sets the change's key too, so lanes and sinks find the row by
/// its new value. [`Change::map_str`] also rewrites the old key of an update that changed the
/// key, which a mask or hash of a key column needs.
pub struct Change<'b> {
    out: &'b mut Out,
    raw: wit::Change,
    dropped: bool,
}

impl<'b> Change<'b> {
    pub(crate) fn new(out: &'b mut Out, raw: wit::Change) -> Self {
        Change {
            out,
            raw,
            dropped: false,
        }
    }

    /// The change to output, unless it was dropped.
    pub(crate) fn finish(self) -> Option<wit::Change> {
        (!self.dropped).then_some(self.raw)
    }

    fn shape(&self) -> &wit::Table {
        &self.out.tables[self.raw.table as usize]
    }

    /// What the change does: insert, update, delete or truncate.
    pub fn op(&self) -> Op {
        self.raw.op
    }

    /// The table's schema.
    pub fn schema(&self) -> &str {
        &self.shape().schema
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.shape().name
    }

    /// Whether the change's table is `name`: `schema.table`, or a bare table name for any
    /// schema.
    pub fn is_table(&self, name: &str) -> bool {
        match name.split_once('.') {
            Some((schema, table)) => self.schema() == schema && self.table() == table,
            None => self.table() == name,
        }
    }

    /// Whether the table has `column`.
    pub fn has_column(&self, column: impl Column) -> bool {
        column.index(self.shape()).is_some()
    }

    /// The table's column names, in order.
    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.shape().columns.iter().map(|c| c.name.as_str())
    }

    /// Where column `i`'s value sits in `values`: the row, or for a delete the key.
    fn slot(&self, i: usize) -> Option<usize> {
        if i < self.raw.values.len as usize {
            return Some(self.raw.values.start as usize + i);
        }
        let t = self.shape();
        if !t.columns.get(i)?.is_key {
            return None;
        }
        let k = t.columns[..i].iter().filter(|c| c.is_key).count();
        (k < self.raw.key.len as usize).then_some(self.raw.key.start as usize + k)
    }

    /// The value of `column`; `None` when there is no such column or the change has no value
    /// for it (a delete's non-key column, a truncate).
    pub fn get(&self, column: impl Column) -> Option<Value<'_>> {
        let i = column.index(self.shape())?;
        let v = self.out.values[self.slot(i)?];
        let text = |s: Span| self.out.text(s);
        Some(match v {
            wit::Value::Null => Value::Null,
            wit::Value::Boolean(b) => Value::Bool(b),
            wit::Value::Int2(i) => Value::Int(i.into()),
            wit::Value::Int4(i) => Value::Int(i.into()),
            wit::Value::Int8(i) => Value::Int(i),
            wit::Value::Float4(f) => Value::Float(f.into()),
            wit::Value::Float8(f) => Value::Float(f),
            wit::Value::Numeric(s) => Value::Numeric(text(s)),
            wit::Value::Text(s) => Value::Text(text(s)),
            wit::Value::Bytes(s) => Value::Bytes(self.out.bytes(s)),
            wit::Value::Date(d) => Value::Date(d),
            wit::Value::Time(t) => Value::Time(t),
            wit::Value::Timestamp(t) => Value::Timestamp(t),
            wit::Value::Timestamptz(t) => Value::TimestampTz(t),
            wit::Value::Uuid((hi, lo)) => Value::Uuid((u128::from(hi) << 64) | u128::from(lo)),
            wit::Value::Json(s) => Value::Json(text(s)),
            wit::Value::Other(o) => Value::Other(o.type_oid, text(o.text)),
            wit::Value::Unchanged => Value::Unchanged,
        })
    }

    /// The text of a text, numeric, json or other-typed column.
    pub fn get_str(&self, column: impl Column) -> Option<&str> {
        self.get(column)?.as_str()
    }

    /// An integer column of any width.
    pub fn get_i64(&self, column: impl Column) -> Option<i64> {
        self.get(column)?.as_i64()
    }

    /// A float column (or an integer one, converted).
    pub fn get_f64(&self, column: impl Column) -> Option<f64> {
        self.get(column)?.as_f64()
    }

    /// A boolean column.
    pub fn get_bool(&self, column: impl Column) -> Option<bool> {
        self.get(column)?.as_bool()
    }

    /// Whether `column` is SQL NULL.
    pub fn is_null(&self, column: impl Column) -> bool {
        self.get(column).is_some_and(|v| v.is_null())
    }

    fn index_of(&self, column: impl Column) -> Result<usize, String> {
        column.index(self.shape()).ok_or_else(|| {
            format!(
                "{}.{} has no such column (it has {})",
                self.schema(),
                self.table(),
                self.columns().collect::<Vec<_>>().join(", ")
            )
        })
    }

    /// The key position of column `i`, if it is a key column.
    fn key_position(&self, i: usize) -> Option<usize> {
        let cols = &self.shape().columns;
        cols[i]
            .is_key
            .then(|| cols[..i].iter().filter(|c| c.is_key).count())
    }

    /// The WIT form of `v` for column `i`: integers at the column's width, texts in the
    /// kind the column had.
    fn lower(&mut self, i: usize, v: Value<'_>) -> Result<wit::Value, String> {
        let current = self.slot(i).map(|s| self.out.values[s]);
        let oid = self.shape().columns[i].type_oid;
        let narrow = |what: &str| {
            format!(
                "{what} does not fit column {}",
                self.shape().columns[i].name
            )
        };
        Ok(match v {
            Value::Null => wit::Value::Null,
            Value::Bool(b) => wit::Value::Boolean(b),
            Value::Int(n) => match oid {
                21 => wit::Value::Int2(n.try_into().map_err(|_| narrow(&n.to_string()))?),
                23 => wit::Value::Int4(n.try_into().map_err(|_| narrow(&n.to_string()))?),
                _ => wit::Value::Int8(n),
            },
            Value::Float(f) if oid == 700 => wit::Value::Float4(f as f32),
            Value::Float(f) => wit::Value::Float8(f),
            Value::Numeric(s) => wit::Value::Numeric(self.out.append(s.as_bytes())),
            Value::Text(s) => {
                let span = self.out.append(s.as_bytes());
                match current {
                    Some(wit::Value::Json(_)) => wit::Value::Json(span),
                    Some(wit::Value::Numeric(_)) => wit::Value::Numeric(span),
                    Some(wit::Value::Other(o)) => wit::Value::Other(wit::OtherValue {
                        type_oid: o.type_oid,
                        text: span,
                    }),
                    _ => wit::Value::Text(span),
                }
            }
            Value::Bytes(b) => wit::Value::Bytes(self.out.append(b)),
            Value::Date(d) => wit::Value::Date(d),
            Value::Time(t) => wit::Value::Time(t),
            Value::Timestamp(t) => wit::Value::Timestamp(t),
            Value::TimestampTz(t) => wit::Value::Timestamptz(t),
            Value::Uuid(u) => wit::Value::Uuid(((u >> 64) as u64, u as u64)),
            Value::Json(s) => wit::Value::Json(self.out.append(s.as_bytes())),
            Value::Other(type_oid, s) => wit::Value::Other(wit::OtherValue {
                type_oid,
                text: self.out.append(s.as_bytes()),
            }),
            Value::Unchanged => wit::Value::Unchanged,
        })
    }

    /// Sets `column` to `value`; a key column's key value follows. `Err` names a column the
    /// table does not have, or an integer too wide for it.
    pub fn set<'v>(
        &mut self,
        column: impl Column,
        value: impl Into<Value<'v>>,
    ) -> Result<(), String> {
        let i = self.index_of(column)?;
        let w = self.lower(i, value.into())?;
        if let Some(s) =
            (i < self.raw.values.len as usize).then(|| self.raw.values.start as usize + i)
        {
            self.out.values[s] = w;
        }
        if let Some(k) = self.key_position(i)
            && k < self.raw.key.len as usize
        {
            self.out.values[self.raw.key.start as usize + k] = w;
        }
        Ok(())
    }

    /// Sets a text column.
    pub fn set_str(&mut self, column: impl Column, value: &str) -> Result<(), String> {
        self.set(column, Value::Text(value))
    }

    /// Sets an integer column (written at the column's width).
    pub fn set_i64(&mut self, column: impl Column, value: i64) -> Result<(), String> {
        self.set(column, Value::Int(value))
    }

    /// Sets `column` to SQL NULL.
    pub fn set_null(&mut self, column: impl Column) -> Result<(), String> {
        self.set(column, Value::Null)
    }

    /// Replaces the text of `column` with `f(text)` everywhere the change holds it: the row,
    /// the key and, for an update that changed its key, the old key. A deterministic `f` (a
    /// mask, a hash) keeps every row findable by its transformed key. NULL, unchanged and
    /// non-text values are left alone.
    pub fn map_str(
        &mut self,
        column: impl Column,
        f: impl Fn(&str) -> String,
    ) -> Result<(), String> {
        let i = self.index_of(column)?;
        let mut slots = Vec::with_capacity(3);
        if i < self.raw.values.len as usize {
            slots.push(self.raw.values.start as usize + i);
        }
        if let Some(k) = self.key_position(i) {
            for span in [Some(self.raw.key), self.raw.old_key].into_iter().flatten() {
                if k < span.len as usize {
                    slots.push(span.start as usize + k);
                }
            }
        }
        for s in slots {
            let (span, rebuild): (Span, fn(Span, wit::Value) -> wit::Value) =
                match self.out.values[s] {
                    wit::Value::Text(sp) => (sp, |n, _| wit::Value::Text(n)),
                    wit::Value::Json(sp) => (sp, |n, _| wit::Value::Json(n)),
                    wit::Value::Numeric(sp) => (sp, |n, _| wit::Value::Numeric(n)),
                    wit::Value::Other(o) => (o.text, |n, v| match v {
                        wit::Value::Other(o) => wit::Value::Other(wit::OtherValue {
                            type_oid: o.type_oid,
                            text: n,
                        }),
                        _ => v,
                    }),
                    _ => continue,
                };
            let new = f(self.out.text(span));
            let span = self.out.append(new.as_bytes());
            self.out.values[s] = rebuild(span, self.out.values[s]);
        }
        Ok(())
    }

    /// Drops this change: nothing of it reaches the sinks (changes it emitted still do).
    // The name every SDK uses; a `Change` is never dropped by `Drop`, so no confusion arises.
    #[allow(clippy::should_implement_trait)]
    pub fn drop(&mut self) {
        self.dropped = true;
    }

    /// Undoes [`Change::drop`].
    pub fn keep(&mut self) {
        self.dropped = false;
    }

    /// Whether the change is dropped.
    pub fn is_dropped(&self) -> bool {
        self.dropped
    }

    /// Gives the change another table shape, made by `edit` from the current one.
    fn reshape(&mut self, edit: impl FnOnce(&mut wit::Table)) {
        let mut t = self.shape().clone();
        edit(&mut t);
        self.raw.table = self.out.table(t);
    }

    /// Moves the change to table `schema.name` (same columns).
    pub fn rename_table(&mut self, schema: &str, name: &str) {
        self.reshape(|t| {
            t.schema = schema.to_owned();
            t.name = name.to_owned();
        });
    }

    /// Renames `column` to `new_name`.
    pub fn rename_column(&mut self, column: impl Column, new_name: &str) -> Result<(), String> {
        let i = self.index_of(column)?;
        self.reshape(|t| t.columns[i].name = new_name.to_owned());
        Ok(())
    }

    /// Removes `column` from the change (and its table). A key column cannot be dropped.
    pub fn drop_column(&mut self, column: impl Column) -> Result<(), String> {
        let i = self.index_of(column)?;
        if self.shape().columns[i].is_key {
            return Err(format!(
                "cannot drop key column {} of {}.{}",
                self.shape().columns[i].name,
                self.schema(),
                self.table()
            ));
        }
        let v = self.raw.values;
        if i < v.len as usize {
            let start = v.start as usize;
            self.out.values[start + i..start + v.len as usize].rotate_left(1);
            self.raw.values.len -= 1;
        }
        self.reshape(|t| {
            t.columns.remove(i);
        });
        Ok(())
    }

    /// Emits a copy of this change (same op, position, key and values) into table
    /// `schema.name` of the same columns, after this change.
    pub fn emit_copy(&mut self, schema: &str, name: &str) {
        let mut t = self.shape().clone();
        t.schema = schema.to_owned();
        t.name = name.to_owned();
        let mut copy = self.raw;
        copy.table = self.out.table(t);
        self.out.changes.push(copy);
    }

    /// Emits a new change of `op` into `table` with the row `values` (one per column; for a
    /// delete, the key columns' are used). Its key is taken from the key columns.
    pub fn emit(&mut self, op: Op, table: wit::Table, values: &[Value<'_>]) -> Result<(), String> {
        if values.len() != table.columns.len() {
            return Err(format!(
                "emit into {}.{}: {} values for {} columns",
                table.schema,
                table.name,
                values.len(),
                table.columns.len()
            ));
        }
        let key_cols: Vec<usize> = (0..table.columns.len())
            .filter(|&i| table.columns[i].is_key)
            .collect();
        let index = self.out.table(table);
        let saved = (self.raw, self.dropped);
        // Lower through a change of the new table, so widths and kinds follow its columns.
        let row_start = self.out.values.len() as u32;
        self.raw.table = index;
        self.raw.values = Span {
            start: row_start,
            len: 0,
        };
        self.raw.key = Span { start: 0, len: 0 };
        let mut row = Vec::with_capacity(values.len());
        for (i, v) in values.iter().enumerate() {
            row.push(self.lower(i, *v)?);
        }
        let key: Vec<wit::Value> = key_cols.iter().map(|&i| row[i]).collect();
        self.raw = saved.0;
        self.dropped = saved.1;
        let with_row = matches!(op, Op::Insert | Op::Update);
        let row_span = Span {
            start: row_start,
            len: if with_row { row.len() as u32 } else { 0 },
        };
        if with_row {
            self.out.values.extend(row);
        }
        let key_span = Span {
            start: self.out.values.len() as u32,
            len: if op == Op::Truncate {
                0
            } else {
                key.len() as u32
            },
        };
        if op != Op::Truncate {
            self.out.values.extend(key);
        }
        self.out.changes.push(wit::Change {
            table: index,
            op,
            position: self.raw.position,
            key: key_span,
            old_key: None,
            values: row_span,
        });
        Ok(())
    }

    /// Keeps only rows for which `keep` holds, correctly across updates: an insert that fails
    /// is dropped; an update that fails becomes a delete of its (old) key, since the row may
    /// have matched before; an update that holds goes on as an update, which the sinks apply
    /// as an upsert of the whole new row, since the row may not have matched before. Deletes
    /// and truncates pass (deleting a row the sink never had does nothing). So the sink table
    /// equals `SELECT … WHERE keep` on the source, provided `keep` reads only the row's own
    /// values and the table sends whole rows (see README.md on REPLICA IDENTITY FULL).
    pub fn filter(&mut self, keep: impl FnOnce(&Change<'_>) -> bool) {
        match self.raw.op {
            Op::Insert => {
                if !keep(self) {
                    self.dropped = true;
                }
            }
            Op::Update => {
                if !keep(self) {
                    self.raw.op = Op::Delete;
                    self.raw.key = self.raw.old_key.take().unwrap_or(self.raw.key);
                    self.raw.values.len = 0;
                }
            }
            Op::Delete | Op::Truncate => {}
        }
    }
}
