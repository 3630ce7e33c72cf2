//! PostgreSQL → PostgreSQL: Zipline against PostgreSQL's own logical replication
//! (`CREATE SUBSCRIPTION`), in one run on one machine.
//!
//! Two throwaway clusters: the source (database `bench`, table `items` and the `ticks` table
//! the live phase uses, publication `zbench`) and the target (databases `native` and `zl`,
//! same tables). Before any change is written, a subscription `nsub` is created on `native`
//! with `copy_data = false, enabled = false` (its slot starts retaining WAL), and Zipline runs
//! until it has created its slot `zbench` and recorded its start in the sink, then stops (a
//! slot made by hand would be refused: the sink would hold nothing of it). Then:
//!
//! - **set-up** (`ZIPLINE_BENCH_SETUP`): `empty` (the default) starts `items` empty everywhere,
//!   so the backlog's updates and deletes hit rows it inserted itself. `prefilled` is closer to
//!   production: before the subscription and the slot are created (so neither replicates them),
//!   `ZIPLINE_BENCH_PREFILL` rows (default: `ZIPLINE_BENCH_CHANGES`), ids 1 to N, are loaded
//!   into `items` on the source and in both target databases, each by one server-side `INSERT
//!   … SELECT … FROM generate_series` computing every column from the id (so all three hold the
//!   same rows), then `VACUUM ANALYZE` and `CHECKPOINT`. The backlog then inserts ids from N + 1
//!   and its updates and deletes pick among all live rows, prefilled or inserted. The live
//!   phase is the same in both set-ups: its writer updates and deletes only rows it inserted.
//! - **(a) native backlog**: a backlog of `ZIPLINE_BENCH_CHANGES` changes (default 1,000,000;
//!   100 per transaction: 60 inserts, 30 updates, 10 deletes) is written; the subscription is
//!   enabled and timed until the target shows the backlog's last transaction (a marker in
//!   `ticks`; the apply worker applies transactions in order), and until the source's slot
//!   has confirmed the backlog's end. Then it is disabled.
//! - **(b) Zipline backlog**: `zipline pipeline apply` (sink `sink/postgres` into `zl`) catches
//!   up the same backlog from its slot, timed the same two ways.
//! - **apply strategies** (`ZIPLINE_BENCH_STRATEGY_CHANGES`, default 200,000; 0 skips): the
//!   first changes of the backlog written straight into the target with three statement
//!   strategies (see `pg_vs_native/strategies.rs`), to justify the one the sink uses; each
//!   strategy's database is prefilled like the targets.
//! - **(c) live**: a writer offers `ZIPLINE_BENCH_LIVE_RATE` changes/s (default 10,000) for
//!   `ZIPLINE_BENCH_LIVE_SECS` seconds (default 30) to each system in turn (native, then
//!   Zipline, each first caught up), measuring every transaction's commit-to-visible lag (see
//!   `pg_vs_native/live.rs`).
//!
//! Phases run one at a time so neither system competes with the other for the two cores.
//! Prints throughputs and their ratio, lags, CPU seconds per process tree (and, for the backlog
//! phases, CPU µs per change), Zipline's peak RSS, and checks that the source and both targets
//! end identical. Result lines carry the set-up's name, so runs can be told apart.
//!
//! `cargo bench --bench pg_vs_native` (env: the above, `ZIPLINE_BENCH_SETUP` (`empty`),
//! `ZIPLINE_BENCH_PREFILL` (`ZIPLINE_BENCH_CHANGES`), `ZIPLINE_BENCH_LANES` (4),
//! `ZIPLINE_BENCH_BATCH` (1000), `ZIPLINE_BENCH_WRAP` to run Zipline under a profiler,
//! `ZIPLINE_BENCH_ONLY=zipline` to run the Zipline backlog phase alone, for profiling,
//! `ZIPLINE_BENCH_BINARY_VALUES=false` to read values in text).

#[path = "../tests/common/mod.rs"]
pub mod common;
pub mod common_backlog;
#[path = "pg_vs_native/live.rs"]
mod live;
#[path = "pg_vs_native/strategies.rs"]
mod strategies;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Postgres;
use common_backlog::{
    Generator, ITEMS_PG, Op, context_switches, env_or, prime, proc_stat, server_cpu, spawn_zipline,
    stop_zipline,
};
use live::ms;
use strategies::Strategy;
use zipline::change::Value;

const SRC_DB: &str = "bench";
/// Tick value of the backlog's last transaction.
const MARKER: i64 = 1_000_000_000;
/// First id the live phase inserts; the prefill and the backlog stay below it.
const LIVE_FIRST_ID: i64 = 100_000_000;

