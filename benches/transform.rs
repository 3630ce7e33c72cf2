//! Transform benchmark (not a timed test: it prints figures and checks only correctness).
//!
//! 1. **Per-change cost** on batches of 1,000 changes of an 8-column table, through the whole
//!    host path (conversion to WIT, the call, output checks, conversion back): a pass-through
//!    and a masking transform, in Rust (`guest-examples/rust-mask`, on the SDK) and JavaScript
//!    (`guest-examples/js-mask`), next to the same logic written natively in the host; and the
//!    other examples (C hashing, Go splitting, Python renaming on the SDK) alike.
//! 2. **Pipeline throughput**: a backlog of changes (default 500,000; 100 per transaction:
//!    60 inserts, 30 updates, 10 deletes) replayed PostgreSQL → MariaDB by `zipline pipeline
//!    apply` from slots each pipeline created (`snapshot: never`) before the backlog,
//!    alternating without a transform and with the Rust SDK's masking transform
//!    (`ZIPLINE_BENCH_ROUNDS`, default 2, rounds of each, so load from other processes falls
//!    on both alike); changes/s of each and the ratio.
//!
//! `cargo bench --bench transform` (env: `ZIPLINE_BENCH_CHANGES`, `ZIPLINE_BENCH_BATCHES`,
//! `ZIPLINE_BENCH_ROUNDS`, `ZIPLINE_BENCH_GUESTS=rust,c,go,python,javascript`,
//! `ZIPLINE_BENCH_SKIP_PIPELINE=1`, `ZIPLINE_BENCH_KEEP_LOGS=1` keeps each pipeline's config and
//! log). Needs the guests in `target/guests/` (`.ci/run guests`);
//! a missing JavaScript guest is reported and skipped.

#[path = "../tests/common/mod.rs"]
pub mod common;
pub mod common_backlog;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zipline::change::{Change, Column, Lsn, Op, Position, Table, Value};
use zipline::config::{OnError, TransformLimits, TransformSpec};
use zipline::transform::Transformer;

use common_backlog::{env_or, prime, proc_stat};

// The same allocator as the `zipline` binary, so the in-process figures match production.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn guest(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("target/guests/{name}.wasm"))
}

fn table() -> Arc<Table> {
    let col = |name: &str, type_oid, is_key| Column {
        name: name.into(),
        type_oid,
        type_modifier: -1,
        is_key,
    };
    Arc::new(Table::new(
        "public".into(),
        "customers".into(),
        vec![
            col("id", 20, true),
            col("email", 25, false),
            col("name", 25, false),
            col("amount", 1700, false),
            col("status", 1043, false),
            col("created_at", 1184, false),
            col("vip", 16, false),
            col("note", 25, false),
        ],
    ))
}

fn batch(n: usize) -> Vec<Change> {
    let t = table();
    (0..n)
        .map(|i| {
            let id = i as i64 + 1;
            Change {
                position: Position::new(Lsn(0x1000 + (i as u128 / 100)), (i % 100) as u32 + 1),
                op: if i % 10 == 9 { Op::Update } else { Op::Insert },
                table: t.clone(),
                key: vec![Value::Int8(id)].into(),
                old_key: None,
                values: vec![
                    Value::Int8(id),
                    Value::Text(format!("customer{id}@example.com").into()),
                    Value::Text(format!("Customer Number {id}").into()),
                    Value::Numeric(format!("{}.{:02}", id * 7, id % 100).into()),
                    Value::Text("active".into()),
                    Value::TimestampTz(1_700_000_000_000_000 + id),
                    Value::Bool(id % 2 == 0),
                    Value::Text("a short note about this customer".into()),
                ],
            }
        })
        .collect()
}

/// rust-mask's rule, natively.
fn mask_text(s: &str) -> String {
    let Some(first) = s.chars().next() else {
        return String::new();
    };
    let mut out = String::with_capacity(8 + s.len().min(64));
    out.push(first);
    out.push_str("***");
    if let Some(at) = s.rfind('@') {
        out.push_str(&s[at..]);
    }
    out
}

fn native_pass(changes: Vec<Change>) -> Vec<(usize, Change)> {
    changes.into_iter().enumerate().collect()
}

