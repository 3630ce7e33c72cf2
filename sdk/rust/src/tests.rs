//! The SDK on hand-built batches (natively: `cargo test` in sdk/rust).

use super::*;
use wit::{Change as Raw, Column as Col, Position, Span, Table};

fn users() -> Table {
    let col = |name: &str, type_oid, is_key| Col {
        name: name.into(),
        type_oid,
        type_modifier: -1,
        is_key,
    };
    Table {
        schema: "public".into(),
        name: "users".into(),
        columns: vec![
            col("id", 23, true),
            col("email", 25, false),
            col("status", 25, false),
        ],
    }
}

/// A batch of `rows` (id, email, status) as inserts, or updates when `update`.
fn batch(rows: &[(i32, &str, &str)], op: Op) -> bindings::Batch {
    let mut data = Vec::new();
    let mut values = Vec::new();
    let mut changes = Vec::new();
    let text = |s: &str, data: &mut Vec<u8>| {
        let span = Span {
            start: data.len() as u32,
            len: s.len() as u32,
        };
        data.extend_from_slice(s.as_bytes());
        wit::Value::Text(span)
    };
    for (n, (id, email, status)) in rows.iter().enumerate() {
        let key = Span {
            start: values.len() as u32,
            len: 1,
        };
        values.push(wit::Value::Int4(*id));
        let row = Span {
            start: values.len() as u32,
            len: 3,
        };
        values.push(wit::Value::Int4(*id));
        values.push(text(email, &mut data));
        values.push(text(status, &mut data));
        changes.push(Raw {
            table: 0,
            op,
            position: Position {
                lsn_high: 0,
                lsn_low: 10,
                ordinal: n as u32 + 1,
            },
            key,
            old_key: None,
            values: if op == Op::Delete {
                Span { start: 0, len: 0 }
            } else {
                row
            },
        });
    }
    wit::Batch {
        tables: vec![users()],
        data,
        values,
        changes,
    }
}

