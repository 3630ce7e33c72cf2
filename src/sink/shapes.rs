//! Which table shapes a lane has already matched against its sink tables, so that checking a
//! batch for schema changes costs a pointer lookup per run of changes of one shape.
//!
//! Changes of one table share one `Arc<Table>` until the source reports a new shape, so a
//! shape is known by its address. The cache holds each `Arc` it knows, which keeps the address
//! from being reused by another shape while it is cached.

use std::collections::HashMap;
use std::sync::Arc;

use crate::change::{Change, Table};

/// Shapes kept before the cache is emptied (shapes are few; this only bounds a pathological
/// stream of ever-new shapes).
const LIMIT: usize = 1024;

/// Shapes known to fit the sink, by address.
#[derive(Debug, Default)]
pub(crate) struct KnownShapes {
    known: HashMap<usize, Arc<Table>>,
}

fn addr(table: &Arc<Table>) -> usize {
    Arc::as_ptr(table) as usize
}

impl KnownShapes {
    /// The distinct shapes of `changes` not known yet, in first-seen order. A shape equal to a
    /// known one (another `Arc` of the same columns) becomes known on the way.
    pub(crate) fn unknown(&mut self, changes: &[Change]) -> Vec<Arc<Table>> {
        let mut out: Vec<Arc<Table>> = Vec::new();
        let mut last = 0;
        for change in changes {
            let a = addr(&change.table);
            if a == last || self.known.contains_key(&a) {
                last = a;
                continue;
            }
            last = a;
            if out.iter().any(|t| addr(t) == a) {
                continue;
            }
            if self.known.values().any(|k| **k == *change.table) {
                self.insert(Arc::clone(&change.table));
                continue;
            }
            out.push(Arc::clone(&change.table));
        }
        out
    }

    /// Records `table` as fitting the sink.
    pub(crate) fn insert(&mut self, table: Arc<Table>) {
        if self.known.len() >= LIMIT {
            self.known.clear();
        }
        self.known.insert(addr(&table), table);
    }

    /// Forgets every shape (the sink tables may have changed meanwhile).
    pub(crate) fn clear(&mut self) {
        self.known.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::{Column, Key, Op, Position};

    fn table(columns: &[&str]) -> Arc<Table> {
        let columns = columns
            .iter()
            .enumerate()
            .map(|(i, name)| Column {
                name: (*name).into(),
                type_oid: 23,
                type_modifier: -1,
                is_key: i == 0,
            })
            .collect();
        Arc::new(Table::new("public".into(), "t".into(), columns))
    }

    fn change(table: &Arc<Table>) -> Change {
        Change {
            position: Position::default(),
            op: Op::Delete,
            table: Arc::clone(table),
            key: Key::new(),
            old_key: None,
            values: Vec::new(),
        }
    }

    #[test]
    fn shapes_are_reported_once_until_known() {
        let mut shapes = KnownShapes::default();
        let (a, b) = (table(&["id"]), table(&["id", "x"]));
        let batch = [change(&a), change(&b), change(&a), change(&b)];
        let unknown = shapes.unknown(&batch);
        assert_eq!(unknown.len(), 2);
        assert!(Arc::ptr_eq(&unknown[0], &a) && Arc::ptr_eq(&unknown[1], &b));
        shapes.insert(a);
        assert_eq!(shapes.unknown(&batch).len(), 1);
        // An equal shape in another Arc is known too.
        let a2 = table(&["id"]);
        assert!(shapes.unknown(&[change(&a2)]).is_empty());
        shapes.clear();
        assert_eq!(shapes.unknown(&[change(&a2)]).len(), 1);
    }
}