fn native_mask(changes: Vec<Change>) -> Vec<(usize, Change)> {
    changes
        .into_iter()
        .map(|mut c| {
            let masked: Vec<usize> = c
                .table
                .columns
                .iter()
                .enumerate()
                .filter(|(_, col)| col.name == "email")
                .map(|(i, _)| i)
                .collect();
            for i in masked {
                if let Some(Value::Text(s)) = c.values.get_mut(i) {
                    *s = mask_text(s).into();
                }
            }
            c
        })
        .enumerate()
        .collect()
}

/// Median µs per change over `batches` calls of `f` on fresh copies of `input`.
fn measure(
    batches: usize,
    input: &[Change],
    mut f: impl FnMut(Vec<Change>) -> Vec<(usize, Change)>,
) -> (f64, Vec<(usize, Change)>) {
    let mut last = Vec::new();
    for _ in 0..3 {
        last = f(input.to_vec());
    }
    let mut samples = Vec::with_capacity(batches);
    for _ in 0..batches {
        let copy = input.to_vec();
        let started = Instant::now();
        let out = f(copy);
        samples.push(started.elapsed().as_secs_f64() * 1e6 / input.len() as f64);
        // Dropping the output is the sink's business, not the transform's: outside the timing.
        last = out;
    }
    samples.sort_by(f64::total_cmp);
    (samples[samples.len() / 2], last)
}

fn spec(module: &str, config: &[(&str, &str)]) -> TransformSpec {
    TransformSpec {
        module: guest(module),
        module_label: format!("{module}.wasm"),
        config: config
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        limits: TransformLimits {
            memory: 256 << 20,
            timeout: Duration::from_secs(10),
            output: 256 << 20,
        },
        on_error: OnError::Halt,
        dead_letter: std::env::temp_dir().join("zipline-bench.deadletter.jsonl"),
        batch_size: 1000,
        row_filter: false,
    }
}

fn per_change(batches: usize) {
    let input = batch(1000);
    println!(
        "per-change cost, batches of {} changes, 8 columns (median of {batches} batches):",
        input.len()
    );
    let (pass, _) = measure(batches, &input, native_pass);
    let (mask, masked) = measure(batches, &input, native_mask);
    println!("  native      pass-through {pass:>8.3} µs/change   mask {mask:>8.3} µs/change");
    type Config<'a> = &'a [(&'a str, &'a str)];
    // (language, module, config that touches nothing, what the second config does, it)
    let guests: [(&str, &str, Config, &str, Config); 5] = [
        ("Rust", "rust-mask", &[], "mask", &[("columns", "email")]),
        (
            "C",
            "c-drop-hash",
            &[("hash", "no_such_column")],
            "hash",
            &[("hash", "email")],
        ),
        (
            "Go",
            "go-split",
            &[("table", "public.no_such_table")],
            "split",
            &[("table", "public.customers"), ("columns", "status")],
        ),
        (
            "Python",
            "python-rename",
            &[("tables", "public.no_such_table=x")],
            "rename",
            &[("tables", "public.customers=crm.customers")],
        ),
        (
            "JavaScript",
            "js-mask",
            &[("columns", "no_such_column")],
            "mask",
            &[("columns", "email")],
        ),
    ];
    let only = std::env::var("ZIPLINE_BENCH_GUESTS").unwrap_or_default();
    for (lang, module, pass_cfg, work, work_cfg) in guests {
        if !only.is_empty() && !only.split(',').any(|g| lang.eq_ignore_ascii_case(g)) {
            continue;
        }
        if !guest(module).exists() {
            println!(
                "  {lang:<11} skipped: {} not built (`.ci/run guests`)",
                guest(module).display()
            );
            continue;
        }
        let loaded = Instant::now();
        let mut t =
            Transformer::new("bench", &spec(module, pass_cfg)).expect("pass-through transform");
        let load_ms = loaded.elapsed().as_secs_f64() * 1e3;
        let (pass, out) = measure(batches, &input, |c| t.transform(c).expect("transform"));
        assert_eq!(out.len(), input.len());
        let mut t = Transformer::new("bench", &spec(module, work_cfg)).expect("transform");
        let (cost, out) = measure(batches, &input, |c| t.transform(c).expect("transform"));
        match module {
            "rust-mask" => assert_eq!(out, masked, "the Rust guest and the native mask disagree"),
            "go-split" => assert_eq!(out.len(), 2 * input.len(), "one audit row per change"),
            "python-rename" => assert_eq!(out[0].1.table.schema, "crm"),
            _ => assert_ne!(
                out[0].1.values[1], input[0].values[1],
                "{module} left email as is"
            ),
        }
        println!(
            "  {lang:<11} pass-through {pass:>8.3} µs/change   {work:<6} {cost:>8.3} µs/change   (load {load_ms:.0} ms)"
        );
    }
}

