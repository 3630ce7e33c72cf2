//! One poll: an LSN window `(lo, hi]`, read from every table's change function and merged
//! into transactions of changes in commit order.
//!
//! Message flow of a poll: `sys.fn_cdc_get_max_lsn()` → (when above `lo`) re-read
//! `cdc.change_tables` → up to [`WINDOW_TRANSACTIONS`] commit LSNs from `cdc.lsn_time_mapping`
//! (the last one is `hi`, a transaction boundary, so no transaction is split) → per table and
//! capture instance one `cdc.fn_cdc_get_all_changes_<instance>(from, to, N'all update old')`,
//! an index range read of its change table → merge by `(__$start_lsn, __$seqval,
//! __$operation)` → ordinals → changes.
//!
//! Operation mapping: 1 → delete (only the key is kept), 2 → insert, 4 → update (the whole
//! new row); 3, the before-image, is only used to find the old key of an update that changed
//! the key (`old_key`), since it shares its `__$seqval` with the after-image that follows it.
//! See the result columns of
//! <https://learn.microsoft.com/sql/relational-databases/system-functions/cdc-fn-cdc-get-all-changes-capture-instance-transact-sql>
//! and, for commit times, `cdc.lsn_time_mapping`
//! (<https://learn.microsoft.com/sql/relational-databases/system-tables/cdc-lsn-time-mapping-transact-sql>).
//!
//! Quirk: the change table's own docs say `__$seqval` should not order operations inside a
//! transaction (`__$command_id` should), but `fn_cdc_get_all_changes_*` does not return
//! `__$command_id`; Zipline orders by `__$seqval`, a log position, which orders the changes
//! of one row correctly — and per-row order is what the sinks depend on.
//!
//! [`WINDOW_TRANSACTIONS`]: super::sql::WINDOW_TRANSACTIONS

use std::collections::HashMap;

use tiberius::Row;

use super::catalog::{Captured, Instance};
use super::conn::{self, Conn};
use super::lsn::{self, Operation, Ordinals, RowOrder};
use super::sql;
use super::types::{self, mask_has};
use crate::change::{Change, Key, Lsn, Op, Position, Value};
use crate::config;
use crate::source::SourceError;

/// One change row as read.
#[derive(Debug, Clone)]
pub(crate) struct RawRow {
    pub(crate) order: RowOrder,
    /// Index into the table's instances.
    pub(crate) instance: usize,
    pub(crate) mask: Vec<u8>,
    /// Captured columns, in the instance's column order.
    pub(crate) values: Vec<Value>,
}

/// The changes of one source transaction.
#[derive(Debug)]
pub(crate) struct Tx {
    pub(crate) lsn: Lsn,
    /// Age of the commit when the window was read, in microseconds.
    pub(crate) age_us: i64,
    pub(crate) changes: Vec<Change>,
}

/// The current highest LSN the capture job has processed (`0` before its first run).
pub(crate) async fn max_lsn(
    conn: &mut Conn,
    opts: &config::SqlServerSource,
) -> Result<Lsn, SourceError> {
    let doing = "reading sys.fn_cdc_get_max_lsn()";
    let rows = conn::query(conn, opts, doing, sql::MAX_LSN).await?;
    let Some(row) = rows.first() else {
        return Ok(Lsn(0));
    };
    Ok(conn::lsn_at(row, 0, "max_lsn")
        .map_err(|e| conn::bad_result(opts, doing, e))?
        .unwrap_or_default())
}

/// The window above `lo`, at most up to `max`: its end and the commit LSNs (with ages) in it.
pub(crate) async fn window(
    conn: &mut Conn,
    opts: &config::SqlServerSource,
    lo: Lsn,
    max: Lsn,
) -> Result<(Lsn, HashMap<Lsn, i64>), SourceError> {
    let doing = "reading cdc.lsn_time_mapping";
    let rows = conn::query(conn, opts, doing, &sql::window(lo, max)).await?;
    let mut ages = HashMap::with_capacity(rows.len());
    let mut last = None;
    for row in &rows {
        let bad = |e| conn::bad_result(opts, doing, e);
        let at = conn::lsn_at(row, 0, "start_lsn")
            .map_err(bad)?
            .unwrap_or_default();
        let age = conn::int(row, 1, "age_us")
            .map_err(bad)?
            .unwrap_or_default();
        ages.insert(at, age.max(0));
        last = Some(at);
    }
    // A short page means the window reaches `max` (which may be an idle marker past the last
    // transaction); a full one ends at its last transaction.
    let hi = match last {
        Some(last) if rows.len() >= sql::WINDOW_TRANSACTIONS as usize => last,
        _ => max,
    };
    Ok((hi, ages))
}