/// Each output change as (table, op, key, row) in text.
fn show(input: &bindings::Batch, out: &bindings::Output) -> Vec<String> {
    let text = |s: Span| {
        let (start, len) = (s.start as usize, s.len as usize);
        let bytes = if start >= input.data.len() {
            &out.data[start - input.data.len()..][..len]
        } else {
            &input.data[start..][..len]
        };
        String::from_utf8(bytes.to_vec()).unwrap()
    };
    let vals = |s: Span| {
        out.values[s.start as usize..][..s.len as usize]
            .iter()
            .map(|v| match *v {
                wit::Value::Int4(i) => i.to_string(),
                wit::Value::Text(s) => text(s),
                wit::Value::Null => "NULL".into(),
                other => format!("{other:?}"),
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    out.changes
        .iter()
        .map(|c| {
            let t = &out.tables[c.table as usize];
            let cols: Vec<&str> = t.columns.iter().map(|c| c.name.as_str()).collect();
            format!(
                "{}.{}({}) {} key[{}] row[{}]",
                t.schema,
                t.name,
                cols.join(","),
                format!("{:?}", c.op).trim_start_matches("Op::"),
                vals(c.key),
                vals(c.values)
            )
        })
        .collect()
}

fn run_with<T: Transform>(
    config: &[(&str, &str)],
    input: bindings::Batch,
) -> (bindings::Output, Vec<String>) {
    let config = Config::new(
        config
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    let mut t = T::init(&config).unwrap();
    let out = run(&mut t, input.clone()).unwrap();
    let shown = show(&input, &out);
    (out, shown)
}

struct Mask;
impl Transform for Mask {
    fn init(_: &Config) -> Result<Self, String> {
        Ok(Mask)
    }
    fn change(&mut self, c: &mut Change<'_>) -> Result<(), String> {
        c.map_str("email", |s| format!("{}***", &s[..1]))
    }
}

#[test]
fn map_str_writes_new_text_and_passes_the_rest() {
    let (_, got) = run_with::<Mask>(
        &[],
        batch(&[(1, "ann@x", "ok"), (2, "bo@y", "test")], Op::Insert),
    );
    assert_eq!(
        got,
        [
            "public.users(id,email,status) Insert key[1] row[1,a***,ok]",
            "public.users(id,email,status) Insert key[2] row[2,b***,test]",
        ]
    );
}

struct NoTest;
impl Transform for NoTest {
    fn init(_: &Config) -> Result<Self, String> {
        Ok(NoTest)
    }
    fn change(&mut self, c: &mut Change<'_>) -> Result<(), String> {
        c.filter(|row| row.get_str("status") != Some("test"));
        Ok(())
    }
}

#[test]
fn filter_drops_inserts_and_turns_updates_leaving_it_into_deletes() {
    let rows = [(1, "a", "ok"), (2, "b", "test")];
    let (_, got) = run_with::<NoTest>(&[], batch(&rows, Op::Insert));
    assert_eq!(
        got,
        ["public.users(id,email,status) Insert key[1] row[1,a,ok]"]
    );
    let (_, got) = run_with::<NoTest>(&[], batch(&rows, Op::Update));
    assert_eq!(
        got,
        [
            "public.users(id,email,status) Update key[1] row[1,a,ok]",
            "public.users(id,email,status) Delete key[2] row[]",
        ]
    );
    let (_, got) = run_with::<NoTest>(&[], batch(&rows, Op::Delete));
    assert_eq!(got.len(), 2, "deletes pass: {got:?}");
}

struct Shift;
impl Transform for Shift {
    fn init(c: &Config) -> Result<Self, String> {
        c.allow_only(&["by"])?;
        Ok(Shift)
    }
    fn change(&mut self, c: &mut Change<'_>) -> Result<(), String> {
        let id = c.get_i64("id").ok_or("no id")?;
        if c.get_str(1) == Some("refuse") {
            return Err("refused".into());
        }
        c.set_i64("id", id + 100)?;
        c.drop_column("status")?;
        c.rename_column("email", "mail")?;
        c.rename_table("audit", "people");
        c.emit_copy("audit", "copy");
        Ok(())
    }
}

#[test]
fn key_columns_set_the_key_and_shapes_change_per_change() {
    let (out, got) = run_with::<Shift>(
        &[],
        batch(&[(1, "a", "ok"), (2, "refuse", "x")], Op::Insert),
    );
    assert_eq!(
        got,
        [
            "audit.people(id,mail) Insert key[101] row[101,a]",
            "audit.copy(id,mail) Insert key[101] row[101,a]",
        ]
    );
    assert_eq!(out.errors.len(), 1);
    assert_eq!(
        (out.errors[0].index, out.errors[0].message.as_str()),
        (1, "refused")
    );
    let e = Shift::init(&Config::new(vec![("bye".into(), "1".into())]))
        .err()
        .unwrap();
    assert_eq!(e, "unknown config key `bye`; expected by");
}

#[test]
fn config_parses_typed_values_and_names_bad_ones() {
    let c = Config::new(vec![
        ("n".into(), " 42 ".into()),
        ("cols".into(), "a, b,,c".into()),
    ]);
    assert_eq!(c.parse::<u32>("n"), Ok(Some(42)));
    assert_eq!(c.list("cols"), ["a", "b", "c"]);
    assert_eq!(c.parse::<u32>("missing"), Ok(None));
    assert!(
        c.require::<u32>("missing")
            .unwrap_err()
            .contains("`missing` is required")
    );
    let e = c.parse::<bool>("n").unwrap_err();
    assert!(e.starts_with("config `n`: cannot read ` 42 `"), "{e}");
}

#[test]
fn integers_are_written_at_the_column_s_width() {
    struct Wide;
    impl Transform for Wide {
        fn init(_: &Config) -> Result<Self, String> {
            Ok(Wide)
        }
        fn change(&mut self, c: &mut Change<'_>) -> Result<(), String> {
            c.set_i64("id", i64::MAX)
        }
    }
    let (out, _) = run_with::<Wide>(&[], batch(&[(1, "a", "ok")], Op::Insert));
    assert_eq!(
        out.errors[0].message,
        format!("{} does not fit column id", i64::MAX)
    );
}
