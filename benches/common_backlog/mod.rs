//! Shared by the benchmarks (`benches/replication.rs`, `benches/pg_vs_native.rs`): the
//! deterministic backlog generator, per-process CPU and memory accounting, and starting and
//! watching a `zipline` process.
//!
//! A directory module rather than `benches/common_backlog.rs`: Cargo would build a file
//! directly under `benches/` as a benchmark target of its own.
//!
//! The backlog: transactions of 100 changes (60 inserts, 30 updates, 10 deletes of rows
//! inserted earlier) on `items`, written as SQL text, plus the same changes as an op stream in
//! the order pgoutput sends them (statement order, rows in statement order). A generator made
//! by `Generator::with_existing` also updates and deletes rows the table held beforehand.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::common::Postgres;

/// The benchmarked table on PostgreSQL.
pub const ITEMS_PG: &str = "CREATE TABLE items (id bigint PRIMARY KEY, name text NOT NULL, \
    qty int NOT NULL, price numeric(12,2) NOT NULL, updated_at timestamptz NOT NULL)";

#[derive(Clone)]
pub struct Row {
    pub id: i64,
    pub name: String,
    pub qty: i32,
    pub price: String,
    /// Seconds after 2024-01-01 00:00:00 UTC.
    pub updated_at: i64,
}

#[derive(Clone)]
pub enum Op {
    Upsert(Row),
    Delete(i64),
}

impl Op {
    pub fn id(&self) -> i64 {
        match self {
            Op::Upsert(r) => r.id,
            Op::Delete(id) => *id,
        }
    }
}

/// Source settings from the environment, as YAML lines of the source entry:
/// `ZIPLINE_BENCH_BINARY_VALUES` sets `binary_values` (`false` reads values in text, to compare
/// with the default, binary).
pub fn source_settings() -> String {
    std::env::var("ZIPLINE_BENCH_BINARY_VALUES")
        .map(|v| format!("    binary_values: {v}\n"))
        .unwrap_or_default()
}

/// `name`'s value as a number, or `default`.
pub fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A tiny deterministic generator, so every run writes the same backlog.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

fn row(id: i64, tx: usize, rng: &mut Rng) -> Row {
    Row {
        id,
        name: format!("item-{id}-{}", rng.below(1000)),
        qty: rng.below(10_000) as i32,
        price: format!("{}.{:02}", rng.below(100_000), rng.below(100)),
        updated_at: tx as i64,
    }
}

/// The backlog of `changes` changes: transactions as SQL text, and the op stream.
pub fn generate(changes: usize) -> (Vec<String>, Vec<Op>) {
    let mut g = Generator::new(1, 0x5EED_2210_4471);
    let mut txs = Vec::new();
    let mut ops = Vec::with_capacity(changes);
    for _ in 0..changes.div_ceil(100) {
        let (sql, tx_ops) = g.next_tx("");
        txs.push(sql);
        ops.extend(tx_ops);
    }
    (txs, ops)
}

/// Transactions of 100 changes, one at a time; ids start at `first_id`, so generators with
/// far-apart starts never touch each other's rows.
pub struct Generator {
    rng: Rng,
    live: Vec<i64>,
    next_id: i64,
    tx: usize,
}

impl Generator {
    pub fn new(first_id: i64, seed: u64) -> Generator {
        Generator {
            rng: Rng(seed),
            live: Vec::new(),
            next_id: first_id,
            tx: 0,
        }
    }

    /// Like `new`, for a table that already holds the rows `existing` (all below `first_id`):
    /// updates and deletes pick among those as well as among the rows inserted since.
    pub fn with_existing(
        first_id: i64,
        existing: std::ops::RangeInclusive<i64>,
        seed: u64,
    ) -> Generator {
        assert!(
            existing.is_empty() || *existing.end() < first_id,
            "new ids from {first_id} would collide with the existing rows {existing:?}"
        );
        let mut g = Generator::new(first_id, seed);
        g.live.extend(existing);
        g
    }