/// Reads every table's change rows with commit LSN in `(lo, hi]`.
pub(crate) async fn read(
    conn: &mut Conn,
    opts: &config::SqlServerSource,
    tables: &[Captured],
    lo: Lsn,
    hi: Lsn,
) -> Result<Vec<RawRow>, SourceError> {
    let mut out = Vec::new();
    for (t, table) in tables.iter().enumerate() {
        let reads = super::catalog::plan_reads(table, lo, hi)
            .map_err(|e| SourceError::fatal(format!("{}: {e}", opts.name)))?;
        for r in reads {
            let inst = &table.instances[r.instance];
            let doing = format!(
                "reading changes of {} from capture instance {} ({}..={})",
                table.qualified(),
                inst.name,
                lsn::literal(r.from),
                lsn::literal(r.to)
            );
            let sql = sql::changes(&inst.name, r.from, r.to, &inst.select);
            let rows = conn::query(conn, opts, &doing, &sql).await?;
            for row in &rows {
                out.push(parse_row(opts, table, t, r.instance, row)?);
            }
        }
    }
    Ok(out)
}

fn parse_row(
    opts: &config::SqlServerSource,
    table: &Captured,
    t: usize,
    instance: usize,
    row: &Row,
) -> Result<RawRow, SourceError> {
    let inst = &table.instances[instance];
    let bad = |e: String| {
        SourceError::fatal(format!(
            "{}: change row of {} (capture instance {}): {e}",
            opts.name,
            table.qualified(),
            inst.name
        ))
    };
    let start_lsn = conn::lsn_at(row, 0, "__$start_lsn")
        .map_err(bad)?
        .ok_or_else(|| bad("__$start_lsn is NULL".into()))?;
    let seqval = conn::lsn_at(row, 1, "__$seqval")
        .map_err(bad)?
        .ok_or_else(|| bad("__$seqval is NULL".into()))?;
    let code = conn::int(row, 2, "__$operation")
        .map_err(bad)?
        .ok_or_else(|| bad("__$operation is NULL".into()))?;
    let operation = Operation::from_code(code).map_err(bad)?;
    let mask = conn::bytes(row, 3, "__$update_mask")
        .map_err(bad)?
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    let values = row_values(inst, row, 4).map_err(|e| {
        SourceError::fatal(format!(
            "{}: change at LSN {} of {}: {e}",
            opts.name,
            lsn::literal(start_lsn),
            table.qualified()
        ))
    })?;
    Ok(RawRow {
        order: RowOrder {
            start_lsn,
            seqval,
            operation,
            table: t,
        },
        instance,
        mask,
        values,
    })
}

/// Converts the captured columns of `row`, which start at column `first`.
pub(crate) fn row_values(inst: &Instance, row: &Row, first: usize) -> Result<Vec<Value>, String> {
    inst.columns
        .iter()
        .enumerate()
        .map(|(i, col)| {
            let data = row
                .get_column_data(first + i)
                .map_err(|e| format!("column {}: {e}", col.name))?;
            types::to_value(col.ty, data).map_err(|e| format!("column {}: {e}", col.name))
        })
        .collect()
}