/// Backlog transactions and the number of row changes they make.
fn generate(changes: usize) -> (Vec<String>, usize) {
    let mut txs = Vec::new();
    let mut count = 0;
    let mut next = 1i64;
    let mut live: std::collections::VecDeque<i64> = Default::default();
    for tx in 0..changes.div_ceil(100) {
        let inserts: Vec<String> = (0..60)
            .map(|_| {
                let id = next;
                next += 1;
                live.push_back(id);
                format!(
                    "({id}, 'person{id}@example.com', {}, {}.{:02})",
                    id % 1000,
                    id % 5000,
                    id % 100
                )
            })
            .collect();
        let mut sql = format!(
            "BEGIN;INSERT INTO items (id, name, qty, price) VALUES {};",
            inserts.join(",")
        );
        count += inserts.len();
        if live.len() > 200 {
            count += 40;
            let upd: Vec<String> = live
                .iter()
                .skip(tx % 50)
                .step_by(3)
                .take(30)
                .map(i64::to_string)
                .collect();
            sql.push_str(&format!(
                "UPDATE items SET qty = qty + 1, name = 'u' || name WHERE id IN ({});",
                upd.join(",")
            ));
            let del: Vec<String> = (0..10)
                .filter_map(|_| live.pop_front())
                .map(|i| i.to_string())
                .collect();
            sql.push_str(&format!(
                "DELETE FROM items WHERE id IN ({});",
                del.join(",")
            ));
        }
        sql.push_str("COMMIT;");
        txs.push(sql);
    }
    (txs, count)
}