    /// The next transaction as SQL (`BEGIN; … ; <extra> COMMIT;`) and its ops.
    pub fn next_tx(&mut self, extra: &str) -> (String, Vec<Op>) {
        let (rng, live, tx) = (&mut self.rng, &mut self.live, self.tx);
        self.tx += 1;
        let mut inserts = Vec::new();
        for _ in 0..60 {
            inserts.push(row(self.next_id, tx, rng));
            self.next_id += 1;
        }
        let mut picked = HashSet::new();
        let mut updates = Vec::new();
        let mut deletes = Vec::new();
        while updates.len() < 30 && live.len() > 100 {
            let id = live[rng.below(live.len())];
            if picked.insert(id) {
                updates.push(row(id, tx, rng));
            }
        }
        while deletes.len() < 10 && live.len() > 100 {
            let i = rng.below(live.len());
            if picked.insert(live[i]) {
                deletes.push(live.swap_remove(i));
            }
        }
        let values = |rows: &[Row]| {
            rows.iter()
                .map(|r| {
                    format!(
                        "({}, '{}', {}, {}, timestamptz '2024-01-01 00:00:00+00' + interval '{} seconds')",
                        r.id, r.name, r.qty, r.price, r.updated_at
                    )
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut sql = String::from("BEGIN;");
        let _ = write!(
            sql,
            "INSERT INTO items (id, name, qty, price, updated_at) VALUES {};",
            values(&inserts)
        );
        if !updates.is_empty() {
            let _ = write!(
                sql,
                "UPDATE items SET name = v.name, qty = v.qty, price = v.price, updated_at = v.updated_at FROM (VALUES {}) v(id, name, qty, price, updated_at) WHERE items.id = v.id;",
                values(&updates)
            );
        }
        if !deletes.is_empty() {
            let ids: Vec<String> = deletes.iter().map(i64::to_string).collect();
            let _ = write!(sql, "DELETE FROM items WHERE id IN ({});", ids.join(","));
        }
        sql.push_str(extra);
        sql.push_str("COMMIT;");
        live.extend(inserts.iter().map(|r| r.id));
        let mut ops: Vec<Op> = inserts.into_iter().map(Op::Upsert).collect();
        ops.extend(updates.into_iter().map(Op::Upsert));
        ops.extend(deletes.into_iter().map(Op::Delete));
        (sql, ops)
    }
}

/// Peak resident memory (KiB) and CPU seconds (user + system) of process `pid` so far.
pub fn proc_stat(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm_kb = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    (hwm_kb, ticks as f64 / 100.0)
}

/// Context switches (voluntary and involuntary) of every thread of process `pid` so far.
pub fn context_switches(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// CPU seconds used so far by `root` and every descendant, live or reaped.
pub fn tree_cpu(root: u32) -> f64 {
    let mut parent_of = Vec::new();
    let mut ticks_of = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        let num = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        parent_of.push((pid, num(1) as u32));
        // utime, stime, and the reaped children's cutime, cstime.
        ticks_of.insert(pid, num(11) + num(12) + num(13) + num(14));
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree.iter().filter_map(|p| ticks_of.get(p)).sum::<u64>() as f64 / 100.0
}

/// CPU seconds of a server's process tree (0 when it is not running).
pub fn server_cpu(pg: &Postgres) -> f64 {
    pg.pid().map_or(0.0, tree_cpu)
}

/// Starts `zipline pipeline apply -f <yaml>`, output to `log`. `ZIPLINE_BENCH_WRAP` runs it
/// under a profiler, e.g. `perf record -g -o /tmp/zl.data --`.
pub fn spawn_zipline(yaml: &Path, log: &Path) -> Child {
    let wrap: Vec<String> = std::env::var("ZIPLINE_BENCH_WRAP")
        .map(|w| w.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    let mut command = match wrap.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(crate::common::zipline_bin());
            c
        }
        None => Command::new(crate::common::zipline_bin()),
    };
    let out = std::fs::File::create(log).expect("creating the zipline log");
    command
        .args(["pipeline", "apply", "--log-format", "text", "-f"])
        .arg(yaml)
        .stderr(out)
        .spawn()
        .expect("spawn zipline")
}

/// Waits until slot `slot` on `pg` (database `db`) has confirmed `end_lsn`, failing if
/// `child` exits first or after 30 minutes. Returns the child's peak RSS (KiB) and CPU
/// seconds at that moment.
pub fn wait_confirmed(
    pg: &Postgres,
    db: &str,
    slot: &str,
    end_lsn: &str,
    child: &mut Child,
    log: &Path,
) -> (u64, f64) {
    let started = Instant::now();
    loop {
        let done = pg.psql(
            db,
            &format!(
                "SELECT confirmed_flush_lsn >= '{end_lsn}' FROM pg_replication_slots \
                 WHERE slot_name = '{slot}'"
            ),
        );
        let stat = proc_stat(child.id());
        if done == "t" {
            return stat;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "zipline exited early with {status}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "zipline did not catch up in 30 minutes"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `zipline pipeline apply -f <yaml>` (whose source must say `snapshot: never`) until
/// its slot `slot` on `pg` (database `db`) is active, then stops it: Zipline has created the
/// slot and recorded in the sink where the pipeline starts. A backlog written after this
/// replays from there, as after an outage. (A slot made by hand would be refused: the sink
/// would hold nothing of a slot that already exists.)
pub fn prime(pg: &Postgres, db: &str, slot: &str, yaml: &Path, log: &Path) {
    let mut child = spawn_zipline(yaml, log);
    let started = Instant::now();
    let active =
        format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active");
    while pg.psql(db, &active) != "1" {
        assert!(
            started.elapsed() < Duration::from_secs(60)
                && child.try_wait().expect("zipline").is_none(),
            "zipline did not start streaming from {slot}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = stop_zipline(child);
    assert!(status.success(), "priming run of {slot} exited {status}");
}

/// SIGTERM and wait.
pub fn stop_zipline(mut child: Child) -> std::process::ExitStatus {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    child.wait().expect("wait zipline")
}