/// Sorts rows into commit order and turns them into changes, grouped by transaction.
pub(crate) fn assemble(
    tables: &[Captured],
    mut rows: Vec<RawRow>,
    ages: &HashMap<Lsn, i64>,
) -> Result<Vec<Tx>, String> {
    rows.sort_by_key(|r| r.order);
    let mut txs: Vec<Tx> = Vec::new();
    let mut ordinals = Ordinals::default();
    let mut before: Option<RawRow> = None;
    for row in rows {
        if row.order.operation == Operation::UpdateBefore {
            before = Some(row);
            continue;
        }
        let paired = before.take().filter(|b| {
            b.order.start_lsn == row.order.start_lsn
                && b.order.seqval == row.order.seqval
                && b.order.table == row.order.table
        });
        let table = &tables[row.order.table];
        let inst = &table.instances[row.instance];
        let lsn = row.order.start_lsn;
        let position = Position::new(lsn, ordinals.next(lsn)?);
        let change = build(inst, row, paired.as_ref(), position);
        match txs.last_mut() {
            Some(tx) if tx.lsn == lsn => tx.changes.push(change),
            _ => txs.push(Tx {
                lsn,
                age_us: ages.get(&lsn).copied().unwrap_or(0),
                changes: vec![change],
            }),
        }
    }
    Ok(txs)
}

fn key_of(inst: &Instance, values: &[Value]) -> Key {
    inst.shape.key.iter().map(|&i| values[i].clone()).collect()
}

