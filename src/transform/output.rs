//! Checking a component's `output` and turning it back into [`Change`]s.
//!
//! Every change is checked before it can reach a lane (table index in range, value and data
//! spans in range and text spans UTF-8, as many values as columns, as many key values as key
//! columns, a position some input had, `unchanged` only in updates), what its values come to
//! once resolved counted against the output limit (many values may point at the same bytes,
//! and each gets its own copy; what was copied out of the guest was counted before lifting,
//! in [`super::lift`]), and output tables are turned back into
//! `Arc<Table>`s — the input's own `Arc` when the guest returned the shape as is, or one shared
//! `Arc` per distinct new shape (cached across batches), so lanes and sinks keep seeing one
//! table object per shape. Outputs are put back in input order (stably: a guest's order among
//! the outputs of one input is kept) and numbered apart with `Position::sub`.

use std::collections::HashMap;
use std::sync::Arc;

use super::abi as w;
use super::bindings::{Data, InputBatch, Output, lsn_of, op_from_wit, table_from_wit};
use crate::change::{self, Change, Key, Op, Position};
/// The outcome of one successful call, checked.
#[derive(Debug, Default)]
pub(crate) struct Checked {
    /// `(input index, change)` in input order; positions carry `sub` 0, 1, 2… per input.
    pub(crate) outputs: Vec<(usize, Change)>,
    /// Per-change errors the guest reported: `(input index, message)`.
    pub(crate) errors: Vec<(usize, String)>,
}

/// Shapes of output tables the guest made up, shared across batches.
#[derive(Debug, Default)]
pub(crate) struct TableCache {
    shapes: HashMap<String, Arc<change::Table>>,
}

impl TableCache {
    fn get(&mut self, t: &w::Table) -> Arc<change::Table> {
        let mut fp = String::with_capacity(64);
        for s in [&t.schema, &t.name] {
            fp.push_str(s);
            fp.push('\0');
        }
        for c in &t.columns {
            fp.push_str(&format!(
                "{}\0{}\0{}\0{}\0",
                c.name, c.type_oid, c.type_modifier, c.is_key
            ));
        }
        if self.shapes.len() > 4096 {
            // A guest inventing shapes without end must not grow the host without end.
            self.shapes.clear();
        }
        self.shapes
            .entry(fp)
            .or_insert_with(|| Arc::new(table_from_wit(t)))
            .clone()
    }
}

/// Checks `out` against `input` and converts it. `Err` names the first problem.
pub(crate) fn check_output(
    out: Output,
    input: &InputBatch,
    cache: &mut TableCache,
    max_bytes: u64,
) -> Result<Checked, String> {
    let tables: Vec<Arc<change::Table>> = out
        .tables
        .iter()
        .enumerate()
        .map(|(j, t)| {
            // Usually the guest returns the input's tables as they were, in their order.
            if input.wit.tables.get(j) == Some(t) {
                return input.tables[j].clone();
            }
            match input.wit.tables.iter().position(|i| i == t) {
                Some(k) => input.tables[k].clone(),
                None => cache.get(t),
            }
        })
        .collect();
    let mut errors = Vec::with_capacity(out.errors.len());
    for e in out.errors {
        let i = e.index as usize;
        if i >= input.len() {
            return Err(format!(
                "an error refers to input change #{i}, but the batch has {} changes",
                input.len()
            ));
        }
        errors.push((i, e.message));
    }
    let data = Data {
        input: &input.wit.data,
        output: &out.data,
        buffers: Some(&input.buffers),
    };
    let mut bytes = 0u64;
    let mut outputs = Vec::with_capacity(out.changes.len());
    for (n, c) in out.changes.iter().enumerate() {
        let what = || format!("output change #{n}");
        let Some(table) = tables.get(c.table as usize) else {
            return Err(format!(
                "{}: table #{} does not exist (the output lists {} tables)",
                what(),
                c.table,
                tables.len()
            ));
        };
        let input_index = input.input_of(&c.position).ok_or_else(|| {
            format!(
                "{}: position {} is not the position of any input change",
                what(),
                Position::new(lsn_of(&c.position), c.position.ordinal)
            )
        })?;
        let op = op_from_wit(c.op);
        let blame = |m: String| format!("{} ({}): {m}", what(), table.qualified_name());
        let spans = Spans::of(&out.values, c).map_err(blame)?;
        check_shape(table, op, &spans).map_err(blame)?;
        check_key(table, op, &spans, &data).map_err(blame)?;
        bytes += 64 + spans.size();
        if bytes > max_bytes {
            return Err(format!(
                "output exceeds the limit of {max_bytes} bytes (limits.output): its changes' \
                 values come to more than that once resolved, at output change #{n}"
            ));
        }
        let resolve = |vs: &[w::Value]| -> Result<Vec<change::Value>, String> {
            let mut out = input.spare.row(vs.len());
            data.resolve(vs, &mut out)?;
            Ok(out)
        };
        let resolve_key = |vs: &[w::Value]| -> Result<Key, String> {
            let mut out = input.spare.key(vs.len());
            data.resolve(vs, &mut out)?;
            Ok(out)
        };
        let values = match op {
            // The contract says a delete's values are empty; tolerate a guest that sends them.
            Op::Delete | Op::Truncate => Vec::new(),
            _ => resolve(spans.values).map_err(blame)?,
        };
        outputs.push((
            input_index,
            Change {
                position: input.positions[input_index],
                op,
                table: table.clone(),
                key: resolve_key(spans.key).map_err(blame)?,
                old_key: spans
                    .old_key
                    .map(|k| resolve_key(k).map(Box::new))
                    .transpose()
                    .map_err(blame)?,
                values,
            },
        ));
    }
    if !errors.is_empty() {
        // A refused change is refused whole: whatever the guest also emitted for it is dropped.
        outputs.retain(|(i, _)| !errors.iter().any(|(e, _)| e == i));
    }
    if !outputs.is_sorted_by_key(|(i, _)| *i) {
        // Stable: the guest's order among outputs of one input is kept.
        outputs.sort_by_key(|(i, _)| *i);
    }
    let mut prev = usize::MAX;
    let mut sub = 0u32;
    for (i, c) in &mut outputs {
        sub = if *i == prev { sub + 1 } else { 0 };
        prev = *i;
        c.position.sub = sub;
    }
    Ok(Checked { outputs, errors })
}