/// The set-up's name and how many rows `items` holds before the backlog (ids 1 to that).
fn read_setup(changes: usize) -> (&'static str, usize) {
    match std::env::var("ZIPLINE_BENCH_SETUP").as_deref() {
        Err(_) | Ok("empty") => ("empty", 0),
        Ok("prefilled") => ("prefilled", env_or("ZIPLINE_BENCH_PREFILL", changes)),
        Ok(other) => panic!("ZIPLINE_BENCH_SETUP must be `empty` or `prefilled`, not `{other}`"),
    }
}

/// Loads ids 1 to `rows` into `db`'s empty `items`, every column computed from the id alone so
/// that every database gets the same rows (names shaped like the backlog's, timestamps on the
/// day before it). Then `VACUUM ANALYZE`, so the backlog meets a settled table (visibility map,
/// statistics), and `CHECKPOINT`, so the load's dirty pages are written now rather than during
/// a timed phase.
fn prefill(pg: &Postgres, db: &str, rows: usize) {
    if rows == 0 {
        return;
    }
    pg.psql(
        db,
        &format!(
            "INSERT INTO items (id, name, qty, price, updated_at) \
             SELECT g, 'item-' || g || '-' || (g * 7919 % 1000), g * 104729 % 10000, \
             g * 15485863 % 10000000 / 100.0, \
             timestamptz '2023-12-31 00:00:00+00' + (g % 86400) * interval '1 second' \
             FROM generate_series(1, {rows}::bigint) g; \
             VACUUM ANALYZE items; CHECKPOINT;"
        ),
    );
}

/// Keys of `ticks`, one owned by each of Zipline's `lanes` lanes.
fn tick_keys(lanes: usize) -> Vec<i32> {
    let mut keys = vec![None; lanes];
    let mut k = 0;
    while keys.iter().any(Option::is_none) {
        k += 1;
        let lane = zipline::lane::lane_of("public", "ticks", &[Value::Int4(k)], lanes as u32);
        keys[lane as usize].get_or_insert(k);
    }
    keys.into_iter().flatten().collect()
}

fn tables_sql(ticks: &[i32]) -> String {
    let rows: Vec<String> = ticks.iter().map(|k| format!("({k}, 0)")).collect();
    format!(
        "{ITEMS_PG}; CREATE TABLE ticks (id int PRIMARY KEY, seq bigint NOT NULL); \
         INSERT INTO ticks VALUES {};",
        rows.join(",")
    )
}

/// Whole-table checksum (row count and md5 of every row's text).
fn checksum(pg: &Postgres, db: &str) -> String {
    pg.psql(
        db,
        "SET TimeZone = 'UTC'; SELECT count(*) || ':' || md5(coalesce(string_agg(t::text, ';' \
         ORDER BY id), '')) FROM items t",
    )
}

/// CPU seconds used by the source and target clusters since `before`.
struct Cpu {
    src: f64,
    dst: f64,
}