fn build(inst: &Instance, row: RawRow, before: Option<&RawRow>, position: Position) -> Change {
    let table = inst.shape.clone();
    match row.order.operation {
        Operation::Delete => Change {
            position,
            op: Op::Delete,
            key: key_of(inst, &row.values),
            table,
            old_key: None,
            values: Vec::new(),
        },
        Operation::Insert => Change {
            position,
            op: Op::Insert,
            key: key_of(inst, &row.values),
            table,
            old_key: None,
            values: row.values,
        },
        Operation::UpdateAfter | Operation::UpdateBefore => {
            let mut values = row.values;
            for (value, col) in values.iter_mut().zip(&inst.columns) {
                if col.ty.is_lob() && value.is_null() && !mask_has(&row.mask, col.ordinal) {
                    *value = Value::Unchanged;
                }
            }
            let key = key_of(inst, &values);
            let old_key = before
                .map(|b| key_of(inst, &b.values))
                .filter(|old| *old != key)
                .map(Box::new);
            Change {
                position,
                op: Op::Update,
                key,
                table,
                old_key,
                values,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::sqlserver::catalog::{self, CapturedColumn};
    use crate::source::sqlserver::types::SqlType;

    fn tables() -> Vec<Captured> {
        let opts = crate::source::sqlserver::tests::options();
        let cols = |names: &[(&str, SqlType, bool)]| {
            names
                .iter()
                .enumerate()
                .map(|(i, (n, ty, key))| CapturedColumn {
                    name: (*n).into(),
                    ordinal: i + 1,
                    ty: *ty,
                    is_key: *key,
                })
                .collect::<Vec<_>>()
        };
        let orders = catalog::instance(
            &opts,
            "dbo",
            "orders",
            "dbo_orders",
            10,
            cols(&[
                ("id", SqlType::Int, true),
                ("note", SqlType::String { max: true }, false),
                ("qty", SqlType::Int, false),
            ]),
        )
        .unwrap();
        let items = catalog::instance(
            &opts,
            "dbo",
            "items",
            "dbo_items",
            11,
            cols(&[("sku", SqlType::String { max: false }, true)]),
        )
        .unwrap();
        vec![
            Captured {
                schema: "dbo".into(),
                name: "orders".into(),
                instances: vec![orders],
            },
            Captured {
                schema: "dbo".into(),
                name: "items".into(),
                instances: vec![items],
            },
        ]
    }

    fn row(lsn: u128, seq: u128, op: i64, table: usize, mask: &[u8], values: Vec<Value>) -> RawRow {
        RawRow {
            order: RowOrder {
                start_lsn: Lsn(lsn),
                seqval: Lsn(seq),
                operation: Operation::from_code(op).unwrap(),
                table,
            },
            instance: 0,
            mask: mask.to_vec(),
            values,
        }
    }

    fn order_row(lsn: u128, seq: u128, op: i64, id: i32, note: Value, qty: i32) -> RawRow {
        row(
            lsn,
            seq,
            op,
            0,
            &[0x07],
            vec![Value::Int4(id), note, Value::Int4(qty)],
        )
    }

    #[test]
    fn merges_tables_into_transactions_in_commit_order() {
        let t = tables();
        let rows = vec![
            // Second transaction, read first (tables are read one after another).
            order_row(20, 5, 2, 3, Value::Null, 1),
            row(10, 2, 2, 1, &[0x01], vec![Value::Text("a".into())]),
            order_row(10, 1, 2, 1, Value::Text("x".into()), 5),
            order_row(10, 3, 1, 1, Value::Text("x".into()), 5),
        ];
        let ages = HashMap::from([(Lsn(10), 7_000), (Lsn(20), 1_000)]);
        let txs = assemble(&t, rows, &ages).unwrap();
        assert_eq!(txs.len(), 2);
        assert_eq!((txs[0].lsn, txs[0].age_us), (Lsn(10), 7_000));
        let summary: Vec<_> = txs[0]
            .changes
            .iter()
            .map(|c| {
                (
                    c.position.ordinal,
                    c.op,
                    c.table.name.as_str(),
                    c.key.to_vec(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (1, Op::Insert, "orders", vec![Value::Int4(1)]),
                (2, Op::Insert, "items", vec![Value::Text("a".into())]),
                (3, Op::Delete, "orders", vec![Value::Int4(1)]),
            ]
        );
        assert!(
            txs[0].changes[2].values.is_empty(),
            "a delete carries only its key"
        );
        assert_eq!(txs[1].changes[0].position, Position::new(Lsn(20), 1));
    }

    #[test]
    fn replay_of_a_window_gives_the_same_positions() {
        let t = tables();
        let rows = vec![
            order_row(10, 1, 2, 1, Value::Null, 1),
            order_row(10, 2, 2, 2, Value::Null, 1),
            order_row(11, 3, 2, 3, Value::Null, 1),
        ];
        let mut shuffled = rows.clone();
        shuffled.reverse();
        let a = assemble(&t, rows, &HashMap::new()).unwrap();
        let b = assemble(&t, shuffled, &HashMap::new()).unwrap();
        let positions = |txs: &[Tx]| {
            txs.iter()
                .flat_map(|tx| tx.changes.iter().map(|c| (c.position, c.key.clone())))
                .collect::<Vec<_>>()
        };
        assert_eq!(positions(&a), positions(&b));
    }

    #[test]
    fn updates_pair_before_and_after_images() {
        let t = tables();
        let rows = vec![
            // Key change 1 → 2: the before-image gives the old key.
            order_row(10, 4, 4, 2, Value::Text("n".into()), 9),
            order_row(10, 4, 3, 1, Value::Text("n".into()), 8),
            // Plain update of 5; only qty (bit 3) changed, note is a LOB left NULL by CDC.
            row(
                10,
                6,
                3,
                0,
                &[0x04],
                vec![Value::Int4(5), Value::Null, Value::Int4(1)],
            ),
            row(
                10,
                6,
                4,
                0,
                &[0x04],
                vec![Value::Int4(5), Value::Null, Value::Int4(2)],
            ),
            // Update that set the LOB to NULL (bit 2 set): a real NULL.
            row(
                10,
                7,
                4,
                0,
                &[0x02],
                vec![Value::Int4(6), Value::Null, Value::Int4(2)],
            ),
        ];
        let txs = assemble(&t, rows, &HashMap::new()).unwrap();
        let c = &txs[0].changes;
        assert_eq!(c.len(), 3, "before-images are not changes of their own");
        assert_eq!(c[0].op, Op::Update);
        assert_eq!(c[0].key[..], [Value::Int4(2)]);
        assert_eq!(
            c[0].old_key,
            Some(Box::new(smallvec::smallvec![Value::Int4(1)]))
        );
        assert_eq!(c[0].position.ordinal, 1);
        assert_eq!(c[1].old_key, None, "same key: no old key");
        assert_eq!(
            c[1].values,
            vec![Value::Int4(5), Value::Unchanged, Value::Int4(2)]
        );
        assert_eq!(c[2].values[1], Value::Null);
        assert_eq!(c[2].old_key, None, "no before-image: nothing to compare");
        assert_eq!(
            c.iter().map(|c| c.position.ordinal).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
    }
}