/// One output change's value spans, resolved against the output's `values`.
struct Spans<'a> {
    key: &'a [w::Value],
    old_key: Option<&'a [w::Value]>,
    values: &'a [w::Value],
}

impl<'a> Spans<'a> {
    fn of(values: &'a [w::Value], c: &w::Change) -> Result<Self, String> {
        let get = |what: &str, s: &w::Span| {
            let (start, len) = (s.start as usize, s.len as usize);
            values.get(start..start + len).ok_or_else(|| {
                format!(
                    "{what} span {start}+{len} is out of range (the output has {} values)",
                    values.len()
                )
            })
        };
        Ok(Spans {
            key: get("key", &c.key)?,
            old_key: c.old_key.as_ref().map(|s| get("old-key", s)).transpose()?,
            values: get("values", &c.values)?,
        })
    }

    /// What the change costs against `limits.output`: a fixed part per value plus its bytes.
    fn size(&self) -> u64 {
        let all = self
            .key
            .iter()
            .chain(self.values)
            .chain(self.old_key.unwrap_or(&[]));
        all.map(|v| 16 + data_len(*v)).sum()
    }
}

/// The bytes `v` refers to in `data` (its span's length; checked when it is resolved).
fn data_len(v: w::Value) -> u64 {
    match v {
        w::Value::Numeric(s) | w::Value::Text(s) | w::Value::Bytes(s) | w::Value::Json(s) => {
            u64::from(s.len)
        }
        w::Value::Other(o) => u64::from(o.text.len),
        _ => 0,
    }
}

fn check_shape(table: &change::Table, op: Op, c: &Spans<'_>) -> Result<(), String> {
    let keys = table.key.len();
    if op == Op::Truncate {
        return if c.key.is_empty() {
            Ok(())
        } else {
            Err("a truncate must have an empty key".to_owned())
        };
    }
    if c.key.len() != keys {
        return Err(format!("{} key values for {keys} key columns", c.key.len()));
    }
    if let Some(old) = &c.old_key {
        if op != Op::Update {
            return Err(format!(
                "old-key is only allowed on updates, found a {}",
                op.as_str()
            ));
        }
        if old.len() != keys {
            return Err(format!(
                "{} old-key values for {keys} key columns",
                old.len()
            ));
        }
    }
    if matches!(op, Op::Insert | Op::Update) && c.values.len() != table.columns.len() {
        return Err(format!(
            "{} values for {} columns",
            c.values.len(),
            table.columns.len()
        ));
    }
    if op != Op::Update && c.values.iter().any(|v| matches!(v, w::Value::Unchanged)) {
        return Err(format!(
            "`unchanged` is only allowed in updates, found it in a {}",
            op.as_str()
        ));
    }
    if c.key.iter().any(|v| matches!(v, w::Value::Unchanged)) {
        return Err("`unchanged` is not allowed in a key".to_owned());
    }
    Ok(())
}

