//! One 1,000,000-row transaction, PostgreSQL → MariaDB: Zipline's peak memory while the
//! server streams it in progress (pgoutput protocol 2) and Zipline spills it to disk, then
//! applies it at commit. Prints the apply rate, peak RSS and how the server sent it.
//!
//! `cargo bench --bench large_tx` (env: `ZIPLINE_BENCH_ROWS`, default 1,000,000;
//! `ZIPLINE_BENCH_WRAP` as in the backlog benchmarks). Zipline primes its own slot first: a
//! slot made by hand would be refused as a sink that lost its state.

#[path = "../tests/common/mod.rs"]
pub mod common;
pub mod common_backlog;

use std::time::{Duration, Instant};

use common_backlog::{prime, spawn_zipline};

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Bytes in the files under `dir`: the spill files sit in a directory per run.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn main() {
    let rows: u64 = std::env::var("ZIPLINE_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let pg = common::Postgres::start();
    let my = common::MariaDb::start();
    pg.create_database("bench");
    pg.psql(
        "bench",
        "CREATE TABLE items (id bigint PRIMARY KEY, name text NOT NULL, qty int NOT NULL, price numeric(12,2) NOT NULL, note text)",
    );
    pg.psql("bench", "CREATE PUBLICATION zbig FOR TABLE items");
    my.create_database("zl");
    my.sql(
        "zl",
        "CREATE TABLE items (id BIGINT PRIMARY KEY, name VARCHAR(64) NOT NULL, qty INT NOT NULL, price DECIMAL(12,2) NOT NULL, note TEXT)",
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = dir.path().join("big.yaml");
    std::fs::write(
        &yaml,
        format!(
            "name: big\nconnectors:\n  - name: pg\n    type: source/postgres\n    host: 127.0.0.1\n    port: {}\n    database: bench\n    user: postgres\n    publication: zbig\n    slot_name: zbig\n    snapshot: never\n    tables: [public.items]\n    spill_dir: {}\n  - name: my\n    type: sink/mysql\n    host: 127.0.0.1\n    port: {}\n    database: zl\n    user: root\nroutes:\n  - from: pg\n    to: [my]\n",
            pg.port,
            dir.path().join("spill").display(),
            my.port
        ),
    )
    .expect("write yaml");
    // Zipline creates the slot and records where the pipeline starts; the transaction written
    // next is then caught up as after an outage.
    prime(&pg, "bench", "zbig", &yaml, &dir.path().join("prime.log"));
    let started = Instant::now();
    pg.psql(
        "bench",
        &format!(
            "INSERT INTO items SELECT g, 'item-' || g, g % 10000, (g % 100000) / 100.0, repeat('x', 40) FROM generate_series(1, {rows}) g"
        ),
    );
    let end_lsn = pg.psql("bench", "SELECT pg_current_wal_lsn()");
    println!(
        "one transaction of {rows} rows written in {:.1}s",
        started.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    let mut child = spawn_zipline(&yaml, &dir.path().join("zipline.log"));
    let pid = child.id();
    let mut peak = 0;
    let mut spill_peak = 0u64;
    loop {
        peak = peak.max(peak_rss_kib(pid));
        let spilled = dir_bytes(&dir.path().join("spill"));
        spill_peak = spill_peak.max(spilled);
        let done = pg.psql(
            "bench",
            &format!("SELECT confirmed_flush_lsn >= '{end_lsn}' FROM pg_replication_slots WHERE slot_name = 'zbig'"),
        );
        if done == "t" {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "zipline exited early with {status}: {}",
                std::fs::read_to_string(dir.path().join("zipline.log")).unwrap_or_default()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "no catch-up in 30 minutes"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let secs = started.elapsed().as_secs_f64();
    peak = peak.max(peak_rss_kib(pid));
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let status = child.wait().expect("wait zipline");
    let streamed = pg.psql(
        "bench",
        "SELECT stream_txns || ' streamed transaction(s) in ' || stream_count || ' blocks, ' || pg_size_pretty(stream_bytes) FROM pg_stat_replication_slots WHERE slot_name = 'zbig'",
    );
    let count = my.sql("zl", "SELECT COUNT(*) FROM items");
    println!("server sent it as   : {streamed}");
    println!(
        "zipline applied     : {count} rows in {secs:.2}s = {:.0} rows/s (exit {status})",
        rows as f64 / secs
    );
    println!(
        "zipline peak RSS    : {:.1} MiB (target < 200 MiB); spill file peak {:.1} MiB",
        peak as f64 / 1024.0,
        spill_peak as f64 / 1_048_576.0
    );
    assert_eq!(count, rows.to_string(), "the sink should hold every row");
}