/// `, N guest calls of M changes on average`, from the `transform stopped` line of a log.
fn calls_made(log: &std::path::Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let Some(line) = text.lines().find(|l| l.contains("transform stopped")) else {
        return ", no `transform stopped` line in the log".into();
    };
    let field = |name: &str| -> Option<f64> {
        let rest = line.split(&format!("{name}=")).nth(1)?;
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    match (field("calls"), field("changes_in")) {
        (Some(calls), Some(changes)) if calls > 0.0 => format!(
            ", {calls} guest calls of {:.0} changes on average",
            changes / calls
        ),
        _ => format!(", unreadable: {line}"),
    }
}

/// The slots of `rounds` alternating runs: `plain1, wasm1, plain2, wasm2, …`.
fn runs(rounds: usize) -> Vec<String> {
    (1..=rounds)
        .flat_map(|r| [format!("plain{r}"), format!("wasm{r}")])
        .collect()
}

async fn pipeline(changes: usize, rounds: usize) {
    let pg = common::Postgres::start();
    let my = common::MariaDb::start();
    pg.create_database("bench");
    pg.psql("bench", "CREATE TABLE items (id bigint PRIMARY KEY, name text NOT NULL, qty int NOT NULL, price numeric(12,2) NOT NULL)");
    pg.psql("bench", "CREATE PUBLICATION zbench FOR TABLE items");
    let dir = tempfile::tempdir().expect("tempdir");
    // Each run's pipeline creates its slot first (see `prime`), before the backlog.
    for slot in runs(rounds) {
        my.create_database(&slot);
        my.sql(&slot, "CREATE TABLE items (id BIGINT PRIMARY KEY, name VARCHAR(64) NOT NULL, qty INT NOT NULL, price DECIMAL(12,2) NOT NULL)");
        let transform = if slot.starts_with("wasm") {
            format!(
                "    transform:\n      module: {}\n      config: {{ columns: name }}\n",
                guest("rust-mask").display()
            )
        } else {
            String::new()
        };
        std::fs::write(
            dir.path().join(format!("{slot}.yaml")),
            format!(
                "name: {slot}\nconnectors:\n  - name: pg\n    type: source/postgres\n    host: 127.0.0.1\n    port: {}\n    database: bench\n    user: postgres\n    publication: zbench\n    slot_name: {slot}\n    tables: [public.items]\n    snapshot: never\n  - name: my\n    type: sink/mysql\n    host: 127.0.0.1\n    port: {}\n    database: {slot}\n    user: root\n    lanes: 4\nroutes:\n  - from: pg\n    to: [my]\n{transform}",
                pg.port, my.port
            ),
        )
        .expect("write yaml");
        let log = dir.path().join(format!("{slot}.prime.log"));
        prime(
            &pg,
            "bench",
            &slot,
            &dir.path().join(format!("{slot}.yaml")),
            &log,
        );
    }
    let client = pg.client("bench").await;
    let (txs, changes) = generate(changes);
    for sql in &txs {
        client
            .batch_execute(sql)
            .await
            .expect("backlog transaction");
    }
    let end_lsn = pg.psql("bench", "SELECT pg_current_wal_lsn()");
    println!(
        "pipeline: backlog of {changes} changes in {} transactions, 4 lanes, {rounds} alternating rounds:",
        txs.len()
    );
    let keep_logs = std::env::var_os("ZIPLINE_BENCH_KEEP_LOGS").is_some();
    if keep_logs {
        println!(
            "  pipeline configs and logs kept in {}",
            dir.path().display()
        );
    }
    // Seconds spent without and with the transform, summed over the rounds.
    let (mut plain_secs, mut wasm_secs) = (0.0, 0.0);
    for slot in runs(rounds) {
        let wasm = slot.starts_with("wasm");
        let yaml = dir.path().join(format!("{slot}.yaml"));
        let log = std::fs::File::create(dir.path().join(format!("{slot}.log"))).expect("log");
        let started = Instant::now();
        let mut child = std::process::Command::new(common::zipline_bin())
            .args(["pipeline", "apply", "--log-format", "text", "-f"])
            .arg(&yaml)
            .stderr(log)
            .spawn()
            .expect("spawn zipline");
        loop {
            let done = pg.psql("bench", &format!("SELECT confirmed_flush_lsn >= '{end_lsn}' FROM pg_replication_slots WHERE slot_name = '{slot}'"));
            if done == "t" {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "zipline ({slot}) exited early with {status}: {}",
                    std::fs::read_to_string(dir.path().join(format!("{slot}.log")))
                        .unwrap_or_default()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(1800),
                "no catch-up in 30 minutes"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let secs = started.elapsed().as_secs_f64();
        let cpu = proc_stat(child.id()).1;
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let _ = child.wait();
        let calls = if wasm {
            wasm_secs += secs;
            calls_made(&dir.path().join(format!("{slot}.log")))
        } else {
            plain_secs += secs;
            String::new()
        };
        println!(
            "  {slot:<7} {:<23} {changes} changes in {secs:.2}s = {:.0} changes/s (zipline CPU {cpu:.2}s){calls}",
            if wasm {
                "with the Rust transform"
            } else {
                "without a transform"
            },
            changes as f64 / secs
        );
    }
    let total = (changes * rounds) as f64;
    let (plain_rate, wasm_rate) = (total / plain_secs, total / wasm_secs);
    println!("  without a transform, all rounds: {plain_rate:.0} changes/s");
    println!("  with the Rust transform, all rounds: {wasm_rate:.0} changes/s");
    println!("  ratio with/without: {:.2}", wasm_rate / plain_rate);
    let count = |db: &str| {
        my.sql(
            db,
            "SELECT CONCAT(COUNT(*), ':', SUM(qty), ':', SUM(name LIKE '%***%')) FROM items",
        )
    };
    let (plain, wasm) = (count("plain1"), count("wasm1"));
    println!("  sinks (rows:sum(qty):masked) plain {plain}, wasm {wasm}");
    assert_eq!(
        plain.split(':').take(2).collect::<Vec<_>>(),
        wasm.split(':').take(2).collect::<Vec<_>>()
    );
    if keep_logs {
        let _ = dir.keep();
    }
}

fn main() {
    // Outside any runtime, as a route's transform thread is: WASI guests (Go) block on their
    // own small runtime inside calls.
    per_change(env_or("ZIPLINE_BENCH_BATCHES", 200));
    if std::env::var_os("ZIPLINE_BENCH_SKIP_PIPELINE").is_none() {
        let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
        rt.block_on(pipeline(
            env_or("ZIPLINE_BENCH_CHANGES", 500_000),
            env_or("ZIPLINE_BENCH_ROUNDS", 2).max(1),
        ));
    }
}