/// An insert's or update's key must be its key columns' values: lanes route and sinks apply
/// by the key, so a key column set without its key would write one row and route another.
fn check_key(table: &change::Table, op: Op, c: &Spans<'_>, data: &Data<'_>) -> Result<(), String> {
    if !matches!(op, Op::Insert | Op::Update) {
        return Ok(());
    }
    let key_columns = table
        .columns
        .iter()
        .enumerate()
        .filter(|(_, col)| col.is_key);
    for ((i, col), k) in key_columns.zip(c.key) {
        let v = &c.values[i];
        if matches!(v, w::Value::Unchanged) || same_value(v, k, data)? {
            continue;
        }
        return Err(format!(
            "key column {} is {} in the values but {} in the key: a change's key must be its \
             key columns' values (set both, or use a transform SDK, which does)",
            col.name,
            show(v, data),
            show(k, data)
        ));
    }
    Ok(())
}

/// Whether two WIT values are equal, texts by their bytes wherever their spans point.
fn same_value(a: &w::Value, b: &w::Value, data: &Data<'_>) -> Result<bool, String> {
    use w::Value as V;
    Ok(match (a, b) {
        (V::Numeric(x), V::Numeric(y))
        | (V::Text(x), V::Text(y))
        | (V::Bytes(x), V::Bytes(y))
        | (V::Json(x), V::Json(y)) => data.bytes(*x)? == data.bytes(*y)?,
        (V::Other(x), V::Other(y)) => {
            x.type_oid == y.type_oid && data.bytes(x.text)? == data.bytes(y.text)?
        }
        (V::Float4(x), V::Float4(y)) => x.to_bits() == y.to_bits(),
        (V::Float8(x), V::Float8(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    })
}

/// A value for a message: its text (cut) or its case and number.
fn show(v: &w::Value, data: &Data<'_>) -> String {
    use w::Value as V;
    let text = |s: &w::Span| match data.bytes(*s) {
        Ok(b) => {
            let t = String::from_utf8_lossy(&b[..b.len().min(64)]).into_owned();
            format!("{t:?}")
        }
        Err(e) => e,
    };
    match v {
        V::Numeric(s) | V::Text(s) | V::Json(s) => text(s),
        V::Other(o) => text(&o.text),
        V::Int2(i) => i.to_string(),
        V::Int4(i) => i.to_string(),
        V::Int8(i) => i.to_string(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::Value;
    use crate::transform::bindings::tests::{echo, insert, users};

    #[test]
    fn fan_out_gets_sub_positions_in_input_order_and_new_tables_are_shared() {
        let t = users();
        let input = InputBatch::new(vec![insert(&t, 1, 1, "x"), insert(&t, 2, 2, "y")]);
        let mut out = echo(&input);
        let mut copy = out.tables[0].clone();
        copy.name = "users_copy".into();
        out.tables.push(copy);
        // Outputs of input 1 first, then two of input 0: the host restores input order.
        let mut c1 = out.changes[0];
        c1.table = 1;
        out.changes = vec![out.changes[1], out.changes[0], c1];
        let mut cache = TableCache::default();
        let checked = check_output(out.clone(), &input, &mut cache, u64::MAX).unwrap();
        let got: Vec<(usize, u32, String)> = checked
            .outputs
            .iter()
            .map(|(i, c)| (*i, c.position.sub, c.table.name.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (0, 0, "users".into()),
                (0, 1, "users_copy".into()),
                (1, 0, "users".into())
            ]
        );
        let again = check_output(out, &input, &mut cache, u64::MAX).unwrap();
        assert!(Arc::ptr_eq(
            &checked.outputs[1].1.table,
            &again.outputs[1].1.table
        ));
    }

    #[test]
    fn invalid_outputs_are_named() {
        let t = users();
        let input = InputBatch::new(vec![insert(&t, 1, 1, "x")]);
        let mut cache = TableCache::default();
        let mut check = |edit: &dyn Fn(&mut Output)| {
            let mut out = echo(&input);
            edit(&mut out);
            check_output(out, &input, &mut cache, 10_000).unwrap_err()
        };
        assert_eq!(
            check(&|o| o.changes[0].table = 5),
            "output change #0: table #5 does not exist (the output lists 1 tables)"
        );
        assert_eq!(
            check(&|o| o.changes[0].values.len = 1),
            "output change #0 (public.users): 1 values for 2 columns"
        );
        assert_eq!(
            check(&|o| o.changes[0].key.len = 0),
            "output change #0 (public.users): 0 key values for 1 key columns"
        );
        assert_eq!(
            check(&|o| o.changes[0].position.ordinal = 9),
            "output change #0: position 0x00010000000000000001#9 is not the position of any input change"
        );
        assert_eq!(
            check(&|o| o.values[1] = w::Value::Int8(2)),
            "output change #0 (public.users): key column id is 2 in the values but 1 in the \
             key: a change's key must be its key columns' values (set both, or use a transform \
             SDK, which does)"
        );
        assert!(check(&|o| o.values[2] = w::Value::Unchanged).contains("only allowed in updates"));
        assert_eq!(
            check(&|o| o.errors.push(w::ChangeError {
                index: 3,
                message: "m".into()
            })),
            "an error refers to input change #3, but the batch has 1 changes"
        );
        assert_eq!(
            check(&|o| {
                o.data = vec![b'x'; 20_000];
                o.values[2] = w::Value::Text(w::Span {
                    start: 1,
                    len: 20_000,
                });
            }),
            "output exceeds the limit of 10000 bytes (limits.output): its changes' values come \
             to more than that once resolved, at output change #0"
        );
        assert_eq!(
            check(&|o| o.changes[0].values.start = 2),
            "output change #0 (public.users): values span 2+2 is out of range (the output has 3 values)"
        );
        // Data spans: the input's data is "x" (1 byte); the output's starts at 1.
        let text =
            |o: &mut Output, start, len| o.values[2] = w::Value::Text(w::Span { start, len });
        assert_eq!(
            check(&|o| {
                o.data = b"yz".to_vec();
                text(o, 0, 2);
            }),
            "output change #0 (public.users): data span 0+2 straddles the input's data (which ends at 1) and the output's"
        );
        assert_eq!(
            check(&|o| text(o, 1, 1)),
            "output change #0 (public.users): data span 1+1 is out of range (input data 1 bytes, output data 0 bytes)"
        );
        assert!(
            check(&|o| {
                o.data = vec![0xff];
                text(o, 1, 1);
            })
            .contains("data span 1+1 is not UTF-8 text")
        );
    }

    #[test]
    fn spans_address_the_input_data_then_the_output_data() {
        let t = users();
        // Longer than a CompactString holds inline, so the value has a heap buffer to hand back.
        let long = "ann.with.a.long.address@example.com";
        let first = insert(&t, 1, 1, long);
        let Value::Text(ann) = &first.values[1] else {
            unreachable!()
        };
        assert!(ann.is_heap_allocated());
        let ann_buffer = ann.as_ptr();
        let input = InputBatch::new(vec![first, insert(&t, 2, 2, "bo@y")]);
        let mut out = echo(&input);
        // Mask the second email: new bytes after the input's, the first email passed through.
        let after_input = (long.len() + "bo@y".len()) as u32;
        out.data = b"b***@y".to_vec();
        out.values[5] = w::Value::Text(w::Span {
            start: after_input,
            len: 6,
        });
        let checked = check_output(out, &input, &mut TableCache::default(), u64::MAX).unwrap();
        let emails: Vec<_> = checked
            .outputs
            .iter()
            .map(|(_, c)| c.values[1].clone())
            .collect();
        assert_eq!(
            emails,
            [Value::Text(long.into()), Value::Text("b***@y".into())]
        );
        // The passed-through email is the input's own buffer, handed back, not a copy.
        let Value::Text(ann) = &checked.outputs[0].1.values[1] else {
            unreachable!()
        };
        assert_eq!(ann.as_ptr(), ann_buffer);
    }

    #[test]
    fn refused_changes_lose_their_outputs() {
        let t = users();
        let input = InputBatch::new(vec![insert(&t, 1, 1, "x"), insert(&t, 2, 2, "y")]);
        let mut out = echo(&input);
        out.errors.push(w::ChangeError {
            index: 0,
            message: "no".into(),
        });
        let checked = check_output(out, &input, &mut TableCache::default(), u64::MAX).unwrap();
        assert_eq!(checked.errors, [(0, "no".to_owned())]);
        assert_eq!(checked.outputs.len(), 1);
        assert_eq!(checked.outputs[0].0, 1);
    }
}
