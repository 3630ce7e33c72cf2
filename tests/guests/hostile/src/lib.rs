//! A test transform that misbehaves on request, so the host's containment can be tested.
//!
//! Config `mode` picks the behavior for every batch:
//! - `echo` (default): returns the batch unchanged;
//! - `loop`: spins forever (the host's time limit must stop it);
//! - `bomb`: allocates until memory runs out (the host's memory limit must stop it);
//! - `trap`: executes `unreachable`;
//! - `panic`: panics (the panic hook logs the message through the host before aborting);
//! - `err`: returns `err` for the whole batch (a message of `data` bytes when `data` is set);
//! - `oversize`: returns each change 10,000 times with a 1 KiB text (over any sane output limit);
//! - `bad-table`: returns a change referring to a table that does not exist;
//! - `bad-values`: returns a change with one value too few;
//! - `bad-position`: returns a change with a position no input had;
//! - `fanout`: returns every change twice, the copy in table `<name>_copy`;
//! - `rekey`: adds 1,000,000 to the first key column (int4/int8) in key, old key and values;
//! - `stale-key`: adds 1,000,000 to the first key column in the values only, leaving `key` as
//!   it was (the host must refuse the output);
//! - `unreferenced`: echoes the batch plus `data=N` bytes of output data and `values=N` values
//!   that no change refers to (the host copies them all the same).
//!
//! Config `key=N` limits `loop`, `trap`, `panic`, `bomb` and `reject` to batches holding a change
//! whose first key value is the integer N; other batches are echoed. `mode=reject` reports a
//! per-change error for that change and echoes the rest.

use std::sync::OnceLock;

wit_bindgen::generate!({
    path: "../../../wit",
    world: "transform",
});

use zipline::transform::host::{Level, log};
use zipline::transform::types::{Change, ChangeError, Column, Span, Table, Value};

struct Config {
    mode: String,
    key: Option<i64>,
    data: usize,
    values: usize,
}

static CONFIG: OnceLock<Config> = OnceLock::new();

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int2(i) => Some(i64::from(*i)),
        Value::Int4(i) => Some(i64::from(*i)),
        Value::Int8(i) => Some(*i),
        _ => None,
    }
}

fn hits(cfg: &Config, values: &[Value], c: &Change) -> bool {
    match cfg.key {
        None => true,
        Some(k) => c.key.len > 0 && values.get(c.key.start as usize).and_then(int) == Some(k),
    }
}

/// Index in `values` of value `i` of `span`, if it has one.
fn at(span: Span, i: usize) -> Option<usize> {
    (i < span.len as usize).then_some(span.start as usize + i)
}

fn shift(v: &mut Value) {
    match v {
        Value::Int4(i) => *i += 1_000_000,
        Value::Int8(i) => *i += 1_000_000,
        _ => {}
    }
}

struct Component;

