//! The guest examples of guest-examples/ written in Rust, C, JavaScript, Python and Go, loaded
//! through the host as a route loads them (`Transformer`: compile, link, `init` with the
//! config, `transform`), each on its `sample.jsonl` with the config in its `sample.config`:
//! the output must be exactly its `expected.jsonl`, and the changes it refuses exactly its
//! `expected-errors.jsonl` (when there is one; they are read back from the dead-letter file).
//! Each sample is run as one batch and again one change per call, which must give the same
//! output (the examples keep no state between calls); and an unknown config key must stop the
//! example at `init`.
//!
//! Lines compare as JSON values (key order aside), in the format of `zipline::transform::json`.
//! The components are built by `.ci/run guests`, or by each example's build.sh, into
//! target/guests/; a missing one fails the test with the command that builds it.

use std::path::Path;

use serde_json::Value as Json;
use zipline::change::Change;
use zipline::config::{OnError, TransformLimits, TransformSpec};
use zipline::transform::Transformer;
use zipline::transform::json::{change_from_json, change_to_json};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn json_lines(path: &Path) -> Vec<Json> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), i + 1))
        })
        .collect()
}

/// `key=value` per line, `#` comments: the route's `config:` map for the sample.
fn sample_config(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, l)| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("{}:{}: expected key=value", path.display(), i + 1));
            (k.trim().to_owned(), v.trim().to_owned())
        })
        .collect()
}

fn sample_changes(path: &Path) -> Vec<Change> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut tables = Vec::new();
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let n = u32::try_from(i + 1).expect("a short sample");
            change_from_json(l, n, &mut tables)
                .unwrap_or_else(|e| panic!("{}:{n}: {e}", path.display()))
        })
        .collect()
}

/// Panics with every differing line, so one run shows all of a mismatch.
fn assert_lines(what: &str, got: &[Json], want: &[Json]) {
    let mut diffs = Vec::new();
    for i in 0..got.len().max(want.len()) {
        let (g, w) = (got.get(i), want.get(i));
        if g != w {
            let show = |v: Option<&Json>| v.map_or("(none)".to_owned(), Json::to_string);
            diffs.push(format!(
                "line {}:\n   got  {}\n   want {}",
                i + 1,
                show(g),
                show(w)
            ));
        }
    }
    assert!(
        diffs.is_empty(),
        "{what}: {} line(s) differ\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

/// `position` and `reason` of each dead-letter record.
fn dead_letters(path: &Path) -> Vec<Json> {
    if !path.exists() {
        return Vec::new();
    }
    json_lines(path)
        .into_iter()
        .map(|r| serde_json::json!({"position": r["change"]["position"], "reason": r["reason"]}))
        .collect()
}

fn check(example: &str) {
    let dir = repo().join("guest-examples").join(example);
    let module = repo().join("target/guests").join(format!("{example}.wasm"));
    assert!(
        module.exists(),
        "{} is missing: build it with `.ci/run guests` or `guest-examples/{example}/build.sh`",
        module.display()
    );
    let scratch = tempfile::tempdir().expect("temporary directory");
    let spec = |dead_letter: &str| TransformSpec {
        module: module.clone(),
        module_label: format!("{example}.wasm"),
        config: sample_config(&dir.join("sample.config")),
        limits: TransformLimits::default(),
        on_error: OnError::DeadLetter,
        dead_letter: scratch.path().join(dead_letter),
        batch_size: 1000,
        row_filter: false,
    };
    let changes = sample_changes(&dir.join("sample.jsonl"));
    let want = json_lines(&dir.join("expected.jsonl"));
    let want_errors = match dir.join("expected-errors.jsonl") {
        p if p.exists() => json_lines(&p),
        _ => Vec::new(),
    };

    let mut whole = Transformer::new("examples", &spec("batch.jsonl")).expect("load and init");
    let got: Vec<Json> = whole
        .transform(changes.clone())
        .expect("transform the sample")
        .iter()
        .map(|(_, c)| change_to_json(c))
        .collect();
    assert_lines(&format!("{example}: one batch"), &got, &want);
    assert_lines(
        &format!("{example}: refused changes (one batch)"),
        &dead_letters(&scratch.path().join("batch.jsonl")),
        &want_errors,
    );

    let mut single = Transformer::new("examples", &spec("single.jsonl")).expect("load and init");
    let mut got = Vec::new();
    for change in changes {
        let out = single
            .transform(vec![change])
            .expect("transform one change");
        got.extend(out.iter().map(|(_, c)| change_to_json(c)));
    }
    assert_lines(&format!("{example}: one change per call"), &got, &want);
    assert_lines(
        &format!("{example}: refused changes (one change per call)"),
        &dead_letters(&scratch.path().join("single.jsonl")),
        &want_errors,
    );

    // A key the example does not know stops it at `init`, naming the key.
    let mut unknown = spec("unused.jsonl");
    unknown.config = vec![("no_such_key".into(), "1".into())];
    let err = Transformer::new("examples", &unknown)
        .expect_err("init must refuse an unknown key")
        .to_string();
    assert!(
        err.contains("unknown config key `no_such_key`"),
        "{example}: unexpected error: {err}"
    );
}

#[test]
fn rust_mask_on_the_sdk_masks_columns_keys_and_old_keys_and_drops_tables() {
    check("rust-mask");
}

#[test]
fn rust_filter_on_the_sdk_drops_rows_and_turns_updates_leaving_them_into_deletes() {
    check("rust-filter");
}

#[test]
fn c_drop_hash_drops_tables_and_hashes_columns() {
    check("c-drop-hash");
}

#[test]
fn js_mask_masks_columns() {
    check("js-mask");
}

#[test]
fn python_rename_renames_tables_and_columns() {
    check("python-rename");
}

#[test]
fn go_split_fans_orders_out_to_an_audit_table() {
    check("go-split");
}
