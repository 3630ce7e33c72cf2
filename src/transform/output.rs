//! Checking a component's `output` and turning it back into [`Change`]s.
//!
//! Every change is checked before it can reach a lane (table index in range, as many values as
//! columns, as many key values as key columns, a position some input had, `unchanged` only in
//! updates), its size counted against the output limit, and output tables are turned back into
//! `Arc<Table>`s — the input's own `Arc` when the guest returned the shape as is, or one shared
//! `Arc` per distinct new shape (cached across batches), so lanes and sinks keep seeing one
//! table object per shape. Outputs are put back in input order (stably: a guest's order among
//! the outputs of one input is kept) and numbered apart with `Position::sub`.

use std::collections::HashMap;
use std::sync::Arc;

use super::bindings::zipline::transform::types as w;
use super::bindings::{InputBatch, Output, lsn_of, op_from_wit, table_from_wit, value_from_wit};
use crate::change::{self, Change, Op, Position};
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
    let mut bytes = 0u64;
    let mut outputs = Vec::with_capacity(out.changes.len());
    for (n, c) in out.changes.into_iter().enumerate() {
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
        check_shape(table, op, &c)
            .map_err(|m| format!("{} ({}): {m}", what(), table.qualified_name()))?;
        bytes += 64 + values_size(&c.key) + values_size(&c.values);
        if let Some(k) = &c.old_key {
            bytes += values_size(k);
        }
        if bytes > max_bytes {
            return Err(format!(
                "output exceeds the limit of {max_bytes} bytes (limits.output) at output change #{n}"
            ));
        }
        let values = match op {
            // The contract says a delete's values are empty; tolerate a guest that sends them.
            Op::Delete | Op::Truncate => Vec::new(),
            _ => c.values.into_iter().map(value_from_wit).collect(),
        };
        outputs.push((
            input_index,
            Change {
                position: input.positions[input_index],
                op,
                table: table.clone(),
                key: c.key.into_iter().map(value_from_wit).collect(),
                old_key: c
                    .old_key
                    .map(|k| k.into_iter().map(value_from_wit).collect()),
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

fn check_shape(table: &change::Table, op: Op, c: &w::Change) -> Result<(), String> {
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

fn values_size(vs: &[w::Value]) -> u64 {
    vs.iter()
        .map(|v| {
            16 + match v {
                w::Value::Numeric(s) | w::Value::Text(s) | w::Value::Json(s) => s.len() as u64,
                w::Value::Other(o) => o.text.len() as u64,
                w::Value::Bytes(b) => b.len() as u64,
                _ => 0,
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let mut c1 = out.changes[0].clone();
        c1.table = 1;
        out.changes = vec![out.changes[1].clone(), out.changes[0].clone(), c1];
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
            check(&|o| {
                o.changes[0].values.pop();
            }),
            "output change #0 (public.users): 1 values for 2 columns"
        );
        assert_eq!(
            check(&|o| o.changes[0].key.clear()),
            "output change #0 (public.users): 0 key values for 1 key columns"
        );
        assert_eq!(
            check(&|o| o.changes[0].position.ordinal = 9),
            "output change #0: position 0x00010000000000000001#9 is not the position of any input change"
        );
        assert!(
            check(&|o| o.changes[0].values[1] = w::Value::Unchanged)
                .contains("only allowed in updates")
        );
        assert_eq!(
            check(&|o| o.errors.push(w::ChangeError {
                index: 3,
                message: "m".into()
            })),
            "an error refers to input change #3, but the batch has 1 changes"
        );
        assert_eq!(
            check(&|o| o.changes[0].values[1] = w::Value::Text("x".repeat(20_000))),
            "output exceeds the limit of 10000 bytes (limits.output) at output change #0"
        );
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