impl Guest for Component {
    fn init(config: Vec<(String, String)>) -> Result<(), String> {
        std::panic::set_hook(Box::new(|info| {
            log(Level::Error, &format!("guest panicked: {info}"));
        }));
        let get = |k: &str| {
            config
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        let key = match get("key") {
            Some(k) => Some(k.parse().map_err(|_| format!("key: not an integer: {k}"))?),
            None => None,
        };
        let count = |k: &str| match get(k) {
            Some(n) => n.parse().map_err(|_| format!("{k}: not a count: {n}")),
            None => Ok(0),
        };
        let (data, values) = (count("data")?, count("values")?);
        let mode = get("mode").unwrap_or_else(|| "echo".to_owned());
        if mode == "init-fails" {
            return Err("refusing to start: init-fails mode".to_owned());
        }
        let _ = CONFIG.set(Config {
            mode,
            key,
            data,
            values,
        });
        Ok(())
    }

    fn transform(batch: Batch) -> Result<Output, String> {
        let cfg = CONFIG.get().ok_or("transform before init")?;
        let hit = batch.changes.iter().any(|c| hits(cfg, &batch.values, c));
        let Batch {
            mut tables,
            data,
            mut values,
            mut changes,
        } = batch;
        let mut new_data = Vec::new();
        let mut errors = Vec::new();
        match cfg.mode.as_str() {
            "loop" if hit => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "bomb" if hit => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "trap" if hit => core::arch::wasm32::unreachable(),
            "panic" if hit => panic!("hostile guest panics on purpose"),
            "err" if cfg.data > 0 => return Err("e".repeat(cfg.data)),
            "err" => return Err("hostile guest refuses the batch".to_owned()),
            "unreferenced" => {
                new_data = vec![b'u'; cfg.data];
                values.extend(std::iter::repeat_n(Value::Null, cfg.values));
            }
            "reject" => {
                let mut kept = Vec::new();
                for (i, c) in changes.into_iter().enumerate() {
                    if hits(cfg, &values, &c) {
                        errors.push(ChangeError {
                            index: i as u32,
                            message: "rejected on purpose".to_owned(),
                        });
                    } else {
                        kept.push(c);
                    }
                }
                changes = kept;
            }
            "oversize" => {
                // One 1 KiB text, referred to by 10,000 copies of each change.
                new_data = vec![b'x'; 1024];
                let big = Span {
                    start: data.len() as u32,
                    len: 1024,
                };
                let mut out = Vec::new();
                for c in &changes {
                    let mut row: Vec<Value> =
                        values[c.values.start as usize..][..c.values.len as usize].to_vec();
                    if let Some(v) = row.iter_mut().find(|v| matches!(v, Value::Text(_))) {
                        *v = Value::Text(big);
                    }
                    let mut copy = c.clone();
                    copy.values = Span {
                        start: values.len() as u32,
                        len: row.len() as u32,
                    };
                    values.extend(row);
                    out.extend(std::iter::repeat_n(copy, 10_000));
                }
                changes = out;
            }
            "bad-table" => {
                if let Some(c) = changes.first_mut() {
                    c.table = 1000;
                }
            }
            "bad-values" => {
                if let Some(c) = changes.iter_mut().find(|c| c.values.len > 0) {
                    c.values.len -= 1;
                }
            }
            "bad-position" => {
                if let Some(c) = changes.first_mut() {
                    c.position.ordinal += 100_000;
                }
            }
            "fanout" => {
                let n = tables.len() as u32;
                let copies: Vec<Table> = tables
                    .iter()
                    .map(|t| Table {
                        schema: t.schema.clone(),
                        name: format!("{}_copy", t.name),
                        columns: t.columns.iter().map(|c| Column { ..c.clone() }).collect(),
                    })
                    .collect();
                tables.extend(copies);
                let mut out = Vec::with_capacity(changes.len() * 2);
                for c in changes {
                    // The copy shares the original's values: spans are only indexes.
                    let mut copy = c.clone();
                    copy.table += n;
                    out.push(c);
                    out.push(copy);
                }
                changes = out;
            }
            "rekey" => {
                for c in &changes {
                    let t = &tables[c.table as usize];
                    if let Some(first_key) = t.columns.iter().position(|col| col.is_key) {
                        let spots = [
                            at(c.key, 0),
                            c.old_key.and_then(|k| at(k, 0)),
                            at(c.values, first_key),
                        ];
                        for i in spots.into_iter().flatten() {
                            shift(&mut values[i]);
                        }
                    }
                }
            }
            "stale-key" => {
                for c in &changes {
                    let t = &tables[c.table as usize];
                    if let Some(first_key) = t.columns.iter().position(|col| col.is_key) {
                        if let Some(i) = at(c.values, first_key) {
                            shift(&mut values[i]);
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(Output {
            tables,
            data: new_data,
            values,
            changes,
            errors,
        })
    }
}

export!(Component);