impl Cpu {
    fn now(src: &Postgres, dst: &Postgres) -> Cpu {
        Cpu {
            src: server_cpu(src),
            dst: server_cpu(dst),
        }
    }
    fn since(&self, src: &Postgres, dst: &Postgres) -> Cpu {
        let now = Cpu::now(src, dst);
        Cpu {
            src: now.src - self.src,
            dst: now.dst - self.dst,
        }
    }
    /// The per-change line of a phase that applied `changes` changes, Zipline having used
    /// `zipline` CPU seconds in it (`None` in the native phase, where it does not run).
    fn per_change(&self, zipline: Option<f64>, changes: usize) -> String {
        let us = |secs: f64| secs * 1e6 / changes as f64;
        let mut line = format!(
            "CPU µs per change: source {:.1}, target {:.1}",
            us(self.src),
            us(self.dst),
        );
        if let Some(zipline) = zipline {
            line.push_str(&format!(", zipline {:.1}", us(zipline)));
        }
        line
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Polls until the target `db` shows tick `seq` on every row, and until slot `slot` on the
/// source has confirmed `end_lsn`; returns the times since `started` for both (the target
/// side first). `alive` fails the wait when the replicator died.
async fn wait_done(
    src: &tokio_postgres::Client,
    dst: &tokio_postgres::Client,
    slot: &str,
    seq: i64,
    end_lsn: &str,
    started: Instant,
    mut alive: impl FnMut(),
) -> (f64, f64) {
    let (mut applied, mut confirmed) = (None, None);
    loop {
        if applied.is_none() {
            let min: i64 = dst
                .query_one("SELECT min(seq) FROM ticks", &[])
                .await
                .expect("polling ticks")
                .get(0);
            if min >= seq {
                applied = Some(started.elapsed().as_secs_f64());
            }
        }
        if confirmed.is_none() {
            let done: bool = src
                .query_one(
                    "SELECT coalesce(confirmed_flush_lsn >= $2::text::pg_lsn, false) \
                     FROM pg_replication_slots WHERE slot_name = $1",
                    &[&slot, &end_lsn],
                )
                .await
                .expect("polling the slot")
                .get(0);
            if done {
                confirmed = Some(started.elapsed().as_secs_f64());
            }
        }
        if let (Some(a), Some(c)) = (applied, confirmed) {
            return (a, c);
        }
        alive();
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "no catch-up within 30 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pipeline_yaml(src: &Postgres, dst: &Postgres, lanes: usize, batch: usize) -> String {
    format!(
        "name: bench
settings: {{ progress_interval: 5s }}
connectors:
  - name: src
    type: source/postgres
    host: 127.0.0.1
    port: {}
    database: {SRC_DB}
    user: postgres
    publication: zbench
    slot_name: zbench
    snapshot: never
{}  - name: dst
    type: sink/postgres
    host: 127.0.0.1
    port: {}
    database: zl
    user: postgres
    lanes: {lanes}
    batch_size: {batch}
routes:
  - from: src
    to: [dst]
",
        src.port,
        common_backlog::source_settings(),
        dst.port
    )
}

fn zipline_alive(child: &mut std::process::Child, log: &Path) {
    if let Ok(Some(status)) = child.try_wait() {
        panic!(
            "zipline exited early with {status}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
}

#[tokio::main]
async fn main() {
    let changes = env_or("ZIPLINE_BENCH_CHANGES", 1_000_000);
    let (setup, prefilled) = read_setup(changes);
    let lanes = env_or("ZIPLINE_BENCH_LANES", 4);
    let batch = env_or("ZIPLINE_BENCH_BATCH", 1000);
    let live_secs = env_or("ZIPLINE_BENCH_LIVE_SECS", 30);
    let live_rate = env_or("ZIPLINE_BENCH_LIVE_RATE", 10_000);
    let only_zipline = std::env::var("ZIPLINE_BENCH_ONLY").is_ok_and(|v| v == "zipline");
    let strategy_changes = if only_zipline {
        0
    } else {
        env_or("ZIPLINE_BENCH_STRATEGY_CHANGES", 200_000)
    };
    // Each backlog transaction inserts at most 100 ids.
    assert!(
        prefilled + changes.div_ceil(100) * 100 < LIVE_FIRST_ID as usize,
        "ZIPLINE_BENCH_PREFILL + ZIPLINE_BENCH_CHANGES must stay below the live phase's ids \
         ({LIVE_FIRST_ID})"
    );
    println!(
        "set-up {setup}: items holds {prefilled} rows before the backlog; load average at \
         start: {}",
        load()
    );

    // A long wal_sender_timeout: a busy subscriber must not be cut off mid-catch-up.
    let src = Postgres::start_with(&[("wal_sender_timeout", "60s")]);
    let dst = Postgres::start();
    let ticks = tick_keys(lanes);
    let started = Instant::now();
    src.create_database(SRC_DB);
    src.psql(SRC_DB, &tables_sql(&ticks));
    prefill(&src, SRC_DB, prefilled);
    src.psql(SRC_DB, "CREATE PUBLICATION zbench FOR TABLE items, ticks");
    for db in ["native", "zl"] {
        dst.create_database(db);
        dst.psql(db, &tables_sql(&ticks));
        prefill(&dst, db, prefilled);
    }
    if prefilled > 0 {
        println!(
            "prefill: {prefilled} rows into the source and both targets in {:.1}s",
            started.elapsed().as_secs_f64()
        );
    }
    dst.psql(
        "native",
        &format!(
            "CREATE SUBSCRIPTION nsub CONNECTION 'host=127.0.0.1 port={} dbname={SRC_DB} \
             user=postgres' PUBLICATION zbench WITH (copy_data = false, enabled = false)",
            src.port
        ),
    );
    // Zipline creates its slot and records in the sink where the pipeline starts, then stops;
    // the backlog is written while no replicator runs, as after an outage.
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = dir.path().join("bench.yaml");
    std::fs::write(&yaml, pipeline_yaml(&src, &dst, lanes, batch)).expect("write yaml");
    prime(&src, SRC_DB, "zbench", &yaml, &dir.path().join("prime.log"));

    // The backlog, its last transaction carrying the marker tick; new ids follow the prefill's.
    let mut generator =
        Generator::with_existing(prefilled as i64 + 1, 1..=prefilled as i64, 0x5EED_2210_4471);
    let txs = changes.div_ceil(100);
    let writer = src.client(SRC_DB).await;
    let mut ops: Vec<Op> = Vec::with_capacity(changes.min(strategy_changes));
    // Counted rather than txs × 100: on an empty table the first transactions, with too few
    // live rows to pick from, only insert.
    let mut total = 0;
    let started = Instant::now();
    for i in 0..txs {
        let extra = if i + 1 == txs {
            format!("UPDATE ticks SET seq = {MARKER};")
        } else {
            String::new()
        };
        let (sql, tx_ops) = generator.next_tx(&extra);
        writer
            .batch_execute(&sql)
            .await
            .expect("backlog transaction");
        total += tx_ops.len();
        if ops.len() < strategy_changes {
            ops.extend(tx_ops);
        }
    }
    let end_lsn = src.psql(SRC_DB, "SELECT pg_current_wal_lsn()");
    println!(
        "backlog: {total} changes in {txs} transactions written in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let src_client = src.client(SRC_DB).await;

    // (a) Native logical replication.
    let native = dst.client("native").await;
    let cpu = Cpu::now(&src, &dst);
    let started = Instant::now();
    let (na_applied, na_confirmed) = if only_zipline {
        (f64::NAN, f64::NAN)
    } else {
        dst.psql("native", "ALTER SUBSCRIPTION nsub ENABLE");
        let done = wait_done(
            &src_client,
            &native,
            "nsub",
            MARKER,
            &end_lsn,
            started,
            || {},
        );
        let done = done.await;
        dst.psql("native", "ALTER SUBSCRIPTION nsub DISABLE");
        done
    };
    let na_cpu = cpu.since(&src, &dst);

    // (b) Zipline.
    let log = dir.path().join("zipline-backlog.log");
    let zl = dst.client("zl").await;
    let cpu = Cpu::now(&src, &dst);
    let started = Instant::now();
    let mut child = spawn_zipline(&yaml, &log);
    let (zl_applied, zl_confirmed) = wait_done(
        &src_client,
        &zl,
        "zbench",
        MARKER,
        &end_lsn,
        started,
        || zipline_alive(&mut child, &log),
    )
    .await;
    let (zl_rss, zl_cpu_s) = proc_stat(child.id());
    let zl_switches = context_switches(child.id());
    let zl_cpu = cpu.since(&src, &dst);
    let status = stop_zipline(child);
    let sums = [
        checksum(&src, SRC_DB),
        checksum(&dst, "native"),
        checksum(&dst, "zl"),
    ];
    let rate = |secs: f64| total as f64 / secs;
    println!(
        "(a) native backlog [{setup}]: {total} changes applied in {na_applied:.2}s = {:.0} \
         changes/s (slot confirmed after {na_confirmed:.2}s = {:.0}/s); CPU: source {:.1}s, \
         target {:.1}s",
        rate(na_applied),
        rate(na_confirmed),
        na_cpu.src,
        na_cpu.dst
    );
    // Zipline does not run in the native phase.
    println!("    {}", na_cpu.per_change(None, total));
    println!(
        "(b) zipline backlog [{setup}]: {total} changes applied in {zl_applied:.2}s = {:.0} \
         changes/s (slot confirmed after {zl_confirmed:.2}s = {:.0}/s); CPU: source {:.1}s, \
         target {:.1}s, zipline {zl_cpu_s:.1}s ({zl_switches} context switches); peak RSS \
         {:.1} MiB; {lanes} lanes, batch {batch}; exit {status}",
        rate(zl_applied),
        rate(zl_confirmed),
        zl_cpu.src,
        zl_cpu.dst,
        zl_rss as f64 / 1024.0
    );
    println!("    {}", zl_cpu.per_change(Some(zl_cpu_s), total));
    println!(
        "    ratio zipline/native [{setup}]: {:.2} (applied), {:.2} (confirmed); load average \
         now {}",
        na_applied / zl_applied,
        na_confirmed / zl_confirmed,
        load()
    );
    assert!(
        sums[0] == sums[2] && (only_zipline || sums[0] == sums[1]),
        "after the backlog the tables differ: source {}, native {}, zipline {}",
        sums[0],
        sums[1],
        sums[2]
    );
    if only_zipline {
        return;
    }

    // Apply strategies, on the first changes of the backlog.
    if !ops.is_empty() {
        for s in Strategy::ALL {
            let db = format!("s_{}", s.name());
            dst.create_database(&db);
            dst.psql(&db, ITEMS_PG);
            // The ops update and delete prefilled rows: start from the table they were written
            // against.
            prefill(&dst, &db, prefilled);
            let rate = strategies::measure(&dst, &db, s, &ops, lanes, batch).await;
            println!(
                "    strategy {:<8} [{setup}]: {} changes at {rate:.0} changes/s ({lanes} \
                 connections, batch {batch})",
                s.name(),
                ops.len()
            );
        }
        let first = checksum(&dst, "s_literal");
        for s in ["s_unnest", "s_copy"] {
            assert_eq!(
                checksum(&dst, s),
                first,
                "strategy {s} wrote different rows"
            );
        }
    }

    // (c) Live, native first.
    let mut live_gen = Generator::new(LIVE_FIRST_ID, 0x11FE);
    dst.psql("native", "ALTER SUBSCRIPTION nsub ENABLE");
    let now_lsn = src.psql(SRC_DB, "SELECT pg_current_wal_lsn()");
    wait_done(
        &src_client,
        &native,
        "nsub",
        MARKER,
        &now_lsn,
        Instant::now(),
        || {},
    )
    .await;
    let cpu = Cpu::now(&src, &dst);
    let (na_live, na_last) = live::run(
        &writer,
        dst.client("native").await,
        &mut live_gen,
        2 * MARKER,
        live_secs,
        live_rate,
    )
    .await;
    let na_live_cpu = cpu.since(&src, &dst);
    dst.psql("native", "ALTER SUBSCRIPTION nsub DISABLE");

    let log = dir.path().join("zipline-live.log");
    let mut child = spawn_zipline(&yaml, &log);
    let now_lsn = src.psql(SRC_DB, "SELECT pg_current_wal_lsn()");
    let started = Instant::now();
    let (catch_up, _) = wait_done(
        &src_client,
        &zl,
        "zbench",
        2 * MARKER + na_live.txs as i64,
        &now_lsn,
        started,
        || zipline_alive(&mut child, &log),
    )
    .await;
    let cpu = Cpu::now(&src, &dst);
    let (_, cpu_before) = proc_stat(child.id());
    let (zl_live, zl_last) = live::run(
        &writer,
        dst.client("zl").await,
        &mut live_gen,
        3 * MARKER,
        live_secs,
        live_rate,
    )
    .await;
    let zl_live_cpu = cpu.since(&src, &dst);
    let (zl_live_rss, cpu_after) = proc_stat(child.id());
    zipline_alive(&mut child, &log);
    let status = stop_zipline(child);

    println!(
        "(c) live [{setup}], {live_rate} changes/s offered for {live_secs}s (lag = commit on \
         the source to the whole transaction visible on the target):"
    );
    println!(
        "    native : {}; CPU: source {:.1}s, target {:.1}s",
        na_live.summary(na_last),
        na_live_cpu.src,
        na_live_cpu.dst
    );
    println!(
        "    zipline: {}; CPU: source {:.1}s, target {:.1}s, zipline {:.1}s; peak RSS {:.1} \
         MiB; caught up {:.1}s of backlog first; exit {status}",
        zl_live.summary(zl_last),
        zl_live_cpu.src,
        zl_live_cpu.dst,
        cpu_after - cpu_before,
        zl_live_rss as f64 / 1024.0,
        catch_up
    );
    println!(
        "    zipline p99 lag [{setup}] {:.1} ms (target < 50 ms); load average now {}",
        ms(zl_live.percentile(0.99)),
        load()
    );

    // Both targets must equal the source at the end (native catches up the Zipline phase).
    dst.psql("native", "ALTER SUBSCRIPTION nsub ENABLE");
    let now_lsn = src.psql(SRC_DB, "SELECT pg_current_wal_lsn()");
    wait_done(
        &src_client,
        &native,
        "nsub",
        3 * MARKER + zl_live.txs as i64,
        &now_lsn,
        Instant::now(),
        || {},
    )
    .await;
    let sums = [
        checksum(&src, SRC_DB),
        checksum(&dst, "native"),
        checksum(&dst, "zl"),
    ];
    println!(
        "final tables equal [{setup}]: {}",
        sums[0] == sums[1] && sums[0] == sums[2]
    );
    assert!(
        sums[0] == sums[1] && sums[0] == sums[2],
        "at the end the tables differ: source {}, native {}, zipline {}",
        sums[0],
        sums[1],
        sums[2]
    );
    // The subscription's slot lives on the source cluster; dropping it keeps teardown quick.
    dst.psql("native", "ALTER SUBSCRIPTION nsub DISABLE");
    dst.psql("native", "ALTER SUBSCRIPTION nsub SET (slot_name = NONE)");
    dst.psql("native", "DROP SUBSCRIPTION nsub");
}
